"""Subchain sampling for stochastic variational learning (MATH.md §5).

Every epoch partitions each sequence into consecutive blocks of ``subchain_length``
positions, starting from a fresh random offset (so block boundaries move from epoch to
epoch), shuffles all blocks together, and hands them out ``batch_size`` at a time
without replacement; when an epoch runs out, the next epoch's blocks continue the
batch. Every position is therefore used exactly once per epoch. The learners divide a
batch's summed ELBO gradient by the positions it counts (not by a fixed ``B·L``): a
ratio of two random sums, which gives the positions of short blocks (at the ends of
sequences) a little more weight than the others over an epoch, about 3 % more with
10 subchains of 5 positions per batch and more with fewer subchains per batch.

A block that does not start a sequence carries one extra *context* row before its
first position: its θ enters the first pair term, its own term is not counted.
"""
from __future__ import annotations

import numpy as np

from .._validation import check_bounds, check_generator, check_positive_int

__all__ = ["SubchainSampler", "Batch", "expected_subchains"]


class Batch:
    """One minibatch of subchains, laid out for the Numba kernels.

    Attributes
    ----------
    rows : ndarray of int64, shape (n_rows,)
        Absolute row indices into the data, subchain after subchain (context row first
        where there is one).
    row_start, row_end : ndarray of int64, shape (n_rows,)
        Bounds of the sequence holding each row (for edge-padded windows).
    offsets : ndarray of int64, shape (B + 1,)
        Subchain ``b`` occupies ``rows[offsets[b]:offsets[b+1]]``.
    first_is_start : ndarray of bool, shape (B,)
        True where row 0 of the subchain is the first step of a sequence (counted),
        False where it is a context row (not counted).
    n_positions : int
        Number of counted positions in the batch.
    """

    __slots__ = ("rows", "row_start", "row_end", "offsets", "first_is_start", "n_positions")

    def __init__(self, rows, row_start, row_end, offsets, first_is_start):
        self.rows = rows
        self.row_start = row_start
        self.row_end = row_end
        self.offsets = offsets
        self.first_is_start = first_is_start
        self.n_positions = int(len(rows) - np.count_nonzero(~first_is_start))


class SubchainSampler:
    """Minibatches of ``batch_size`` subchains of ``subchain_length`` positions.

    Parameters
    ----------
    bounds : ndarray of int, shape (n_sequences + 1,)
        Sequence ``i`` is rows ``bounds[i]:bounds[i+1]``: non-negative, non-decreasing,
        spanning at least one row (else ValueError; an empty span would never fill a
        batch).
    subchain_length : int
        Positions per subchain (the last block of a sequence may be shorter).
    batch_size : int
        Subchains per minibatch.
    rng : numpy.random.Generator
    """

    def __init__(self, bounds, subchain_length: int, batch_size: int, rng: np.random.Generator):
        self.bounds = check_bounds(bounds)
        self.subchain_length = check_positive_int(subchain_length, "subchain_length")
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.rng = check_generator(rng)
        self.n_positions = int(self.bounds[-1] - self.bounds[0])
        self.epoch = 0
        empty = np.empty(0, dtype=np.int64)
        self.q_start, self.q_stop, self.q_lo, self.q_hi = empty, empty, empty, empty
        self._cursor = 0

    def _epoch_blocks(self):
        L = self.subchain_length
        starts, stops, seqs = [], [], []
        for i in range(len(self.bounds) - 1):
            lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
            offset = int(self.rng.integers(0, L)) if hi - lo > L else 0
            cuts = sorted({lo, hi, *range(lo + (offset or L), hi, L)})
            starts.extend(cuts[:-1])
            stops.extend(cuts[1:])
            seqs.extend([i] * (len(cuts) - 1))
        order = self.rng.permutation(len(starts))
        seqs = np.asarray(seqs, dtype=np.int64)[order]
        self.epoch += 1
        return (np.asarray(starts, dtype=np.int64)[order], np.asarray(stops, dtype=np.int64)[order],
                self.bounds[seqs], self.bounds[seqs + 1])

    def ensure(self, n: int):
        """Make sure the next ``n`` blocks are queued contiguously from ``cursor``."""
        while self._cursor + n > len(self.q_start):
            rest = [a[self._cursor:] for a in (self.q_start, self.q_stop, self.q_lo, self.q_hi)]
            new = self._epoch_blocks()
            self.q_start, self.q_stop, self.q_lo, self.q_hi = (
                np.concatenate([r, a]) for r, a in zip(rest, new))
            self._cursor = 0

    @property
    def cursor(self) -> int:
        return self._cursor

    def advance(self, n: int):
        self._cursor += n

    @property
    def max_rows(self) -> int:
        """The most rows a batch can have: B · (subchain_length + 1)."""
        return self.batch_size * (self.subchain_length + 1)

    def next_batch(self) -> Batch:
        """The next minibatch (continuing into a new epoch when this one is used up)."""
        B = self.batch_size
        self.ensure(B)
        rows, rs, re, offsets, first = [], [], [], [0], []
        for k in range(self._cursor, self._cursor + B):
            start, stop, lo, hi = (int(a[k]) for a in (self.q_start, self.q_stop, self.q_lo, self.q_hi))
            is_start = start == lo
            r = np.arange(start if is_start else start - 1, stop, dtype=np.int64)
            rows.append(r)
            rs.append(np.full(len(r), lo, dtype=np.int64))
            re.append(np.full(len(r), hi, dtype=np.int64))
            offsets.append(offsets[-1] + len(r))
            first.append(is_start)
        self._cursor += B
        return Batch(np.concatenate(rows), np.concatenate(rs), np.concatenate(re),
                     np.asarray(offsets, dtype=np.int64), np.asarray(first, dtype=bool))


def expected_subchains(lengths, subchain_length: int) -> np.ndarray:
    """Mean number of subchains an epoch of :class:`SubchainSampler` cuts from each
    sequence, shape (n_sequences,).

    The cut of :meth:`SubchainSampler._epoch_blocks`: a sequence of ``T <= L`` positions
    is one subchain; a longer one is cut every ``L`` from a random offset ``o`` in
    ``0 .. L-1``, into ``ceil(T / L)`` subchains for ``o = 0`` and ``1 + ceil((T - o) / L)``
    otherwise, the offsets equally likely; an empty sequence gives none.
    """
    L = check_positive_int(subchain_length, "subchain_length")
    T = np.asarray(lengths)
    if T.ndim != 1 or not (np.issubdtype(T.dtype, np.integer) or T.size == 0) or (T < 0).any():
        raise ValueError(f"lengths must be a 1-d sequence of non-negative integers, got {lengths!r}")
    T = T.astype(np.int64)
    out = (T > 0).astype(np.float64)
    long = T > L
    t = T[long][:, None]
    o = np.arange(1, L, dtype=np.int64)[None, :]
    out[long] = ((T[long] + L - 1) // L + (1 + (t - o + L - 1) // L).sum(axis=1)) / L
    return out
