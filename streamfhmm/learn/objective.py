"""The learning objective: the ELBO of MATH.md §4 composed with the recognition
networks of §3, and its gradient with respect to every parameter.

The model parameters travel as one flat vector (so RMSprop, checkpoints and the
distributed learner treat them as one array)::

    W (M+1, D) | L's lower triangle, row by row, diagonal as λ_d = log L_dd | α (M,) | β (M,)

and the network weights as the flat vector of :class:`~streamfhmm.network.RecognitionNet`.
The start probabilities are the chains' stationary probabilities ``a / (a + b)``
(MATH.md §1: the subchain learner cannot learn them separately), so the gradient of
``E log p(s_1)`` flows into α and β.

Covariance families (``covariance_type``, hmmlearn's name): ``"full"`` (any Σ, the
paper's model), ``"diag"`` (Σ diagonal) and ``"spherical"`` (Σ = σ² I). The flat
layout is the same for all three; a constrained Σ has a diagonal L (and, spherical,
equal λ_d). :func:`project_covariance` and :func:`constrain_params` map a model onto a
family, :func:`check_covariance_matches` tells whether it already is on it.
"""
from __future__ import annotations

import numpy as np

from .._validation import check_bounds, check_observations, check_positive_int
from ..kernels import elbo as _elbo
from ..kernels import recognition as _rk
from ..model import FHMMParams, check_params, sigmoid
from ..network import check_net

__all__ = ["COVARIANCE_TYPES", "ModelPacker", "Workspace", "batch_objective", "sequence_elbo",
           "check_covariance_type", "covariance_mode", "project_covariance", "constrain_params",
           "check_covariance_matches"]

#: the covariance families of Σ, in the order of their ``cov_mode`` codes 0, 1, 2
COVARIANCE_TYPES = ("full", "diag", "spherical")
#: relative size of the entries a covariance may have off its family and still count as on it
COVARIANCE_RTOL = 1e-10


def check_covariance_type(covariance_type) -> str:
    """``covariance_type`` itself if it is one of :data:`COVARIANCE_TYPES`, else ValueError."""
    if not isinstance(covariance_type, str) or covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    return covariance_type


def covariance_mode(covariance_type) -> int:
    """The kernels' ``cov_mode`` code: 0 ``"full"``, 1 ``"diag"``, 2 ``"spherical"``."""
    return COVARIANCE_TYPES.index(check_covariance_type(covariance_type))


def project_covariance(Sigma, covariance_type) -> np.ndarray:
    """The covariance family's member that keeps Σ's variances.

    Parameters
    ----------
    Sigma : array_like, shape (D, D)
    covariance_type : {"full", "diag", "spherical"}

    Returns
    -------
    ndarray, shape (D, D)
        ``Σ`` (full), ``diag(Σ_dd)`` (diag) or ``tr(Σ)/D · I`` (spherical).

    Notes
    -----
    These are also the exact constrained M-steps of a Gaussian: for a fixed mean, the
    maximiser of ``Σ_t E log N(y_t; μ_t, Σ)`` over diagonal Σ is the diagonal of the
    unconstrained maximiser S (each variance has its own term ``-½(log σ_d² +
    S_dd/σ_d²)``), and over ``σ² I`` it is ``tr(S)/D`` (the terms add to
    ``-½ D (log σ² + tr(S)/(D σ²))``).
    """
    S = np.array(Sigma, dtype=np.float64)
    mode = covariance_mode(covariance_type)
    if mode == 0:
        return S
    D = S.shape[0]
    if mode == 1:
        return np.diag(np.diag(S).copy())
    return (np.trace(S) / D) * np.eye(D)


def check_covariance_matches(Sigma, covariance_type, rtol: float = COVARIANCE_RTOL) -> bool:
    """Whether Σ belongs to the family (up to ``rtol`` relative to its variances)."""
    S = np.asarray(Sigma, dtype=np.float64)
    mode = covariance_mode(covariance_type)
    if mode == 0:
        return True
    d = np.diag(S)
    off = S - np.diag(d)
    scale = np.sqrt(np.outer(d, d))
    if not (np.abs(off) <= rtol * scale).all():
        return False
    return mode == 1 or bool(np.ptp(d) <= rtol * d.max())


def constrain_params(params: FHMMParams, covariance_type) -> FHMMParams:
    """``params`` with Σ replaced by :func:`project_covariance` (exactly on the family:
    L diagonal, and for ``"spherical"`` all ``L_dd`` equal); ``params`` itself for
    ``"full"``."""
    mode = covariance_mode(covariance_type)
    if mode == 0:
        return params
    L = params.L
    var = (L * L).sum(axis=1)  # Σ_dd
    if mode == 2:
        var = np.full(len(var), var.sum() / len(var))
    return params.replace(L=np.diag(np.sqrt(var)))


def _check_real_vector(vec, size: int, name: str, what: str) -> np.ndarray:
    """``vec`` as a float64 array if it is a finite real (integer or float) array of
    shape ``(size,)``, else ValueError saying ``what`` the size is (a NaN made the
    ELBO NaN without a word)."""
    a = np.asarray(vec)
    # (bool is neither: np.issubdtype(np.bool_, np.integer) is False)
    if a.shape != (size,) or not (np.issubdtype(a.dtype, np.floating)
                                  or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be a real array of shape ({size},) {what}, got shape "
                         f"{a.shape} and dtype {a.dtype}")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        i = int(np.flatnonzero(~np.isfinite(a))[0])
        raise ValueError(f"{name} must be finite, got {float(a[i])!r} at index {i}")
    return a


class ModelPacker:
    """Maps :class:`FHMMParams` to and from the flat model vector.

    Parameters
    ----------
    n_chains, n_features : int
        M ≥ 1 and D ≥ 1.
    """

    def __init__(self, n_chains: int, n_features: int):
        self.n_chains = M = check_positive_int(n_chains, "n_chains")
        self.n_features = D = check_positive_int(n_features, "n_features")
        self.tril = np.tril_indices(D)
        self.diag_pos = np.flatnonzero(self.tril[0] == self.tril[1])
        self.sW = slice(0, (M + 1) * D)
        self.sL = slice(self.sW.stop, self.sW.stop + len(self.tril[0]))
        self.sa = slice(self.sL.stop, self.sL.stop + M)
        self.sb = slice(self.sa.stop, self.sa.stop + M)
        self.size = self.sb.stop

    def check_vector(self, vec, name: str = "model_vec") -> np.ndarray:
        """``vec`` as float64 if it is a real array of shape ``(size,)``, else ValueError."""
        return _check_real_vector(vec, self.size, name,
                                  f"for {self.n_chains} chains and {self.n_features} features")

    def pack(self, params: FHMMParams) -> np.ndarray:
        """The flat vector of ``params`` (``n_chains`` and ``n_features`` as the packer's)."""
        check_params(params)
        if (params.n_chains, params.n_features) != (self.n_chains, self.n_features):
            raise ValueError(f"params must have {self.n_chains} chains and {self.n_features} "
                             f"features like the packer, got {params.n_chains} and "
                             f"{params.n_features}")
        vec = np.empty(self.size)
        vec[self.sW] = params.W.ravel()
        ltri = params.L[self.tril].copy()
        ltri[self.diag_pos] = np.log(ltri[self.diag_pos])
        vec[self.sL] = ltri
        vec[self.sa] = params.alpha
        vec[self.sb] = params.beta
        return vec

    def W(self, vec):
        return vec[self.sW].reshape(self.n_chains + 1, self.n_features)

    def L(self, vec):
        L = np.zeros((self.n_features, self.n_features))
        ltri = vec[self.sL].copy()
        ltri[self.diag_pos] = np.exp(ltri[self.diag_pos])
        L[self.tril] = ltri
        return L

    def unpack(self, vec) -> FHMMParams:
        """The :class:`FHMMParams` of a flat vector of shape ``(size,)``."""
        vec = self.check_vector(vec)
        alpha, beta = vec[self.sa].copy(), vec[self.sb].copy()
        a, b = sigmoid(alpha), sigmoid(beta)
        return FHMMParams(W=self.W(vec).copy(), L=self.L(vec), alpha=alpha, beta=beta,
                          startprob=a / (a + b))

    def grad_vector(self, gW, gL, g_alpha, g_beta, g_logpi, alpha, beta) -> np.ndarray:
        """Assemble the flat gradient; ``gL`` already holds the λ-gradient on its diagonal.

        ``g_logpi`` (M, 2) is chained through the stationary start probability:
        ``log π₁ = log a - log(a+b)``, ``log π₀ = log b - log(a+b)``.
        """
        a, b = sigmoid(alpha), sigmoid(beta)
        g0, g1 = g_logpi[:, 0], g_logpi[:, 1]
        s = a + b
        out = np.empty(self.size)
        out[self.sW] = gW.ravel()
        out[self.sL] = gL[self.tril]
        out[self.sa] = g_alpha + g1 * (1 - a) - (g0 + g1) * a * (1 - a) / s
        out[self.sb] = g_beta + g0 * (1 - b) - (g0 + g1) * b * (1 - b) / s
        return out


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def _log_transmat(alpha, beta):
    out = np.empty((len(alpha), 2, 2))
    out[:, 0, 0] = _log_sigmoid(-alpha)
    out[:, 0, 1] = _log_sigmoid(alpha)
    out[:, 1, 0] = _log_sigmoid(beta)
    out[:, 1, 1] = _log_sigmoid(-beta)
    return out


def _log_stationary(alpha, beta):
    la, lb = _log_sigmoid(alpha), _log_sigmoid(beta)
    lab = np.logaddexp(la, lb)
    return np.stack([lb - lab, la - lab], axis=1)


class Workspace:
    """Per-learner scratch arrays, grown on demand (no allocation on a steady batch size)."""

    def __init__(self, packer: ModelPacker, net):
        if not isinstance(packer, ModelPacker):
            raise ValueError(f"packer must be a ModelPacker, got {type(packer).__name__}")
        check_net(net, packer.n_chains, packer.n_features, "the packer's")
        self.packer = packer
        self.net = net
        M, D = packer.n_chains, packer.n_features
        self.gW = np.zeros((M + 1, D))
        self.gSigma = np.zeros((D, D))
        self.gL = np.zeros((D, D))
        self.g_alpha = np.zeros(M)
        self.g_beta = np.zeros(M)
        self.g_logpi = np.zeros((M, 2))
        self.grad_net = np.zeros(net.n_weights)
        self._n = -1
        self._ensure(256)

    def _ensure(self, n):
        if n <= self._n:
            return
        M = self.packer.n_chains
        self._n = n
        self.Xw = np.empty((n, self.net.n_inputs))
        self.hidden = np.empty((n, self.net.n_groups * self.net.n_hidden))
        self.theta = np.empty((n, M))
        self.rho = np.empty((n, M))
        self.g_theta = np.zeros((n, M))
        self.g_rho = np.zeros((n, M))

    def views(self, n):
        self._ensure(n)
        return (self.Xw[:n], self.hidden[:n], self.theta[:n], self.rho[:n],
                self.g_theta[:n], self.g_rho[:n])

    def zero_model_grads(self):
        for a in (self.gW, self.gSigma, self.g_alpha, self.g_beta, self.g_logpi):
            a[...] = 0.0


def batch_objective(model_vec, weights, Y, rows, row_start, row_end, offsets, first_is_start,
                    ws: Workspace):
    """ELBO of a batch of subchains and its gradient (sums, not means).

    Parameters
    ----------
    model_vec : ndarray of float64, shape (packer.size,)
    weights : ndarray of float64, shape (net.n_weights,)
    Y : ndarray of float64, shape (T, D)
        The whole data set (NaN = missing), as :func:`~streamfhmm._validation.check_observations`
        returns it (not scanned here: a call reads only a batch of it).
    rows, row_start, row_end : ndarray of int, shape (n_rows,)
        The rows of the batch's subchains and their sequence bounds (see
        :class:`~streamfhmm.learn.sampler.Batch`): ``0 ≤ row_start ≤ rows < row_end ≤ T``.
    offsets : ndarray of int, shape (B + 1,)
        Increasing from 0 to ``n_rows``.
    first_is_start : ndarray of bool, shape (B,)
    ws : Workspace

    Any other shape, type or range is a ValueError.

    Returns
    -------
    value : float
        Σ of the counted ``ℓ_t`` (MATH.md §4).
    grad_model : ndarray, shape (packer.size,)
    grad_net : ndarray, shape (net.n_weights,)
        A view into the workspace: copy it before the next call.
    """
    if not isinstance(ws, Workspace):
        raise ValueError(f"ws must be a Workspace, got {type(ws).__name__}")
    model_vec, weights, Y = _check_vectors_and_data(model_vec, weights, Y, ws)
    T = Y.shape[0]
    idx = []
    for name, a in (("rows", rows), ("row_start", row_start), ("row_end", row_end)):
        a = np.asarray(a)
        if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be a non-empty 1-D integer array, got shape {a.shape} "
                             f"and dtype {a.dtype}")
        if a.shape != np.shape(rows):
            raise ValueError(f"{name} must have the shape of rows {np.shape(rows)}, got {a.shape}")
        idx.append(a.astype(np.int64))
    rows, row_start, row_end = idx
    if not ((row_start >= 0) & (row_start <= rows) & (rows < row_end) & (row_end <= T)).all():
        raise ValueError(f"rows must lie in their sequences: 0 <= row_start <= rows < row_end <= "
                         f"{T} (the rows of Y) is expected")
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or offsets.size < 2 or not np.issubdtype(offsets.dtype, np.integer) \
            or offsets[0] != 0 or offsets[-1] != rows.size or (np.diff(offsets) <= 0).any():
        raise ValueError(f"offsets must be a 1-D integer array increasing from 0 to "
                         f"{rows.size} (the number of rows), got {offsets!r}")
    first_is_start = np.asarray(first_is_start)
    if first_is_start.dtype != bool or first_is_start.shape != (offsets.size - 1,):
        raise ValueError(f"first_is_start must be a boolean array of shape ({offsets.size - 1},) "
                         f"(one per subchain), got shape {first_is_start.shape} and dtype "
                         f"{first_is_start.dtype}")
    return _batch_objective(model_vec, weights, Y, rows, row_start, row_end,
                            offsets.astype(np.int64), first_is_start, ws)


def _check_vectors_and_data(model_vec, weights, Y, ws: Workspace):
    """The model vector, the network weights and the data against the workspace."""
    model_vec = ws.packer.check_vector(model_vec)
    weights = _check_real_vector(weights, ws.net.n_weights, "weights", "(the network's)")
    D = ws.packer.n_features
    if not (isinstance(Y, np.ndarray) and Y.dtype == np.float64 and Y.ndim == 2 and Y.shape[1] == D):
        got = f"shape {Y.shape} and dtype {Y.dtype}" if isinstance(Y, np.ndarray) else type(Y).__name__
        raise ValueError(f"Y must be a float64 array of shape (T, {D}), got {got}")
    return model_vec, weights, Y


def _batch_objective(model_vec, weights, Y, rows, row_start, row_end, offsets,
                     first_is_start, ws: Workspace):
    """:func:`batch_objective` on checked inputs."""
    packer, net = ws.packer, ws.net
    n = rows.shape[0]
    Xw, hidden, theta, rho, g_theta, g_rho = ws.views(n)
    W = packer.W(model_vec)
    L = packer.L(model_vec)
    alpha, beta = model_vec[packer.sa], model_vec[packer.sb]
    Linv = np.linalg.inv(L)
    P = Linv.T @ Linv
    _rk.build_windows(Y, row_start, row_end, rows, net.window, net.offset, net.mean, net.scale, Xw)
    _rk.forward_batch(Xw, weights, net.layout, theta, rho, hidden)
    g_theta[...] = 0.0
    g_rho[...] = 0.0
    ws.zero_model_grads()
    Yb = Y[rows]
    starts = offsets[:-1]
    n_pos = np.diff(offsets)
    value = _elbo.elbo_batch(Yb, starts, n_pos, first_is_start, theta, rho, W, L, P,
                             _log_transmat(alpha, beta), _log_stationary(alpha, beta),
                             g_theta, g_rho, ws.gW, ws.gSigma, ws.g_alpha, ws.g_beta, ws.g_logpi)
    _elbo.sigma_grad_to_chol(ws.gSigma, L, ws.gL)
    grad_model = packer.grad_vector(ws.gW, ws.gL, ws.g_alpha, ws.g_beta, ws.g_logpi, alpha, beta)
    _rk.backward_batch(Xw, hidden, theta, rho, g_theta, g_rho, weights, net.layout, ws.grad_net)
    return float(value), grad_model, ws.grad_net


def sequence_elbo(model_vec, weights, Y, bounds, ws: Workspace, chunk: int = 4096,
                  with_grad: bool = False):
    """The full ELBO of whole sequences (MATH.md §4), chunk by chunk.

    Each sequence is cut into chunks of ``chunk`` positions; every chunk after the first
    carries the previous position as its context row, so the chunks' terms add up to
    the ELBO of the sequence exactly.

    Parameters
    ----------
    model_vec : ndarray of float64, shape (ws.packer.size,)
    weights : ndarray of float64, shape (ws.net.n_weights,)
    Y : array_like, shape (T, D)
        NaN marks a missing value (no infinities, no row without an observed value).
    bounds : array_like of int, shape (n_sequences + 1,)
        Sequence i is ``Y[bounds[i]:bounds[i+1]]``; non-decreasing, inside ``[0, T]``.
    ws : Workspace
    chunk : int
        Positions per batch (≥ 1).
    with_grad : bool

    Returns
    -------
    value : float
    grads : (grad_model, grad_net) or None
    """
    if not isinstance(ws, Workspace):
        raise ValueError(f"ws must be a Workspace, got {type(ws).__name__}")
    Y = check_observations(Y, "Y", n_features=ws.packer.n_features, allow_nan=True)
    model_vec, weights, Y = _check_vectors_and_data(model_vec, weights, Y, ws)
    bounds = check_bounds(bounds, Y.shape[0])
    chunk = check_positive_int(chunk, "chunk")
    rows_l, rs_l, re_l, off_l, first_l = [], [], [], [0], []
    total = 0.0
    g_model = np.zeros(ws.packer.size) if with_grad else None
    g_net = np.zeros(ws.net.n_weights) if with_grad else None

    def flush():
        nonlocal total
        if not rows_l:
            return
        v, gm, gn = _batch_objective(model_vec, weights, Y, np.concatenate(rows_l),
                                    np.concatenate(rs_l), np.concatenate(re_l),
                                    np.asarray(off_l, dtype=np.int64), np.asarray(first_l), ws)
        total += v
        if with_grad:
            g_model[...] += gm
            g_net[...] += gn
        rows_l.clear(), rs_l.clear(), re_l.clear(), first_l.clear()
        del off_l[1:]

    for i in range(len(bounds) - 1):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        for s in range(lo, hi, chunk):
            e = min(hi, s + chunk)
            r = np.arange(s if s == lo else s - 1, e, dtype=np.int64)
            rows_l.append(r)
            rs_l.append(np.full(len(r), lo, dtype=np.int64))
            re_l.append(np.full(len(r), hi, dtype=np.int64))
            off_l.append(off_l[-1] + len(r))
            first_l.append(s == lo)
            if off_l[-1] >= chunk:
                flush()
    flush()
    return total, ((g_model, g_net) if with_grad else None)
