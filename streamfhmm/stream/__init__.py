"""Streaming inference: ring buffer, reservoir, the StreamEngine and its learner thread."""

#: the engine's default ``learner_duty`` (fraction of one core the background learner
#: uses); here, not in :mod:`.learner`, so that the command line reads it without Numba
DEFAULT_LEARNER_DUTY = 0.25
