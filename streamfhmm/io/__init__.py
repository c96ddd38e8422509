"""Input and output: the ZeroMQ wire format, sources and sinks, checkpoints."""
