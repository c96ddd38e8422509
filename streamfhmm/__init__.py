"""streamfhmm: streaming online inference for Factorial Hidden Markov Models."""
from .model import FHMMParams

__version__ = "0.1.0"
__all__ = ["FHMMParams", "__version__"]
