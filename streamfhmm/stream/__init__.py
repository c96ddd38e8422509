"""Streaming inference: ring buffer, reservoir, the StreamEngine and its learner thread."""
