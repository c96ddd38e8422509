"""streamfhmm: streaming online inference for Factorial Hidden Markov Models.

The public API: :class:`FHMM` (the estimator), :class:`FHMMParams` (an immutable
parameter set), :class:`StreamEngine` (online inference with a background learner) and
:class:`Posterior` (what it emits per time step).
"""
import logging as _logging

from .estimator import FHMM
from .model import FHMMParams
from .stream.engine import StreamEngine
from .stream.posterior import Posterior

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__version__ = "0.1.0"
__all__ = ["FHMM", "FHMMParams", "StreamEngine", "Posterior", "__version__"]
