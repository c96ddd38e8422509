"""Incremental kernels of the streaming engine: one sample at a time (MATH.md §3, §5, §7).

* **Exact filtering and fixed-lag smoothing** over the 2^M joint states, built on the
  factorial kernels of :mod:`.exact`. The forward message is updated once per sample;
  the last ``lag + 1`` filtered messages and log emission densities are kept in rings
  (slot ``t % (lag + 1)``), and the fixed-lag posterior ``p(s_{t-lag} | y_1..y_t)`` is a
  backward pass over those ``lag`` steps. A missing value (NaN) is marginalised: the
  emission density is that of the observed dimensions.
* **The recognition step**: write one raw sample into a double-written ring and run
  :func:`.recognition.forward_one` on the window ending at it, then reconstruct
  ``Wᵀ[θ; 1]`` — one call per sample, nothing allocated.
* **The learner's inner loop**: several SVI steps (:func:`.svi.svi_step`) on subchains
  stored as contiguous raw segments, each step checked and rolled back if anything is
  not finite — one call, without the GIL, per snapshot interval.

Ring convention
---------------
A ring of capacity C is a C-contiguous ``(2C, D)`` array; sample ``t`` is written to rows
``t % C`` and ``t % C + C``, so the ``w ≤ C`` samples ending at ``t`` are rows
``(t - w + 1) % C … (t - w + 1) % C + w - 1``, one contiguous block of the flat buffer.
"""
import math

import numpy as np

from ._jit import jit
from .elbo import observed_cholesky
from .exact import (_chain_marginals, _step, leave_out_overflow, log_emission, transition_backward,
                    transition_forward)
from .recognition import LAYOUT_N_CHAINS, consecutive_windows, forward_batch, forward_one
from .svi import svi_step

__all__ = [
    "STATUS_OK", "STATUS_MISSING", "STATUS_INFINITE",
    "check_sample", "ring_write", "recognition_push", "recognition_block", "reconstruct",
    "log_emission_missing", "filter_step", "fixed_lag_marginals", "exact_push", "exact_run",
    "exact_tail", "svi_run",
]

#: posterior flags (the values of :mod:`streamfhmm.stream.posterior`)
_FLAG_IMPUTED = 1
_FLAG_EDGE = 4

#: :func:`check_sample` codes
STATUS_OK = 0
STATUS_MISSING = 1
STATUS_INFINITE = 2

LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------------------
# the ring
# --------------------------------------------------------------------------------------
@jit
def check_sample(x):
    """``STATUS_INFINITE`` if ``x`` holds an infinity, else ``STATUS_MISSING`` if it
    holds a NaN, else ``STATUS_OK``."""
    status = STATUS_OK
    for d in range(x.shape[0]):
        v = x[d]
        if v != v:
            status = STATUS_MISSING
        elif v - v != 0.0:
            return STATUS_INFINITE
    return status


@jit
def ring_write(x, ring, slot, capacity):
    """Write ``x`` (D,) to rows ``slot`` and ``slot + capacity`` of ``ring`` (2C, D)
    unless it holds an infinity; returns :func:`check_sample`'s code."""
    status = check_sample(x)
    if status == STATUS_INFINITE:
        return status
    for d in range(x.shape[0]):
        ring[slot, d] = x[d]
        ring[slot + capacity, d] = x[d]
    return status


@jit
def reconstruct(theta, W, out):
    """``out = Wᵀ [θ; 1]``: ``W[M] + Σ_m θ_m W[m]``, shape (D,)."""
    M = W.shape[0] - 1
    for d in range(W.shape[1]):
        acc = W[M, d]
        for m in range(M):
            acc += theta[m] * W[m, d]
        out[d] = acc


@jit
def recognition_push(x, ring, slot, capacity, emit, first_row, weights, layout, mean, scale,
                     scratch, W, theta_blk, rho_blk, mean_blk, i):
    """Write one sample into the ring and, if ``emit``, run the window ending at it.

    Parameters
    ----------
    x : ndarray, shape (D,)
        The raw sample (NaN = missing).
    ring : ndarray, shape (2C, D), C-contiguous
        Double-written ring (module docstring); ``x`` goes to rows ``slot``, ``slot + C``.
    slot, capacity : int
        ``t % C`` and C.
    emit : bool
        Compute a posterior (False while a centred window still lacks its first h
        samples).
    first_row : int
        Ring row of the window's first sample, ``(t - window + 1) % C``.
    weights, layout, mean, scale, scratch
        As in :func:`.recognition.forward_one`.
    W : ndarray, shape (M+1, D)
        For the reconstruction ``Wᵀ[θ; 1]``.
    theta_blk, rho_blk : ndarray, shape (n, M)
    mean_blk : ndarray, shape (n, D)
        Output blocks; row ``i`` is written.
    i : int

    Returns
    -------
    int
        :func:`check_sample`'s code; on ``STATUS_INFINITE`` nothing is written.

    Notes
    -----
    MATH.md §3. Allocates nothing.
    """
    status = ring_write(x, ring, slot, capacity)
    if status == STATUS_INFINITE or not emit:
        return status
    D = ring.shape[1]
    flat = ring.reshape(ring.shape[0] * D)
    forward_one(flat, first_row * D, weights, layout, mean, scale, scratch, theta_blk[i],
                rho_blk[i])
    reconstruct(theta_blk[i], W, mean_blk[i])
    return status


# --------------------------------------------------------------------------------------
# exact filtering and fixed-lag smoothing
# --------------------------------------------------------------------------------------
@jit
def recognition_block(Xc, ring, capacity, t, seq_start, window, lag, hist, mean, scale, weights,
                      layout, W, version, extra_flags, Z, cs, zs, xw, hidden,
                      tau, theta, rho, out_mean, out_version, out_flags, info):
    """The recognition path over a block of samples: one call for what ``push`` does per
    sample (the throughput path of ``push_many``).

    Parameters
    ----------
    Xc : ndarray, shape (m, D)
        New raw samples at positions ``t … t + m - 1`` (NaN missing, no infinity).
    ring : ndarray, shape (2C, D)
        The raw-sample ring (module docstring); ``Xc`` is written into it.
    capacity : int
        C.
    t, seq_start : int
        Position of ``Xc[0]``; first position of the current sequence.
    window, lag, hist : int
        w, the smoothing lag h (w // 2, or 0 when filtering) and the number of samples
        before ``t`` the windows need (``w - 1 - h + h`` rows; ``hist ≤ C``).
    mean, scale : ndarray, shape (D,)
        Standardisation of the network's inputs.
    weights, layout :
        The network (:func:`.recognition.forward_batch`).
    W : ndarray, shape (M + 1, D)
        Loadings and bias: the reconstruction is ``Wᵀ [θ; 1]``.
    version, extra_flags : int
        Snapshot version, and flags every posterior of the block gets.
    Z : ndarray, shape (≥ hist + m, D); cs : ndarray of int64, shape (≥ hist + m + 1,)
    zs, xw, hidden :
        Scratch (:func:`.recognition.consecutive_windows`, :func:`.recognition.forward_batch`).
    tau, out_version, out_flags : ndarray of int64, shape (≥ m,)
    theta, rho : ndarray, shape (≥ m, M); out_mean : ndarray, shape (≥ m, D)
        Out: the posteriors emitted, in their first ``ne`` rows.
    info : ndarray of int64, shape (2,)
        Out: the number of rows of ``Xc`` with a missing value, and the offset of the
        last such row (-1 if none).

    Returns
    -------
    int
        ne, the posteriors emitted: those of positions ``τ = t + k - h`` for
        ``k = k0 … m-1``, ``k0 = min(m, max(0, seq_start + h - t))``, each from the window
        of rows ``τ - h … τ + h`` edge-padded at the sequence start (MATH.md §3, §5):
        ``Z`` holds the ``hist`` samples before ``t`` (read from the ring, which holds the
        padding) and then ``Xc``. Flags: ``extra_flags``, plus FLAG_EDGE where the window
        reaches before ``seq_start`` and FLAG_IMPUTED where it holds a missing value.
    """
    m = Xc.shape[0]
    D = Xc.shape[1]
    r = (t - hist) % capacity
    for i in range(hist):
        for d in range(D):
            Z[i, d] = ring[r + i, d]
    for i in range(m):
        for d in range(D):
            Z[hist + i, d] = Xc[i, d]
    cs[0] = 0
    n_nan = 0
    last_nan = -1
    for i in range(hist + m):
        missing = 0
        for d in range(D):
            if Z[i, d] != Z[i, d]:
                missing = 1
                break
        cs[i + 1] = cs[i] + missing
        if missing and i >= hist:
            n_nan += 1
            last_nan = i - hist
    info[0] = n_nan
    info[1] = last_nan
    k0 = min(m, max(0, seq_start + lag - t))
    ne = m - k0
    if ne > 0:
        consecutive_windows(Z[hist + k0 - window + 1:hist + m], window, mean, scale, zs, xw[:ne])
        forward_batch(xw[:ne], weights, layout, theta[:ne], rho[:ne], hidden[:ne])
        n_edge = max(0, seq_start - (t + k0 - window + 1))
        for j in range(ne):
            k = k0 + j
            tau[j] = t + k - lag
            reconstruct(theta[j], W, out_mean[j])
            out_version[j] = version
            f = extra_flags
            if j < n_edge:
                f |= _FLAG_EDGE
            a = hist + k - window + 1
            if cs[a + window] - cs[a] > 0:
                f |= _FLAG_IMPUTED
            out_flags[j] = f
    for i in range(max(0, m - capacity), m):
        s = (t + i) % capacity
        for d in range(D):
            ring[s, d] = Xc[i, d]
            ring[s + capacity, d] = Xc[i, d]
    return ne


@jit
def log_emission_missing(y, W, L, out):
    """Log emission density of a sample with missing values, for every joint state.

    Parameters
    ----------
    y : ndarray, shape (D,)
        NaN marks a missing value.
    W : ndarray, shape (M+1, D)
    L : ndarray, shape (D, D)
        Lower Cholesky factor of the noise covariance ``Σ = L Lᵀ``, positive diagonal.
    out : ndarray, shape (2^M,)
        Receives ``log N(y_o; (Wᵀŝ)_o, Σ_oo)`` over the observed dimensions o (0 for
        every state when nothing is observed).

    Returns
    -------
    float
        The largest entry of ``out``.

    Notes
    -----
    MATH.md §4 (marginal Gaussian of the observed dimensions) and §7 (whitening and
    the state-by-state linear part). ``C Cᵀ = Σ_oo`` is computed from the rows of L
    (:func:`.elbo.observed_cholesky`), never from a formed Σ, and the quadratic forms
    are squared norms of vectors whitened by ``C⁻¹`` (forward substitution), so the
    density is finite whenever L is a valid factor (the Cholesky of a formed ``Σ_oo``
    meets a zero or negative pivot, NaN for every state, when ``L Lᵀ`` rounds to a
    singular block: ``1 + ε²`` is 1 for ``ε < 1e-8``).
    The slow path: it allocates O(2^M · |o| + |o| · D).
    """
    M = W.shape[0] - 1
    D = W.shape[1]
    K = out.shape[0]
    obs = np.empty(D, dtype=np.int64)
    n = 0
    for d in range(D):
        if y[d] == y[d]:
            obs[n] = d
            n += 1
    if n == 0:
        for s in range(K):
            out[s] = 0.0
        return 0.0
    Lo = np.empty((n, D))   # Lo[:n, :n] lower, Lo Loᵀ = Σ_oo
    observed_cholesky(L, obs, n, Lo)
    # whiten the residual and the contributions: solve Lo z = v
    ytil = np.empty(n)
    Ut = np.empty((M, n))
    sq = 0.0
    for i in range(n):
        acc = y[obs[i]] - W[M, obs[i]]
        for k in range(i):
            acc -= Lo[i, k] * ytil[k]
        ytil[i] = acc / Lo[i, i]
        sq += ytil[i] * ytil[i]
    for m in range(M):
        for i in range(n):
            acc = W[m, obs[i]]
            for k in range(i):
                acc -= Lo[i, k] * Ut[m, k]
            Ut[m, i] = acc / Lo[i, i]
    const = -0.5 * n * LOG_2PI - 0.5 * sq
    for i in range(n):
        const -= math.log(Lo[i, i])
    sums = np.zeros((K, n))
    out[0] = const
    mx = const
    for s in range(1, K):
        top = 0
        while (s >> (top + 1)) > 0:
            top += 1
        prev = s ^ (1 << top)
        lin = 0.0
        quad = 0.0
        for i in range(n):
            v = sums[prev, i] + Ut[top, i]
            sums[s, i] = v
            lin += v * ytil[i]
            quad += v * v
        val = const + lin - 0.5 * quad
        out[s] = val
        if val > mx:
            mx = val
    return mx


@jit
def filter_step(y, first, alpha_prev, alpha, le, work, bias, Linv, Ut, half_c, const, A, pi,
                W, L, ytil):
    """One forward step: ``alpha ← p(s_t | y_1..y_t)`` from ``alpha_prev = p(s_{t-1} | …)``.

    Parameters
    ----------
    y : ndarray, shape (D,)
        The sample (NaN = missing, marginalised).
    first : bool
        ``t`` starts a sequence: the prediction is the start distribution ``pi``.
    alpha_prev, alpha : ndarray, shape (2^M,)
        Previous and new filtered message (may be the same array).
    le : ndarray, shape (2^M,)
        Receives the log emission densities of ``y``.
    work, ytil : ndarray, shapes (2^M,), (D,)
        Scratch.
    bias, Linv, Ut, half_c, const
        ``W[M]`` and the tables of :func:`.exact.prepare_emission`.
    A : ndarray, shape (M, 2, 2)
    pi : ndarray, shape (2^M,)
        Joint start distribution (:func:`.exact.joint_startprob`).
    W, L : ndarray, shapes (M+1, D), (D, D)
        Loadings with the bias, and the lower Cholesky factor of Σ: for samples with
        missing values (:func:`log_emission_missing`).

    Returns
    -------
    float
        ``log p(y_t | y_1..y_{t-1})``; ``-inf`` when it is below the float range (a
        sample so far from the model that ``½‖L⁻¹(y - μ)‖²`` overflows: its emission
        is left out, the filtered message is the prediction).

    Notes
    -----
    MATH.md §7; O(M·2^M + D²).
    """
    K = alpha.shape[0]
    if first:
        for s in range(K):
            alpha[s] = pi[s]
    else:
        for s in range(K):  # a no-op when alpha_prev is alpha (filtering, one slot)
            alpha[s] = alpha_prev[s]
        transition_forward(alpha, A)
    missing = False
    for d in range(y.shape[0]):
        if y[d] != y[d]:
            missing = True
            break
    if missing:
        mx = log_emission_missing(y, W, L, le)
    else:
        mx = log_emission(y, bias, Linv, Ut, half_c, const, ytil, le)
    # a finite sample so far from the model that its log densities overflow: its
    # emission is left out (exact.leave_out_overflow; the filtered message is then the
    # prediction, log p(y_t | y_<t) is -inf). Refusing such samples in the engine
    # instead would change the input contract (only infinities are refused), would miss
    # the other users of this kernel (the river adapter) and would need a bound that
    # depends on Σ.
    mx, kept = leave_out_overflow(le, mx)
    logc = _step(alpha, work, le, mx)
    return logc if kept else -np.inf


@jit
def fixed_lag_marginals(alpha_ring, le_ring, t, tau, A, beta, g, out_theta):
    """``p(s_τ^m = 1 | y_1..y_t)`` for ``t - R < τ ≤ t`` from the message rings.

    Parameters
    ----------
    alpha_ring : ndarray, shape (R, 2^M)
        Filtered messages, ``p(s_r | y_1..y_r)`` in slot ``r % R`` for the last R steps.
    le_ring : ndarray, shape (R, 2^M)
        Log emission densities of the same steps.
    t, tau : int
        Newest step and the step whose posterior is wanted.
    A : ndarray, shape (M, 2, 2)
    beta, g : ndarray, shape (2^M,)
        Scratch.
    out_theta : ndarray, shape (M,)

    Notes
    -----
    MATH.md §7: ``β_t = 1``, ``β_{r-1} = A (e_r ⊙ β_r)`` for ``r = t … τ+1``, then
    ``p(s_τ | y_1..t) ∝ α_τ ⊙ β_τ``; β is rescaled to max 1 at every step (its scale
    cancels). O((t - τ)·M·2^M).

    A state with ``α_r(s) = 0`` (a transition probability that is 0.0 in float64, or a
    flushed one) lies on no path the model allows: its ``e_r(s) β_r(s)`` is set to 0 and
    the emissions are scaled by the largest over the kept states only, as in
    :func:`streamfhmm.kernels.exact._backward_weights`. Scaled by the largest over all
    states, a state the data favour by hundreds of nats but the model excludes pushed
    the kept states' weights into subnormals, and ``α_τ ⊙ β_τ`` to NaN.
    """
    R = alpha_ring.shape[0]
    K = beta.shape[0]
    for s in range(K):
        beta[s] = 1.0
    for r in range(t, tau, -1):
        le = le_ring[r % R]
        alpha_r = alpha_ring[r % R]
        mx = -np.inf
        for s in range(K):
            if alpha_r[s] > 0.0 and le[s] > mx:
                mx = le[s]
        if mx == -np.inf:
            mx = 0.0
        for s in range(K):
            g[s] = math.exp(le[s] - mx) * beta[s] if alpha_r[s] > 0.0 else 0.0
        transition_backward(g, A)
        mb = 0.0
        for s in range(K):
            if g[s] > mb:
                mb = g[s]
        inv = 1.0 / mb if mb > 0.0 else 1.0
        for s in range(K):
            beta[s] = g[s] * inv
    alpha = alpha_ring[tau % R]
    tot = 0.0
    for s in range(K):
        v = alpha[s] * beta[s]
        g[s] = v
        tot += v
    if tot > 0.0:
        inv = 1.0 / tot
        for s in range(K):
            g[s] *= inv
    _chain_marginals(g, out_theta)


@jit
def exact_push(x, ring, slot, capacity, t, first, lag, alpha_ring, le_ring, logc_ring, work,
               beta, g, ytil, bias, Linv, Ut, half_c, const, A, pi, W, L, emit,
               theta_blk, mean_blk, i):
    """Write one sample into the raw ring, take an exact forward step and, if ``emit``,
    the posterior of step ``t - lag``.

    Parameters
    ----------
    x, ring, slot, capacity
        As in :func:`recognition_push`.
    t : int
        Stream position of ``x``.
    first : bool
        ``x`` starts a sequence.
    lag : int
        0 (filtering) or h (fixed-lag smoothing); the rings hold ``lag + 1`` slots.
    alpha_ring, le_ring : ndarray, shape (lag + 1, 2^M)
    logc_ring : ndarray, shape (lag + 1,)
        Receives ``log p(y_t | y_<t)`` in slot ``t % (lag + 1)``.
    work, beta, g, ytil
        Scratch, shapes (2^M,), (2^M,), (2^M,), (D,).
    bias, Linv, Ut, half_c, const, A, pi, W, L
        Parameter tables and the Cholesky factor of Σ (:func:`filter_step`).
    emit : bool
        ``t - lag`` is a step of the current sequence.
    theta_blk, mean_blk : ndarray, shapes (n, M), (n, D)
        Row ``i`` receives the posterior marginals of step ``t - lag`` and ``Wᵀ[θ; 1]``.

    Returns
    -------
    int
        :func:`check_sample`'s code; on ``STATUS_INFINITE`` nothing is written.

    Notes
    -----
    MATH.md §7.
    """
    status = ring_write(x, ring, slot, capacity)
    if status == STATUS_INFINITE:
        return status
    R = lag + 1
    cur = t % R
    prev = (t - 1) % R
    logc_ring[cur] = filter_step(x, first, alpha_ring[prev], alpha_ring[cur], le_ring[cur], work,
                                 bias, Linv, Ut, half_c, const, A, pi, W, L, ytil)
    if emit:
        fixed_lag_marginals(alpha_ring, le_ring, t, t - lag, A, beta, g, theta_blk[i])
        reconstruct(theta_blk[i], W, mean_blk[i])
    return status


@jit
def exact_run(Y, t0, seq_start, lag, alpha_ring, le_ring, logc_ring, work, beta, g, ytil, bias,
              Linv, Ut, half_c, const, A, pi, W, L, theta_out, mean_out, tau_out):
    """:func:`exact_push` over a block of samples (positions ``t0 … t0 + n - 1``).

    ``Y`` (n, D) must hold no infinity. The tables (``bias`` … ``W``, ``L``) are those of
    :func:`filter_step`. Posteriors of the steps ``t - lag ≥ seq_start`` are written to
    consecutive rows of ``theta_out`` / ``mean_out`` with their step in ``tau_out``.

    Returns
    -------
    n_emitted : int
    loglik : float
        ``Σ log p(y_t | y_<t)`` over the block.
    """
    R = lag + 1
    n_out = 0
    total = 0.0
    for i in range(Y.shape[0]):
        t = t0 + i
        cur = t % R
        prev = (t - 1) % R
        lc = filter_step(Y[i], t == seq_start, alpha_ring[prev], alpha_ring[cur], le_ring[cur],
                         work, bias, Linv, Ut, half_c, const, A, pi, W, L, ytil)
        logc_ring[cur] = lc
        total += lc
        if t - lag >= seq_start:
            fixed_lag_marginals(alpha_ring, le_ring, t, t - lag, A, beta, g, theta_out[n_out])
            reconstruct(theta_out[n_out], W, mean_out[n_out])
            tau_out[n_out] = t - lag
            n_out += 1
    return n_out, total


@jit
def exact_tail(t_last, tau0, alpha_ring, le_ring, A, beta, g, W, theta_out, mean_out):
    """Posteriors ``p(s_τ | y_1..y_{t_last})`` for ``τ = tau0 … t_last`` (the end of a
    sequence: these are the exact smoothing marginals of its last steps)."""
    n = t_last - tau0 + 1
    for k in range(n):
        fixed_lag_marginals(alpha_ring, le_ring, t_last, tau0 + k, A, beta, g, theta_out[k])
        reconstruct(theta_out[k], W, mean_out[k])
    return n


# --------------------------------------------------------------------------------------
# the learner's inner loop
# --------------------------------------------------------------------------------------
@jit
def svi_run(Y, slots, seg_len, sub_len, window, off, mean, scale, x, n_model, layout, D, sq,
            decay, eps, lr, step0, freeze_model, rows, row_start, row_end, offsets, first, Xw,
            hidden, theta, rho, g_theta, g_rho, Yb, grad, x_prev, sq_prev, values,
            cov_mode=0):
    """Several SVI steps on subchains held as contiguous raw segments.

    Parameters
    ----------
    Y : ndarray, shape (n_slots * seg_len, D)
        The reservoir, segment ``j`` in rows ``j*seg_len … (j+1)*seg_len - 1``.
    slots : ndarray of int64, shape (n_steps, B)
        Segments of each step's minibatch.
    seg_len, sub_len : int
        Segment length ``sub_len + window`` and subchain length L: a segment holds the
        windows of one context row and L counted positions, at segment rows
        ``off … off + L`` (no padding).
    window, off, mean, scale, layout
        The network's window, window offset, scaler and weight layout.
    x : ndarray, shape (n_model + n_weights,)
        Model vector then network weights; updated in place.
    D : int
    sq : ndarray, like ``x``
        RMSprop's running mean of squared gradients (updated).
    decay, eps : float
        RMSprop's γ and ε.
    lr : ndarray, shape (n_steps,)
        Learning rate of each step.
    step0 : int
        Steps taken before (RMSprop bias correction).
    freeze_model : bool
        Keep the model part ``x[:n_model]`` fixed (its ``sq`` still tracks its
        gradients): train the network only, as ``FHMM.fit(net_warmup=...)``.
    rows, row_start, row_end, offsets, first, Xw, hidden, theta, rho, g_theta, g_rho, Yb, grad
        Scratch for :func:`.svi.svi_step` (``B * (sub_len + 1)`` rows).
    x_prev, sq_prev : ndarray, like ``x``
        Scratch: the state before each step, restored when the step is discarded.
    values : ndarray, shape (n_steps,)
        Receives each step's per-position mean ELBO, NaN for a discarded step.
    cov_mode : int
        Covariance family of Σ (0 full, 1 diagonal, 2 spherical; see
        :func:`.svi.constrain_model_grad`); ``x`` must lie on it and stays on it.

    Returns
    -------
    int
        Number of steps taken (the others were discarded: a non-finite gradient, ELBO or
        parameter, which leaves ``x`` and ``sq`` as they were).

    Notes
    -----
    MATH.md §5.
    """
    n_steps = slots.shape[0]
    B = slots.shape[1]
    M = layout[LAYOUT_N_CHAINS]
    n_ok = 0
    for k in range(n_steps):
        n = 0
        offsets[0] = 0
        for b in range(B):
            base = slots[k, b] * seg_len
            first[b] = False
            for j in range(sub_len + 1):
                rows[n] = base + off + j
                row_start[n] = base
                row_end[n] = base + seg_len
                n += 1
            offsets[b + 1] = n
        for i in range(x.shape[0]):
            x_prev[i] = x[i]
            sq_prev[i] = sq[i]
        value = svi_step(Y, rows, row_start, row_end, offsets, first, window, off, mean, scale,
                         x, n_model, layout, M, D, sq, decay, eps, lr[k], step0 + n_ok, Xw,
                         hidden, theta, rho, g_theta, g_rho, Yb, grad, cov_mode,
                         0.0 if freeze_model else 1.0)
        ok = np.isfinite(value)
        if ok:
            for i in range(x.shape[0]):
                if not np.isfinite(x[i]) or not np.isfinite(sq[i]):
                    ok = False
                    break
        if not ok:
            for i in range(x.shape[0]):
                x[i] = x_prev[i]
                sq[i] = sq_prev[i]
            values[k] = np.nan
            continue
        values[k] = value
        n_ok += 1
    return n_ok
