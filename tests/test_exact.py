"""Exact factorial inference against brute-force enumeration and hmmlearn."""
import numpy as np
import pytest

from streamfhmm import exact
from streamfhmm.exact import bounds_from_lengths
from streamfhmm.kernels import exact as kx
from streamfhmm.model import FHMMParams

from . import naive


def _model(M, D, seed, **kw):
    print(f"seed={seed} M={M} D={D}")
    return FHMMParams.random(M, D, random_state=seed, **kw)


@pytest.mark.parametrize("M,D,T,seed", [(1, 1, 6, 0), (2, 2, 5, 1), (3, 2, 4, 2), (2, 3, 5, 3)])
def test_against_brute_force(M, D, T, seed):
    p = _model(M, D, seed, noise=0.8)
    X, _ = p.sample(T, random_state=seed + 100)
    ll_ref, theta_ref, xi_ref, filt_ref = naive.brute_force_posterior(p, X)
    assert exact.log_likelihood(p, X) == pytest.approx(ll_ref, rel=1e-10)
    ll, theta, xi = exact.smoothed_marginals(p, X, pairwise=True)
    assert ll == pytest.approx(ll_ref, rel=1e-10)
    np.testing.assert_allclose(theta, theta_ref, atol=1e-10)
    np.testing.assert_allclose(xi, xi_ref, atol=1e-10)
    llf, filt = exact.filtered_marginals(p, X)
    assert llf == pytest.approx(ll_ref, rel=1e-10)
    np.testing.assert_allclose(filt, filt_ref, atol=1e-10)


@pytest.mark.parametrize("M,seed", [(1, 10), (2, 11), (4, 12), (6, 13)])
def test_against_hmmlearn_product_space(M, seed):
    hmm = pytest.importorskip("hmmlearn.hmm")
    D = 3
    p = _model(M, D, seed)
    X, _ = p.sample(300, random_state=seed)
    start, trans, means, cov = naive.product_space_hmm(p)
    ref = hmm.GaussianHMM(n_components=len(start), covariance_type="tied", init_params="", params="")
    ref.startprob_, ref.transmat_, ref.means_, ref.covars_ = start, trans, means, cov
    lengths = [100, 150, 50]
    expected = ref.score(X, lengths)
    got = exact.log_likelihood(p, X, lengths)
    print(f"hmmlearn {expected!r} ours {got!r}")
    assert got == pytest.approx(expected, rel=1e-8)
    # smoothing marginals against hmmlearn's posteriors, marginalised per chain
    post = ref.predict_proba(X, lengths)
    theta_ref = post @ naive.joint_states(M)
    _, theta = exact.smoothed_marginals(p, X, lengths)
    np.testing.assert_allclose(theta, theta_ref, atol=1e-8)


def test_loops_reference_agrees():
    p = _model(3, 2, 5)
    print("seed=5")
    X, _ = p.sample(40, random_state=5)
    assert exact.log_likelihood(p, X) == pytest.approx(naive.forward_loglik_loops(p, X), rel=1e-10)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64])
def test_smoother_block_size_does_not_matter(block):
    seed = 21
    p = _model(3, 2, seed, noise=0.5)
    X, _ = p.sample(50, random_state=seed)
    lengths = np.array([17, 33])
    bounds = bounds_from_lengths(lengths)
    M = p.n_chains
    theta = np.zeros((50, M))
    xi = np.zeros((50, M, 2, 2))
    ll = kx.forward_backward(X, bounds, p.W, p.L, p.transmat, p.startprob, block, True, theta, xi, np.zeros(0))
    ll0, theta0, xi0 = exact.smoothed_marginals(p, X, lengths, pairwise=True)
    assert ll == pytest.approx(ll0, rel=1e-12)
    np.testing.assert_allclose(theta, theta0, atol=1e-12)
    np.testing.assert_allclose(xi, xi0, atol=1e-12)
    # pairwise rows are consistent with the marginals
    np.testing.assert_allclose(xi[1:17, :, 1, :].sum(-1), theta[:16], atol=1e-10)
    np.testing.assert_allclose(xi[1:17, :, :, 1].sum(-1), theta[1:17], atol=1e-10)


def test_several_sequences_are_independent():
    p = _model(2, 2, 31)
    print("seed=31")
    X, _ = p.sample(60, random_state=31)
    whole = exact.log_likelihood(p, X, [20, 40])
    parts = exact.log_likelihood(p, X[:20]) + exact.log_likelihood(p, X[20:])
    assert whole == pytest.approx(parts, rel=1e-12)
    _, th = exact.smoothed_marginals(p, X, [20, 40])
    _, th2 = exact.smoothed_marginals(p, X[20:])
    np.testing.assert_allclose(th[20:], th2, atol=1e-12)


def test_extreme_observation_does_not_underflow():
    # an outlier far from every joint mean: every emission underflows in linear space
    p = _model(3, 2, 41, noise=0.05)
    print("seed=41")
    X, _ = p.sample(20, random_state=41)
    X[10] += 50.0
    ll, theta = exact.smoothed_marginals(p, X)
    assert np.isfinite(ll) and np.isfinite(theta).all()
    assert ll == pytest.approx(naive.forward_loglik_loops(p, X), rel=1e-9)


@pytest.mark.parametrize("alpha0", [-800.0, -1e5, -725.0])
@pytest.mark.parametrize("block", [1, 2, 256])
def test_smoother_state_favoured_by_data_but_unreachable(alpha0, block):
    """Chain 0 starts off and switches on with probability σ(α0): exactly 0.0 in float64
    for α0 = -800 and -1e5, subnormal (1.4e-315) for -725. One sample favours chain 0 on
    by 730 nats, so ``e_r(s) / c_r = exp(730)`` overflows: the smoother gave NaN marginals
    (0·inf, inf·A) while the forward pass and log p(y) were right. Reference: enumeration
    of all 4^T joint paths under the same float64 transition matrix (log 0 = -inf)."""
    seed = 47
    print(f"seed={seed} alpha0={alpha0} block={block}")
    W = np.array([[1.0, 0.0], [0.3, -0.8], [0.2, 0.1]])
    L = np.array([[0.1, 0.0], [0.03, 0.1]])
    p = FHMMParams(W=W, L=L, alpha=np.array([alpha0, -1.5]), beta=np.array([2.0, -1.0]),
                   startprob=np.array([0.0, 0.4]))
    X, S = p.sample(4, random_state=seed)
    assert not S[:, 0].any()
    # y_2 = mean + k w_0: chain 0 on instead of off gains (k - ½) w_0ᵀ P w_0 = 730 nats,
    # less than the 800 the prior charges, so the posterior keeps it off (as with a = 0)
    P = np.linalg.inv(p.covariance)
    c = W[0] @ P @ W[0]
    mean = S[2] @ W[:2] + W[2]
    X[2] = mean + (730.0 / c + 0.5) * W[0]
    gain = W[0] @ P @ (X[2] - mean) - 0.5 * c
    assert 709.8 < gain < 800.0
    with np.errstate(divide="ignore"):
        ll_ref, theta_ref, xi_ref, filt_ref = naive.brute_force_posterior(p, X)
    T, M = X.shape[0], p.n_chains
    theta = np.zeros((T, M))
    xi = np.zeros((T, M, 2, 2))
    ll = kx.forward_backward(X, bounds_from_lengths(np.array([T])), p.W, p.L, p.transmat,
                             p.startprob, block, True, theta, xi, np.zeros(0))
    assert ll == pytest.approx(ll_ref, rel=1e-12)
    np.testing.assert_allclose(theta, theta_ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(xi, xi_ref, rtol=0, atol=1e-10)
    ll2, theta2, xi2 = exact.smoothed_marginals(p, X, pairwise=True)
    np.testing.assert_allclose(theta2, theta_ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(xi2, xi_ref, rtol=0, atol=1e-10)
    llf, filt = exact.filtered_marginals(p, X)
    assert exact.log_likelihood(p, X) == llf == pytest.approx(ll_ref, rel=1e-12)
    np.testing.assert_allclose(filt, filt_ref, rtol=0, atol=1e-10)


def test_errors():
    p = _model(2, 2, 0)
    with pytest.raises(ValueError, match="X must have 2 features"):
        exact.log_likelihood(p, np.zeros((5, 3)))
    with pytest.raises(ValueError, match="lengths must sum to the number of samples"):
        exact.log_likelihood(p, np.zeros((5, 2)), [2, 2])
    with pytest.raises(ValueError, match="must not contain NaN"):
        exact.log_likelihood(p, np.full((5, 2), np.nan))
    with pytest.raises(ValueError, match="params must be an FHMMParams"):
        exact.log_likelihood("model", np.zeros((5, 2)))
    big = FHMMParams.random(exact.MAX_EXACT_CHAINS + 1, 1, random_state=0)
    with pytest.raises(ValueError, match="exact inference is limited to n_chains"):
        exact.log_likelihood(big, np.zeros((3, 1)))


def test_smoother_checkpoint_interval():
    """The interval is ⌈√T⌉ of the longest sequence, at most SMOOTH_BLOCK (the block's
    messages were 256 · 2^M doubles for any sequence of 256 steps: 512 MB at M = 18 and
    T = 300), and the marginals do not depend on it."""
    from streamfhmm.exact import SMOOTH_BLOCK, smooth_block

    assert smooth_block(np.array([0, 300])) == 18
    assert smooth_block(np.array([0, 5, 405, 406])) == 20
    assert smooth_block(np.array([0, 10**6])) == SMOOTH_BLOCK == 256
    assert smooth_block(np.array([0, 1])) == 1
    seed = 8
    print(f"seed={seed}")
    p = FHMMParams.random(3, 2, random_state=seed)
    X, _ = p.sample(300, random_state=seed)
    bounds = np.array([0, 120, 300])
    runs = []
    for block in (1, 7, 18, 256):
        theta, xi = np.zeros((300, 3)), np.zeros((300, 3, 2, 2))
        ll = kx.forward_backward(X, bounds, p.W, p.L, p.transmat, p.startprob, block, True, theta, xi,
                                np.zeros(0))
        runs.append((ll, theta, xi))
    for ll, theta, xi in runs[1:]:
        assert ll == pytest.approx(runs[0][0], rel=1e-13)
        np.testing.assert_allclose(theta, runs[0][1], rtol=0, atol=1e-12)
        np.testing.assert_allclose(xi, runs[0][2], rtol=0, atol=1e-12)


def test_filtering_honours_lengths():
    seed = 9
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed)
    X, _ = p.sample(50, random_state=seed)
    ll, both = exact.filtered_marginals(p, X, [20, 30])
    (ll1, one), (ll2, two) = exact.filtered_marginals(p, X[:20]), exact.filtered_marginals(p, X[20:])
    assert ll == pytest.approx(ll1 + ll2, rel=1e-13)
    np.testing.assert_allclose(both, np.r_[one, two], rtol=0, atol=1e-13)


def test_a_sample_whose_density_overflows_is_left_out_as_the_engine_does():
    """One finite value of 1e200 (½‖L⁻¹(y - μ)‖² overflows): batch exact inference made
    the whole posterior and log-likelihood NaN. Its emission is left out, as the
    streaming filter leaves it out: the posteriors are those of the path enumeration
    without that emission, and the log-likelihood is -inf (below the float range)."""
    import itertools
    from scipy.stats import multivariate_normal
    seed = 61
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.5)
    X, _ = p.sample(6, random_state=seed)
    k = 3
    Y = X.copy()
    Y[k, 1] = 1e200
    # the reference: every path's log joint without sample k's emission
    states = naive.joint_states(2)
    seqs = list(itertools.product(range(4), repeat=len(X)))
    logs = []
    for seq in seqs:
        S = states[list(seq)]
        mean_k = S[k] @ p.W[:2] + p.W[2]
        logs.append(naive.log_joint(p, X, S) - multivariate_normal.logpdf(X[k], mean_k, p.covariance))
    logs = np.array(logs)
    w = np.exp(logs - np.logaddexp.reduce(logs))
    theta = sum(wi * states[list(seq)] for seq, wi in zip(seqs, w))
    ll, got = exact.smoothed_marginals(p, Y)
    assert ll == -np.inf and exact.log_likelihood(p, Y) == -np.inf
    np.testing.assert_allclose(got, theta, rtol=0, atol=1e-12)
    ll_f, filt = exact.filtered_marginals(p, Y)
    assert ll_f == -np.inf and np.isfinite(filt).all()
    np.testing.assert_allclose(filt[:k], exact.filtered_marginals(p, X[:k])[1], rtol=0, atol=1e-12)
