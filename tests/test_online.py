"""Incremental kernels of the streaming engine (MATH.md §3, §5, §7) against the batch
kernels and the dense references of tests/naive_stream.py."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from streamfhmm import exact
from streamfhmm.kernels import exact as kx
from streamfhmm.kernels import online as ko
from streamfhmm.learn.objective import ModelPacker
from streamfhmm.model import FHMMParams
from streamfhmm.network import RecognitionNet

from . import naive_stream as naive
from .naive import brute_force_posterior


def _params(M, D, seed, noise=0.5):
    print(f"params seed={seed}")
    return FHMMParams.random(M, D, random_state=seed, noise=noise, switch=(0.05, 0.3))


def _tables(p):
    Linv, Ut, half_c, const = kx.prepare_emission(p.W, p.L)
    pi = np.empty(1 << p.n_chains)
    kx.joint_startprob(p.startprob, pi)
    return dict(bias=p.W[-1].copy(), Linv=Linv, Ut=Ut, half_c=half_c, const=const, A=p.transmat,
                pi=pi, W=p.W, L=p.L)


def _run(p, X, lag, t0=0):
    """exact_run over X as one sequence starting at stream position t0."""
    M, D = p.n_chains, p.n_features
    K, R = 1 << M, lag + 1
    tb = _tables(p)
    alpha, le, logc = np.zeros((R, K)), np.zeros((R, K)), np.zeros(R)
    theta, mean, tau = np.empty((len(X), M)), np.empty((len(X), D)), np.empty(len(X), np.int64)
    work, beta, g, ytil = np.empty(K), np.empty(K), np.empty(K), np.empty(D)
    n, ll = ko.exact_run(X, t0, t0, lag, alpha, le, logc, work, beta, g, ytil, tb["bias"],
                         tb["Linv"], tb["Ut"], tb["half_c"], tb["const"], tb["A"], tb["pi"], tb["W"],
                         tb["L"], theta, mean, tau)
    tail = np.empty((lag, M))
    tail_mean = np.empty((lag, D))
    t_last = t0 + len(X) - 1
    nt = ko.exact_tail(t_last, max(t0, t_last - lag + 1), alpha, le, tb["A"], beta, g, tb["W"],
                       tail, tail_mean)
    return theta[:n], mean[:n], tau[:n], ll, tail[:nt], tail_mean[:nt]


def test_check_sample_codes():
    assert ko.check_sample(np.array([1.0, 2.0])) == ko.STATUS_OK
    assert ko.check_sample(np.array([1.0, np.nan])) == ko.STATUS_MISSING
    assert ko.check_sample(np.array([np.nan, np.inf])) == ko.STATUS_INFINITE
    assert ko.check_sample(np.array([-np.inf, 0.0])) == ko.STATUS_INFINITE
    assert ko.check_sample(np.array([1e308, -1e308])) == ko.STATUS_OK


@pytest.mark.parametrize("M", [1, 3, 5])
def test_filtering_equals_batch_forward(M):
    p = _params(M, 3, seed=M)
    print(f"seed={10 + M}")
    X, _ = p.sample(200, random_state=10 + M)
    theta, mean, tau, ll, _, _ = _run(p, X, lag=0, t0=7)
    ll_ref, theta_ref = exact.filtered_marginals(p, X)
    np.testing.assert_array_equal(tau, np.arange(200) + 7)
    np.testing.assert_allclose(theta, theta_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    np.testing.assert_allclose(mean, theta @ p.W[:-1] + p.W[-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("lag", [1, 3])
@pytest.mark.parametrize("nan_fraction", [0.0, 0.25])
def test_fixed_lag_against_dense_reference(lag, nan_fraction):
    seed = 3 + lag
    p = _params(3, 3, seed=seed)
    X, _ = p.sample(18, random_state=seed)
    rng = np.random.default_rng(seed)
    print(f"nan seed={seed}")
    mask = rng.random(X.shape) < nan_fraction
    mask[4] = True  # one sample with nothing observed
    X[mask] = np.nan
    theta, _, tau, _, tail, _ = _run(p, X, lag)
    ref = naive.fixed_lag_dense(p.W, p.covariance, p.transmat, p.startprob, X, lag)
    np.testing.assert_array_equal(tau, np.arange(len(X) - lag))
    np.testing.assert_allclose(theta, ref[:len(X) - lag], rtol=0, atol=1e-10)
    # the tail (end of the sequence) is the exact smoothing of the last steps
    np.testing.assert_allclose(tail, ref[len(X) - lag:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("lag", [1, 2, 4])
def test_fixed_lag_state_favoured_by_data_but_unreachable(lag):
    """Chain 0 can never switch on (σ(-800) is 0.0 in float64) and one sample favours it on
    by 730 nats. The backward weights were scaled by the largest emission over all
    states, the excluded one's, so the kept states' underflowed to subnormals and the
    fixed-lag posteriors (push, push_many and the tail) came out NaN. Reference: the
    brute-force smoother (every joint path) on each prefix y_1..y_{τ+lag}."""
    seed = 47
    print(f"seed={seed}")
    W = np.array([[1.0, 0.0], [0.3, -0.8], [0.2, 0.1]])
    L = np.array([[0.1, 0.0], [0.03, 0.1]])
    p = FHMMParams(W=W, L=L, alpha=np.array([-800.0, -1.5]), beta=np.array([2.0, -1.0]),
                   startprob=np.array([0.0, 0.4]))
    assert p.transmat[0, 0, 1] == 0.0
    X, S = p.sample(6, random_state=seed)
    P = np.linalg.inv(p.covariance)
    mean = S[2] @ W[:2] + W[2]
    X[2] = mean + (730.0 / (W[0] @ P @ W[0]) + 0.5) * W[0]
    theta, _, tau, _, tail, _ = _run(p, X, lag)
    T = len(X)
    with np.errstate(divide="ignore"):
        ref = np.array([brute_force_posterior(p, X[:min(T, t + lag + 1)])[1][t]
                        for t in range(T)])
    np.testing.assert_array_equal(tau, np.arange(T - lag))
    np.testing.assert_allclose(theta, ref[:T - lag], rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(tail, ref[T - lag:], rtol=1e-9, atol=1e-300)


def test_tail_equals_smoothing_marginals():
    p = _params(4, 2, seed=21)
    print("seed=22")
    X, _ = p.sample(300, random_state=22)
    lag = 6
    theta, _, _, _, tail, _ = _run(p, X, lag)
    _, smooth = exact.smoothed_marginals(p, X)
    np.testing.assert_allclose(tail, smooth[-lag:], rtol=0, atol=1e-10)
    # fixed-lag smoothing is close to full smoothing but not equal to it
    assert np.abs(theta - smooth[:-lag]).max() < 0.5
    assert np.abs(theta - smooth[:-lag]).max() > 1e-6


def test_short_sequence_tail():
    p = _params(2, 2, seed=5)
    print("seed=6")
    X, _ = p.sample(3, random_state=6)
    theta, _, _, _, tail, _ = _run(p, X, lag=5)
    assert theta.shape == (0, 2)
    np.testing.assert_allclose(tail, exact.smoothed_marginals(p, X)[1], rtol=0, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), M=st.integers(1, 4), D=st.integers(1, 4))
def test_log_emission_missing_matches_scipy(seed, M, D):
    p = _params(M, D, seed)
    rng = np.random.default_rng(seed)
    y = rng.normal(size=D) * 2
    y[rng.random(D) < 0.5] = np.nan
    out = np.empty(1 << M)
    mx = ko.log_emission_missing(y, p.W, p.L, out)
    ref = naive.log_emission_dense(p.W, p.covariance, y)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)
    assert mx == out.max()


def test_log_emission_missing_without_missing_equals_whitened_kernel():
    p = _params(4, 5, seed=8)
    print("seed=8")
    y = np.random.default_rng(8).normal(size=5)
    Linv, Ut, half_c, const = kx.prepare_emission(p.W, p.L)
    a, b = np.empty(16), np.empty(16)
    kx.log_emission(y, p.W[-1].copy(), Linv, Ut, half_c, const, np.empty(5), a)
    ko.log_emission_missing(y, p.W, p.L, b)
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-10)


def _ill_conditioned(eps, seed, M=2):
    """D=3, a valid L whose rows 1 and 2 are parallel up to ``eps``: ``Σ = L Lᵀ`` has an
    eigenvalue of order eps², and with dimension 0 missing the formed
    ``Σ_oo = [[1, 1], [1, 1 + eps²]]`` is singular in float64 for eps ≤ 1e-8. ``W``'s
    columns 1 and 2 are equal (along Σ_oo's well-conditioned direction), so the states'
    densities differ by O(1), not O(1/eps²)."""
    print(f"seed={seed} eps={eps}")
    rng = np.random.default_rng(seed)
    L = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.6, 0.8, eps]])
    W = rng.standard_normal((M + 1, 3))
    W[:, 2] = W[:, 1]
    return FHMMParams(W=W, L=L, alpha=np.array([-1.0, -2.0, -1.2][:M]),
                      beta=np.array([-1.5, -0.5, -1.0][:M]),
                      startprob=np.array([0.3, 0.6, 0.5][:M])), rng


@pytest.mark.parametrize("eps", [1e-7, 1e-8, 1e-9])
def test_log_emission_missing_ill_conditioned_L_against_exact_arithmetic(eps):
    """Σ_oo was factorised from the formed Σ = L Lᵀ: NaN for every state at eps ≤ 1e-8
    (a zero pivot), and at eps = 1e-7 an error of order 1e-2. Now from the rows of L
    (elbo.observed_cholesky). Reference: exact rational arithmetic from L."""
    p, rng = _ill_conditioned(eps, seed=61, M=3)
    X, _ = p.sample(4, random_state=rng)
    X[:, 0] = np.nan
    X[3, 1] = np.nan  # observed {2}: a 1x1 block, no rotation of rows 0..1 needed
    out = np.empty(8)
    for y in X:
        mx = ko.log_emission_missing(y, p.W, p.L, out)
        ref = naive.log_emission_exact(p.W, p.L, y)
        print("kernel", out, "exact", ref)
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)
        assert mx == out.max()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_emission_missing_ordinary_L_against_exact_arithmetic(seed):
    """A well-conditioned Σ, every pattern with 1 ≤ |o| < D (rows of L rotated when a
    missing dimension comes before an observed one): as exact arithmetic to rounding."""
    M, D = 3, 4
    p = _params(M, D, seed=100 + seed)
    rng = np.random.default_rng(seed)
    print(f"y seed={seed}")
    y0 = p.sample(1, random_state=rng)[0][0]
    out = np.empty(1 << M)
    for code in range(1, (1 << D) - 1):
        y = y0.copy()
        y[[(code >> d) & 1 == 1 for d in range(D)]] = np.nan
        ko.log_emission_missing(y, p.W, p.L, out)
        np.testing.assert_allclose(out, naive.log_emission_exact(p.W, p.L, y), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("lag", [0, 2])
def test_exact_run_with_missing_values_and_ill_conditioned_L(lag):
    """exact_run through filter_step: the NaN emissions of samples with dimension 0
    missing were taken for an overflow and left out (the posteriors were the
    predictions, log p(y) = -inf). Against the dense smoother with exact emissions."""
    p, rng = _ill_conditioned(1e-9, seed=62)
    X, _ = p.sample(10, random_state=rng)
    X[[1, 2, 5, 6, 7], 0] = np.nan
    X[8] = np.nan
    theta, _, tau, ll, tail, _ = _run(p, X, lag)
    ref = naive.fixed_lag_dense(p.W, None, p.transmat, p.startprob, X, lag, L=p.L)
    ll_ref = naive.loglik_dense(p.W, None, p.transmat, p.startprob, X, L=p.L)
    print(f"loglik {ll!r} exact {ll_ref!r}")
    np.testing.assert_array_equal(tau, np.arange(len(X) - lag))
    np.testing.assert_allclose(np.concatenate([theta, tail]), ref, rtol=0, atol=1e-6)
    assert ll == pytest.approx(ll_ref, rel=0, abs=1e-5)


def test_ring_write_and_recognition_push_match_forward_one():
    seed = 31
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    M, D, w, C = 3, 2, 5, 8
    net = RecognitionNet(M, D, window=w, n_hidden=4, share="chain").init(random_state=seed)
    net.weights = 0.5 * rng.standard_normal(net.n_weights)
    W = rng.normal(size=(M + 1, D))
    ring = np.zeros((2 * C, D))
    Y = rng.normal(size=(20, D))
    tb, rb, mb = np.zeros((20, M)), np.zeros((20, M)), np.zeros((20, D))
    scratch = np.empty(net.scratch_size)
    for t in range(20):
        emit = t >= w - 1
        st_ = ko.recognition_push(Y[t], ring, t % C, C, emit, (t - w + 1) % C, net.weights,
                                  net.layout, net.mean, net.scale, scratch, W, tb, rb, mb, t)
        assert st_ == ko.STATUS_OK
        np.testing.assert_array_equal(ring[t % C], Y[t])
        np.testing.assert_array_equal(ring[t % C + C], Y[t])
        if emit:
            th, rh = net.forward_window(Y[t - w + 1:t + 1])
            np.testing.assert_allclose(tb[t], th, rtol=0, atol=1e-14)
            np.testing.assert_allclose(rb[t], rh, rtol=0, atol=1e-14)
            np.testing.assert_allclose(mb[t], th @ W[:-1] + W[-1], rtol=0, atol=1e-14)
    before = ring.copy()
    bad = np.array([1.0, np.inf])
    assert ko.recognition_push(bad, ring, 3, C, True, 0, net.weights, net.layout, net.mean,
                               net.scale, scratch, W, tb, rb, mb, 0) == ko.STATUS_INFINITE
    np.testing.assert_array_equal(ring, before)


# ----------------------------------------------------------------------------- learner loop
def _svi_setup(seed, M=2, D=2, w=3, L=4, n_seg=12, scale=1.0):
    print(f"seed={seed}")
    p = _params(M, D, seed)
    X, _ = p.sample(n_seg * (L + w) + 5, random_state=seed)
    net = RecognitionNet(M, D, window=w, n_hidden=3, share="chain").init(random_state=seed)
    net.fit_scaler(X)
    S = L + w
    segs = np.stack([X[j * S:(j + 1) * S] for j in range(n_seg)]) * scale
    packer = ModelPacker(M, D)
    x = np.concatenate([packer.pack(p), net.weights])
    return p, net, segs.reshape(-1, D), S, L, x, packer.size


def _svi_scratch(net, B, L, x, M, D):
    n = B * (L + 1)
    return dict(rows=np.empty(n, np.int64), row_start=np.empty(n, np.int64),
                row_end=np.empty(n, np.int64), offsets=np.empty(B + 1, np.int64),
                first=np.zeros(B, np.bool_), Xw=np.empty((n, net.n_inputs)),
                hidden=np.empty((n, net.n_groups * net.n_hidden)), theta=np.empty((n, M)),
                rho=np.empty((n, M)), g_theta=np.empty((n, M)), g_rho=np.empty((n, M)),
                Yb=np.empty((n, D)), grad=np.empty_like(x), x_prev=np.empty_like(x),
                sq_prev=np.empty_like(x))


def _call_svi_run(Y, slots, S, L, net, x, nm, D, sq, lr, freeze, sc, values):
    return ko.svi_run(Y, slots, S, L, net.window, net.offset, net.mean, net.scale, x, nm,
                      net.layout, D, sq, 0.9, 1e-8, lr, 0, freeze, sc["rows"], sc["row_start"],
                      sc["row_end"], sc["offsets"], sc["first"], sc["Xw"], sc["hidden"],
                      sc["theta"], sc["rho"], sc["g_theta"], sc["g_rho"], sc["Yb"], sc["grad"],
                      sc["x_prev"], sc["sq_prev"], values)


def test_svi_run_matches_svi_step_on_gathered_subchains():
    from streamfhmm.kernels.svi import svi_step
    p, net, Y, S, L, x, nm = _svi_setup(seed=41)
    M, D = p.n_chains, p.n_features
    slots = np.array([[3, 0, 7]], dtype=np.int64)
    B = slots.shape[1]
    x1, sq1 = x.copy(), np.zeros_like(x)
    sc = _svi_scratch(net, B, L, x, M, D)
    values = np.empty(1)
    assert _call_svi_run(Y, slots, S, L, net, x1, nm, D, sq1, np.array([1e-2]), False, sc,
                         values) == 1
    # the same step by hand: subchain b = segment rows off..off+L, context row first
    off = net.offset
    rows = np.concatenate([j * S + off + np.arange(L + 1) for j in slots[0]]).astype(np.int64)
    rs = np.repeat(slots[0] * S, L + 1).astype(np.int64)
    re = rs + S
    offsets = np.arange(B + 1, dtype=np.int64) * (L + 1)
    first = np.zeros(B, np.bool_)
    x2, sq2 = x.copy(), np.zeros_like(x)
    sc2 = _svi_scratch(net, B, L, x, M, D)
    v2 = svi_step(Y, rows, rs, re, offsets, first, net.window, off, net.mean, net.scale, x2, nm,
                  net.layout, M, D, sq2, 0.9, 1e-8, 1e-2, 0, sc2["Xw"], sc2["hidden"], sc2["theta"],
                  sc2["rho"], sc2["g_theta"], sc2["g_rho"], sc2["Yb"], sc2["grad"])
    assert values[0] == v2
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(sq1, sq2)
    # windows never leave their segment: no row index outside [start, end)
    assert (sc["rows"] - net.offset >= sc["row_start"]).all()
    assert (sc["rows"] - net.offset + net.window <= sc["row_end"]).all()


def test_svi_run_freeze_keeps_model_part():
    p, net, Y, S, L, x, nm = _svi_setup(seed=43)
    sc = _svi_scratch(net, 2, L, x, p.n_chains, p.n_features)
    x1, sq = x.copy(), np.zeros_like(x)
    values = np.empty(5)
    print("seed=0")
    slots = np.random.default_rng(0).integers(0, 12, size=(5, 2))
    assert _call_svi_run(Y, slots, S, L, net, x1, nm, p.n_features, sq, np.full(5, 1e-2), True,
                         sc, values) == 5
    np.testing.assert_array_equal(x1[:nm], x[:nm])
    assert np.abs(x1[nm:] - x[nm:]).max() > 1e-4
    assert np.isfinite(values).all()


def test_svi_run_discards_non_finite_steps():
    p, net, Y, S, L, x, nm = _svi_setup(seed=47)
    sc = _svi_scratch(net, 2, L, x, p.n_chains, p.n_features)
    Ybad = Y.copy()
    Ybad[:S] = 1e300  # segment 0 overflows the emission term
    slots = np.array([[0, 1], [2, 3], [0, 0], [4, 5]], dtype=np.int64)
    x1, sq = x.copy(), np.zeros_like(x)
    values = np.empty(4)
    n_ok = _call_svi_run(Ybad, slots, S, L, net, x1, nm, p.n_features, sq, np.full(4, 1e-2),
                         False, sc, values)
    assert n_ok == 2
    assert np.isnan(values[[0, 2]]).all() and np.isfinite(values[[1, 3]]).all()
    assert np.isfinite(x1).all() and np.isfinite(sq).all()
    # the kept steps equal the two good steps taken alone
    x2, sq2 = x.copy(), np.zeros_like(x)
    v2 = np.empty(2)
    assert _call_svi_run(Ybad, slots[[1, 3]], S, L, net, x2, nm, p.n_features, sq2,
                         np.full(2, 1e-2), False, sc, v2) == 2
    np.testing.assert_array_equal(x1, x2)


@pytest.mark.parametrize("cov_mode", [1, 2])
def test_svi_run_keeps_the_covariance_family(cov_mode):
    """svi_run passes cov_mode to each step: equal to svi_step with it, and Σ stays on the
    family (off-diagonal L exactly 0; spherical: every L_dd equal)."""
    from streamfhmm.kernels.svi import constrain_model, svi_step
    p, net, Y, S, L, x, nm = _svi_setup(seed=51, D=3)
    M, D = p.n_chains, p.n_features
    constrain_model(x, np.empty(0), M, D, cov_mode)
    print("seed=51")
    slots = np.random.default_rng(51).integers(0, 12, size=(6, 2))
    sc = _svi_scratch(net, 2, L, x, M, D)
    x1, sq1 = x.copy(), np.zeros_like(x)
    values = np.empty(6)
    n_ok = ko.svi_run(Y, slots, S, L, net.window, net.offset, net.mean, net.scale, x1, nm,
                      net.layout, D, sq1, 0.9, 1e-8, np.full(6, 1e-2), 0, False, sc["rows"],
                      sc["row_start"], sc["row_end"], sc["offsets"], sc["first"], sc["Xw"],
                      sc["hidden"], sc["theta"], sc["rho"], sc["g_theta"], sc["g_rho"], sc["Yb"],
                      sc["grad"], sc["x_prev"], sc["sq_prev"], values, cov_mode)
    assert n_ok == 6
    Lm = ModelPacker(M, D).L(x1[:nm])
    assert (Lm[np.tril_indices(D, -1)] == 0.0).all()
    assert np.abs(np.diag(Lm) - np.diag(ModelPacker(M, D).L(x[:nm]))).max() > 1e-4
    if cov_mode == 2:
        assert (np.diag(Lm) == Lm[0, 0]).all()
    # the first step by hand
    off = net.offset
    B = slots.shape[1]
    rows = np.concatenate([j * S + off + np.arange(L + 1) for j in slots[0]]).astype(np.int64)
    rs = np.repeat(slots[0] * S, L + 1).astype(np.int64)
    offsets = np.arange(B + 1, dtype=np.int64) * (L + 1)
    x2, sq2 = x.copy(), np.zeros_like(x)
    sc2 = _svi_scratch(net, B, L, x, M, D)
    v2 = svi_step(Y, rows, rs, rs + S, offsets, np.zeros(B, np.bool_), net.window, off, net.mean,
                  net.scale, x2, nm, net.layout, M, D, sq2, 0.9, 1e-8, 1e-2, 0, sc2["Xw"],
                  sc2["hidden"], sc2["theta"], sc2["rho"], sc2["g_theta"], sc2["g_rho"],
                  sc2["Yb"], sc2["grad"], cov_mode)
    x3, sq3 = x.copy(), np.zeros_like(x)
    v3 = np.empty(1)
    ko.svi_run(Y, slots[:1], S, L, net.window, net.offset, net.mean, net.scale, x3, nm,
               net.layout, D, sq3, 0.9, 1e-8, np.full(1, 1e-2), 0, False, sc["rows"],
               sc["row_start"], sc["row_end"], sc["offsets"], sc["first"], sc["Xw"],
               sc["hidden"], sc["theta"], sc["rho"], sc["g_theta"], sc["g_rho"], sc["Yb"],
               sc["grad"], sc["x_prev"], sc["sq_prev"], v3, cov_mode)
    assert v3[0] == v2
    np.testing.assert_array_equal(x3, x2)


def test_stream_learner_passes_its_covariance_type():
    from streamfhmm.stream.learner import Learner
    from streamfhmm.stream.reservoir import Reservoir
    p, net, Y, S, L, x, nm = _svi_setup(seed=53, D=3)
    res = Reservoir(50, S, 3, random_state=0)
    for j in range(12):
        res.offer(Y[j * S:(j + 1) * S].copy(), (j + 1) * S)
    learner = Learner(p, net, res, batch_size=3, subchain_length=L, learning_rate=1e-2,
                      covariance_type="spherical")
    L0 = learner.params().L
    assert (L0 == L0[0, 0] * np.eye(3)).all()  # the start is projected
    assert learner.run_steps(20) == 20
    L1 = learner.params().L
    assert (L1 == L1[0, 0] * np.eye(3)).all() and L1[0, 0] != L0[0, 0]
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        Learner(p, net, res, batch_size=3, subchain_length=L, covariance_type="tied")


@pytest.mark.parametrize("lag", [0, 2])
@pytest.mark.parametrize("missing", [False, True])
def test_huge_sample_keeps_the_messages_finite(lag, missing):
    """A finite sample so far from the model that ½‖L⁻¹(y - μ)‖² overflows (1e200,
    1e300): every log emission was -inf and exp(-inf - -inf) put NaN into the forward
    message for good. Its emission is now left out, as the float arithmetic already
    does below the overflow (1e140: the state-dependent terms vanish next to ½‖ỹ‖²):
    the posteriors equal those of 1e140 and of a sample with nothing observed;
    log p(y_t | y_<t) is -inf."""
    p = _params(2, 3, seed=60)
    print("seed=61")
    X, _ = p.sample(40, random_state=61)
    Z = X.copy()
    Z[10] = np.nan
    ref = _run(p, Z, lag=lag)
    out = {}
    for big in (1e140, 1e200, 1e300):
        Y = X.copy()
        Y[10, 0] = big
        if missing:
            Y[10, 2] = np.nan
        theta, mean, tau, ll, tail, _ = _run(p, Y, lag=lag)
        assert np.isfinite(theta).all() and np.isfinite(tail).all() and np.isfinite(mean).all()
        out[big] = (theta, tail, ll)
    assert np.isfinite(out[1e140][2]) and out[1e200][2] == out[1e300][2] == -np.inf
    for big in (1e140, 1e200, 1e300):
        np.testing.assert_allclose(out[big][0], ref[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(out[big][1], ref[4], rtol=0, atol=1e-12)


def test_sample_beyond_the_float_range_after_whitening_is_left_out():
    """Even ỹ overflows (|y| near the float maximum, small noise: NaN log emissions):
    that emission is left out, the message stays a distribution."""
    p = _params(2, 2, seed=62, noise=0.01)
    print("seed=63")
    X, _ = p.sample(30, random_state=63)
    Y = X.copy()
    Y[10] = [1.7e308, -1.7e308]
    theta, _, _, ll, _, _ = _run(p, Y, lag=0)
    assert np.isfinite(theta).all() and ll == -np.inf
    Z = X.copy()
    Z[10] = np.nan
    np.testing.assert_allclose(theta, _run(p, Z, lag=0)[0], rtol=0, atol=1e-12)


# ---- O10: fixed-lag smoothing over a long lag where β would underflow unless rescaled
def test_fixed_lag_long_lag_keeps_beta_scaled():
    """A lag of 120 over data that switches every chain at every step: β must be
    rescaled as it goes back (unscaled it underflowed to 0, and so did the marginals;
    the other tests' lags are at most 6)."""
    M, D = 2, 2
    sw = 1e-3
    params = FHMMParams.from_natural(W=[[3.0, 0.0], [0.0, 3.0], [0.0, 0.0]],
                                     covariance=0.3**2 * np.eye(D),
                                     transmat=[[[1 - sw, sw], [sw, 1 - sw]]] * M)
    T, lag = 160, 120
    S = (np.arange(T)[:, None] + np.arange(M)[None, :]) % 2   # every chain switches every step
    X = S @ params.W[:M] + params.W[M]
    theta, _, tau, _, tail, _ = _run(params, X, lag)
    _, smooth = exact.smoothed_marginals(params, X)
    assert np.isfinite(theta).all() and np.isfinite(tail).all()
    np.testing.assert_allclose(tail, smooth[-lag:], rtol=0, atol=1e-10)


# ---- O14: a step whose gradient is finite but whose square overflows the RMSprop average
def test_svi_run_discards_a_step_whose_running_average_overflows():
    """A finite gradient whose square overflows RMSprop's mean squares (values of 1e80,
    below the reservoir's 1e150 cut): the step is rolled back with sq, not only x."""
    p, net, Y, S, L, x, nm = _svi_setup(seed=47)
    sc = _svi_scratch(net, 2, L, x, p.n_chains, p.n_features)
    Ybig = Y.copy()
    Ybig[:S] *= 1e80      # finite ELBO (~1e160) and gradient (~1e160), gradient² = inf
    slots = np.array([[0, 1], [2, 3]], dtype=np.int64)
    x1, sq = x.copy(), np.zeros_like(x)
    values = np.empty(2)
    n_ok = _call_svi_run(Ybig, slots, S, L, net, x1, nm, p.n_features, sq, np.full(2, 1e-2),
                         False, sc, values)
    assert np.isfinite(sq).all() and np.isfinite(x1).all()
    assert n_ok == 1 and np.isnan(values[0]) and np.isfinite(values[1])
