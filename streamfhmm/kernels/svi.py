"""One fused SVI step (MATH.md §5): windows → recognition forward → ELBO and its
gradients → network backward → RMSprop, in a single Numba call so that a step of ten
short subchains costs kernel time, not interpreter time.

Flat model vector (the layout of :class:`streamfhmm.learn.objective.ModelPacker`)::

    W (M+1, D) row-major | L's lower triangle row by row, diagonal as log L_dd | α (M,) | β (M,)

The start probabilities are the stationary ``a / (a + b)``.

Covariance families
-------------------
``cov_mode`` selects the family of Σ = L Lᵀ the learner keeps: ``COV_FULL`` (0, any
lower-triangular L), ``COV_DIAG`` (1, L diagonal) or ``COV_SPHERICAL`` (2, L = e^λ I).
The layout does not change: a constrained L is a full one whose off-diagonal entries
are 0 (and, spherical, whose D entries λ_d are equal). :func:`constrain_model` projects
a model vector onto the family, :func:`constrain_model_grad` maps the gradient to the
family's coordinates, and a step that starts on the family stays on it exactly (see
:func:`constrain_model_grad`).
"""
import math
from typing import NamedTuple

import numpy as np

from ._jit import jit
from .elbo import elbo_batch, sigma_grad_to_chol
from .recognition import backward_batch, build_windows, forward_batch


@jit
def _log_sigmoid(x):
    if x >= 0.0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))


@jit
def _sigmoid(x):
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


#: ``cov_mode`` values: full, diagonal and spherical (σ² I) noise covariance
COV_FULL = 0
COV_DIAG = 1
COV_SPHERICAL = 2


@jit
def model_vec_size(M, D):
    return (M + 1) * D + D * (D + 1) // 2 + 2 * M


@jit
def unpack_model(vec, M, D, W, L, P, log_A, log_pi):
    """Fill ``W``, ``L``, ``P = Σ⁻¹``, ``log A`` and stationary ``log π`` from the flat vector."""
    k = 0
    for i in range(M + 1):
        for d in range(D):
            W[i, d] = vec[k]
            k += 1
    for i in range(D):
        for j in range(D):
            L[i, j] = 0.0
    for i in range(D):
        for j in range(i + 1):
            L[i, j] = math.exp(vec[k]) if i == j else vec[k]
            k += 1
    # P = L⁻ᵀ L⁻¹ via the inverse of the triangular factor
    Linv = np.zeros((D, D))
    for j in range(D):
        Linv[j, j] = 1.0 / L[j, j]
        for i in range(j + 1, D):
            acc = 0.0
            for r in range(j, i):
                acc += L[i, r] * Linv[r, j]
            Linv[i, j] = -acc / L[i, i]
    for i in range(D):
        for j in range(D):
            acc = 0.0
            for r in range(max(i, j), D):
                acc += Linv[r, i] * Linv[r, j]
            P[i, j] = acc
    for m in range(M):
        a = vec[k + m]
        b = vec[k + M + m]
        log_A[m, 0, 0] = _log_sigmoid(-a)
        log_A[m, 0, 1] = _log_sigmoid(a)
        log_A[m, 1, 0] = _log_sigmoid(b)
        log_A[m, 1, 1] = _log_sigmoid(-b)
        la = log_A[m, 0, 1]
        lb = log_A[m, 1, 0]
        mx = max(la, lb)
        lab = mx + math.log(math.exp(la - mx) + math.exp(lb - mx))
        log_pi[m, 0] = lb - lab
        log_pi[m, 1] = la - lab


@jit
def assemble_model_grad(vec, M, D, gW, gL, g_alpha, g_beta, g_logpi, out):
    """Flat model gradient; ``g_logpi`` chained through the stationary start probability."""
    k = 0
    for i in range(M + 1):
        for d in range(D):
            out[k] = gW[i, d]
            k += 1
    for i in range(D):
        for j in range(i + 1):
            out[k] = gL[i, j]
            k += 1
    for m in range(M):
        a = _sigmoid(vec[k + m])
        b = _sigmoid(vec[k + M + m])
        g0 = g_logpi[m, 0]
        g1 = g_logpi[m, 1]
        s = a + b
        out[k + m] = g_alpha[m] + g1 * (1.0 - a) - (g0 + g1) * a * (1.0 - a) / s
        out[k + M + m] = g_beta[m] + g0 * (1.0 - b) - (g0 + g1) * b * (1.0 - b) / s


@jit(inline="always")
def _l_diag(k0, i):
    """Index of ``log L_ii`` in a flat vector whose packed lower triangle (row by row)
    starts at ``k0``: row i starts at ``k0 + i (i + 1) / 2``, its diagonal is its last."""
    return k0 + i * (i + 1) // 2 + i


@jit
def constrain_model_grad(grad, M, D, cov_mode):
    """Map a full model gradient to the coordinates of a constrained covariance, in place.

    Parameters
    ----------
    grad : ndarray, shape (n_model,) or longer
        Flat model gradient (layout of the module docstring); only its first
        ``model_vec_size(M, D)`` entries are read and changed.
    M, D : int
    cov_mode : int
        ``COV_FULL`` (nothing changes), ``COV_DIAG`` (the off-diagonal L entries' gradient
        is set to 0) or ``COV_SPHERICAL`` (also: every λ_d entry receives ``Σ_d ∂F/∂λ_d``).

    Notes
    -----
    MATH.md §1, §4–5. Diagonal: the free parameters are λ_1..λ_D with the off-diagonal L
    fixed at 0, and at such an L the partial derivatives ``∂F/∂λ_d`` of the full
    parameterisation are the constrained ones, so zeroing the others is exact.
    Spherical: one shared λ with ``λ_d = λ`` for all d, so by the chain rule
    ``∂F/∂λ = Σ_d ∂F/∂λ_d`` — the sum, the true gradient (the mean would only rescale
    this one coordinate, which RMSprop's normalisation undoes up to its ε). Every λ_d
    slot receives this value: with equal RMSprop accumulators (as a fresh optimiser or
    :func:`constrain_model` start has) each slot then takes bit-for-bit the same step,
    and a zero gradient leaves the off-diagonal entries exactly 0, so the learner
    stays on the family without any projection after the step.
    """
    if cov_mode == COV_FULL:
        return
    k0 = (M + 1) * D
    total = 0.0
    k = k0
    for i in range(D):
        for j in range(i + 1):
            if i == j:
                total += grad[k]
            else:
                grad[k] = 0.0
            k += 1
    if cov_mode == COV_SPHERICAL:
        for i in range(D):
            grad[_l_diag(k0, i)] = total


@jit
def constrain_model(vec, sq, M, D, cov_mode):
    """Project a model vector onto a covariance family, in place.

    Parameters
    ----------
    vec : ndarray, shape (n_model,) or longer
        Flat model vector; its L block is changed.
    sq : ndarray, like ``vec``, or empty
        RMSprop accumulators of ``vec`` (if non-empty): the spherical family's λ_d
        entries are set to their mean so that they take identical steps.
    M, D : int
    cov_mode : int
        ``COV_FULL`` (nothing changes), ``COV_DIAG`` or ``COV_SPHERICAL``.

    Notes
    -----
    Diagonal: ``L ← diag(√Σ_dd)`` with ``Σ_dd = Σ_j L_dj²``; spherical:
    ``L ← √(tr Σ / D) I`` with ``tr Σ = Σ_ij L_ij²`` — the closest member of the family
    in the sense that keeps every variance (diagonal) or the total variance (spherical).
    """
    if cov_mode == COV_FULL:
        return
    k0 = (M + 1) * D
    trace = 0.0
    k = k0
    for i in range(D):
        var = 0.0
        for j in range(i + 1):
            v = math.exp(vec[k]) if i == j else vec[k]
            var += v * v
            k += 1
        trace += var
        if cov_mode == COV_DIAG:
            vec[k - 1] = 0.5 * math.log(var)
            for j in range(i):
                vec[k - 1 - i + j] = 0.0
    if cov_mode == COV_SPHERICAL:
        lam = 0.5 * math.log(trace / D)
        s = 0.0
        if sq.shape[0] > 0:
            for i in range(D):
                s += sq[_l_diag(k0, i)]
            s /= D
        k = k0
        for i in range(D):
            for j in range(i + 1):
                if i == j:
                    vec[k] = lam
                    if sq.shape[0] > 0:
                        sq[k] = s
                else:
                    vec[k] = 0.0
                k += 1


class BatchScratch(NamedTuple):
    """The work arrays of one SVI minibatch (:func:`fill_batch`, :func:`batch_gradient`,
    :func:`svi_step`), in the order those kernels take them."""

    rows: np.ndarray
    row_start: np.ndarray
    row_end: np.ndarray
    offsets: np.ndarray
    first: np.ndarray
    Xw: np.ndarray
    hidden: np.ndarray
    theta: np.ndarray
    rho: np.ndarray
    g_theta: np.ndarray
    g_rho: np.ndarray
    Yb: np.ndarray


def batch_scratch(n_rows: int, n_blocks: int, n_inputs: int, n_hidden_total: int, M: int,
                  D: int) -> BatchScratch:
    """Allocate :class:`BatchScratch` for batches of at most ``n_rows`` window rows in
    ``n_blocks`` subchains (index arrays zeroed, the others uninitialised)."""
    return BatchScratch(
        rows=np.zeros(n_rows, dtype=np.int64), row_start=np.zeros(n_rows, dtype=np.int64),
        row_end=np.zeros(n_rows, dtype=np.int64), offsets=np.zeros(n_blocks + 1, dtype=np.int64),
        first=np.zeros(n_blocks, dtype=np.bool_), Xw=np.empty((n_rows, n_inputs)),
        hidden=np.empty((n_rows, n_hidden_total)), theta=np.empty((n_rows, M)),
        rho=np.empty((n_rows, M)), g_theta=np.empty((n_rows, M)), g_rho=np.empty((n_rows, M)),
        Yb=np.empty((n_rows, D)))


@jit
def fill_batch(q_start, q_stop, q_lo, q_hi, cursor, B, rows, row_start, row_end, offsets, first):
    """Lay out subchains ``cursor .. cursor+B-1`` of the epoch queue as batch rows.

    Returns the number of rows written (``rows`` etc. must hold at least
    ``B · (max block length + 1)``).
    """
    n = 0
    offsets[0] = 0
    for b in range(B):
        s = q_start[cursor + b]
        e = q_stop[cursor + b]
        lo = q_lo[cursor + b]
        hi = q_hi[cursor + b]
        is_start = s == lo
        first[b] = is_start
        r0 = s if is_start else s - 1
        for r in range(r0, e):
            rows[n] = r
            row_start[n] = lo
            row_end[n] = hi
            n += 1
        offsets[b + 1] = n
    return n


@jit
def batch_gradient(Y, rows, row_start, row_end, offsets, first, window, off, mean, scale,
                   x, n_model, layout, M, D, Xw, hidden, theta, rho, g_theta, g_rho, Yb, grad,
                   cov_mode=COV_FULL):
    """Sum over one batch of the ELBO terms and of their gradient (no update).

    Parameters are those of :func:`svi_step` without the optimiser's. ``grad`` receives
    ``Σ_batch ∇ℓ_t`` (a sum, not a mean: distributed learners add the sums of their
    workers before dividing), in the coordinates of ``cov_mode``'s covariance family
    (:func:`constrain_model_grad`).

    Returns
    -------
    value : float
        ``Σ_batch ℓ_t``.
    counted : int
        Number of counted positions (context rows excluded).
    """
    B = offsets.shape[0] - 1
    n = offsets[B]
    W = np.empty((M + 1, D))
    L = np.empty((D, D))
    P = np.empty((D, D))
    log_A = np.empty((M, 2, 2))
    log_pi = np.empty((M, 2))
    model = x[:n_model]
    weights = x[n_model:]
    unpack_model(model, M, D, W, L, P, log_A, log_pi)
    Xw_n = Xw[:n]
    hid = hidden[:n]
    th = theta[:n]
    rh = rho[:n]
    gth = g_theta[:n]
    grh = g_rho[:n]
    Ybn = Yb[:n]
    build_windows(Y, row_start[:n], row_end[:n], rows[:n], window, off, mean, scale, Xw_n)
    forward_batch(Xw_n, weights, layout, th, rh, hid)
    for i in range(n):
        for d in range(D):
            Ybn[i, d] = Y[rows[i], d]
        for m in range(M):
            gth[i, m] = 0.0
            grh[i, m] = 0.0
    gW = np.zeros((M + 1, D))
    gSigma = np.zeros((D, D))
    gL = np.empty((D, D))
    g_alpha = np.zeros(M)
    g_beta = np.zeros(M)
    g_logpi = np.zeros((M, 2))
    starts = offsets[:B]
    n_pos = np.empty(B, dtype=np.int64)
    counted = 0
    for b in range(B):
        n_pos[b] = offsets[b + 1] - offsets[b]
        counted += n_pos[b] - (0 if first[b] else 1)
    value = elbo_batch(Ybn, starts, n_pos, first[:B], th, rh, W, L, P, log_A, log_pi,
                       gth, grh, gW, gSigma, g_alpha, g_beta, g_logpi)
    sigma_grad_to_chol(gSigma, L, gL)
    assemble_model_grad(model, M, D, gW, gL, g_alpha, g_beta, g_logpi, grad[:n_model])
    constrain_model_grad(grad, M, D, cov_mode)
    backward_batch(Xw_n, hid, th, rh, gth, grh, weights, layout, grad[n_model:])
    return value, counted


@jit
def rmsprop_update(x, grad, sq, decay, eps, lr, step_count, n_head=0, head_scale=1.0,
                   head_unit=None):
    """RMSprop ascent in place: ``g² ← γ g² + (1-γ) ∇²``, ``x ← x + η ∇ / (√(g²/(1-γ^k)) + ε)``.

    ``step_count`` is the number of earlier steps (bias correction of ``g²``). The first
    ``n_head`` entries of ``x`` (the model) take steps of ``head_scale · η`` (0 holds
    them; their ``g²`` is tracked all the same). With ``head_unit`` (``n_head``,
    :func:`model_units`), entry i of the head takes ``x_i ← x_i + η u_i ∇_i / (√(g²_i/…)
    + ε / u_i)``, ``u_i = head_unit[i]``: exactly the step RMSprop takes on ``x_i / u_i``
    (the parameter in units where the data have unit standard deviation: its gradient is
    ``u_i ∇_i``), so that the learner does not depend on the data's units.
    Returns False (and changes nothing) if ``grad`` holds a non-finite value.
    """
    for i in range(grad.shape[0]):
        if not np.isfinite(grad[i]):
            return False
    corr = 1.0 - decay ** (step_count + 1)
    for i in range(x.shape[0]):
        g = grad[i]
        s = decay * sq[i] + (1.0 - decay) * g * g
        sq[i] = s
        if i < n_head:
            eta = lr * head_scale
            if head_unit is not None:
                u = head_unit[i]
                x[i] += eta * u * g / (math.sqrt(s / corr) + eps / u)
                continue
        else:
            eta = lr
        x[i] += eta * g / (math.sqrt(s / corr) + eps)
    return True


@jit
def model_units(M, D, scale, out):
    """The unit of each model-vector entry (:func:`rmsprop_update`'s ``head_unit``).

    Parameters
    ----------
    M, D : int
    scale : ndarray, shape (D,)
        The data's standard deviation per feature (the networks' input scaler).
    out : ndarray, shape (≥ (M+1)·D + D(D+1)/2 + 2M,)
        Receives ``scale[d]`` for ``W[k, d]`` (the loadings and the bias are in the
        data's units), ``scale[i]`` for ``L[i, j]``, ``j < i`` (``L = diag(scale) L_z``),
        and 1 for ``log L_dd`` (shifted, not scaled, by a change of units), ``α`` and
        ``β``. A ``scale`` entry that is not positive and finite counts as 1.
    """
    n = 0
    for k in range(M + 1):
        for d in range(D):
            out[n] = _unit(scale[d])
            n += 1
    for i in range(D):
        for j in range(i + 1):
            out[n] = 1.0 if j == i else _unit(scale[i])
            n += 1
    for k in range(2 * M):
        out[n] = 1.0
        n += 1


@jit
def _unit(s):
    return s if s > 0.0 and np.isfinite(s) else 1.0


@jit
def svi_step(Y, rows, row_start, row_end, offsets, first, window, off, mean, scale,
             x, n_model, layout, M, D, sq, decay, eps, lr, step_count,
             Xw, hidden, theta, rho, g_theta, g_rho, Yb, grad, cov_mode=COV_FULL,
             model_lr_scale=1.0):
    """Gradient of the per-position mean ELBO of one batch and an RMSprop ascent step.

    Parameters
    ----------
    Y : ndarray, shape (T, D)
        All data (NaN = missing).
    rows, row_start, row_end, offsets, first
        The batch (see :func:`fill_batch`); only ``offsets[-1]`` rows are used.
    window, off : int
        Window width and offset of the networks (:mod:`.recognition`).
    mean, scale : ndarray, shape (D,)
        The networks' input scaler.
    x : ndarray, shape (n_model + n_weights,)
        Model vector then network weights; updated in place.
    layout : ndarray of int64
        Network weight layout.
    sq : ndarray, like ``x``
        RMSprop's running mean of squared gradients (updated).
    decay, eps, lr : float
        RMSprop's γ, ε and this step's learning rate.
    step_count : int
        Steps taken before this one (bias correction of ``sq``).
    Xw, hidden, theta, rho, g_theta, g_rho, Yb : ndarray
        Scratch with at least ``offsets[-1]`` rows.
    grad : ndarray, like ``x``
        Receives the gradient of the per-position mean ELBO.
    cov_mode : int
        Covariance family (``COV_FULL``, ``COV_DIAG``, ``COV_SPHERICAL``); ``x`` must lie
        on it (:func:`constrain_model`) and stays on it.
    model_lr_scale : float
        The model's steps are ``model_lr_scale`` times the networks' (0 holds the
        model while the networks learn).

    Returns
    -------
    value : float
        The per-position mean ELBO of the batch (before the update), NaN if the
        gradient was not finite (then nothing was updated).

    Notes
    -----
    MATH.md §5: ``∇ = (1/n) Σ_batch ∇ℓ_t`` (n counted positions), then
    :func:`rmsprop_update`, the model's steps in the data's units (:func:`model_units`
    from ``scale``).
    """
    value, counted = batch_gradient(Y, rows, row_start, row_end, offsets, first, window, off,
                                    mean, scale, x, n_model, layout, M, D, Xw, hidden, theta,
                                    rho, g_theta, g_rho, Yb, grad, cov_mode)
    inv = 1.0 / counted
    for i in range(grad.shape[0]):
        grad[i] *= inv
    if not np.isfinite(value):
        return np.nan
    units = np.empty(n_model)
    model_units(M, D, scale, units)
    if not rmsprop_update(x, grad, sq, decay, eps, lr, step_count, n_model, model_lr_scale, units):
        return np.nan
    return value * inv
