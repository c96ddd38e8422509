"""Recognition-network kernels: windows of observations to every chain's θ and ρ
(MATH.md §3).

Conventions
-----------
* A window holds ``window = 2h+1`` samples; its input vector has ``K = window * D``
  entries, time-major: ``x[k*D + d] = y[t - off + k, d]``, with ``off = h`` for centred
  windows (smoothing, lag h) and ``off = window - 1`` for causal ones (filtering, lag 0).
* Rows outside a sequence ``[seq_start, seq_end)`` repeat the edge sample (the row
  index is clamped into ``[seq_start, seq_end - 1]``).
* Inputs are standardised, ``(y - mean) / scale``; a missing value (NaN) becomes 0, the
  standardised mean, and a standardised value is clipped to ±1e150 (two finite values
  near the float range, or one over a small scale, overflowed to inf, and ``inf·w -
  inf·w`` made the posteriors of every window holding them NaN; the units saturate
  long before the clip).
* Hidden units come in ``G`` groups of ``Hg`` units (``G = 1``: one layer shared by all
  heads; ``G = M``: one group per chain), every unit sees the whole window:
  ``z = tanh(U x + c)``. Group ``g`` feeds ``P = 2M / G`` heads.
* **Head / column mapping.** Head ``p`` of group ``g`` writes column ``j = g*P + p`` of
  the pre-activation row ``(2M,)``; column ``2m`` is chain m's θ pre-activation ``a``,
  column ``2m + 1`` its ρ pre-activation ``b``. So with one shared group head ``2m`` is
  θ_m and head ``2m+1`` is ρ_m; with one group per chain, group m's head 0 is θ_m and
  head 1 is ρ_m.
* Outputs: ``θ = ε + (1 - 2ε) σ(a)``, ``ρ = (1 - ε_ρ) tanh(b)``, ``ε = ε_ρ = 1e-6``.

Weight layout
-------------
All weights live in one flat float64 vector, blocks in this order (C order inside each
block)::

    U (G, Hg, K) | c (G, Hg) | V (G, P, Hg) | e (G, P)

``U`` read as one ``(G*Hg, K)`` matrix is the first layer of every group at once, so the
first layer is a single matrix product in both sharing modes. The offsets and sizes
travel with the weights in an int64 ``layout`` vector (:func:`weight_layout`, indices
``LAYOUT_*``), so every kernel takes ``(weights, layout)``.
"""
import numpy as np

from ._jit import jit
from ._math import tanh, tanh_bias_inplace
from .bvn import EPS_RHO, EPS_THETA, clip_rho, clip_theta

__all__ = [
    "LAYOUT_N_CHAINS", "LAYOUT_N_FEATURES", "LAYOUT_WINDOW", "LAYOUT_N_GROUPS",
    "LAYOUT_N_HIDDEN", "LAYOUT_N_HEADS", "LAYOUT_N_INPUTS", "LAYOUT_OFF_U",
    "LAYOUT_OFF_C", "LAYOUT_OFF_V", "LAYOUT_OFF_E", "LAYOUT_N_WEIGHTS", "LAYOUT_SIZE",
    "weight_layout", "scratch_size",
    "build_windows", "forward_batch", "backward_batch", "forward_one",
]

# indices into the int64 ``layout`` vector
LAYOUT_N_CHAINS = 0     # M
LAYOUT_N_FEATURES = 1   # D
LAYOUT_WINDOW = 2       # samples per window
LAYOUT_N_GROUPS = 3     # G
LAYOUT_N_HIDDEN = 4     # Hg, hidden units per group
LAYOUT_N_HEADS = 5      # P = 2M / G, heads per group
LAYOUT_N_INPUTS = 6     # K = window * D
LAYOUT_OFF_U = 7
LAYOUT_OFF_C = 8
LAYOUT_OFF_V = 9
LAYOUT_OFF_E = 10
LAYOUT_N_WEIGHTS = 11   # length of the flat weight vector
LAYOUT_SIZE = 12

#: windows per block of :func:`forward_batch`: a block's activations (256 x 200 float64,
#: 400 KB) stay in the L2 cache from the first product to the second
_FORWARD_BLOCK = 256

# the one clipping of θ and ρ used everywhere (MATH.md §2)
_EPS_THETA = EPS_THETA
_EPS_RHO = EPS_RHO
#: the clip of a standardised input (see the module notes)
_Z_MAX = 1e150


def weight_layout(n_chains, n_features, window, n_groups, n_hidden):
    """The int64 layout vector describing a flat weight vector.

    Parameters
    ----------
    n_chains, n_features, window : int
        M, D and the number of samples per window.
    n_groups : int
        G: 1 (one hidden layer for all heads) or M (one group per chain).
    n_hidden : int
        Hg, hidden units per group.

    Returns
    -------
    layout : ndarray of int64, shape (LAYOUT_SIZE,)

    Notes
    -----
    MATH.md §3. Block order ``U (G, Hg, K) | c (G, Hg) | V (G, P, Hg) | e (G, P)``.

    Examples
    --------
    >>> lay = weight_layout(2, 3, 5, 1, 4)
    >>> int(lay[LAYOUT_N_INPUTS]), int(lay[LAYOUT_N_WEIGHTS])
    (15, 84)
    """
    M, D, W, G, Hg = (int(n_chains), int(n_features), int(window), int(n_groups), int(n_hidden))
    if (2 * M) % G != 0:
        raise ValueError(f"n_groups must divide 2 * n_chains = {2 * M}, got {G}")
    P = 2 * M // G
    K = W * D
    lay = np.zeros(LAYOUT_SIZE, dtype=np.int64)
    lay[LAYOUT_N_CHAINS] = M
    lay[LAYOUT_N_FEATURES] = D
    lay[LAYOUT_WINDOW] = W
    lay[LAYOUT_N_GROUPS] = G
    lay[LAYOUT_N_HIDDEN] = Hg
    lay[LAYOUT_N_HEADS] = P
    lay[LAYOUT_N_INPUTS] = K
    lay[LAYOUT_OFF_U] = 0
    lay[LAYOUT_OFF_C] = G * Hg * K
    lay[LAYOUT_OFF_V] = lay[LAYOUT_OFF_C] + G * Hg
    lay[LAYOUT_OFF_E] = lay[LAYOUT_OFF_V] + G * P * Hg
    lay[LAYOUT_N_WEIGHTS] = lay[LAYOUT_OFF_E] + G * P
    return lay


def scratch_size(layout):
    """Length of the float64 scratch vector :func:`forward_one` needs: ``K + G*Hg + 2M``."""
    return int(layout[LAYOUT_N_INPUTS] + layout[LAYOUT_N_GROUPS] * layout[LAYOUT_N_HIDDEN]
               + 2 * layout[LAYOUT_N_CHAINS])


@jit
def _dtheta_da(theta):
    """dθ/da = (1-2ε) σ(1-σ), written with the clipped θ itself."""
    return (theta - _EPS_THETA) * (1.0 - _EPS_THETA - theta) / (1.0 - 2.0 * _EPS_THETA)


@jit
def _drho_db(rho):
    """dρ/db = (1-ε_ρ)(1 - tanh² b), written with the clipped ρ itself."""
    return (1.0 - _EPS_RHO) - rho * rho / (1.0 - _EPS_RHO)


@jit(inline="always")
def standardise(v, mean, scale):
    """``(v - mean) / scale`` clipped to ±1e150; 0 for a missing value (NaN)."""
    if v != v:
        return 0.0
    z = (v - mean) / scale
    if z > _Z_MAX:
        return _Z_MAX
    if z < -_Z_MAX:
        return -_Z_MAX
    return z


@jit(inline="always")
def _heads(pre, E, out_theta, out_rho):
    """θ_m = clip(pre_{2m} + E_{2m}), ρ_m = clip(pre_{2m+1} + E_{2m+1}) for one window
    (MATH.md §3: the output layer's pre-activations, interleaved θ, ρ)."""
    for m in range(out_theta.shape[0]):
        out_theta[m] = clip_theta(pre[2 * m] + E[2 * m])
        out_rho[m] = clip_rho(pre[2 * m + 1] + E[2 * m + 1])


@jit(inline="always")
def _group_heads(weights, oV, oE, G, P, Hg, z, out_theta, out_rho):
    """The heads of one window when each of the G groups has its own hidden units
    (``z``: the G·Hg activations): output j = g·P + p reads group g's units only."""
    for g in range(G):
        for p in range(P):
            j = g * P + p
            vo = oV + j * Hg
            acc = weights[oE + j]
            for h in range(Hg):
                acc += weights[vo + h] * z[g * Hg + h]
            m = j // 2
            if j % 2 == 0:
                out_theta[m] = clip_theta(acc)
            else:
                out_rho[m] = clip_rho(acc)


@jit
def consecutive_windows(Z, window, mean, scale, zs, out):
    """The standardised windows of consecutive rows: ``out[i]`` stacks rows
    ``i … i + window - 1`` of ``Z`` (already edge-padded and in order).

    Parameters
    ----------
    Z : ndarray, shape (n + window - 1, D)
        Raw rows; NaN marks a missing value.
    window : int
    mean, scale : ndarray, shape (D,)
        Standardisation: ``(y - mean) / scale``.
    zs : ndarray, shape (≥ n + window - 1, D)
        Scratch: receives the standardised rows.
    out : ndarray, shape (n, window * D), C-contiguous
        Overwritten: ``out[i, k*D + d] = (Z[i + k, d] - mean[d]) / scale[d]``, 0 for NaN —
        what :func:`build_windows` gives for the positions of one sequence with no
        clipping, each row standardised once instead of once per window holding it.

    Notes
    -----
    MATH.md §3 (windows).
    """
    n = out.shape[0]
    D = Z.shape[1]
    for r in range(n + window - 1):
        for d in range(D):
            v = Z[r, d]
            zs[r, d] = standardise(v, mean[d], scale[d])
    # (element by element: a slice assignment compiles a shape check whose error message
    # alone took 3.6 s of a first run's compilation)
    for i in range(n):
        for k in range(window):
            for d in range(D):
                out[i, k * D + d] = zs[i + k, d]


@jit
def build_windows(Y, seq_start, seq_end, positions, window, off, mean, scale, out):
    """Stack the standardised, edge-padded, NaN-imputed windows of ``positions``.

    Parameters
    ----------
    Y : ndarray, shape (T, D)
        Raw observations of all sequences, concatenated; NaN marks a missing value.
    seq_start, seq_end : ndarray of int64, shape (n,)
        Bounds ``[seq_start[i], seq_end[i])`` of the sequence holding ``positions[i]``.
    positions : ndarray of int64, shape (n,)
        Absolute row indices into ``Y`` of the windows' positions t.
    window : int
        Samples per window.
    off : int
        Row ``t - off`` is the window's first sample: ``h`` for centred windows,
        ``window - 1`` for causal ones.
    mean, scale : ndarray, shape (D,)
        Standardisation: ``(y - mean) / scale``.
    out : ndarray, shape (n, window * D), C-contiguous
        Overwritten: ``out[i, k*D + d] = (Y[r, d] - mean[d]) / scale[d]`` with
        ``r = clip(positions[i] - off + k, seq_start[i], seq_end[i] - 1)``, 0 for NaN.

    Notes
    -----
    MATH.md §3 (windows) and §5 (edge padding).
    """
    n = positions.shape[0]
    D = Y.shape[1]
    for i in range(n):
        lo = seq_start[i]
        hi = seq_end[i] - 1
        first = positions[i] - off
        for k in range(window):
            r = first + k
            if r < lo:
                r = lo
            elif r > hi:
                r = hi
            base = k * D
            for d in range(D):
                out[i, base + d] = standardise(Y[r, d], mean[d], scale[d])


@jit
def forward_batch(Xw, weights, layout, out_theta, out_rho, hidden):
    """θ and ρ of every chain for a stack of windows (the throughput path).

    Parameters
    ----------
    Xw : ndarray, shape (n, K), C-contiguous
        Standardised windows (:func:`build_windows`).
    weights : ndarray, shape (n_weights,)
        Flat weight vector (module docstring).
    layout : ndarray of int64, shape (LAYOUT_SIZE,)
        From :func:`weight_layout`.
    out_theta, out_rho : ndarray, shape (n, M)
        Overwritten with the clipped θ and ρ.
    hidden : ndarray, shape (n, G*Hg), C-contiguous
        Overwritten with the hidden activations ``z = tanh(U x + c)`` (group g in columns
        ``g*Hg : (g+1)*Hg``); :func:`backward_batch` needs them.

    Notes
    -----
    MATH.md §3. Blocks of ``_FORWARD_BLOCK`` windows: the first layer is one BLAS
    product ``Xw @ U.T`` with ``U`` read as ``(G*Hg, K)``, then the vectorised tanh
    (:mod:`._math`), then (when ``G = 1``) one more product and the heads, while the
    block's activations are still in the L2 cache.
    """
    n = Xw.shape[0]
    G = layout[LAYOUT_N_GROUPS]
    Hg = layout[LAYOUT_N_HIDDEN]
    P = layout[LAYOUT_N_HEADS]
    K = layout[LAYOUT_N_INPUTS]
    GH = G * Hg
    U = weights[layout[LAYOUT_OFF_U]:layout[LAYOUT_OFF_U] + GH * K].reshape((GH, K))
    c = weights[layout[LAYOUT_OFF_C]:layout[LAYOUT_OFF_C] + GH]
    oV = layout[LAYOUT_OFF_V]
    oE = layout[LAYOUT_OFF_E]
    if G == 1:
        V = weights[oV:oV + P * Hg].reshape((P, Hg))
        E = weights[oE:oE + P]
        pre = np.empty((min(n, _FORWARD_BLOCK), P))
    for b0 in range(0, n, _FORWARD_BLOCK):
        b1 = min(n, b0 + _FORWARD_BLOCK)
        z = hidden[b0:b1]
        np.dot(Xw[b0:b1], U.T, z)
        tanh_bias_inplace(z, c)
        if G == 1:
            pb = pre[:b1 - b0]
            np.dot(z, V.T, pb)
            for i in range(b1 - b0):
                _heads(pb[i], E, out_theta[b0 + i], out_rho[b0 + i])
        else:
            for i in range(b0, b1):
                _group_heads(weights, oV, oE, G, P, Hg, hidden[i], out_theta[i], out_rho[i])


@jit
def backward_batch(Xw, hidden, theta, rho, g_theta, g_rho, weights, layout, grad):
    """Gradient of ``Σ_i Σ_m (g_theta θ + g_rho ρ)`` with respect to every weight.

    Parameters
    ----------
    Xw : ndarray, shape (n, K), C-contiguous
        The windows given to :func:`forward_batch`.
    hidden, theta, rho : ndarray, shapes (n, G*Hg), (n, M), (n, M)
        What :func:`forward_batch` returned for ``Xw``.
    g_theta, g_rho : ndarray, shape (n, M)
        Upstream gradients of a scalar objective with respect to the clipped θ and ρ.
    weights : ndarray, shape (n_weights,)
    layout : ndarray of int64, shape (LAYOUT_SIZE,)
    grad : ndarray, shape (n_weights,)
        **Overwritten** with the gradient, laid out like ``weights``.

    Notes
    -----
    MATH.md §3: ``dθ/da = (1-2ε) σ(a)(1-σ(a))``, ``dρ/db = (1-ε_ρ)(1 - tanh² b)``, then
    the usual backpropagation. ``dU = dZᵀ Xw`` is one BLAS product; so are ``dV`` and
    ``dZ`` when ``G = 1``. Allocates ``(n, 2M)`` and ``(n, G*Hg)`` work arrays.
    """
    n = Xw.shape[0]
    M = layout[LAYOUT_N_CHAINS]
    G = layout[LAYOUT_N_GROUPS]
    Hg = layout[LAYOUT_N_HIDDEN]
    P = layout[LAYOUT_N_HEADS]
    K = layout[LAYOUT_N_INPUTS]
    GH = G * Hg
    oU = layout[LAYOUT_OFF_U]
    oC = layout[LAYOUT_OFF_C]
    oV = layout[LAYOUT_OFF_V]
    oE = layout[LAYOUT_OFF_E]
    # gradient with respect to the pre-activations, columns as in the head mapping
    delta = np.empty((n, 2 * M))
    for i in range(n):
        for m in range(M):
            delta[i, 2 * m] = g_theta[i, m] * _dtheta_da(theta[i, m])
            delta[i, 2 * m + 1] = g_rho[i, m] * _drho_db(rho[i, m])
    gE = grad[oE:oE + G * P]
    gE[:] = 0.0
    for i in range(n):
        for j in range(2 * M):
            gE[j] += delta[i, j]
    if G == 1:
        V = weights[oV:oV + P * Hg].reshape((P, Hg))
        gV = grad[oV:oV + P * Hg].reshape((P, Hg))
        np.dot(delta.T, hidden, gV)
        dz = np.dot(delta, V)
    else:
        gV = grad[oV:oV + G * P * Hg]
        gV[:] = 0.0
        dz = np.zeros((n, GH))
        for i in range(n):
            for g in range(G):
                for p in range(P):
                    j = g * P + p
                    dj = delta[i, j]
                    vo = oV + j * Hg
                    go = j * Hg
                    for h in range(Hg):
                        gV[go + h] += dj * hidden[i, g * Hg + h]
                        dz[i, g * Hg + h] += dj * weights[vo + h]
    gC = grad[oC:oC + GH]
    gC[:] = 0.0
    for i in range(n):
        for j in range(GH):
            zij = hidden[i, j]
            v = dz[i, j] * (1.0 - zij * zij)
            dz[i, j] = v
            gC[j] += v
    gU = grad[oU:oU + GH * K].reshape((GH, K))
    np.dot(dz.T, Xw, gU)


@jit
def forward_one(window_buf, start, weights, layout, mean, scale, scratch, out_theta, out_rho):
    """θ and ρ of every chain for ONE window read from a buffer (the streaming path).

    Parameters
    ----------
    window_buf : ndarray, shape (N,), C-contiguous
        Flat buffer of raw samples (a double-written ring's ``ring.reshape(-1)``, made
        once); the window is ``window_buf[start : start + K]``, time-major.
    start : int
        Offset of the window's first value.
    weights : ndarray, shape (n_weights,)
    layout : ndarray of int64, shape (LAYOUT_SIZE,)
    mean, scale : ndarray, shape (D,)
        Standardisation; NaN becomes 0 after it.
    scratch : ndarray, shape (>= scratch_size(layout),)
        Work space, overwritten: standardised window ``[0:K]``, hidden activations
        ``[K:K+G*Hg]``, pre-activations (when G = 1) ``[K+G*Hg : K+G*Hg+2M]``.
    out_theta, out_rho : ndarray, shape (M,)
        Overwritten with the clipped θ and ρ.

    Notes
    -----
    MATH.md §3. Allocates nothing; agrees with :func:`forward_batch` to rounding.
    """
    D = layout[LAYOUT_N_FEATURES]
    G = layout[LAYOUT_N_GROUPS]
    Hg = layout[LAYOUT_N_HIDDEN]
    P = layout[LAYOUT_N_HEADS]
    K = layout[LAYOUT_N_INPUTS]
    GH = G * Hg
    oU = layout[LAYOUT_OFF_U]
    oC = layout[LAYOUT_OFF_C]
    oV = layout[LAYOUT_OFF_V]
    oE = layout[LAYOUT_OFF_E]
    x = scratch[0:K]
    for k in range(K):
        x[k] = standardise(window_buf[start + k], mean[k % D], scale[k % D])
    z = scratch[K:K + GH]
    U = weights[oU:oU + GH * K].reshape((GH, K))
    np.dot(U, x, z)
    c = weights[oC:oC + GH]
    for j in range(GH):
        z[j] = tanh(z[j] + c[j])
    if G == 1:
        pre = scratch[K + GH:K + GH + P]
        V = weights[oV:oV + P * Hg].reshape((P, Hg))
        np.dot(V, z, pre)
        _heads(pre, weights[oE:oE + P], out_theta, out_rho)
    else:
        _group_heads(weights, oV, oE, G, P, Hg, z, out_theta, out_rho)
