"""The event the engine emits for every time step."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Posterior", "FLAG_IMPUTED", "FLAG_WARMUP", "FLAG_EDGE"]

#: the window held at least one missing (NaN) value, imputed
FLAG_IMPUTED = 1
#: the posterior of a cold-start warm-up sample (by the model initialised from the
#: warm-up: the call that ends it emits them, the last lag's in smooth mode come later)
FLAG_WARMUP = 2
#: the window reached past a stream edge and was padded by repeating the edge sample
FLAG_EDGE = 4


@dataclass(frozen=True, eq=False)
class Posterior:
    """Posterior of every chain at one time step.

    Attributes
    ----------
    t : int
        Stream position (0-based index of the sample this posterior is about).
    theta : ndarray, shape (M,)
        ``q(s_t^m = 1)``.
    rho : ndarray, shape (M,)
        Copula correlation between ``s_{t-1}^m`` and ``s_t^m`` (0 in exact mode).
    mean : ndarray, shape (D,)
        Reconstructed observation ``Wᵀ [θ_t, 1]``.
    version : int
        Version of the parameter snapshot that produced it.
    flags : int
        Bit set of ``FLAG_IMPUTED``, ``FLAG_WARMUP``, ``FLAG_EDGE``.
    """

    t: int
    theta: np.ndarray
    rho: np.ndarray
    mean: np.ndarray
    version: int
    flags: int = 0

    @property
    def imputed(self) -> bool:
        return bool(self.flags & FLAG_IMPUTED)

    @property
    def warmup(self) -> bool:
        return bool(self.flags & FLAG_WARMUP)

    @property
    def edge(self) -> bool:
        return bool(self.flags & FLAG_EDGE)
