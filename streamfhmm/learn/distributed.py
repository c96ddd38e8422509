"""Data-parallel stochastic variational learning on a Dask cluster (MATH.md §5).

:func:`fit_svi_distributed` runs the learner of :mod:`streamfhmm.learn.svi` over data
that lives on the workers: a list of independent sequences ("chunks"), given either as
in-memory ``(T_i, D)`` arrays (sent once to the workers) or as paths of ``.npy`` files
that the workers open themselves, memory-mapped. The driver reads only the files'
headers (their shapes); it never loads a sequence.

How a step runs
---------------
The chunks are split into one *shard* per worker (longest first onto the least-loaded
shard). Each shard lives on its worker for the whole fit as a Dask actor holding the
chunks (arrays or memory maps), its own :class:`~streamfhmm.learn.sampler.SubchainSampler`
(seeded from ``random_state``, one independent stream per shard) and its scratch
buffers. Each step the driver

1. splits the ``batch_size`` subchains among the shards in proportion to the number
   of subchains an epoch of their sampler holds on average (integer parts, then
   systematic rounding of the remainders). Every shard then runs through its epochs at
   the same pace, so every position is used equally often, as in the local learner
   (in proportion to positions, a shard of sequences shorter than a subchain would be
   visited less often per position than a shard of long ones);
2. sends every shard the current flat parameter vector (model vector then network
   weights, one float64 array) and its number of subchains;
3. each shard samples its subchains, copies only the rows their windows need into a
   small buffer and returns :func:`~streamfhmm.kernels.svi.batch_gradient`'s sums: the
   ELBO terms, the gradient and the number of counted positions;
4. the driver adds the sums, divides by the total counted positions (the
   per-position mean of MATH.md §5, exactly what the local learner optimises) and
   applies :func:`~streamfhmm.kernels.svi.rmsprop_update` with the same cosine
   learning-rate schedule as :func:`~streamfhmm.learn.svi.fit_svi`.

This is synchronous data parallelism: every step uses one global batch, so the
optimisation is the local learner's with the batch drawn from several machines, its
results are reproducible for a fixed seed and a fixed number of shards, and nothing
about convergence changes. Asynchronous or local-step schemes (workers updating stale
copies of the parameters) would save round trips but change the optimiser; they are
not implemented.

When it helps
-------------
A step costs one round trip to every worker (the parameter vector out, a gradient of
the same size back) on top of the gradient itself. At the paper's power configuration
(M = 10, D = 6, window 21, 200 hidden units: a 29,527-float vector) with 10 subchains
of 5 positions, a gradient takes 2-4 ms on one core, while on a busy 2-core machine a
round trip to a worker process measured 7-20 ms: there the local learner is 3-10 times
faster. Distribution pays only when a step's gradient costs much more than the round
trip — hundreds of subchains per step, long subchains, large networks — and the
workers have cores (or machines) of their own, or when the data do not fit on one
machine. ``bench/distributed.py`` measures both sides and prints the break-even batch
size.

Failures
--------
Every wait on a worker has a timeout (``step_timeout``, ``setup_timeout``). When a
worker dies or does not answer in time, the shards it held are re-created on the
remaining workers (in-memory chunks are sent again from the driver; ``.npy`` chunks
are re-opened, so the files must be readable at the same path from every worker,
e.g. on a shared file system) with fresh sampler seeds, and the step is repeated
whole. A worker that died is not used again while the cluster still lists it; one
that only timed out stays in use, after the workers that did not. After
``max_recoveries`` such events, or when no worker is left, the fit raises
:class:`RuntimeError` naming the lost shard; it never hangs. Losing the scheduler
ends the fit at once with a :class:`RuntimeError` that says so.

Clusters
--------
Works with any ``distributed.Client``: ``LocalCluster(processes=False)`` (workers are
threads; the gradient kernels release the GIL), ``LocalCluster(n_workers=N,
threads_per_worker=1)``, or a real cluster::

    # on the machines: dask scheduler; dask worker tcp://scheduler:8786 --nthreads 1
    from distributed import Client
    client = Client("tcp://scheduler:8786")
    paths = write_npy_chunks(X, "/shared/data/run1", n_chunks=16)   # or your own files
    state = fit_svi_distributed(paths, params, net, client, max_iter=20_000,
                                batch_size=200, random_state=0)

Each worker runs one shard in one thread, so start workers with one thread each and
as many workers as cores; streamfhmm must be importable on every worker.
``direct_to_workers=True`` (the default here) sends the actor calls straight to the
workers instead of through the scheduler; pass ``False`` when the client cannot reach
the workers directly. A shard is a Dask actor, and Dask does not retire a worker that
holds one: a cluster cannot scale down (``retire_workers``, adaptive scaling) while a
fit runs on it; it can lose workers (see above) and grow.

Live streams
------------
This module learns from recorded data. Sharding many *live* streams across machines
(inference and continual learning on each) is done with ``streamfhmm serve --topics``
over ZeroMQ (:mod:`streamfhmm.stream`), not with Dask.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import numbers
import os
import socket
import time
from dataclasses import dataclass

import numpy as np

from .._blas import BlasHold
from .._validation import (MIN_ABS_SCALE, check_fit_magnitude, check_observations,
                           check_positive_int, check_random_state)
from ..kernels import svi as _ks
from ..model import FHMMParams
from ..network import RecognitionNet
from .objective import check_covariance_type, covariance_mode
from .sampler import SubchainSampler, expected_subchains
from .svi import (SVIState, advance_bar, apply_gradient_sum, check_svi_settings, count_step,
                  cosine_lr, log_step, start_state, store)

__all__ = ["fit_svi_distributed", "write_npy_chunks", "chunk_lengths", "chunk_scaler",
           "head_rows"]

#: rows per block when a worker scans a memory-mapped chunk
_SCAN_ROWS = 65536


# --------------------------------------------------------------------------- chunks
def _is_path(source) -> bool:
    return isinstance(source, (str, os.PathLike))


#: the ``.npy`` format versions read, and numpy's public reader of each header. 3.0 is
#: 2.0 with a UTF-8 header instead of latin-1 (numpy writes it only for field names
#: latin-1 cannot encode, i.e. structured dtypes, which a chunk cannot hold): the
#: header's length field and every descr, shape and order a chunk can have are the same
#: bytes. (numpy's private reader of any version, used before, is gone in numpy 2:
#: AttributeError for a valid 3.0 file.)
_NPY_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0,
                (3, 0): np.lib.format.read_array_header_2_0}


def _npy_header(path: str):
    """Shape, Fortran order, dtype and data offset (bytes) of a ``.npy`` file, from its
    header only; ValueError for a file that is not one, or of a format version other
    than 1.0, 2.0 and 3.0."""
    with open(path, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
        except ValueError as exc:
            raise ValueError(f"chunk {path!r} is not a .npy file: {exc}") from None
        read = _NPY_READERS.get(version)
        if read is None:
            raise ValueError(f"chunk {path!r} is a .npy file of an unsupported format version "
                             f"{version[0]}.{version[1]} (expected 1.0, 2.0 or 3.0)")
        try:
            header = read(fh)
        except (ValueError, TypeError) as exc:   # (TypeError: a header numpy cannot parse)
            raise ValueError(f"chunk {path!r} is not a .npy file: {exc}") from None
        return (*header, fh.tell())


def _check_dtype(dtype, where):
    if dtype.kind not in "fiu" or dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"{where} must hold real numbers, got dtype {dtype}")


@dataclass
class _Chunk:
    source: object       # validated float64 ndarray, or the path of a .npy file
    length: int
    n_features: int


class _Described(list):
    """Chunks :func:`_describe_chunks` checked (a list of :class:`_Chunk`): the public
    functions take them back as they are, so a fit checks its data once, not once per
    call (FHMM.fit with a client makes four)."""


def _describe_chunks(chunks) -> _Described:
    if isinstance(chunks, _Described):
        return chunks
    if isinstance(chunks, (str, os.PathLike, np.ndarray)) or not hasattr(chunks, "__len__"):
        raise ValueError("chunks must be a list of (T_i, D) arrays or of .npy file paths, got "
                         f"{type(chunks).__name__}")
    if len(chunks) == 0:
        raise ValueError("chunks must hold at least one sequence, got an empty list")
    out = []
    for i, src in enumerate(chunks):
        if _is_path(src):
            path = os.fspath(src)
            if not path.endswith(".npy"):
                raise ValueError(f"chunks[{i}] = {path!r}: only .npy files are supported "
                                 f"(write them with write_npy_chunks or np.save)")
            if not os.path.isfile(path):
                raise ValueError(f"chunks[{i}] = {path!r} does not exist")
            shape, _, dtype, offset = _npy_header(path)
            _check_dtype(dtype, f"chunks[{i}] ({path})")
            if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
                raise ValueError(f"chunks[{i}] ({path}) must hold a 2-D array (T_i, D) with "
                                 f"T_i, D >= 1, got shape {shape}")
            need = offset + shape[0] * shape[1] * dtype.itemsize
            size = os.path.getsize(path)
            if size < need:
                raise ValueError(f"chunks[{i}] ({path}) is truncated: its header announces "
                                 f"shape {shape} of {dtype}, {need} bytes with the header, "
                                 f"but the file has {size}")
            # the workers open it: relative to their own working directory, a relative
            # path would name another file (or none)
            out.append(_Chunk(os.path.abspath(path), int(shape[0]), int(shape[1])))
        else:
            X = check_fit_magnitude(check_observations(src, f"chunks[{i}]", allow_nan=True),
                                    f"chunks[{i}]")
            out.append(_Chunk(X, X.shape[0], X.shape[1]))
    D = {c.n_features for c in out}
    if len(D) > 1:
        raise ValueError(f"every chunk must have the same number of features, got {sorted(D)}")
    if not any(_is_path(c.source) for c in out):
        # the whole data is here: the test a single array gets, over every chunk (a
        # .npy chunk's values are known once :func:`chunk_scaler` has scanned it)
        parts = [_extremes(c.source) for c in out]
        lo, hi, nonzero = parts[0]
        for p in parts[1:]:
            lo, hi, nonzero = np.minimum(lo, p[0]), np.maximum(hi, p[1]), nonzero + p[2]
        _check_tiny(lo, hi, nonzero)
    return _Described(out)


def _extremes(block, observed=None):
    """Per-feature smallest and largest observed value (+inf and -inf for a feature with
    none) and number of observed values other than zero of the float64 ``block``."""
    if observed is None:
        observed = ~np.isnan(block)
    lo = np.where(observed, block, np.inf).min(axis=0)
    hi = np.where(observed, block, -np.inf).max(axis=0)
    nonzero = np.count_nonzero(observed & (block != 0.0), axis=0).astype(np.float64)
    return lo, hi, nonzero


def _peak(lo, hi):
    """Per-feature largest magnitude of the observed values (0 for a feature with none)."""
    return np.where(lo <= hi, np.maximum(np.abs(lo), np.abs(hi)), 0.0)


def _check_tiny(lo, hi, nonzero):
    """Raise ValueError if a feature that varies has its largest magnitude below
    :data:`~streamfhmm._validation.MIN_ABS_SCALE` over every chunk (``lo``, ``hi``,
    ``nonzero``: :func:`_extremes` over all chunks), as
    :func:`~streamfhmm._validation.check_fit_magnitude` refuses a whole series (``tiny``).
    A feature varies when it has two distinct values and two values other than zero."""
    peak = _peak(lo, hi)
    low = (peak > 0.0) & (peak < MIN_ABS_SCALE) & (lo < hi) & (nonzero > 1)
    if low.any():
        c = int(np.flatnonzero(low)[0])
        raise ValueError(f"the chunks' column {c} holds no value larger than {peak[c]:g} in "
                         f"magnitude (over every chunk): a fit needs a feature's largest value "
                         f"at least {MIN_ABS_SCALE:g} (its statistics square them, and they "
                         f"underflow); rescale the data")


def chunk_lengths(chunks) -> np.ndarray:
    """Lengths of the chunks (from the ``.npy`` headers for paths; nothing is loaded).

    Parameters
    ----------
    chunks : list of ndarray (T_i, D) or of ``.npy`` paths

    Returns
    -------
    ndarray of int64, shape (n_chunks,)
    """
    return np.array([c.length for c in _describe_chunks(chunks)], dtype=np.int64)


def write_npy_chunks(X, directory, n_chunks: int, prefix: str = "chunk") -> list[str]:
    """Write a long ``(T, D)`` array as ``n_chunks`` consecutive ``.npy`` files.

    Each file is one independent sequence for :func:`fit_svi_distributed`; cutting a
    sequence loses only the dependence across each cut (``n_chunks - 1`` transitions).

    Parameters
    ----------
    X : array_like, shape (T, D)
        NaN marks a missing value.
    directory : str or path
        Created if needed.
    n_chunks : int
        Number of files, at most T; the lengths differ by at most one.
    prefix : str
        Files are ``{prefix}_{i:05d}.npy``.

    Returns
    -------
    list of str
        The absolute paths, in order.

    Examples
    --------
    >>> import tempfile
    >>> paths = write_npy_chunks(np.zeros((10, 2)), tempfile.mkdtemp(), 3)
    >>> chunk_lengths(paths).tolist()
    [4, 3, 3]
    """
    X = check_observations(X, allow_nan=True)
    n_chunks = check_positive_int(n_chunks, "n_chunks")
    if n_chunks > X.shape[0]:
        raise ValueError(f"n_chunks must be at most the number of samples ({X.shape[0]}), "
                         f"got {n_chunks}")
    directory = os.path.abspath(os.fspath(directory))
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(X, n_chunks)):
        path = os.path.join(directory, f"{prefix}_{i:05d}.npy")
        np.save(path, np.ascontiguousarray(part))
        paths.append(path)
    return paths


def _check_rows(block, path, first_row):
    """Raise if rows ``first_row ...`` of the chunk at ``path`` (``block``, float64) hold
    an infinity, a value too large to fit (as
    :func:`~streamfhmm._validation.check_fit_magnitude`) or a row with every value
    missing."""
    if np.isinf(block).any():
        r, c = np.argwhere(np.isinf(block))[0]
        raise ValueError(f"chunk {path} contains an infinity at row {first_row + r}, column {c}")
    check_fit_magnitude(block, f"chunk {path}", first_row)
    empty = np.isnan(block).all(axis=1)
    if empty.any():
        raise ValueError(f"chunk {path} has a row with every value missing (row "
                         f"{first_row + int(np.flatnonzero(empty)[0])}); drop or interpolate it")


def _map_chunk(path: str, n_features: int):
    """The ``.npy`` file at ``path`` memory-mapped (nothing read but its header)."""
    try:
        # a plain array over the mapped file (slicing a memmap object is slower)
        Y = np.asarray(np.load(path, mmap_mode="r"))
    except (OSError, ValueError) as exc:  # missing here, unreadable, truncated, not a .npy
        raise ValueError(f"chunk {path} cannot be opened on {socket.gethostname()} "
                         f"({type(exc).__name__}: {exc}); .npy chunks must be readable at "
                         f"the same path on every worker") from None
    if Y.ndim != 2 or Y.shape[1] != n_features:
        raise ValueError(f"chunk {path} has shape {Y.shape}, expected (T, {n_features})")
    _check_dtype(Y.dtype, f"chunk {path}")
    return Y


def _open_chunk(source, n_features: int):
    """Worker side: the chunk as an array, ``.npy`` files memory-mapped and checked."""
    if not _is_path(source):
        return source
    path = os.fspath(source)
    Y = _map_chunk(path, n_features)
    if Y.dtype.kind == "f":
        for s in range(0, Y.shape[0], _SCAN_ROWS):
            _check_rows(np.asarray(Y[s:s + _SCAN_ROWS], dtype=np.float64), path, s)
    return Y


def _moments(source, n_features):
    """Per-feature count, mean, sum of squared deviations, smallest and largest value and
    number of values other than zero of the observed values (:func:`_combine_moments`
    adds two chunks')."""
    Y = _open_chunk(source, n_features)
    out = None
    for s in range(0, Y.shape[0], _SCAN_ROWS):
        block = np.asarray(Y[s:s + _SCAN_ROWS], dtype=np.float64)
        obs = ~np.isnan(block)
        n = obs.sum(axis=0).astype(np.float64)
        mb = np.where(obs, block, 0.0).sum(axis=0) / np.maximum(n, 1)
        m2b = (np.where(obs, block - mb, 0.0) ** 2).sum(axis=0)
        part = (n, mb, m2b, *_extremes(block, obs))
        out = part if out is None else _combine_moments(out, part)
    return out


def _check_seconds(value, name):
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
            or not (value > 0 and math.isfinite(value))):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_client(client):
    """Raise ValueError unless ``client`` is a connected, synchronous ``distributed.Client``.

    Called before any work, so a wrong ``client`` fails at once, not as an
    AttributeError after the initialisation or the workers' start.

    Parameters
    ----------
    client : object
        What the caller passed as the client.
    """
    # duck-typed: distributed is an optional dependency, and these are the methods used
    if not hasattr(client, "submit") or not hasattr(client, "nthreads"):
        raise ValueError(f"client must be a distributed.Client, got {type(client).__name__}")
    if getattr(client, "asynchronous", False):
        raise ValueError("client must be a synchronous distributed.Client (asynchronous=False)")
    if getattr(client, "status", None) in ("closing", "closed"):
        raise ValueError("client is closed: pass a connected distributed.Client")


def _combine_moments(a, b):
    """Two parts' :func:`_moments` as one: Chan et al.'s pairwise update of the counts,
    means and squared deviations; the extremes and counts of values other than zero
    combined."""
    na, ma, m2a, loa, hia, nza = a
    nb, mb, m2b, lob, hib, nzb = b
    n = na + nb
    w = np.divide(nb, n, out=np.zeros_like(n), where=n > 0)
    delta = mb - ma
    return (n, ma + delta * w, m2a + m2b + delta * delta * na * w, np.minimum(loa, lob),
            np.maximum(hia, hib), nza + nzb)


def chunk_scaler(chunks, client=None, timeout: float = 600.0):
    """The input scaler of :meth:`RecognitionNet.fit_scaler` over all chunks.

    The same mean and scale as ``fit_scaler`` on the chunks concatenated (to rounding):
    a feature whose standard deviation is at most 1e-12 times its largest magnitude is
    constant and gets scale 1, so the scaler of data in any units is the rescaled one.
    The ``.npy`` chunks are scanned chunk by chunk on the workers when ``client`` is
    given (each opens its files memory-mapped), else in this process; in-memory
    chunks are always scanned here (they are already here: sending them to the
    workers would cost more than the scan).

    Parameters
    ----------
    chunks : list of ndarray (T_i, D) or of ``.npy`` paths
    client : distributed.Client, optional
    timeout : float
        Seconds to wait for the workers.

    Returns
    -------
    mean, scale : ndarray, shape (D,)
        For ``net.set_scaler(mean, scale)``.

    Raises
    ------
    ValueError
        A chunk is invalid, or a feature that varies holds no value of magnitude
        1e-150 or more in any chunk (a fit's statistics would underflow: rescale the
        data), as a fit of one array refuses it.
    """
    if client is not None:
        check_client(client)
    desc = _describe_chunks(chunks)
    D = desc[0].n_features
    if client is None:
        parts = [_moments(c.source, D) for c in desc]
    else:
        timeout = _check_seconds(timeout, "timeout")
        futures = [client.submit(_moments, c.source, D, pure=False) if _is_path(c.source)
                   else None for c in desc]
        parts = [_moments(c.source, D) if f is None else f.result(timeout=timeout)
                 for c, f in zip(desc, futures)]
    total = parts[0]
    for p in parts[1:]:
        total = _combine_moments(total, p)
    n, mean, m2, lo, hi, nonzero = total
    _check_tiny(lo, hi, nonzero)
    std = np.sqrt(m2 / np.maximum(n, 1))
    # fit_scaler's rule: constant when the spread is below rounding of the feature's
    # largest magnitude
    scale = np.where(std > 1e-12 * _peak(lo, hi), std, 1.0)
    return mean, scale


def head_rows(chunks, n_rows: int) -> np.ndarray:
    """The first ``n_rows`` rows of the chunks in order (fewer if there are fewer).

    Reads only those rows (``.npy`` files memory-mapped), e.g. to initialise the model
    (:func:`streamfhmm.learn.smf.init_params`) without loading the data.

    Returns
    -------
    ndarray of float64, shape (min(n_rows, Σ T_i), D)
    """
    n_rows = check_positive_int(n_rows, "n_rows")
    desc = _describe_chunks(chunks)
    parts, left = [], n_rows
    for c in desc:
        if left <= 0:
            break
        if _is_path(c.source):  # only the rows taken are read (and checked)
            path = os.fspath(c.source)
            rows = np.asarray(_map_chunk(path, c.n_features)[:left], dtype=np.float64)
            _check_rows(rows, path, 0)
        else:
            rows = np.asarray(c.source[:left], dtype=np.float64)
        parts.append(rows)
        left -= rows.shape[0]
    return np.ascontiguousarray(np.concatenate(parts))


# --------------------------------------------------------------------- worker side
class _ShardLearner:
    """One shard of the data on one worker: chunks, sampler and scratch (a Dask actor).

    Parameters
    ----------
    sources : list
        Float64 arrays or ``.npy`` paths (opened memory-mapped here).
    spec : dict
        Shapes and fixed network data: ``M, D, n_model, n_weights, window, offset,
        layout, mean, scale, n_inputs, n_hidden_total, subchain_length, max_blocks``.
    seed : numpy.random.SeedSequence
        The sampler's seed.
    """

    def __init__(self, sources, spec, seed):
        D = spec["D"]
        self.chunks = [_open_chunk(s, D) for s in sources]
        lengths = np.array([c.shape[0] for c in self.chunks], dtype=np.int64)
        self.bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        L, B = spec["subchain_length"], spec["max_blocks"]
        self.sampler = SubchainSampler(self.bounds, L, B, np.random.default_rng(seed))
        self.M, self.D, self.n_model = spec["M"], D, spec["n_model"]
        self.window, self.offset = spec["window"], spec["offset"]
        self.layout = np.array(spec["layout"], dtype=np.int64)
        self.mean = np.array(spec["mean"], dtype=np.float64)
        self.scale = np.array(spec["scale"], dtype=np.float64)
        self.size = spec["n_model"] + spec["n_weights"]
        n_rows = B * (L + 1)
        (self.rows, self.row_start, self.row_end, self.offsets, self.first, self.Xw,
         self.hidden, self.theta, self.rho, self.g_theta, self.g_rho,
         self.Yb) = _ks.batch_scratch(n_rows, B, spec["n_inputs"], spec["n_hidden_total"],
                                      self.M, D)
        # rows a batch's windows read: each block's positions, its context row and the
        # window's reach on either side
        self.Y = np.zeros((B * (L + self.window), D))
        self._warm_up()

    @property
    def n_positions(self) -> int:
        return int(self.bounds[-1])

    def _warm_up(self):
        """Compile (or load from cache) the kernel before the first timed step."""
        x = np.zeros(self.size)  # W = 0, L = I, α = β = 0, zero weights: all finite
        self.Y[0] = self.chunks[0][0]
        self.rows[0], self.row_start[0], self.row_end[0] = 0, 0, 1
        self.offsets[:2] = (0, 1)
        self.first[0] = True
        self._kernel(x, 1, np.empty(self.size))

    def _kernel(self, x, n_blocks, grad):
        return _ks.batch_gradient(self.Y, self.rows, self.row_start, self.row_end,
                                  self.offsets[:n_blocks + 1], self.first[:n_blocks],
                                  self.window, self.offset, self.mean, self.scale, x,
                                  self.n_model, self.layout, self.M, self.D, self.Xw,
                                  self.hidden, self.theta, self.rho, self.g_theta,
                                  self.g_rho, self.Yb, grad)

    def _fill(self, n_blocks):
        """Lay out the sampler's next ``n_blocks`` subchains, copying the rows they read.

        Block k's positions (and its context row) read rows ``[a_k, e_k)`` of its
        sequence: they are copied to ``Y[m_k : m_k + e_k - a_k]``. The copy starts at
        the sequence's start or early enough that no window reaches before it, and
        ends likewise, so the copied span is the clipping range of its windows.
        """
        s = self.sampler
        s.ensure(n_blocks)
        c0 = s.cursor
        sl = slice(c0, c0 + n_blocks)
        start, stop, lo, hi = s.q_start[sl], s.q_stop[sl], s.q_lo[sl], s.q_hi[sl]
        is_start = start == lo
        r0 = np.where(is_start, start, start - 1)
        a = np.maximum(lo, r0 - self.offset)
        e = np.minimum(hi, stop + (self.window - 1 - self.offset))
        span, nr = e - a, stop - r0
        m_end = np.cumsum(span)
        m0 = m_end - span
        n_end = np.cumsum(nr)
        n = int(n_end[-1])
        self.offsets[0] = 0
        self.offsets[1:n_blocks + 1] = n_end
        self.first[:n_blocks] = is_start
        self.rows[:n] = np.repeat(m0 + r0 - a - (n_end - nr), nr) + np.arange(n)
        self.row_start[:n] = np.repeat(m0, nr)
        self.row_end[:n] = np.repeat(m_end, nr)
        Y, chunks = self.Y, self.chunks
        which = (np.searchsorted(self.bounds, lo, side="right") - 1).tolist()
        for k, c, i, j, m in zip(range(n_blocks), which, (a - lo).tolist(), (e - lo).tolist(),
                                 m0.tolist()):
            Y[m:m + j - i] = chunks[c][i:j]
        s.advance(n_blocks)

    def gradient(self, x, n_blocks):
        """Sums over ``n_blocks`` fresh subchains.

        Returns
        -------
        value : float
            Σ ELBO terms.
        counted : int
            Counted positions.
        grad : ndarray, shape (size,)
            Σ gradient.
        seconds : float
            Time spent here.
        """
        t0 = time.perf_counter()
        x = np.asarray(x, dtype=np.float64)
        if not (x.flags.writeable and x.flags.c_contiguous):
            x = x.copy()  # one compiled signature: writeable, C-ordered
        grad = np.empty(self.size)
        if n_blocks == 0:
            grad[:] = 0.0
            return 0.0, 0, grad, time.perf_counter() - t0
        self._fill(n_blocks)
        value, counted = self._kernel(x, n_blocks, grad)
        return float(value), int(counted), grad, time.perf_counter() - t0


# ---------------------------------------------------------------------- driver side
def _allocate(batch_size, fractions, rng):
    """Integers summing to ``batch_size`` with expectations ``batch_size * fractions``:
    integer parts, then systematic sampling of the remainders."""
    target = batch_size * fractions
    base = np.floor(target).astype(np.int64)
    rest = target - base
    k = int(batch_size - base.sum())
    if k > 0:
        edges = np.cumsum(rest)
        edges *= k / edges[-1]
        points = rng.random() + np.arange(k)
        picked = np.minimum(np.searchsorted(edges, points, side="right"), len(base) - 1)
        base += np.bincount(picked, minlength=len(base))
    return base


def _shard_chunks(lengths, n_shards):
    """Longest chunk first onto the least-loaded shard (deterministic)."""
    load = np.zeros(n_shards, dtype=np.int64)
    members = [[] for _ in range(n_shards)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = int(np.argmin(load))
        members[k].append(i)
        load[k] += lengths[i]
    return [sorted(m) for m in members]


#: what a wait that ran out of time raises (distinct classes before Python 3.11)
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)
# a future the scheduler dropped with its worker ("already forgotten"): distributed's
# FutureCancelledError is a concurrent.futures.CancelledError
_CANCELLED = (concurrent.futures.CancelledError, asyncio.CancelledError)
_POLL = 0.25  # seconds between liveness checks while waiting on a worker


async def _collect(futures, timeout):
    """Await actor futures together for at most ``timeout`` seconds.

    Returns ``(True, result)``, ``(False, exception)`` or ``(None, None)`` (still
    running) per future.
    """
    tasks = [asyncio.ensure_future(f) for f in futures]
    await asyncio.wait(tasks, timeout=timeout)
    out = []
    for t in tasks:
        if not t.done():
            t.cancel()
            out.append((None, None))
        elif t.exception() is not None:
            out.append((False, t.exception()))
        else:
            out.append((True, t.result()))
    return out


class _Lost(Exception):
    """A shard's worker died, left the cluster or did not answer in time (``timed_out``)."""

    def __init__(self, message, timed_out=False):
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class _Loss:
    """Why a shard was lost, kept in place of its :class:`_Lost`: the exception's
    traceback refers to the frames that hold it (a reference cycle), and through them to
    the lost actor's futures, which then outlived the fit until the cyclic garbage
    collector ran."""
    message: str
    timed_out: bool = False

    @classmethod
    def of(cls, exc):
        return cls(str(exc), getattr(exc, "timed_out", False))


class _Shard:
    def __init__(self, index, chunk_ids, n_positions, seed):
        self.index = index
        self.chunk_ids = chunk_ids
        self.n_positions = n_positions
        self.seed = seed
        self.address = None
        self.future = None
        self.actor = None

    @property
    def name(self):
        return f"shard {self.index} (chunks {self.chunk_ids})"


class _ShardPool:
    """The driver's view of the shards: placing, calling and replacing the actors."""

    def __init__(self, client, chunks, shards, spec, workers, restricted, setup_timeout,
                 step_timeout, max_recoveries):
        self.client = client
        self.chunks = chunks
        self.shards = shards
        self.spec = spec
        self.workers = workers
        self.restricted = restricted   # the caller's workers=: recover on them only
        self.setup_timeout = setup_timeout
        self.step_timeout = step_timeout
        self.max_recoveries = max_recoveries
        self.recoveries = 0
        self.excluded = set()   # lost workers the scheduler still lists
        self.timeouts = {}      # address -> times a shard there did not answer in time

    # -- liveness ------------------------------------------------------------------
    def _nthreads(self):
        """The cluster's workers (address -> threads), or RuntimeError when the client
        lost the scheduler (the call would wait ``distributed.comm.timeouts.connect``,
        30 s by default, for a new connection, then raise OSError)."""
        status = getattr(self.client, "status", "running")
        if status != "running":
            raise RuntimeError(f"distributed SVI: the scheduler was lost (the client is "
                               f"{status}): the fit cannot go on without it")
        try:
            return self.client.nthreads()
        except OSError as exc:
            raise RuntimeError(f"distributed SVI: the scheduler was lost ({exc}): the fit "
                               f"cannot go on without it") from exc

    def _live_workers(self):
        """The cluster's workers but those lost during the fit that it still lists (a
        restarted worker, on a new address, included; a worker that only timed out too);
        with the caller's ``workers=``, only those."""
        live = set(self._nthreads())
        # a lost worker the cluster no longer lists is gone: its address, if it comes
        # back, is a new worker
        self.excluded &= live
        if self.restricted:
            live &= set(self.workers)
        return sorted(live - self.excluded)

    def _wait(self, get, address, key_future, deadline, what):
        """``get(timeout)`` until it answers; :class:`_Lost` when the worker at
        ``address`` leaves, the key is lost, the connection fails or time runs out."""
        while True:
            left = deadline - time.monotonic()
            reason, timed_out = None, False
            try:
                return get(max(1e-3, min(_POLL, left)))
            except _TIMEOUTS:
                if left <= _POLL:
                    reason, timed_out = f"no answer from {address} in time", True
            except OSError as exc:
                reason = f"connection to {address} failed ({exc})"
            except _CANCELLED as exc:
                reason = f"the scheduler dropped it with {address} ({exc})"
            if reason is None and key_future is not None and key_future.status not in (
                    "finished", "pending"):
                reason = f"the worker {address} holding it was lost"
            if reason is None and address not in self._nthreads():
                reason = f"the worker {address} left the cluster"
            if reason is not None:
                # raised outside the handlers: the error does not carry the one handled
                # (whose traceback and this frame would refer to each other, and this
                # frame to the futures)
                raise _Lost(f"{what}: {reason}", timed_out)

    # -- placing -------------------------------------------------------------------
    def start(self):
        placed = [(s, self.workers[s.index % len(self.workers)]) for s in self.shards]
        submitted = []
        try:
            for s, addr in placed:  # (a worker that dies now: its shards are placed again below)
                try:
                    submitted.append(self._submit(s, addr))
                except _Lost as exc:
                    submitted.append(_Loss.of(exc))
            deadline = time.monotonic() + self.setup_timeout
            for (shard, addr), sub in zip(placed, submitted):
                loss = sub if isinstance(sub, _Loss) else None
                if loss is None:
                    try:
                        self._bind(shard, addr, sub, deadline)
                    except _Lost as exc:
                        loss = _Loss.of(exc)
                if loss is not None:
                    shard.address = addr
                    self._replace(shard, loss)
        except BaseException:
            # a shard that cannot start (bad data, no worker left, interrupted): the
            # others' actors and scattered data would stay on the workers, held by the
            # client for as long as anything (this frame, in the error's traceback)
            # refers to their futures
            self._cancel([f for sub in submitted if not isinstance(sub, _Loss)
                          for f in (sub[0], *(sub[1] or ()))])
            raise
        finally:
            # started, the scattered arrays live in the actors; failed, they are cancelled
            submitted.clear()

    def _submit(self, shard, address):
        """Scatter the shard's arrays to ``address`` and create its actor there;
        :class:`_Lost` when the worker is gone meanwhile."""
        sources = [self.chunks[i].source for i in shard.chunk_ids]
        data = None
        arrays = [s for s in sources if not _is_path(s)]
        try:
            if arrays:
                data = self.client.scatter(arrays, workers=[address], hash=False,
                                           timeout=self.setup_timeout)
                it = iter(data)
                sources = [s if _is_path(s) else next(it) for s in sources]
            fut = self.client.submit(_ShardLearner, sources, self.spec, shard.seed, actor=True,
                                     workers=[address], allow_other_workers=False, pure=False)
        except (OSError, *_TIMEOUTS, *_CANCELLED) as exc:  # CommClosedError is an OSError
            reason = f"the worker {address} failed ({exc!r})"
            timed_out = isinstance(exc, _TIMEOUTS)
        else:
            return fut, data
        # outside the handler, as in _wait (the data sent so far is dropped with it)
        raise _Lost(f"while sending its data: {reason}", timed_out)

    def _bind(self, shard, address, submitted, deadline):
        """Wait for the actor of ``submitted`` (``_submit``'s future and data) and attach
        it to ``shard``; on any failure the actor and its data are cancelled."""
        fut, data = submitted
        try:
            try:  # (the actor's proxy is made below)
                self._wait(fut.result, address, None, deadline, "while loading its data")
            except _Lost:
                if fut.status == "error":  # the shard itself failed (bad file, ...): no retry
                    fut.result()
                raise
        except BaseException:
            # an errored future's exception (kept by the client) carries this traceback,
            # whose frames refer to the future: without the cancel neither is ever freed
            self._cancel([fut, *(data or ())])
            raise
        shard.address, shard.future, shard.actor = address, fut, self._proxy(address, fut)

    def _proxy(self, address, fut):
        """A proxy of the actor of ``fut`` (at ``address``) that calls through this pool's
        client. The one ``fut.result()`` returns binds to Dask's current client, the
        newest one unless another is made current: with a second client its calls went
        through that one, and closing it lost every shard."""
        from distributed import Actor
        with self.client.as_current():
            return Actor(_ShardLearner, address, fut.key)

    def _cancel(self, futures):
        """Cancel ``futures`` (actors, scattered data) so the workers drop them now."""
        # a closed client cannot send the cancel (it would raise over the fit's own
        # error), and the scheduler released its keys when it closed
        if futures and self.client.status not in ("closing", "closed"):
            self.client.cancel(futures, force=True)

    def _replace(self, shard, loss):
        """Re-create ``shard`` on a live worker, or raise a clear error (``loss``: a
        :class:`_Loss`, why it was lost)."""
        while True:
            self.recoveries += 1
            if shard.future is not None:  # a slow actor is still there: its worker drops it
                self._cancel([shard.future])
            shard.future = shard.actor = None
            if shard.address is not None:
                if loss.timed_out:  # slow, not gone: it may take a shard again, after the others
                    self.timeouts[shard.address] = self.timeouts.get(shard.address, 0) + 1
                else:
                    self.excluded.add(shard.address)
            if self.recoveries > self.max_recoveries:
                hint = (": a worker that misses step_timeout counts as lost, raise it if the "
                        "workers are only slow" if loss.timed_out else "")
                raise RuntimeError(f"distributed SVI: {shard.name} was lost ({loss.message}) and "
                                   f"the {self.max_recoveries} allowed recoveries are used "
                                   f"up{hint}")
            deadline = time.monotonic() + self.setup_timeout
            live = self._live_workers()
            while not live and time.monotonic() < deadline:
                time.sleep(_POLL)
                live = self._live_workers()
            if not live:
                raise RuntimeError(f"distributed SVI: {shard.name} was lost ({loss.message}) and "
                                   f"no worker is left to take it over (waited "
                                   f"{self.setup_timeout:g} s)")
            load = {w: 0 for w in live}
            for s in self.shards:
                if s.actor is not None and s.address in load:
                    load[s.address] += 1
            # the workers that timed out least first (all alive: a slow step is no reason
            # to give up on a worker for good), then the least loaded
            address = min(live, key=lambda w: (self.timeouts.get(w, 0), load[w], w))
            shard.seed = shard.seed.spawn(1)[0]
            try:
                self._bind(shard, address, self._submit(shard, address), deadline)
                return
            except _Lost as exc:
                shard.address, loss = address, _Loss.of(exc)

    # -- one step ------------------------------------------------------------------
    def gradients(self, x, counts):
        """Every shard's sums for ``counts[k]`` subchains, replacing lost shards and
        repeating the round until all answer."""
        size = x.shape[0]
        while True:
            calls, failed = [], []
            for shard, n in zip(self.shards, counts):
                if n == 0:
                    calls.append((shard, None))
                    continue
                try:
                    calls.append((shard, shard.actor.gradient(x, int(n))))
                except RuntimeError as exc:  # the proxy knows its worker is gone
                    failed.append((shard, _Loss(f"during a step: the worker {shard.address} "
                                                f"holding it was lost ({exc})")))
            deadline = time.monotonic() + self.step_timeout
            results = [None] * len(calls)
            waiting = []
            for j, (shard, fut) in enumerate(calls):
                if fut is None:
                    results[j] = (0.0, 0, np.zeros(size), 0.0)
                else:
                    waiting.append(j)
            # fast path: one wait on the client's event loop for every shard
            if waiting:
                outcome = self.client.sync(_collect, [calls[j][1] for j in waiting],
                                           min(self.step_timeout, 10 * _POLL))
                for j, (ok, value) in zip(list(waiting), outcome):
                    if ok is True:
                        results[j] = value
                        waiting.remove(j)
                    elif ok is False and not isinstance(value, OSError):
                        raise value  # a fault in the computation itself
            # slow path: wait shard by shard, checking that the workers are alive
            for j in waiting:
                shard, fut = calls[j]
                try:
                    results[j] = self._wait(fut.result, shard.address, shard.future, deadline,
                                            "during a step")
                except _Lost as exc:
                    failed.append((shard, _Loss.of(exc)))
            if not failed:
                return results
            for shard, loss in failed:
                self._replace(shard, loss)

    def close(self):
        """Cancel the actors: the workers drop them (and their data) now, not when the
        driver's cyclic garbage collector happens to free the last reference."""
        self._cancel([s.future for s in self.shards if s.future is not None])
        for s in self.shards:
            s.actor = s.future = None


def fit_svi_distributed(chunks, params: FHMMParams, net: RecognitionNet, client, *,
                        max_iter: int = 10_000, batch_size: int = 10,
                        subchain_length: int | None = None, learning_rate: float = 1e-2,
                        final_lr_ratio: float = 0.01, decay: float = 0.9,
                        time_budget: float | None = None, random_state=None,
                        progress: bool = True, log_every: int | None = None,
                        state: SVIState | None = None, callback=None, workers=None,
                        step_timeout: float = 60.0, setup_timeout: float = 120.0,
                        max_recoveries: int = 3, direct_to_workers: bool | None = True,
                        covariance_type: str | None = None, net_warmup: int = 0) -> SVIState:
    """Run SVI with the data and the gradient work spread over a Dask cluster.

    Synchronous data parallelism: each step's ``batch_size`` subchains are drawn by the
    workers from the chunks they hold, the workers return gradient sums, and the driver
    takes one RMSprop step on their per-position mean (module docstring).

    Parameters
    ----------
    chunks : list of ndarray (T_i, D) or of ``.npy`` paths
        Independent sequences (NaN = missing), every value within ±1e150 and, for
        in-memory chunks, every feature that varies reaching 1e-150 in magnitude in
        some chunk (:func:`chunk_scaler` checks ``.npy`` chunks so). Paths are
        opened by the workers, memory-mapped (a relative path is taken from this
        process's working directory); the driver reads only their headers.
    params : FHMMParams
        Starting model (ignored when ``state`` is given).
    net : RecognitionNet
        Starting networks with their scaler set (:func:`chunk_scaler`); ignored when
        ``state`` is given.
    client : distributed.Client
        A synchronous client; the workers are called through it, whichever client is
        Dask's current one.
    max_iter, batch_size, subchain_length, learning_rate, final_lr_ratio, decay, time_budget
        As :func:`~streamfhmm.learn.svi.fit_svi`; ``batch_size`` is the total number of
        subchains per step over all workers, and ``time_budget`` also counts the
        workers' start-up (loading the data, loading the compiled kernels).
    random_state : None, int or numpy Generator
        Seeds the shards' samplers and the split of each batch; a fixed seed gives the
        same result for the same chunks and the same number of workers.
    progress : bool
        Show a progress bar.
    log_every : int, optional
        Append to ``history`` every so many steps, at least 1 (default: 100 entries
        per run).
    state : SVIState, optional
        Continue this state (updated in place, also by the steps of a fit that fails
        part-way; a call refused, or failing before its first step, e.g. a chunk a
        worker cannot open, leaves it as it was, its ``covariance_type`` included).
    callback : callable, optional
        ``callback(state)`` after each logged step.
    workers : list of str, optional
        Worker addresses to use (default: every worker of the cluster, one shard each,
        at most one shard per chunk). A lost shard is re-created on one of them; by
        default on any worker of the cluster, one that joined (or restarted) since
        included.
    step_timeout : float
        Seconds to wait for the workers' gradients in one step before treating the
        silent workers' shards as lost (they are re-created, preferably elsewhere).
    setup_timeout : float
        Seconds to wait for a shard to load its data (and compile the kernels).
    max_recoveries : int
        Lost shards re-created before the fit gives up with :class:`RuntimeError`.
    direct_to_workers : bool or None
        Call the workers directly (True) or through the scheduler (False); None keeps
        the client's setting. Restored when the fit returns.
    covariance_type : {"full", "diag", "spherical"}, optional
        Family of the noise covariance Σ, as in :func:`~streamfhmm.learn.svi.fit_svi`
        (default: ``state``'s, else ``"full"``). The workers return full gradients;
        the driver maps their sum to the family
        (:func:`~streamfhmm.kernels.svi.constrain_model_grad`, linear, so this equals
        mapping each worker's part) before the RMSprop step.
    net_warmup : int
        The first ``net_warmup`` steps train the networks only, as in
        :func:`~streamfhmm.learn.svi.fit_svi`.

    Returns
    -------
    SVIState
        As :func:`~streamfhmm.learn.svi.fit_svi`; each ``history`` entry also has
        ``compute`` (the slowest worker's seconds per step), ``overhead`` (step wall
        time minus ``compute``: communication and driver work) and ``recoveries``.

    Notes
    -----
    MATH.md §5: ``∇ = (1/n) Σ_workers Σ_batch ∇ℓ_t`` with ``n`` the counted positions
    of the whole batch, then :func:`~streamfhmm.kernels.svi.rmsprop_update`.
    """
    check_client(client)
    if direct_to_workers is not None and not isinstance(direct_to_workers, (bool, np.bool_)):
        raise ValueError(f"direct_to_workers must be True, False or None, got "
                         f"{direct_to_workers!r}")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be callable, got {type(callback).__name__}")
    if workers is not None and (isinstance(workers, (str, bytes, os.PathLike))
                                or not hasattr(workers, "__iter__")):
        raise ValueError(f"workers must be a list of worker addresses, got "
                         f"{type(workers).__name__} {workers!r}")
    (max_iter, batch_size, subchain_length, learning_rate, final_lr_ratio, decay,
     time_budget) = check_svi_settings(max_iter, batch_size, subchain_length, learning_rate,
                                       final_lr_ratio, decay, time_budget)
    net_warmup = check_positive_int(net_warmup, "net_warmup", minimum=0)
    if log_every is not None:
        log_every = check_positive_int(log_every, "log_every")
    max_recoveries = check_positive_int(max_recoveries, "max_recoveries", minimum=0)
    step_timeout = _check_seconds(step_timeout, "step_timeout")
    setup_timeout = _check_seconds(setup_timeout, "setup_timeout")
    continued = state is not None
    state = start_state(state, params, net, decay, covariance_type)
    desc = _describe_chunks(chunks)
    D = desc[0].n_features
    # a continued state's new family is set once every check has passed (before, a
    # refused call left it changed, and a fit failing before its first step stored the
    # model projected onto it)
    ctype = (check_covariance_type(covariance_type) if continued and covariance_type is not None
             else state.covariance_type)
    packer, net = state.packer, state.net
    cov_mode = covariance_mode(ctype)
    if packer.n_features != D or net.n_features != D:
        raise ValueError(f"the chunks have {D} features but the model has {packer.n_features} "
                         f"and the networks {net.n_features}")
    if net.n_chains != packer.n_chains:
        raise ValueError(f"the networks have {net.n_chains} chains, the model {packer.n_chains}")
    lengths = np.array([c.length for c in desc], dtype=np.int64)
    if lengths.sum() < 2:
        raise ValueError("the chunks must hold at least 2 samples for SVI")
    L = net.window if subchain_length is None else subchain_length

    rng = check_random_state(random_state)
    root = np.random.SeedSequence(int(rng.integers(2**63)))
    if workers is None:
        addresses = sorted(client.nthreads())
        if not addresses:
            client.wait_for_workers(1, timeout=setup_timeout)
            addresses = sorted(client.nthreads())
    else:
        addresses = sorted(set(workers))
        unknown = set(addresses) - set(client.nthreads())
        if unknown or not addresses:
            raise ValueError(f"workers must be addresses of this cluster's workers; unknown: "
                             f"{sorted(unknown) or 'none given'}")
    n_shards = min(len(addresses), len(desc))
    members = _shard_chunks(lengths, n_shards)
    seeds = root.spawn(n_shards + 1)
    alloc_rng = np.random.default_rng(seeds[0])
    shards = [_Shard(k, m, int(lengths[m].sum()), seeds[k + 1]) for k, m in enumerate(members)]
    # the batch split by subchains per epoch, not positions: every position equally often
    blocks = expected_subchains(lengths, L)
    fractions = np.array([blocks[s.chunk_ids].sum() for s in shards])
    fractions /= fractions.sum()
    spec = {"M": packer.n_chains, "D": D, "n_model": packer.size, "n_weights": net.n_weights,
            "window": net.window, "offset": net.offset, "layout": net.layout.copy(),
            "mean": net.mean.copy(), "scale": net.scale.copy(), "n_inputs": net.n_inputs,
            "n_hidden_total": net.n_groups * net.n_hidden, "subchain_length": L,
            "max_blocks": batch_size}

    pool = _ShardPool(client, desc, shards, spec, addresses, workers is not None,
                      setup_timeout, step_timeout,
                      max_recoveries)

    def project(g):  # the workers' full gradients onto the covariance family
        _ks.constrain_model_grad(g, packer.n_chains, D, cov_mode)

    nm = packer.size
    units = np.empty(nm)   # the model's steps in the data's units, as the local kernel's
    _ks.model_units(packer.n_chains, D, net.scale, units)
    opt = state.opt
    log_every = log_every or max(1, min(max_iter // 100, 500))
    # what a fit failing before its first step restores: the caller's state as it was
    # (the workers' start is where a bad .npy chunk or a lost cluster shows)
    before = (state.covariance_type, state.model_vec.copy(), opt.sq.copy(), state.seconds)
    bar = None
    limiter = None
    steps = 0
    previous_direct = client.direct_to_workers
    t0 = time.perf_counter()
    try:
        state.covariance_type = ctype
        _ks.constrain_model(state.model_vec, opt.sq, packer.n_chains, D, cov_mode)
        x = state.state_vector()
        grad = np.empty_like(x)
        if direct_to_workers is not None:
            client.direct_to_workers = bool(direct_to_workers)
        pool.start()  # counts against time_budget, as the whole fit does
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=max_iter, desc="svi (dask)", unit="it", leave=False, mininterval=0.5)
        # in-process workers share this process: one BLAS thread, as the local learner
        limiter = BlasHold(1)   # (the process-wide limit, as the local learner holds it)
        acc_compute = acc_wall = 0.0
        acc_n = 0
        for i in range(1, max_iter + 1):
            ts = time.perf_counter()
            counts = _allocate(batch_size, fractions, alloc_rng)
            results = pool.gradients(x.copy(), counts)
            value, counted, compute = 0.0, 0, 0.0
            grad[:] = 0.0
            for v, c, g, sec in results:
                value += v
                counted += c
                grad += g
                compute = max(compute, sec)
            elapsed = time.perf_counter() - t0
            frac = i / max_iter
            if time_budget:
                frac = max(frac, elapsed / time_budget)
            lr = cosine_lr(learning_rate, final_lr_ratio, frac)
            value = apply_gradient_sum(x, grad, value, counted, opt, lr, nm,
                                       0.0 if i <= net_warmup else 1.0, units, project)
            if not math.isfinite(value):
                raise FloatingPointError(f"non-finite ELBO gradient at iteration "
                                         f"{state.iteration + 1}; parameters left at the "
                                         f"previous step")
            opt.steps += 1
            steps += 1
            count_step(state, value)
            acc_compute += compute
            acc_wall += time.perf_counter() - ts
            acc_n += 1
            out_of_time = time_budget is not None and elapsed >= time_budget
            if i % log_every == 0 or i == max_iter or out_of_time:
                log_step(state, {"iteration": state.iteration, "elbo": state.running, "lr": lr,
                                 "time": state.seconds + elapsed, "compute": acc_compute / acc_n,
                                 "overhead": (acc_wall - acc_compute) / acc_n,
                                 "recoveries": pool.recoveries}, x, bar, callback)
                acc_compute = acc_wall = 0.0
                acc_n = 0
            advance_bar(bar, i)
            if out_of_time:
                break
    finally:
        # the steps taken so far, also when a step fails (iteration and the RMSprop
        # statistics already count them: the state stays consistent and can continue);
        # not a vector a diverging step overflowed (the error says so; writing it would
        # raise here and hide that error). A fit that failed before its first step
        # leaves the state as it was.
        if steps:
            state.seconds += time.perf_counter() - t0
            if np.isfinite(x).all():
                store(state, x)
        else:
            state.covariance_type = before[0]
            state.model_vec[:] = before[1]   # (constrain_model projected them in place)
            opt.sq[:] = before[2]
            state.seconds = before[3]
        if limiter is not None:
            limiter.release()
        if bar is not None:
            bar.close()
        pool.close()
        client.direct_to_workers = previous_direct
    return state
