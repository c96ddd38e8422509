"""A preallocated, double-written ring buffer of raw samples.

Sample ``t`` is written to rows ``t % C`` and ``t % C + C`` of a ``(2C, D)`` array, so
the ``w ≤ C`` samples ending at any position are one contiguous block: a window is
read by :func:`~streamfhmm.kernels.recognition.forward_one` straight from the flat
buffer, with no copy and no wrap-around test. Nothing is allocated per sample.
"""
from __future__ import annotations

import numpy as np

from .._validation import check_positive_int
from ..kernels import online as _ko

__all__ = ["RingBuffer"]


class RingBuffer:
    """The last ``capacity`` samples of a stream, addressed by stream position.

    Parameters
    ----------
    capacity : int
        C, the number of samples kept.
    n_features : int
        D.

    Attributes
    ----------
    buf : ndarray, shape (2C, D), C-contiguous
        The storage; sample ``t`` is in rows ``t % C`` and ``t % C + C``.
    flat : ndarray, shape (2C·D,)
        A flat view of ``buf`` (made once).

    Notes
    -----
    The ring does not know which positions were written: the engine does. Positions
    before a sequence's first sample read whatever :meth:`fill` put there (the engine
    fills the ring with the first sample, which is the edge padding of MATH.md §5).

    Examples
    --------
    >>> r = RingBuffer(4, 2)
    >>> for t in range(6):
    ...     _ = r.write(t, np.array([t, -t], dtype=float))
    >>> r.last(5, 3)[:, 0]
    array([3., 4., 5.])
    """

    def __init__(self, capacity: int, n_features: int):
        self.capacity = check_positive_int(capacity, "capacity")
        self.n_features = check_positive_int(n_features, "n_features")
        self.buf = np.zeros((2 * self.capacity, self.n_features))
        self.flat = self.buf.reshape(-1)

    def slot(self, t: int) -> int:
        """Row of position ``t`` (also at ``slot + capacity``)."""
        return t % self.capacity

    def write(self, t: int, x: np.ndarray) -> int:
        """Write sample ``x`` (D,) at position ``t``; returns the status code of
        :func:`~streamfhmm.kernels.online.check_sample` (an infinite sample is not
        written)."""
        return _ko.ring_write(x, self.buf, t % self.capacity, self.capacity)

    def write_block(self, t0: int, X: np.ndarray) -> None:
        """Write the rows of ``X`` (n, D) at positions ``t0 … t0 + n - 1`` (only the last
        ``capacity`` matter)."""
        n = X.shape[0]
        C = self.capacity
        if n > C:
            X = X[n - C:]
            t0 += n - C
            n = C
        idx = (t0 + np.arange(n)) % C
        self.buf[idx] = X
        self.buf[idx + C] = X

    def fill(self, x: np.ndarray) -> None:
        """Set every position to ``x`` (D,)."""
        self.buf[:] = x

    def first_row(self, t_last: int, w: int) -> int:
        """Row of the first of the ``w`` samples ending at ``t_last``."""
        return (t_last - w + 1) % self.capacity

    def last(self, t_last: int, w: int) -> np.ndarray:
        """View ``(w, D)`` of the samples at positions ``t_last - w + 1 … t_last``
        (``w ≤ capacity``), oldest first."""
        if not 0 < w <= self.capacity:
            raise ValueError(f"w must be in [1, {self.capacity}], got {w}")
        r = self.first_row(t_last, w)
        return self.buf[r:r + w]

    def to_arrays(self) -> dict:
        return {"buf": self.buf.copy()}

    @classmethod
    def from_arrays(cls, buf) -> "RingBuffer":
        buf = np.asarray(buf, dtype=np.float64)
        if buf.ndim != 2 or buf.shape[0] % 2 or buf.shape[0] == 0:
            raise ValueError(f"a ring buffer must have shape (2C, D), got {buf.shape}")
        ring = cls(buf.shape[0] // 2, buf.shape[1])
        ring.buf[:] = buf
        return ring
