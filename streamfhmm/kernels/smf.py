"""Structured mean-field E-step for binary factorial HMMs (MATH.md §6; Ghahramani &
Jordan 1997).

The posterior is approximated by ``q(s) = Π_m q_m(s^m)``, each ``q_m`` a two-state HMM
with the model's ``A_m``, ``π_m`` and a variational emission potential
``exp(s · g_t^m)``. Everything runs in whitened coordinates, ``ỹ_t = L⁻¹(y_t - w_0)``
and ``ũ_m = L⁻¹ w_m``, where

    g_t^m = ũ_mᵀ (ỹ_t - Σ_{n≠m} θ_t^n ũ_n) - ½‖ũ_m‖²  =  ũ_mᵀ r̃_t + (θ_t^m - ½)‖ũ_m‖²

with the whitened residual ``r̃_t = ỹ_t - Σ_n θ_t^n ũ_n`` kept up to date as each
chain's θ changes. One chain update is a forward pass (computing ``g`` on the fly) and
a backward pass that writes the new θ, accumulates the pairwise statistics, updates
the residual and re-sums ``Σ_t ‖r̃_t‖²``: O(T·(2D + c)) per chain, O(T·M·D) per sweep,
O(T·(M + D)) memory.

The messages are not normalised at every step — that would put a division on the
forward recursion's critical path — but rescaled only when their sum falls below
``1e-30``, with the scale factors added to ``log Z``; the posterior of each step and
pair is normalised on the way back, off the recursion's path. This is exact for
transition probabilities down to about 1e-100 (the Python layer refuses smaller ones).
Below that, down to 0.0 (``σ(-α)`` underflows for ``α > 745``) and for start
probabilities of 0 or subnormal size, the recursions stay finite, but a state whose
weight relative to the other falls below float64's range (about e^-745) is dropped,
and with a zero transition probability it cannot come back.

Because the residual sum of squares is re-summed at every chain update, the bound

    F = Σ_t E_q log N(y_t; Wᵀŝ_t, Σ) - Σ_m Σ_t θ_t^m g_t^m + Σ_m log Z_m

is available, exactly, after every chain update at no extra pass over the data.
"""
import math

import numpy as np

from ._jit import jit

#: forward and backward messages are renormalised when their sum falls below this value
_RESCALE = 1e-30
#: a pairwise normaliser below this value is recomputed from normalised messages
_TINY = 1e-250
#: a forward step whose mass falls below this value is redone in logs: ``1 / sm`` must be
#: finite and ``sm`` a normal number (a subnormal one, e.g. ``exp(-730)``, overflows it)
_LOG_PATH = 1e-300
#: the log path keeps both scaled potentials below ``exp(_EMIS_MAX)``
_EMIS_MAX = 700.0
#: the smallest normal float64
_NORMAL_MIN = 2.2250738585072014e-308


@jit
def whiten(X, W, L):
    """Whitened observations and chain rows by forward substitution with ``L``.

    Parameters
    ----------
    X : ndarray, shape (T, D)
    W : ndarray, shape (M+1, D)
        Chain rows, bias last.
    L : ndarray, shape (D, D)
        Lower Cholesky factor of Σ.

    Returns
    -------
    ytil : ndarray, shape (T, D)
        ``L⁻¹(y_t - w_0)`` row by row.
    U : ndarray, shape (M, D)
        ``L⁻¹ w_m`` row by row.

    Notes
    -----
    MATH.md §7 (emission, whitened once per parameter set), used by §6.
    """
    T, D = X.shape
    M = W.shape[0] - 1
    ytil = np.empty((T, D))
    U = np.empty((M, D))
    for t in range(T):
        for i in range(D):
            acc = X[t, i] - W[M, i]
            for j in range(i):
                acc -= L[i, j] * ytil[t, j]
            ytil[t, i] = acc / L[i, i]
    for m in range(M):
        for i in range(D):
            acc = W[m, i]
            for j in range(i):
                acc -= L[i, j] * U[m, j]
            U[m, i] = acc / L[i, i]
    return ytil, U


@jit
def whitened_residual(ytil, U, theta):
    """``r̃_t = ỹ_t - Σ_m θ_t^m ũ_m``.

    Parameters
    ----------
    ytil : ndarray, shape (T, D)
        Whitened, bias-removed observations ``L⁻¹(y_t - w_0)``.
    U : ndarray, shape (M, D)
        Whitened chain rows ``L⁻¹ w_m``.
    theta : ndarray, shape (T, M)

    Returns
    -------
    resid : ndarray, shape (T, D)

    Notes
    -----
    The residual of MATH.md §4 (emission term), in whitened coordinates.
    """
    T, D = ytil.shape
    M = U.shape[0]
    Ut = np.ascontiguousarray(U.T)
    resid = np.empty((T, D))
    for t in range(T):
        for d in range(D):
            acc = ytil[t, d]
            for m in range(M):
                acc -= theta[t, m] * Ut[d, m]
            resid[t, d] = acc
    return resid


@jit
def _xlogy(x, logy):
    """``x · log y`` with ``0 · log 0 = 0``."""
    if x == 0.0:
        return 0.0
    return x * logy


@jit
def _log_cell(a, log_a, f):
    """``log(a · A · f)`` from ``log A``; ``-inf`` if ``a`` or ``f`` is 0."""
    if a > 0.0 and f > 0.0:
        return math.log(a) + log_a + math.log(f)
    return -np.inf


@jit
def smf_e_step(ytil, U, log_A, log_start, bounds, theta, tol, max_sweeps, const,
               chain_terms, xi, log_Z, theta_g, entropy, trace):
    """Structured mean-field sweeps until the largest change of θ is below ``tol``.

    Parameters
    ----------
    ytil : ndarray, shape (T, D)
        Whitened, bias-removed observations ``L⁻¹(y_t - w_0)``.
    U : ndarray, shape (M, D)
        Whitened chain rows ``L⁻¹ w_m``.
    log_A : ndarray, shape (M, 2, 2)
        ``log A_m(i, j)``; ``-inf`` allowed.
    log_start : ndarray, shape (M, 2)
        ``log p(s_1^m = j)``; ``-inf`` allowed.
    bounds : ndarray of int64, shape (n_seq + 1,)
        Sequence ``k`` is ``[bounds[k], bounds[k+1])``; every chain restarts from
        ``π`` at each sequence start.
    theta : ndarray, shape (T, M)
        In: the starting marginals. Out: ``q(s_t^m = 1)``.
    tol : float
        Stop after the first sweep whose largest ``|Δθ|`` is below ``tol``.
    max_sweeps : int
        At most this many sweeps over the chains (at least one is made).
    const : float
        ``-T (D/2 log 2π + Σ_d log L_dd)``, the θ-free part of ``Σ_t E_q log N``.
    chain_terms : ndarray, shape (M,)
        In: ``E_{q_m} log p(s^m) + H[q_m]`` for the starting distribution of each chain
        (NaN if it is not known; the bound then reads NaN until every chain has been
        updated once). Out: ``log Z_m - Σ_t θ_t^m g_t^m`` of the final ``q_m``.
    xi : ndarray, shape (M, 2, 2)
        Out: ``Σ_{t≥2} q(s_{t-1}^m = i, s_t^m = j)`` summed over sequences.
    log_Z : ndarray, shape (M,)
        Out: log normaliser of each chain's forward pass.
    theta_g : ndarray, shape (M,)
        Out: ``Σ_t θ_t^m g_t^m``.
    entropy : ndarray, shape (M,)
        Out: ``H[q_m] = -E_{q_m} log q_m(s^m)``.
    trace : ndarray, shape (1 + max_sweeps · M,)
        Out: ``trace[0]`` the bound at the starting distribution (see ``chain_terms``),
        ``trace[k]`` the bound after the k-th chain update; entries past the last update
        are left untouched.

    Returns
    -------
    n_sweeps : int
    max_delta : float
        Largest ``|Δθ|`` of the last sweep.
    n_updates : int
        Number of chain updates made; the final bound is ``trace[n_updates]``.

    Notes
    -----
    MATH.md §6. The bound after each update is
    ``const - ½ Σ_t (‖r̃_t‖² + Σ_m θ_t^m(1-θ_t^m)‖ũ_m‖²) + Σ_m chain_terms[m]``,
    i.e. ``Σ_t E_q log N - Σ_m Σ_t θ g + Σ_m log Z_m``; each chain update maximises it
    exactly over ``q_m``, so the trace never decreases. ``log Z_m`` and ``Σ_t θ g``
    each grow as ``T‖ũ_m‖²``; their difference is formed as the forward pass's
    rescaling logs plus ``Σ_t (max(g_t, 0) - θ_t g_t)``, whose terms are all ≥ 0, so
    the bound and the entropy keep their precision at any signal-to-noise ratio.
    """
    T, D = ytil.shape
    M = U.shape[0]
    n_seq = bounds.shape[0] - 1
    if (U.shape[1] != D or theta.shape[0] != T or theta.shape[1] != M
            or log_A.shape[0] != M or log_start.shape[0] != M or n_seq < 1
            or bounds[0] != 0 or bounds[n_seq] != T or chain_terms.shape[0] != M
            or xi.shape[0] != M or log_Z.shape[0] != M or theta_g.shape[0] != M
            or entropy.shape[0] != M or trace.shape[0] < 1 + max(max_sweeps, 1) * M):
        raise ValueError("smf_e_step: inconsistent array shapes")

    # chain-major copy of θ: the sweeps read and write one chain at a time
    th = np.empty((M, T))
    for t in range(T):
        for m in range(M):
            th[m, t] = theta[t, m]
    cdiag = np.empty(M)
    for m in range(M):
        acc = 0.0
        for d in range(D):
            acc += U[m, d] * U[m, d]
        cdiag[m] = acc

    resid = whitened_residual(ytil, U, theta)
    rss = 0.0
    for t in range(T):
        for d in range(D):
            rss += resid[t, d] * resid[t, d]
    var_terms = np.empty(M)  # Σ_t θ(1-θ)‖ũ_m‖²
    for m in range(M):
        acc = 0.0
        for t in range(T):
            acc += th[m, t] * (1.0 - th[m, t])
        var_terms[m] = acc * cdiag[m]
    terms = chain_terms.copy()
    trace[0] = const - 0.5 * (rss + var_terms.sum()) + terms.sum()

    alpha = np.empty((T, 2))  # forward messages, each step scaled by an arbitrary factor
    emis = np.empty((T, 2))   # emission potentials (1, e^g), each step scaled by e^{-max(g, 0)}
    g = np.empty(T)

    n_updates = 0
    n_sweeps = 0
    max_delta = np.inf
    for sweep in range(max(max_sweeps, 1)):
        max_delta = 0.0
        for m in range(M):
            A00 = math.exp(log_A[m, 0, 0])
            A01 = math.exp(log_A[m, 0, 1])
            A10 = math.exp(log_A[m, 1, 0])
            A11 = math.exp(log_A[m, 1, 1])
            p0 = math.exp(log_start[m, 0])
            p1 = math.exp(log_start[m, 1])
            c_mm = cdiag[m]
            u = U[m]

            # ---- forward pass ----
            # Messages are left unnormalised (no division on the recursion's critical
            # path) and rescaled only when they approach underflow; the scale factors
            # go into log Z. Messages only shrink: rows of A sum to 1 and potentials ≤ 1.
            # log Z_m = logz + shifts, shifts = Σ_t max(g_t, 0) kept apart: the bound
            # needs log Z_m - Σ_t θ_t g_t, and both sums grow as T‖ũ_m‖² while their
            # difference stays small (see dev below)
            logz = 0.0
            shifts = 0.0
            for k in range(n_seq):
                s = bounds[k]
                e = bounds[k + 1]
                a0 = 0.0
                a1 = 0.0
                for t in range(s, e):
                    acc = 0.0
                    for d in range(D):
                        acc += u[d] * resid[t, d]
                    gt = acc + (th[m, t] - 0.5) * c_mm
                    g[t] = gt
                    ex = math.exp(-abs(gt))
                    pos = gt > 0.0
                    e0 = ex if pos else 1.0
                    e1 = 1.0 if pos else ex
                    shift = gt if pos else 0.0
                    shifts += shift
                    if t == s:
                        pr0 = p0
                        pr1 = p1
                    else:
                        pr0 = a0 * A00 + a1 * A10
                        pr1 = a0 * A01 + a1 * A11
                    a0 = pr0 * e0
                    a1 = pr1 * e1
                    emis[t, 0] = e0
                    emis[t, 1] = e1
                    sm = a0 + a1
                    if sm < _RESCALE:
                        if sm > _LOG_PATH:
                            inv = 1.0 / sm
                            a0 *= inv
                            a1 *= inv
                            logz += math.log(sm)
                        else:
                            # the favoured state has zero or subnormal prior mass (π or A
                            # exactly 0 or 1, σ(-α) for α > 745) and the other one's
                            # potential underflowed: redo in logs. The scale c makes the
                            # larger message 1 unless a potential e^{le - c} (= a/pr, up to
                            # 1/pr for a subnormal pr) would pass e^_EMIS_MAX; a state with
                            # pr = 0 is excluded (potential 0: the backward pass must not
                            # weight it, 0·inf)
                            l0 = math.log(pr0) - shift if pr0 > 0.0 else -np.inf
                            l1 = math.log(pr1) + gt - shift if pr1 > 0.0 else -np.inf
                            le0 = -shift if pr0 > 0.0 else -np.inf
                            le1 = gt - shift if pr1 > 0.0 else -np.inf
                            c = max(max(l0, l1), max(le0, le1) - _EMIS_MAX)
                            a0 = math.exp(l0 - c)
                            a1 = math.exp(l1 - c)
                            emis[t, 0] = math.exp(le0 - c)
                            emis[t, 1] = math.exp(le1 - c)
                            logz += c
                    alpha[t, 0] = a0
                    alpha[t, 1] = a1
                logz += math.log(a0 + a1)

            # ---- backward pass: θ, ξ, residual update, bound pieces ----
            tg = 0.0
            dev = 0.0   # Σ_t (max(g_t, 0) - θ_t g_t): every term ≥ 0, no cancellation
            var_m = 0.0
            rss = 0.0
            x00 = 0.0
            x01 = 0.0
            x10 = 0.0
            x11 = 0.0
            e_start = 0.0
            for k in range(n_seq):
                s = bounds[k]
                e = bounds[k + 1]
                b0 = 1.0
                b1 = 1.0
                for t in range(e - 1, s - 1, -1):
                    a0 = alpha[t, 0]
                    a1 = alpha[t, 1]
                    if t < e - 1:
                        # a state the forward pass excluded at t+1 (its message is 0:
                        # zero prior mass) carries no backward weight, whatever its
                        # potential; otherwise it can dominate b and underflow the rest
                        f0 = emis[t + 1, 0] * b0 if alpha[t + 1, 0] > 0.0 else 0.0
                        f1 = emis[t + 1, 1] * b1 if alpha[t + 1, 1] > 0.0 else 0.0
                        b0 = A00 * f0 + A01 * f1
                        b1 = A10 * f0 + A11 * f1
                        p00 = a0 * A00 * f0
                        p01 = a0 * A01 * f1
                        p10 = a1 * A10 * f0
                        p11 = a1 * A11 * f1
                        n = p00 + p01 + p10 + p11
                        if n < _TINY:
                            # both message sets near their floors: normalise and redo
                            sa = a0 + a1
                            a0 /= sa
                            a1 /= sa
                            sb = b0 + b1
                            f0 /= sb
                            f1 /= sb
                            b0 /= sb
                            b1 /= sb
                            p00 = a0 * A00 * f0
                            p01 = a0 * A01 * f1
                            p10 = a1 * A10 * f0
                            p11 = a1 * A11 * f1
                            n = p00 + p01 + p10 + p11
                            if n < _NORMAL_MIN:
                                # the pair is carried by a transition probability below the
                                # normal range (σ(-α), α > 708): 1/n would overflow; form
                                # the cells in logs, with log A from the logits
                                p00 = _log_cell(a0, log_A[m, 0, 0], f0)
                                p01 = _log_cell(a0, log_A[m, 0, 1], f1)
                                p10 = _log_cell(a1, log_A[m, 1, 0], f0)
                                p11 = _log_cell(a1, log_A[m, 1, 1], f1)
                                lmx = max(max(p00, p01), max(p10, p11))
                                p00 = math.exp(p00 - lmx)
                                p01 = math.exp(p01 - lmx)
                                p10 = math.exp(p10 - lmx)
                                p11 = math.exp(p11 - lmx)
                                n = p00 + p01 + p10 + p11
                        inv = 1.0 / n
                        x00 += p00 * inv
                        x01 += p01 * inv
                        x10 += p10 * inv
                        x11 += p11 * inv
                        q0 = (p00 + p01) * inv
                        q1 = (p10 + p11) * inv
                        sb = b0 + b1
                        # b ≤ 1 while every potential is ≤ 1; only a log-path step (potentials
                        # up to e^_EMIS_MAX) makes it grow, and it must not compound
                        if sb < _RESCALE or sb > 2.0:
                            b0 /= sb
                            b1 /= sb
                    else:
                        inv = 1.0 / (a0 + a1)
                        q0 = a0 * inv
                        q1 = a1 * inv
                    delta = q1 - th[m, t]
                    th[m, t] = q1
                    max_delta = max(max_delta, abs(delta))
                    gt = g[t]
                    tg += q1 * gt
                    dev += q0 * gt if gt > 0.0 else -q1 * gt
                    var_m += q0 * q1          # not q1(1 - q1): q1 may round to 1
                    rr = 0.0
                    for d in range(D):
                        r = resid[t, d] - delta * u[d]
                        resid[t, d] = r
                        rr += r * r
                    rss += rr
                    if t == s:
                        e_start += _xlogy(q0, log_start[m, 0]) + _xlogy(q1, log_start[m, 1])
            xi[m, 0, 0] = x00
            xi[m, 0, 1] = x01
            xi[m, 1, 0] = x10
            xi[m, 1, 1] = x11
            e_trans = (_xlogy(x00, log_A[m, 0, 0]) + _xlogy(x01, log_A[m, 0, 1])
                       + _xlogy(x10, log_A[m, 1, 0]) + _xlogy(x11, log_A[m, 1, 1]))
            log_Z[m] = logz + shifts
            theta_g[m] = tg
            terms[m] = logz + dev        # = log Z_m - Σ_t θ_t g_t
            entropy[m] = terms[m] - e_start - e_trans
            var_terms[m] = var_m * c_mm
            n_updates += 1
            trace[n_updates] = const - 0.5 * (rss + var_terms.sum()) + terms.sum()
        n_sweeps += 1
        if max_delta < tol:
            break

    for m in range(M):
        chain_terms[m] = terms[m]
        for t in range(T):
            theta[t, m] = th[m, t]
    return n_sweeps, max_delta, n_updates
