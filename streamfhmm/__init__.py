"""streamfhmm: streaming online inference for Factorial Hidden Markov Models.

The public API: :class:`FHMM` (the estimator), :class:`FHMMParams` (an immutable
parameter set), :class:`StreamEngine` (online inference with a background learner) and
:class:`Posterior` (what it emits per time step).

The four names are imported on first use (PEP 562): ``import streamfhmm`` alone does
not load Numba, so the ``streamfhmm`` command starts at once and a Ctrl-C while it
starts ends it cleanly.
"""
import importlib as _importlib
import logging as _logging

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__version__ = "0.1.0"
__all__ = ["FHMM", "FHMMParams", "StreamEngine", "Posterior", "__version__"]

#: public name -> the module that defines it
_LAZY = {"FHMM": ".estimator", "FHMMParams": ".model", "StreamEngine": ".stream.engine",
         "Posterior": ".stream.posterior"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value      # later lookups do not come here
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
