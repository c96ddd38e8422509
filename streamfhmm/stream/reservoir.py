"""A reservoir of raw stream segments for the background learner (MATH.md §5).

Each item is one contiguous segment of ``segment_length`` raw samples, long enough for
the windows of one subchain (a context row and L counted positions), so the learner
never pads. Two sampling schemes:

* **uniform** (``half_life=None``): Vitter's Algorithm R. After n offers every segment
  seen is in the reservoir with probability ``capacity / n``; the learner then fits the
  whole stream's history.
* **recency-weighted** (``half_life`` in samples): biased reservoir sampling with an
  exponential memory (Aggarwal, VLDB 2006). A full reservoir takes a new segment with
  probability ``p`` and then overwrites a uniformly chosen slot, so a stored segment
  survives each offer with probability ``1 - p/C`` and its survival halves every
  ``half_life`` samples: ``p = C (1 - 2^(-stride / half_life))``, capped at 1, where
  ``stride`` is the number of samples between offers. The cap bounds the shortest
  half-life to about ``0.69 · C · stride`` samples. The learner then follows drift.
"""
from __future__ import annotations

import json
import math
import numbers

import numpy as np

from .._validation import MAX_ABS_VALUE, check_positive_int, check_random_state

__all__ = ["Reservoir"]

_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def _state_to_json(value):
    """A bit generator's state as JSON-able values: its arrays (MT19937's key,
    Philox's counter, SFC64's state, …) become ``{"__array__": list, "dtype": str}``."""
    if isinstance(value, dict):
        return {k: _state_to_json(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _state_from_json(value):
    """The inverse of :func:`_state_to_json`."""
    if isinstance(value, dict):
        if set(value) == {"__array__", "dtype"}:
            dtype = np.dtype(value["dtype"])
            if dtype.kind not in "iu":
                raise ValueError(f"a random bit generator's state holds integers, got dtype {dtype}")
            return np.array(value["__array__"], dtype=dtype)
        return {k: _state_from_json(v) for k, v in value.items()}
    return value


def generator_to_json(rng: np.random.Generator):
    """A numpy Generator's bit-generator state as JSON-able values."""
    return _state_to_json(rng.bit_generator.state)


def generator_from_json(state) -> np.random.Generator:
    """The Generator :func:`generator_to_json` described (ValueError for an unknown bit
    generator or a malformed state)."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"unknown random bit generator {name!r} in the saved state")
    bg = getattr(np.random, name)()
    try:
        bg.state = _state_from_json(state)
    except (TypeError, KeyError) as exc:
        raise ValueError(f"malformed {name} state: {exc}") from None
    return np.random.Generator(bg)


class Reservoir:
    """A fixed-size sample of stream segments.

    Parameters
    ----------
    capacity : int
        C, the number of segments kept.
    segment_length : int
        Samples per segment.
    n_features : int
        D.
    half_life : float, optional
        Recency weighting: the half-life of a stored segment, in samples; ``None``
        (default) for uniform sampling.
    stride : int
        Samples between successive offers (for ``half_life``).
    random_state : None, int or numpy Generator

    Attributes
    ----------
    data : ndarray, shape (C, segment_length, D)
        Slot j holds a segment when ``j < size``.
    end : ndarray of int64, shape (C,)
        Stream position of each stored segment's last sample.
    size : int
        Filled slots.
    n_seen : int
        Segments offered so far.

    Examples
    --------
    >>> r = Reservoir(3, 2, 1, random_state=0)
    >>> for t in range(10):
    ...     _ = r.offer(np.full((2, 1), t), t)
    >>> r.size, r.n_seen
    (3, 10)
    """

    def __init__(self, capacity: int, segment_length: int, n_features: int, half_life=None,
                 stride: int = 1, random_state=None):
        self.capacity = check_positive_int(capacity, "capacity")
        self.segment_length = check_positive_int(segment_length, "segment_length")
        self.n_features = check_positive_int(n_features, "n_features")
        self.stride = check_positive_int(stride, "stride")
        if half_life is not None:
            if (isinstance(half_life, (bool, np.bool_)) or not isinstance(half_life, numbers.Real)
                    or not (math.isfinite(half_life) and half_life > 0)):
                raise ValueError(f"half_life must be a positive number of samples or None, "
                                 f"got {half_life!r}")
            half_life = float(half_life)
        self.half_life = half_life
        self.rng = check_random_state(random_state)
        self.data = np.zeros((self.capacity, self.segment_length, self.n_features))
        self.end = np.zeros(self.capacity, dtype=np.int64)
        self.size = 0
        self.n_seen = 0

    @property
    def insert_probability(self) -> float:
        """Probability that a full reservoir takes the next segment offered."""
        if self.half_life is None:   # Algorithm R: the (n_seen + 1)-th is kept with C / (n_seen + 1)
            return min(1.0, self.capacity / (self.n_seen + 1))
        return min(1.0, self.capacity * -math.expm1(-math.log(2.0) * self.stride / self.half_life))

    @property
    def flat(self) -> np.ndarray:
        """View ``(C · segment_length, D)`` of :attr:`data` (segment j in rows
        ``j·L … (j+1)·L - 1``)."""
        return self.data.reshape(self.capacity * self.segment_length, self.n_features)

    def offer(self, segment: np.ndarray, end: int) -> int:
        """Offer one segment (segment_length, D) ending at stream position ``end``;
        returns the slot it went to, or -1 (ValueError for another shape, the reservoir
        unchanged)."""
        self._check_segment(segment)
        return self._store(segment, end)

    def _store(self, segment, end: int) -> int:
        """:meth:`offer` without its check."""
        self.n_seen += 1
        if self.size < self.capacity:
            slot = self.size
            self.size += 1
        elif self.half_life is None:
            j = int(self.rng.integers(0, self.n_seen))
            if j >= self.capacity:
                return -1
            slot = j
        else:
            if self.rng.random() >= self.insert_probability:
                return -1
            slot = int(self.rng.integers(0, self.capacity))
        self.data[slot] = segment
        self.end[slot] = end
        return slot

    def offer_many(self, segments, ends) -> int:
        """Offer several segments in order (a sequence of (segment_length, D) arrays and
        their end positions); returns how many were stored.

        The same scheme as :meth:`offer` one by one (Algorithm R: the i-th segment seen is
        kept with probability ``C / i`` in a uniform slot; recency weighting: with the
        insert probability, in a uniform slot), with the random draws made for the whole
        batch at once: a full uniform reservoir rejects most offers, and the rejection no
        longer costs an interpreter round trip each. The random stream differs from that of
        repeated :meth:`offer` calls, not the distribution.
        """
        n = len(segments)
        if len(ends) != n:
            raise ValueError(f"offer_many needs one end position per segment, got {n} segments "
                             f"and {len(ends)} ends")
        for segment in segments:   # all before any is stored: a refused call changes nothing
            self._check_segment(segment)
        return self._offer_many(segments, ends)

    def _offer_many(self, segments, ends) -> int:
        """:meth:`offer_many` without its checks, for segments known to be of the
        reservoir's shape (the learner's, cut by the engine from its ring)."""
        n = len(segments)
        i = 0
        stored = 0
        while i < n and self.size < self.capacity:   # filling: in order
            self._store(segments[i], ends[i])
            i += 1
            stored += 1
        if i == n:
            return stored
        k = n - i
        if self.half_life is None:
            seen = self.n_seen + 1 + np.arange(k, dtype=np.int64)
            j = self.rng.integers(0, seen)
            take = np.flatnonzero(j < self.capacity)
            slots = j[take]
        else:
            take = np.flatnonzero(self.rng.random(k) < self.insert_probability)
            slots = self.rng.integers(0, self.capacity, size=take.size)
        self.n_seen += k
        for a, slot in zip(take.tolist(), slots.tolist()):   # later offers overwrite earlier ones
            self.data[slot] = segments[i + a]
            self.end[slot] = ends[i + a]
        return stored + int(take.size)

    def _check_segment(self, segment) -> None:
        shape = np.shape(segment)
        if shape != (self.segment_length, self.n_features):
            raise ValueError(f"a segment must have shape (segment_length, n_features) = "
                             f"({self.segment_length}, {self.n_features}), got {shape}")

    def sample_slots(self, n_steps: int, batch_size: int) -> np.ndarray:
        """Uniformly chosen filled slots, int64 array (n_steps, batch_size)."""
        if self.size == 0:
            raise ValueError("the reservoir is empty")
        return self.rng.integers(0, self.size, size=(n_steps, batch_size), dtype=np.int64)

    # -- checkpoints --------------------------------------------------------------------
    def to_arrays(self) -> dict:
        """Plain arrays describing the reservoir (filled slots only)."""
        meta = {"capacity": self.capacity, "segment_length": self.segment_length,
                "n_features": self.n_features, "half_life": self.half_life,
                "stride": self.stride, "size": self.size, "n_seen": self.n_seen,
                "rng": generator_to_json(self.rng)}
        return {"meta": np.array(json.dumps(meta)), "data": self.data[:self.size].copy(),
                "end": self.end[:self.size].copy()}

    @classmethod
    def from_arrays(cls, arrays, like: "Reservoir | None" = None) -> "Reservoir":
        """The reservoir :meth:`to_arrays` described.

        Parameters
        ----------
        arrays : dict of str to ndarray
            :meth:`to_arrays` output.
        like : Reservoir, optional
            The reservoir the state is to replace (the one the configuration builds):
            its capacity, segment length, number of features, half-life and stride must
            be the saved ones (checked before anything is allocated).

        Raises
        ------
        ValueError
            The state contradicts ``like`` or itself, or its segments hold infinities or
            values beyond ``MAX_ABS_VALUE`` (the engine never stores such segments).
        """
        meta = json.loads(str(arrays["meta"]))
        if like is not None:
            # a capacity or half-life of its own silently replaced the configuration's
            # (reservoir_size, recency_half_life); a huge capacity was a MemoryError
            half_life = meta["half_life"]
            saved = (meta["capacity"], meta["segment_length"], meta["n_features"],
                     None if half_life is None else float(half_life), meta["stride"])
            want = (like.capacity, like.segment_length, like.n_features, like.half_life,
                    like.stride)
            if saved != want:
                raise ValueError(f"the saved reservoir's (capacity, segment_length, n_features, "
                                 f"half_life, stride) = {saved} contradict the configuration, "
                                 f"which gives {want}")
        res = cls(meta["capacity"], meta["segment_length"], meta["n_features"],
                  half_life=meta["half_life"], stride=meta["stride"])
        size, n_seen = int(meta["size"]), int(meta["n_seen"])
        if not 0 <= size <= res.capacity or n_seen < size:
            # a negative n_seen stopped the learner at its next drain, one below size
            # biased Algorithm R towards overwriting the first slots
            raise ValueError(f"reservoir state: size {size} and segments seen {n_seen} must "
                             f"satisfy 0 <= size <= capacity ({res.capacity}) and seen >= size")
        data = np.asarray(arrays["data"], dtype=np.float64)
        end = np.asarray(arrays["end"], dtype=np.int64)
        if data.shape != (size, res.segment_length, res.n_features) or end.shape != (size,):
            raise ValueError(f"reservoir arrays of shape {data.shape} / {end.shape} do not match "
                             f"its description (size {size})")
        if np.isinf(data).any():
            raise ValueError("reservoir data must not contain infinities")
        big = np.abs(data) > MAX_ABS_VALUE   # (NaN, a missing value, is kept)
        if big.any():
            # the engine offers no such segment (a fit squares the values: 1e200 made
            # every step non-finite, all discarded)
            raise ValueError(f"reservoir data must hold values within ±{MAX_ABS_VALUE:g}, "
                             f"found {float(data[big][0]):g}")
        res.data[:size] = data
        res.end[:size] = end
        res.size = size
        res.n_seen = n_seen
        res.rng = generator_from_json(meta["rng"])
        return res
