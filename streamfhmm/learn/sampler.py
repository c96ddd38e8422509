"""Subchain sampling for stochastic variational learning (MATH.md §5).

Every epoch partitions each sequence into consecutive blocks of ``subchain_length``
positions, starting from a fresh random offset (so block boundaries move from epoch to
epoch), shuffles all blocks together, and hands them out ``batch_size`` at a time
without replacement; when an epoch runs out, the next epoch's blocks continue the
batch. Every position is therefore used exactly once per epoch, and the per-position
mean of the ELBO gradient over a batch is an unbiased estimate of the full gradient
divided by the number of positions.

A block that does not start a sequence carries one extra *context* row before its
first position: its θ enters the first pair term, its own term is not counted.
"""
from __future__ import annotations

import numpy as np

from .._validation import check_positive_int

__all__ = ["SubchainSampler", "Batch"]


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
    bounds : ndarray of int64, shape (n_sequences + 1,)
        Sequence ``i`` is rows ``bounds[i]:bounds[i+1]``.
    subchain_length : int
        Positions per subchain (the last block of a sequence may be shorter).
    batch_size : int
        Subchains per minibatch.
    rng : numpy.random.Generator
    """

    def __init__(self, bounds, subchain_length: int, batch_size: int, rng: np.random.Generator):
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.subchain_length = check_positive_int(subchain_length, "subchain_length")
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.rng = rng
        self.n_positions = int(self.bounds[-1] - self.bounds[0])
        self.epoch = 0
        self._queue_start = np.empty(0, dtype=np.int64)
        self._queue_stop = np.empty(0, dtype=np.int64)
        self._queue_seq = np.empty(0, dtype=np.int64)
        self._cursor = 0

    def _new_epoch(self):
        L = self.subchain_length
        starts, stops, seqs = [], [], []
        for i in range(len(self.bounds) - 1):
            lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
            n = hi - lo
            offset = int(self.rng.integers(0, L)) if n > L else 0
            cuts = [lo] + list(range(lo + offset if offset else lo + L, hi, L)) + [hi]
            cuts = sorted(set(cuts))
            starts.extend(cuts[:-1])
            stops.extend(cuts[1:])
            seqs.extend([i] * (len(cuts) - 1))
        order = self.rng.permutation(len(starts))
        self._queue_start = np.asarray(starts, dtype=np.int64)[order]
        self._queue_stop = np.asarray(stops, dtype=np.int64)[order]
        self._queue_seq = np.asarray(seqs, dtype=np.int64)[order]
        self._cursor = 0
        self.epoch += 1

    def _take(self):
        if self._cursor >= len(self._queue_start):
            self._new_epoch()
        k = self._cursor
        self._cursor += 1
        return int(self._queue_start[k]), int(self._queue_stop[k]), int(self._queue_seq[k])

    def next_batch(self) -> Batch:
        """The next minibatch (continuing into a new epoch when this one is used up)."""
        rows, rs, re, offsets, first = [], [], [], [0], []
        for _ in range(self.batch_size):
            start, stop, seq = self._take()
            lo, hi = int(self.bounds[seq]), int(self.bounds[seq + 1])
            is_start = start == lo
            r = np.arange(start if is_start else start - 1, stop, dtype=np.int64)
            rows.append(r)
            rs.append(np.full(len(r), lo, dtype=np.int64))
            re.append(np.full(len(r), hi, dtype=np.int64))
            offsets.append(offsets[-1] + len(r))
            first.append(is_start)
        return Batch(np.concatenate(rows), np.concatenate(rs), np.concatenate(re),
                     np.asarray(offsets, dtype=np.int64), np.asarray(first, dtype=bool))
