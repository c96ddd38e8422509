"""The ELBO of the copula-chain variational family, position by position, with its
gradients (MATH.md §2 and §4).

The variational parameters ``theta`` (n, M) and ``rho`` (n, M) are taken as explicit
inputs (already kept off their bounds, MATH.md §2); the recognition networks that
produce them are composed with these gradients by the caller.

Per position ``t ≥ 2`` of a sequence (MATH.md §4)::

    ℓ_t = E_q[log N(y_t; Wᵀŝ_t, Σ)]
        + Σ_m { Σ_ij q^m_t(i,j) log A_m(i,j) - Σ_ij q^m_t(i,j) log q^m_t(i,j)
                + θ_{t-1,m} log θ_{t-1,m} + (1-θ_{t-1,m}) log(1-θ_{t-1,m}) }

and ``ℓ_1 = E log p(y_1|s_1) + Σ_m (E log p(s_1^m) + H[q(s_1^m)])``.

Conventions
-----------
* A *subchain* is ``n`` consecutive rows of ``Y``, ``theta``, ``rho``. If it starts a
  sequence (``first_is_start``) row 0 is time ``t = 1`` and contributes ``ℓ_1``;
  otherwise row 0 is context only: it contributes no term of its own, but its θ enters
  ``ℓ`` of row 1 as ``θ_{t-1}`` (its ``Y`` row is ignored). Rows ``1..n-1`` contribute
  ``ℓ_t`` with the pair (row-1, row). ``rho`` of row 0 is never used (gradient 0).
  Consecutive subchains that cover a sequence, each after the first repeating the
  previous one's last row as its context row, sum to the full ELBO.
* A missing value is ``NaN`` in ``Y``. The emission term of a row with missing
  dimensions is that of the marginal Gaussian of its observed dimensions; a row with
  every dimension missing has no emission term. ``Σ_oo`` is factorised from the rows of
  ``L`` (never from a formed ``Σ``) and its quadratic forms are evaluated by
  substitution, so the term is finite whenever ``L`` is a valid factor.
* Every gradient output is **accumulated** (``+=``), so a batch of subchains, and
  subchains that share rows, can share the outputs; zero them before the first call.
* Inside logarithms ``q_ij``, ``θ`` and ``1-θ`` are floored at ``Q_FLOOR = 1e-300``
  (``x log x`` becomes ``x log Q_FLOOR`` below it) and the gradients are those of the
  floored expression. Flooring a pair cell only lowers ``-q log q``, so the bound stays
  a lower bound; with ``θ ∈ [EPS_THETA, 1-EPS_THETA]`` the node floors never act.
* ``P`` must be ``Σ⁻¹`` for ``Σ = L Lᵀ`` (the caller computes it once per parameter
  set); ``log |Σ| = 2 Σ_d log L_dd`` is read from ``L``.
"""
import math

import numpy as np

from ._jit import jit
from .bvn import copula_cells_h, norm_ppf

__all__ = ["Q_FLOOR", "elbo_subchain", "elbo_batch", "sigma_grad_to_chol"]

#: floor of the cells ``q_ij`` (and of ``θ``, ``1-θ``) inside logarithms
Q_FLOOR = 1e-300
LOG_Q_FLOOR = math.log(Q_FLOOR)
LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------------------
# small pieces
# --------------------------------------------------------------------------------------
@jit
def _xlogx(x):
    """``x log max(x, Q_FLOOR)`` and its derivative."""
    if x > Q_FLOOR:
        lx = math.log(x)
        return x * lx, lx + 1.0
    return x * LOG_Q_FLOOR, LOG_Q_FLOOR


@jit
def _neg_entropy(theta):
    """``θ log θ + (1-θ) log(1-θ)`` (floored) and its derivative in ``θ``."""
    f1, d1 = _xlogx(theta)
    f0, d0 = _xlogx(1.0 - theta)
    return f1 + f0, d1 - d0


@jit
def observed_cholesky(L, obs, n, C):
    """Lower Cholesky factor of ``Σ_oo`` computed from ``L``, never from ``Σ = L Lᵀ``.

    Parameters
    ----------
    L : ndarray, shape (D, D)
        Lower Cholesky factor of Σ, positive diagonal.
    obs : ndarray of int64, shape (≥ n,)
        The observed dimensions, increasing.
    n : int
        Their number.
    C : ndarray, shape (≥ n, D)
        Out: ``C[:n, :n]`` lower triangular with a positive diagonal,
        ``C Cᵀ = Σ_oo = L_o L_oᵀ`` (``L_o`` the rows ``obs`` of L); the rest is scratch.

    Notes
    -----
    MATH.md §4, missing dimensions. Forming ``Σ_oo`` squares the condition number:
    ``1 + ε²`` rounds to 1 for ``ε < 1e-8``, so the Cholesky of the formed block of a
    valid L with eigenvalues 1 and 1e-16 met a zero (or negative) pivot and gave NaN.
    Here the rows ``L_o`` are rotated instead (an LQ factorisation by Givens rotations,
    backward stable): ``L_o Q = [C 0]``. Row i of ``L_o`` is zero beyond column
    ``obs[i]``, and the rotations of rows before it touch only columns up to
    ``obs[i-1] < obs[i]``, so ``L[obs[i], obs[i]] > 0`` is still in place when row i is
    reduced and ``C_ii ≥ L[obs[i], obs[i]] > 0``: the factor exists whenever L is valid.
    When the missing dimensions are the last ones no rotation is made: ``C = L_oo``.
    """
    D = L.shape[0]
    for i in range(n):
        r = obs[i]
        for j in range(D):
            C[i, j] = L[r, j] if j <= r else 0.0
    for i in range(n):
        for j in range(obs[i], i, -1):
            # rotate columns (i, j) so that C[i, j] becomes 0; rows above i are 0 there
            b = C[i, j]
            if b == 0.0:
                continue
            a = C[i, i]
            h = math.hypot(a, b)
            cs = a / h
            sn = b / h
            for k in range(i, n):
                u = C[k, i]
                v = C[k, j]
                C[k, i] = cs * u + sn * v
                C[k, j] = cs * v - sn * u
            C[i, j] = 0.0


@jit
def _spd_inverse_from_chol(Lc, n, Linv, out):
    """``out = (Lc Lcᵀ)⁻¹`` for the leading ``n × n`` blocks; ``Linv`` is scratch."""
    for j in range(n):
        Linv[j, j] = 1.0 / Lc[j, j]
        for i in range(j + 1, n):
            acc = 0.0
            for k in range(j, i):
                acc += Lc[i, k] * Linv[k, j]
            Linv[i, j] = -acc / Lc[i, i]
        for i in range(j):
            Linv[i, j] = 0.0
    for i in range(n):
        for j in range(i + 1):
            acc = 0.0
            for k in range(i, n):  # (Linvᵀ Linv)[i, j] = Σ_{k ≥ i} Linv[k, i] Linv[k, j]
                acc += Linv[k, i] * Linv[k, j]
            out[i, j] = acc
            out[j, i] = acc


# --------------------------------------------------------------------------------------
# the per-call workspace and its final reduction
# --------------------------------------------------------------------------------------
@jit
def _workspace(M, D):
    """Scratch arrays for one kernel call (allocated once per call, never per position).

    ``mats`` (4, D, D): Q = Σ_t (P r_t)(P r_t)ᵀ over fully observed rows, and the
    missing-pattern scratch ``C`` (``C Cᵀ = Σ_oo``), ``C⁻¹``, ``P_oo``. ``vecs`` (5, D):
    ``r``, ``P r``, and the missing-row ``r_o``, ``C⁻¹ r_o``, ``P_oo r_o``.
    ``wmiss`` (2, M, D): per cached missing pattern, rows ``C⁻¹ w_{m,o}`` and
    ``P_oo w_{m,o}``.
    ``chain`` (3, M+1): row 0 ``a_m = A_m(0,1)``, row 1 ``b_m = A_m(1,0)``, row 2
    ``Σ_t v_t`` over fully observed rows.
    ``WP`` (M+1, D): rows ``P w_k``. ``c`` (M,): ``w_mᵀ P w_m``.
    ``scal`` (3,): number of fully observed rows, ``log|Σ_oo|`` of the cached missing
    pattern, whether a pattern is cached. ``obs`` (D,): observed indices of the row,
    ``obs_prev`` (D+1,): the cached pattern (its count last). ``q`` (4,), ``dq`` (4, 3).
    """
    mats = np.zeros((4, D, D))
    vecs = np.zeros((5, D))
    wmiss = np.zeros((2, M, D))
    chain = np.zeros((3, M + 1))
    WP = np.zeros((M + 1, D))
    c = np.zeros(M)
    scal = np.zeros(3)
    obs = np.zeros(D, dtype=np.int64)
    obs_prev = np.zeros(D + 1, dtype=np.int64)
    q = np.zeros(4)
    dq = np.zeros((4, 3))
    return mats, vecs, wmiss, chain, WP, c, scal, obs, obs_prev, q, dq


@jit
def _prepare(W, L, P, log_A, mats, chain, WP, c):
    """Per-call constants: ``P w_k``, ``w_mᵀ P w_m``, ``a_m``, ``b_m``; returns
    ``Σ_d log L_dd``."""
    M = W.shape[0] - 1
    D = W.shape[1]
    for k in range(M + 1):
        for i in range(D):
            acc = 0.0
            for j in range(D):
                acc += P[i, j] * W[k, j]
            WP[k, i] = acc
    for m in range(M):
        acc = 0.0
        for i in range(D):
            acc += W[m, i] * WP[m, i]
        c[m] = acc
        chain[0, m] = math.exp(log_A[m, 0, 1])
        chain[1, m] = math.exp(log_A[m, 1, 0])
    half_logdet = 0.0
    for d in range(D):
        half_logdet += math.log(L[d, d])
    return half_logdet


@jit
def _finish(P, mats, chain, WP, scal, gW, gSigma):
    """Add the fully-observed rows' batched terms: ``-diag(Σv) W P`` to ``gW`` and
    ``½(P S P - n P)`` to ``gSigma`` with ``P S P = Q + Σ_m (Σ_t v_{t,m}) P w_m w_mᵀ P``."""
    M = WP.shape[0] - 1
    D = WP.shape[1]
    Q = mats[0]
    vsum = chain[2]
    n_full = scal[0]
    for m in range(M):
        for d in range(D):
            gW[m, d] -= vsum[m] * WP[m, d]
    for i in range(D):
        for j in range(D):
            acc = Q[i, j] - n_full * P[i, j]
            for m in range(M):
                acc += vsum[m] * WP[m, i] * WP[m, j]
            gSigma[i, j] += 0.5 * acc


# --------------------------------------------------------------------------------------
# one row's emission term
# --------------------------------------------------------------------------------------
@jit
def _emission_full(y, theta_row, g_theta_row, W, P, WP, c, const, mats, vecs, chain, scal, gW):
    """``E log N(y; Wᵀŝ, Σ)`` of a fully observed row; θ and the μ-part of W gradients
    directly, the Σ-part and the v-part of W batched into ``mats``/``chain``."""
    M = W.shape[0] - 1
    D = W.shape[1]
    r = vecs[0]
    Pr = vecs[1]
    Q = mats[0]
    vsum = chain[2]
    for d in range(D):
        r[d] = y[d] - W[M, d]
    quad_v = 0.0
    for m in range(M):
        th = theta_row[m]
        quad_v += th * (1.0 - th) * c[m]
        for d in range(D):
            r[d] -= th * W[m, d]
    quad_r = 0.0
    for i in range(D):
        acc = 0.0
        for j in range(D):
            acc += P[i, j] * r[j]
        Pr[i] = acc
        quad_r += r[i] * acc
    for m in range(M):
        th = theta_row[m]
        acc = 0.0
        for d in range(D):
            acc += W[m, d] * Pr[d]
            gW[m, d] += th * Pr[d]
        g_theta_row[m] += acc - 0.5 * (1.0 - 2.0 * th) * c[m]
        vsum[m] += th * (1.0 - th)
    for d in range(D):
        gW[M, d] += Pr[d]
    for i in range(D):
        for j in range(D):
            Q[i, j] += Pr[i] * Pr[j]
    scal[0] += 1.0
    return const - 0.5 * (quad_r + quad_v)


@jit
def _emission_missing(y, n_obs, obs, obs_prev, theta_row, g_theta_row, W, L, mats, vecs, wmiss,
                      scal, gW, gSigma):
    """Emission term of a row with ``0 < n_obs < D`` observed dimensions ``obs``: the
    marginal ``N(y_o; (Wᵀŝ)_o, Σ_oo)``; all of its gradients are added directly.

    ``C Cᵀ = Σ_oo`` comes from L (:func:`observed_cholesky`) and every quadratic form is
    a sum of squares of whitened vectors, ``rᵀ P_oo r = ‖C⁻¹ r‖²``, ``w_mᵀ P_oo w_m =
    ‖C⁻¹ w_m‖²``, ``w_mᵀ P_oo r = (C⁻¹ w_m)ᵀ(C⁻¹ r)`` (MATH.md §7's whitening), and
    ``P_oo r = C⁻ᵀ(C⁻¹ r)`` by substitution: with ``P_oo`` formed explicitly these lose
    everything when Σ_oo is ill-conditioned (``rᵀ P_oo r`` of order 1 from entries of
    order 1e16). ``P_oo`` itself is formed only for its own term of ``∂/∂Σ``.
    """
    M = W.shape[0] - 1
    C = mats[1]
    Cinv = mats[2]
    Po = mats[3]
    ro = vecs[2]
    yt = vecs[3]
    Pro = vecs[4]
    Ut = wmiss[0]
    Z = wmiss[1]
    no = n_obs
    # factorise Σ_oo unless the previous missing row had the same pattern
    last = obs_prev.shape[0] - 1
    same = scal[2] > 0.0 and obs_prev[last] == no
    if same:
        for i in range(no):
            if obs_prev[i] != obs[i]:
                same = False
                break
    if not same:
        observed_cholesky(L, obs, no, C)
        _spd_inverse_from_chol(C, no, Cinv, Po)
        logdet = 0.0
        for i in range(no):
            logdet += 2.0 * math.log(C[i, i])
        for m in range(M):
            u = Ut[m]
            z = Z[m]
            _solve_lower(C, no, W[m], obs, u)
            _solve_upper_t(C, no, u, z)
        scal[1] = logdet
        scal[2] = 1.0
        for i in range(no):
            obs_prev[i] = obs[i]
        obs_prev[last] = no
    logdet = scal[1]
    for i in range(no):
        d = obs[i]
        acc = y[d] - W[M, d]
        for m in range(M):
            acc -= theta_row[m] * W[m, d]
        ro[i] = acc
    for i in range(no):  # ỹ = C⁻¹ r_o
        acc = ro[i]
        for k in range(i):
            acc -= C[i, k] * yt[k]
        yt[i] = acc / C[i, i]
    _solve_upper_t(C, no, yt, Pro)
    quad = 0.0
    for i in range(no):
        quad += yt[i] * yt[i]
    for m in range(M):
        th = theta_row[m]
        v = th * (1.0 - th)
        u = Ut[m]
        z = Z[m]
        cm = 0.0
        wPr = 0.0
        for i in range(no):
            cm += u[i] * u[i]
            wPr += u[i] * yt[i]
        quad += v * cm
        g_theta_row[m] += wPr - 0.5 * (1.0 - 2.0 * th) * cm
        for i in range(no):
            gW[m, obs[i]] += th * Pro[i] - v * z[i]
        if v != 0.0:
            for i in range(no):
                for j in range(no):
                    gSigma[obs[i], obs[j]] += 0.5 * v * z[i] * z[j]
    for i in range(no):
        gW[M, obs[i]] += Pro[i]
        for j in range(no):
            gSigma[obs[i], obs[j]] += 0.5 * (Pro[i] * Pro[j] - Po[i, j])
    return -0.5 * no * LOG_2PI - 0.5 * logdet - 0.5 * quad


@jit
def _solve_lower(C, n, w, obs, out):
    """``out[:n] = C⁻¹ w_o`` (forward substitution), ``w_o = w[obs[:n]]``."""
    for i in range(n):
        acc = w[obs[i]]
        for k in range(i):
            acc -= C[i, k] * out[k]
        out[i] = acc / C[i, i]


@jit
def _solve_upper_t(C, n, b, out):
    """``out[:n] = C⁻ᵀ b`` (back substitution with the transpose of the lower ``C``)."""
    for i in range(n - 1, -1, -1):
        acc = b[i]
        for k in range(i + 1, n):
            acc -= C[k, i] * out[k]
        out[i] = acc / C[i, i]


@jit
def _emission(y, theta_row, g_theta_row, W, L, P, WP, c, const, mats, vecs, wmiss, chain, scal,
              obs, obs_prev, gW, gSigma):
    """Dispatch one row to the fully observed or the missing-value path."""
    D = W.shape[1]
    # (an int64 from the start: a literal 0 had the missing-value path compiled twice,
    # once for the type Literal[int](0) that inference passes through, about 3 s)
    n_obs = D - D
    for d in range(D):
        if not math.isnan(y[d]):
            obs[n_obs] = d
            n_obs += 1
    if n_obs == D:
        return _emission_full(y, theta_row, g_theta_row, W, P, WP, c, const, mats, vecs, chain,
                              scal, gW)
    if n_obs == 0:
        return 0.0
    return _emission_missing(y, n_obs, obs, obs_prev, theta_row, g_theta_row, W, L, mats, vecs,
                             wmiss, scal, gW, gSigma)


# --------------------------------------------------------------------------------------
# one subchain
# --------------------------------------------------------------------------------------
@jit
def _subchain(Y, theta, rho, row0, n, first_is_start, W, L, P, log_A, log_pi, const, mats, vecs,
              wmiss, chain, WP, c, scal, obs, obs_prev, q, dq, hth, g_theta, g_rho, gW, gSigma,
              g_alpha, g_beta, g_logpi):
    """Σ ℓ over the counted rows of the subchain in rows ``row0 .. row0+n-1``.

    ``hth`` (≥ row0+n, M) is scratch: each row's copula thresholds ``h = Φ⁻¹(1-θ)``,
    computed once for the two pair cells the row enters."""
    M = W.shape[0] - 1
    total = 0.0
    if n <= 0:
        return 0.0
    for t in range(row0, row0 + n):
        for m in range(M):
            hth[t, m] = -norm_ppf(theta[t, m])
    if first_is_start:
        t = row0
        total += _emission(Y[t], theta[t], g_theta[t], W, L, P, WP, c, const, mats, vecs, wmiss,
                           chain, scal, obs, obs_prev, gW, gSigma)
        for m in range(M):
            th = theta[t, m]
            ne, dne = _neg_entropy(th)
            total += (1.0 - th) * log_pi[m, 0] + th * log_pi[m, 1] - ne
            g_theta[t, m] += log_pi[m, 1] - log_pi[m, 0] - dne
            g_logpi[m, 0] += 1.0 - th
            g_logpi[m, 1] += th
    for t in range(row0 + 1, row0 + n):
        total += _emission(Y[t], theta[t], g_theta[t], W, L, P, WP, c, const, mats, vecs, wmiss,
                           chain, scal, obs, obs_prev, gW, gSigma)
        for m in range(M):
            tp = theta[t - 1, m]
            copula_cells_h(tp, theta[t, m], hth[t - 1, m], hth[t, m], rho[t, m], q, dq)
            ne, dne = _neg_entropy(tp)
            val = ne
            g_prev = dne
            g_cur = 0.0
            g_r = 0.0
            for i in range(4):
                la = log_A[m, i >> 1, i & 1]
                qi = q[i]
                if qi > Q_FLOOR:
                    lq = math.log(qi)
                    dlq = lq + 1.0
                else:
                    lq = LOG_Q_FLOOR
                    dlq = LOG_Q_FLOOR
                val += qi * (la - lq)
                ci = la - dlq
                g_prev += ci * dq[i, 0]
                g_cur += ci * dq[i, 1]
                g_r += ci * dq[i, 2]
            total += val
            g_theta[t - 1, m] += g_prev
            g_theta[t, m] += g_cur
            g_rho[t, m] += g_r
            a = chain[0, m]
            b = chain[1, m]
            g_alpha[m] += (1.0 - a) * q[1] - a * q[0]
            g_beta[m] += (1.0 - b) * q[2] - b * q[3]
    return total


# --------------------------------------------------------------------------------------
# public kernels
# --------------------------------------------------------------------------------------
@jit
def elbo_subchain(Y, theta, rho, first_is_start, W, L, P, log_A, log_pi, g_theta, g_rho, gW,
                  gSigma, g_alpha, g_beta, g_logpi):
    """ELBO terms ``Σ ℓ_t`` of one subchain and their gradients (accumulated).

    Parameters
    ----------
    Y : ndarray, shape (n, D)
        Observations, ``NaN`` = missing. Row 0 is ignored unless ``first_is_start``.
    theta : ndarray, shape (n, M)
        ``q(s_t^m = 1)``, inside ``(0, 1)``.
    rho : ndarray, shape (n, M)
        Copula correlation between rows ``t-1`` and ``t``, inside ``(-1, 1)``; row 0 unused.
    first_is_start : bool
        Row 0 is the first time step of a sequence (contributes ``ℓ_1``); otherwise it
        is a context row that only supplies ``θ_{t-1}`` to row 1.
    W : ndarray, shape (M+1, D)
        Chain contributions, bias last.
    L : ndarray, shape (D, D)
        Lower Cholesky factor of Σ (its diagonal gives ``log|Σ|``; rows with missing
        values factorise ``Σ_oo`` from its rows, :func:`observed_cholesky`).
    P : ndarray, shape (D, D)
        ``Σ⁻¹``.
    log_A : ndarray, shape (M, 2, 2)
        ``log A_m(i, j)``, finite.
    log_pi : ndarray, shape (M, 2)
        ``log p(s_1^m = j)``.
    g_theta, g_rho : ndarray, shape (n, M)
        Out, accumulated: ``∂value/∂θ``, ``∂value/∂ρ`` (``g_rho[0]`` receives nothing).
    gW : ndarray, shape (M+1, D)
        Out, accumulated: ``∂value/∂W``.
    gSigma : ndarray, shape (D, D)
        Out, accumulated: ``∂value/∂Σ`` as a symmetric matrix (entries of Σ taken as
        independent); convert with :func:`sigma_grad_to_chol`.
    g_alpha, g_beta : ndarray, shape (M,)
        Out, accumulated: gradients wrt the logits of ``a_m = A_m(0,1)`` and
        ``b_m = A_m(1,0)``.
    g_logpi : ndarray, shape (M, 2)
        Out, accumulated: ``∂value/∂log_pi``.

    Returns
    -------
    value : float
        Sum of ``ℓ`` over the counted rows.

    Notes
    -----
    MATH.md §4 (ℓ_t, the emission, transition and entropy gradients), with the pair
    cells and their derivatives of §2. The Σ-gradient of the fully observed rows is
    formed once per call as ``½(P S P - n P)``.

    Examples
    --------
    >>> import numpy as np
    >>> M, D, n = 1, 1, 3
    >>> Y = np.zeros((n, D)); theta = np.full((n, M), 0.5); rho = np.zeros((n, M))
    >>> W = np.array([[1.0], [0.0]]); L = np.eye(1); P = np.eye(1)
    >>> log_A = np.log(np.full((M, 2, 2), 0.5)); log_pi = np.log(np.full((M, 2), 0.5))
    >>> g = [np.zeros_like(theta), np.zeros_like(rho), np.zeros_like(W), np.zeros((D, D)),
    ...      np.zeros(M), np.zeros(M), np.zeros((M, 2))]
    >>> v = elbo_subchain(Y, theta, rho, True, W, L, P, log_A, log_pi, *g)
    >>> bool(abs(v - 3 * (-0.5 * np.log(2 * np.pi) - 0.5 * (0.25 + 0.25)))< 1e-12)
    True
    """
    M = W.shape[0] - 1
    D = W.shape[1]
    mats, vecs, wmiss, chain, WP, c, scal, obs, obs_prev, q, dq = _workspace(M, D)
    half_logdet = _prepare(W, L, P, log_A, mats, chain, WP, c)
    const = -0.5 * D * LOG_2PI - half_logdet
    hth = np.empty(theta.shape)
    total = _subchain(Y, theta, rho, 0, Y.shape[0], first_is_start, W, L, P, log_A, log_pi, const,
                      mats, vecs, wmiss, chain, WP, c, scal, obs, obs_prev, q, dq, hth, g_theta,
                      g_rho, gW, gSigma, g_alpha, g_beta, g_logpi)
    _finish(P, mats, chain, WP, scal, gW, gSigma)
    return total


@jit
def elbo_batch(Y, starts, n_pos, seq_start_flags, theta, rho, W, L, P, log_A, log_pi, g_theta,
               g_rho, gW, gSigma, g_alpha, g_beta, g_logpi):
    """:func:`elbo_subchain` over ``B`` subchains in one call (gradients accumulated).

    Layout: subchain ``b`` is rows ``starts[b] .. starts[b] + n_pos[b] - 1`` of ``Y``,
    ``theta``, ``rho`` (and of ``g_theta``, ``g_rho``), row ``starts[b]`` being its
    context row unless ``seq_start_flags[b]``. The subchains are usually stacked back to
    back (``starts = cumsum([0] + n_pos[:-1])``), but any row ranges work, overlapping
    ones included: shared rows then receive the sum of the gradients.

    Parameters
    ----------
    Y : ndarray, shape (N, D)
    starts, n_pos : ndarray of int64, shape (B,)
        First row and number of rows (context row included) of each subchain.
    seq_start_flags : ndarray of bool, shape (B,)
        Whether each subchain's first row is the first step of a sequence.
    theta, rho : ndarray, shape (N, M)
    W, L, P, log_A, log_pi
        As in :func:`elbo_subchain`.
    g_theta, g_rho : ndarray, shape (N, M)
    gW, gSigma, g_alpha, g_beta, g_logpi
        Out, accumulated, as in :func:`elbo_subchain`.

    Returns
    -------
    value : float
        Sum over the subchains of their counted ``ℓ`` terms.

    Notes
    -----
    MATH.md §4 and §5 (one minibatch of subchains); the Σ-gradient of all fully
    observed rows of the batch is formed once.
    """
    M = W.shape[0] - 1
    D = W.shape[1]
    mats, vecs, wmiss, chain, WP, c, scal, obs, obs_prev, q, dq = _workspace(M, D)
    half_logdet = _prepare(W, L, P, log_A, mats, chain, WP, c)
    const = -0.5 * D * LOG_2PI - half_logdet
    hth = np.empty(theta.shape)
    total = 0.0
    for b in range(starts.shape[0]):
        total += _subchain(Y, theta, rho, starts[b], n_pos[b], seq_start_flags[b], W, L, P, log_A,
                           log_pi, const, mats, vecs, wmiss, chain, WP, c, scal, obs, obs_prev,
                           q, dq, hth, g_theta, g_rho, gW, gSigma, g_alpha, g_beta, g_logpi)
    _finish(P, mats, chain, WP, scal, gW, gSigma)
    return total


@jit
def sigma_grad_to_chol(gSigma, L, out):
    """Gradient wrt the Cholesky factor, with the diagonal as ``λ_d = log L_dd``.

    Parameters
    ----------
    gSigma : ndarray, shape (D, D)
        ``∂F/∂Σ`` (symmetrised here: ``G = ½(gSigma + gSigmaᵀ)``).
    L : ndarray, shape (D, D)
        Lower Cholesky factor of Σ.
    out : ndarray, shape (D, D)
        Overwritten: ``(2 G L)_ij`` for ``i > j``, ``(2 G L)_dd L_dd = ∂F/∂λ_d`` on the
        diagonal, 0 above it.

    Notes
    -----
    MATH.md §4: with ``Σ = L Lᵀ``, ``dF = tr(G dΣ) = tr(2 Lᵀ G dL)``, so
    ``∂F/∂L = 2 G L`` on the lower triangle and ``∂F/∂λ_d = L_dd ∂F/∂L_dd``.
    """
    D = L.shape[0]
    for i in range(D):
        for j in range(D):
            if j > i:
                out[i, j] = 0.0
                continue
            acc = 0.0
            for k in range(j, D):  # L[k, j] = 0 for k < j
                acc += (gSigma[i, k] + gSigma[k, i]) * L[k, j]
            if i == j:
                acc *= L[j, j]
            out[i, j] = acc
