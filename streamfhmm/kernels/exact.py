"""Exact inference over the 2^M joint states of a factorial HMM (MATH.md §7).

The joint state ``k`` has bit ``m`` equal to ``s^m``. Two factorial tricks keep a time
step cheap:

* the transition is applied chain by chain along bit ``m`` of the state index,
  O(M·2^M) per step instead of O(4^M);
* the emission is whitened once per parameter set, ``ỹ = L⁻¹(y - w_0)``,
  ``ũ_m = L⁻¹ w_m``, so that ``log N(y; Wᵀŝ, Σ) = const - ½‖ỹ‖² + Σ_{m∈s} ũ_mᵀỹ - ½c(s)``
  with ``c(s) = ‖Σ_{m∈s} ũ_m‖²`` precomputed; the linear part is built state by state
  from the state with its top bit cleared: O(2^M + M·D) per step.

The recursions run in scaled probability space (each step normalised, the logs of
the normalisers summing to ``log p(y)``). Smoothing stores the forward messages only
every ``block`` steps and recomputes them block by block on the way back, so memory
is O((T/block + block)·2^M) instead of O(T·2^M).
"""
import math

import numpy as np

from ._jit import jit

LOG_2PI = math.log(2.0 * math.pi)
#: normalised state probabilities below this are set to zero (they cannot matter in float64)
FLUSH = 1e-290
#: the backward pass keeps ``e_r(s) / c_r`` below ``exp(_G_MAX)`` (``exp`` overflows at 709.8)
_G_MAX = 700.0


@jit
def prepare_emission(W, L):
    """Whitened emission tables for one parameter set.

    Parameters
    ----------
    W : ndarray, shape (M+1, D)
        Chain contributions, bias last.
    L : ndarray, shape (D, D)
        Lower Cholesky factor of Σ.

    Returns
    -------
    Linv : ndarray, shape (D, D)
        ``L⁻¹`` (lower triangular).
    Ut : ndarray, shape (M, D)
        Whitened contributions ``ũ_m = L⁻¹ w_m``.
    half_c : ndarray, shape (2^M,)
        ``½‖Σ_{m∈s} ũ_m‖²`` per joint state.
    const : float
        ``-D/2 log 2π - Σ_d log L_dd``.
    """
    M = W.shape[0] - 1
    D = W.shape[1]
    Linv = np.zeros((D, D))
    for j in range(D):
        Linv[j, j] = 1.0 / L[j, j]
        for i in range(j + 1, D):
            acc = 0.0
            for k in range(j, i):
                acc += L[i, k] * Linv[k, j]
            Linv[i, j] = -acc / L[i, i]
    Ut = np.zeros((M, D))
    for m in range(M):
        for i in range(D):
            acc = 0.0
            for k in range(i + 1):
                acc += Linv[i, k] * W[m, k]
            Ut[m, i] = acc
    K = 1 << M
    sums = np.zeros((K, D))
    half_c = np.zeros(K)
    for s in range(1, K):
        top = 0
        while (s >> (top + 1)) > 0:
            top += 1
        prev = s ^ (1 << top)
        acc = 0.0
        for d in range(D):
            v = sums[prev, d] + Ut[top, d]
            sums[s, d] = v
            acc += v * v
        half_c[s] = 0.5 * acc
    const = -0.5 * D * LOG_2PI
    for d in range(D):
        const -= math.log(L[d, d])
    return Linv, Ut, half_c, const


@jit
def log_emission(y, bias, Linv, Ut, half_c, const, ytil, out):
    """Log emission density of one sample for every joint state.

    Parameters
    ----------
    y : ndarray, shape (D,)
    bias : ndarray, shape (D,)
        ``w_0`` (the last row of W).
    Linv, Ut, half_c, const
        From :func:`prepare_emission`.
    ytil : ndarray, shape (D,)
        Scratch.
    out : ndarray, shape (2^M,)
        Receives ``log N(y; Wᵀŝ, Σ)`` per state.

    Returns
    -------
    float
        The largest entry of ``out``.

    Notes
    -----
    MATH.md §7: ``const - ½‖ỹ‖² + Σ_{m∈s} ũ_mᵀỹ - ½c(s)``, linear part built from
    the state with its top bit cleared. The three terms cancel to ``-½‖ỹ - Σ ũ_m‖²``:
    the rounding error is about 1e-16·(‖ỹ‖² + c(s)), negligible unless ``‖L⁻¹w_m‖``
    reaches ~1e7 (noise seven orders of magnitude below the loadings), where it is
    nats per sample. SMF-EM and exact EM floor each noise variance at 1e-9 of its
    feature's variance, which keeps their fits below ~1e5 for loadings of a few
    standard deviations.
    """
    D = y.shape[0]
    M = Ut.shape[0]
    sq = 0.0
    for i in range(D):
        acc = 0.0
        for k in range(i + 1):
            acc += Linv[i, k] * (y[k] - bias[k])
        ytil[i] = acc
        sq += acc * acc
    out[0] = 0.0
    for m in range(M):
        proj = 0.0
        for d in range(D):
            proj += Ut[m, d] * ytil[d]
        base = 1 << m
        for s in range(base):
            out[base + s] = out[s] + proj
    c0 = const - 0.5 * sq
    mx = -np.inf
    for s in range(out.shape[0]):
        v = out[s] - half_c[s] + c0
        out[s] = v
        if v > mx:
            mx = v
    return mx


@jit
def leave_out_overflow(le, mx):
    """The rule for a sample so far from the model that ``½‖L⁻¹(y - μ)‖²`` overflows
    (|y| above ~1e154 times the noise scale): every log density in ``le`` is then -inf
    or NaN, and ``exp(-inf - -inf)`` put NaN into every message. Its emission is left out
    (``le`` = 0), which is what the float arithmetic already does a little below the
    overflow (the state-dependent terms vanish next to ½‖ỹ‖²). Shared by the batch
    passes (:func:`emission_or_left_out`) and the streaming filter
    (``online.filter_step``).

    Returns
    -------
    mx : float
        ``mx`` as given, or 0 when the emission is left out.
    kept : bool
        False when it was left out: the sample's log density is below the float range
        (-inf), which the caller adds to the log-likelihood.
    """
    for s in range(le.shape[0]):
        if le[s] - le[s] != 0.0:   # inf or NaN
            for k in range(le.shape[0]):
                le[k] = 0.0
            return 0.0, False
    return mx, True


@jit
def emission_or_left_out(y, bias, Linv, Ut, half_c, const, ytil, out):
    """:func:`log_emission` with :func:`leave_out_overflow`: ``(mx, kept)``."""
    return leave_out_overflow(out, log_emission(y, bias, Linv, Ut, half_c, const, ytil, out))


@jit
def transition_forward(u, A):
    """In place ``u ← Aᵀ u`` for the factorial transition, chain by chain.

    Parameters
    ----------
    u : ndarray, shape (2^M,)
        Distribution over joint states at t-1; holds the prediction for t on return.
    A : ndarray, shape (M, 2, 2)
        Per-chain transition matrices.

    Notes
    -----
    MATH.md §7: for states differing only in bit m,
    ``(u0, u1) ← (u0 A00 + u1 A10, u0 A01 + u1 A11)``; O(M·2^M).
    """
    M = A.shape[0]
    K = u.shape[0]
    for m in range(M):
        a00 = A[m, 0, 0]
        a01 = A[m, 0, 1]
        a10 = A[m, 1, 0]
        a11 = A[m, 1, 1]
        stride = 1 << m
        nb = K // (2 * stride)
        v = u.reshape((nb, 2, stride))  # bit m is axis 1: lets LLVM vectorise the pairs
        for b in range(nb):
            lo = v[b, 0]
            hi = v[b, 1]
            for j in range(stride):
                u0 = lo[j]
                u1 = hi[j]
                lo[j] = u0 * a00 + u1 * a10
                hi[j] = u0 * a01 + u1 * a11


@jit
def transition_backward(v, A):
    """In place ``v ← A v`` (the backward message through the factorial transition)."""
    M = A.shape[0]
    K = v.shape[0]
    for m in range(M):
        a00 = A[m, 0, 0]
        a01 = A[m, 0, 1]
        a10 = A[m, 1, 0]
        a11 = A[m, 1, 1]
        stride = 1 << m
        nb = K // (2 * stride)
        w = v.reshape((nb, 2, stride))
        for b in range(nb):
            lo = w[b, 0]
            hi = w[b, 1]
            for j in range(stride):
                v0 = lo[j]
                v1 = hi[j]
                lo[j] = a00 * v0 + a01 * v1
                hi[j] = a10 * v0 + a11 * v1


@jit
def joint_startprob(startprob, out):
    """``out[s] = Π_m π_m^{s_m} (1-π_m)^{1-s_m}`` for every joint state."""
    M = startprob.shape[0]
    out[0] = 1.0
    for m in range(M):
        base = 1 << m
        p = startprob[m]
        for s in range(base):
            out[base + s] = out[s] * p
            out[s] = out[s] * (1.0 - p)


@jit
def _absorb_logspace(u, le):
    """``u ← u · exp(le)`` normalised, computed in logs; returns the log normaliser.

    The slow path of :func:`_step`, for a step where every state the prediction
    allows has an emission density that underflows relative to the best state.
    """
    K = u.shape[0]
    best = -np.inf
    for s in range(K):
        if u[s] > 0.0:
            v = math.log(u[s]) + le[s]
            if v > best:
                best = v
    total = 0.0
    for s in range(K):
        if u[s] > 0.0:
            w = math.exp(math.log(u[s]) + le[s] - best)
            u[s] = w
            total += w
    inv = 1.0 / total
    for s in range(K):
        u[s] *= inv
    return math.log(total) + best


@jit
def _step(u, work, le, mx):
    """Absorb the emission into the prediction: ``u ← u · exp(le) / c_t``; returns ``log c_t``.

    Parameters
    ----------
    u : ndarray, shape (2^M,)
        Prediction ``p(s_t | y_<t)`` on entry, filtered ``p(s_t | y_≤t)`` on return.
    work : ndarray, shape (2^M,)
        Scratch.
    le : ndarray, shape (2^M,)
        Log emission densities; ``mx`` their maximum.
    """
    K = u.shape[0]
    total = 0.0
    for s in range(K):
        w = u[s] * math.exp(le[s] - mx)
        work[s] = w
        total += w
    if total > 1e-280:
        inv = 1.0 / total
        for s in range(K):
            w = work[s] * inv
            # flush negligible states to zero: subnormal arithmetic is ~100x slower
            u[s] = w if w > FLUSH else 0.0
        return math.log(total) + mx
    return _absorb_logspace(u, le)


@jit
def _backward_weights(alpha_r, le, mx, lc, beta, g):
    """``g(s) = e_r(s) β_r(s) / c_r`` on the states the forward pass kept at r, 0 elsewhere.

    Parameters
    ----------
    alpha_r : ndarray, shape (2^M,)
        Normalised forward message at r.
    le : ndarray, shape (2^M,)
        Log emission densities at r; ``mx`` their maximum.
    lc : float
        ``log c_r``, the forward pass's log normaliser at r.
    beta : ndarray, shape (2^M,)
        Backward message at r (max-normalised).
    g : ndarray, shape (2^M,)
        Out; its overall scale is arbitrary (``β_{r-1} = A g`` is renormalised, the pair
        posteriors are normalised per step).

    Notes
    -----
    A state with ``α_r(s) = 0`` has a zero prediction (a transition probability that is
    0.0 in float64, ``σ(-α)`` for ``α > 745``) or was flushed: the forward pass's model
    excludes it, so every path through it has posterior 0 and it gets ``g(s) = 0``. Its
    ``exp(le(s) - log c_r)`` is unbounded — the data may favour it by any margin — and
    taken literally it overflows to ``inf`` and ``0 · inf`` makes the posteriors NaN (or,
    finite but huge, it dominates the max-normalisation of β and underflows the states
    that matter). On a kept state ``exp(le(s) - log c_r) = α_r(s) / pred_r(s)`` is below
    ``1 / pred_r(s)``, i.e. at most ``e^744.5`` (a subnormal prediction); when the largest
    exponent passes ``_G_MAX`` every ``g`` is scaled by the same ``e^{-shift}`` so that the
    largest is ``e^{_G_MAX}``. Below that (every ordinary step) ``g`` is unchanged.
    """
    K = g.shape[0]
    shift = lc
    if mx - lc > _G_MAX:
        top = -np.inf
        for s in range(K):
            if alpha_r[s] > 0.0 and le[s] > top:
                top = le[s]
        if top - lc > _G_MAX:
            shift = top - _G_MAX
    for s in range(K):
        g[s] = math.exp(le[s] - shift) * beta[s] if alpha_r[s] > 0.0 else 0.0


@jit
def _chain_marginals(u, out):
    """``out[m] = Σ_s u[s] [bit m of s]``."""
    M = out.shape[0]
    K = u.shape[0]
    for m in range(M):
        out[m] = 0.0
    for s in range(K):
        if u[s] != 0.0:
            for m in range(M):
                if (s >> m) & 1:
                    out[m] += u[s]


@jit
def forward_filter(X, bounds, W, L, A, startprob, want_marginals, theta):
    """Forward algorithm: exact log-likelihood and, optionally, filtering marginals.

    Parameters
    ----------
    X : ndarray, shape (T, D)
    bounds : ndarray of int64, shape (n_sequences + 1,)
        Sequence ``i`` is ``X[bounds[i]:bounds[i+1]]``.
    W : ndarray, shape (M+1, D)
    L : ndarray, shape (D, D)
    A : ndarray, shape (M, 2, 2)
    startprob : ndarray, shape (M,)
    want_marginals : bool
    theta : ndarray, shape (T, M)
        Receives ``p(s_t^m = 1 | y_1..y_t)`` when ``want_marginals``.

    Returns
    -------
    float
        ``log p(y)``, summed over the sequences.

    Notes
    -----
    MATH.md §7; O(T·(M·2^M + D²)) time, O(2^M) memory.
    """
    M = W.shape[0] - 1
    D = W.shape[1]
    K = 1 << M
    Linv, Ut, half_c, const = prepare_emission(W, L)
    bias = W[M].copy()
    u = np.empty(K)
    pred = np.empty(K)
    le = np.empty(K)
    ytil = np.empty(D)
    pi = np.empty(K)
    joint_startprob(startprob, pi)
    total = 0.0
    for i in range(bounds.shape[0] - 1):
        for t in range(bounds[i], bounds[i + 1]):
            if t == bounds[i]:
                for s in range(K):
                    u[s] = pi[s]
            else:
                transition_forward(u, A)
            mx, kept = emission_or_left_out(X[t], bias, Linv, Ut, half_c, const, ytil, le)
            c = _step(u, pred, le, mx)
            total += c if kept else -np.inf
            if want_marginals:
                _chain_marginals(u, theta[t])
    return total


@jit
def _pair_marginals(alpha_prev, g, A, fwork, out):
    """Per-chain pairwise posteriors ``p(s_{t-1}^m = i, s_t^m = j | y)``.

    ``alpha_prev`` is the normalised forward message at t-1, ``g`` the normalised
    ``e_t(s) β_t(s) / c_t``; for chain m, every other chain's transition is applied to
    ``alpha_prev`` and chain m's pair is read off. O(M²·2^M).
    """
    M = A.shape[0]
    K = alpha_prev.shape[0]
    for m in range(M):
        for s in range(K):
            fwork[s] = alpha_prev[s]
        for n in range(M):
            if n == m:
                continue
            a00 = A[n, 0, 0]
            a01 = A[n, 0, 1]
            a10 = A[n, 1, 0]
            a11 = A[n, 1, 1]
            stride = 1 << n
            for base in range(0, K, 2 * stride):
                for j in range(base, base + stride):
                    u0 = fwork[j]
                    u1 = fwork[j + stride]
                    fwork[j] = u0 * a00 + u1 * a10
                    fwork[j + stride] = u0 * a01 + u1 * a11
        x00 = 0.0
        x01 = 0.0
        x10 = 0.0
        x11 = 0.0
        stride = 1 << m
        for base in range(0, K, 2 * stride):
            for j in range(base, base + stride):
                f0 = fwork[j]
                f1 = fwork[j + stride]
                g0 = g[j]
                g1 = g[j + stride]
                x00 += f0 * g0
                x01 += f0 * g1
                x10 += f1 * g0
                x11 += f1 * g1
        out[m, 0, 0] = x00 * A[m, 0, 0]
        out[m, 0, 1] = x01 * A[m, 0, 1]
        out[m, 1, 0] = x10 * A[m, 1, 0]
        out[m, 1, 1] = x11 * A[m, 1, 1]


@jit
def forward_backward(X, bounds, W, L, A, startprob, block, want_pairs, theta, xi, gsum):
    """Exact smoothing: per-chain marginals and, optionally, per-chain pairwise posteriors.

    Parameters
    ----------
    X : ndarray, shape (T, D)
    bounds : ndarray of int64, shape (n_sequences + 1,)
    W, L, A, startprob
        Model parameters (see :func:`forward_filter`).
    block : int
        Checkpoint interval of the forward messages (memory/time trade-off).
    want_pairs : bool
    theta : ndarray, shape (T, M)
        Receives ``p(s_t^m = 1 | y)``.
    xi : ndarray, shape (T, M, 2, 2)
        Receives ``p(s_{t-1}^m = i, s_t^m = j | y)`` when ``want_pairs`` (zero at the
        first step of every sequence); may be a (1, M, 2, 2) dummy otherwise.
    gsum : ndarray, shape (2^M,) or (0,)
        When of length 2^M, the joint posteriors ``p(s_t = k | y)`` summed over t are
        added to it (the statistic ``Σ_t E[ŝ_t ŝ_tᵀ]`` of the exact M-step needs them);
        an empty array skips this.

    Returns
    -------
    float
        ``log p(y)``.

    Notes
    -----
    MATH.md §7. Forward messages are checkpointed every ``block`` steps and recomputed
    per block during the backward pass: O(2·T·M·2^M) time,
    O((T/block + block)·2^M) memory.
    """
    M = W.shape[0] - 1
    D = W.shape[1]
    K = 1 << M
    Linv, Ut, half_c, const = prepare_emission(W, L)
    bias = W[M].copy()
    pi = np.empty(K)
    joint_startprob(startprob, pi)
    le = np.empty(K)
    ytil = np.empty(D)
    pred = np.empty(K)
    beta = np.empty(K)
    g = np.empty(K)
    fwork = np.empty(K)
    total = 0.0
    for i in range(bounds.shape[0] - 1):
        start = bounds[i]
        stop = bounds[i + 1]
        n = stop - start
        n_blocks = (n + block - 1) // block
        ckpt = np.empty((n_blocks, K))
        logc = np.empty(n)
        # forward pass, keeping the message at the start of every block
        u = np.empty(K)
        for t in range(start, stop):
            r = t - start
            if r == 0:
                for s in range(K):
                    u[s] = pi[s]
            else:
                transition_forward(u, A)
            mx, kept = emission_or_left_out(X[t], bias, Linv, Ut, half_c, const, ytil, le)
            logc[r] = _step(u, pred, le, mx)
            total += logc[r] if kept else -np.inf
            if r % block == 0:
                ckpt[r // block] = u
        # backward pass, block by block
        alphas = np.empty((block, K))
        for s in range(K):
            beta[s] = 1.0
        for b in range(n_blocks - 1, -1, -1):
            r0 = b * block
            r1 = min(n, r0 + block)
            alphas[0] = ckpt[b]
            for r in range(r0 + 1, r1):
                for s in range(K):
                    u[s] = alphas[r - 1 - r0, s]
                transition_forward(u, A)
                mx = emission_or_left_out(X[start + r], bias, Linv, Ut, half_c, const, ytil, le)[0]
                _step(u, pred, le, mx)
                alphas[r - r0] = u
            for r in range(r1 - 1, r0 - 1, -1):
                # posterior at r: alpha_r * beta_r (both normalised consistently)
                tot = 0.0
                for s in range(K):
                    fwork[s] = alphas[r - r0, s] * beta[s]
                    tot += fwork[s]
                for s in range(K):
                    fwork[s] /= tot
                if gsum.shape[0] == K:
                    for s in range(K):
                        gsum[s] += fwork[s]
                _chain_marginals(fwork, theta[start + r])
                if r == 0:
                    break
                # g(s) = e_r(s) beta_r(s) / c_r, then beta_{r-1} = A g
                mx = emission_or_left_out(X[start + r], bias, Linv, Ut, half_c, const, ytil, le)[0]
                _backward_weights(alphas[r - r0], le, mx, logc[r], beta, g)
                if want_pairs:
                    if r - 1 >= r0:
                        prev = alphas[r - 1 - r0]
                    else:
                        prev = prev_block_last(ckpt, b - 1, X, start, block, bias, Linv, Ut,
                                               half_c, const, A, ytil, le, pred)
                    # unnormalised (beta carries an arbitrary scale): normalised below
                    _pair_marginals(prev, g, A, fwork, xi[start + r])
                for s in range(K):
                    beta[s] = g[s]
                transition_backward(beta, A)
                # keep beta on a sane scale (its scale cancels in the normalised posterior)
                mxb = 0.0
                for s in range(K):
                    if beta[s] > mxb:
                        mxb = beta[s]
                if mxb > 0.0:
                    for s in range(K):
                        beta[s] /= mxb
        if want_pairs:
            for m in range(M):
                for r in range(1, n):
                    tot = xi[start + r, m, 0, 0] + xi[start + r, m, 0, 1] + xi[start + r, m, 1, 0] + xi[start + r, m, 1, 1]
                    xi[start + r, m, 0, 0] /= tot
                    xi[start + r, m, 0, 1] /= tot
                    xi[start + r, m, 1, 0] /= tot
                    xi[start + r, m, 1, 1] /= tot
                xi[start, m, 0, 0] = 0.0
                xi[start, m, 0, 1] = 0.0
                xi[start, m, 1, 0] = 0.0
                xi[start, m, 1, 1] = 0.0
    return total


@jit
def prev_block_last(ckpt, b, X, start, block, bias, Linv, Ut, half_c, const, A, ytil, le, pred):
    """The normalised forward message at the last step of block ``b`` (recomputed)."""
    u = ckpt[b].copy()
    r0 = b * block
    for r in range(r0 + 1, r0 + block):
        transition_forward(u, A)
        mx = emission_or_left_out(X[start + r], bias, Linv, Ut, half_c, const, ytil, le)[0]
        _step(u, pred, le, mx)
    return u
