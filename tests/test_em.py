"""Exact EM: the E-step's statistics against the product-space HMM (hmmlearn), the
log-likelihood never decreasing, the estimator's method="em"."""
import itertools

import numpy as np
import pytest
from hmmlearn.hmm import GaussianHMM

from streamfhmm import FHMM, exact
from streamfhmm.learn.em import MAX_EM_CHAINS, check_em_chains, exact_e_step, fit_exact_em
from streamfhmm.learn.objective import constrain_params
from streamfhmm.model import FHMMParams

from . import naive


def _product_space_posteriors(params, X, lengths):
    start, trans, means, cov = naive.product_space_hmm(params)
    h = GaussianHMM(n_components=len(start), covariance_type="tied", init_params="", params="")
    h.startprob_, h.transmat_, h.means_, h.covars_ = start, trans, means, cov
    return h.predict_proba(X, lengths)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_e_step_statistics_match_the_product_space(seed):
    print(f"seed={seed}")
    p = FHMMParams.random(3, 2, random_state=seed, noise=0.6)
    X, _ = p.sample(70, random_state=seed + 10)
    lengths = np.array([30, 40])
    est = exact_e_step(p, X, lengths)
    gamma = _product_space_posteriors(p, X, lengths)            # (T, 2^M)
    S = np.ones((8, 4))
    S[:, :3] = naive.joint_states(3)
    gram_ref = S.T @ (gamma.sum(axis=0)[:, None] * S)
    np.testing.assert_allclose(est.gram, gram_ref, rtol=1e-9, atol=1e-9)
    ll, theta, xi = exact.smoothed_marginals(p, X, lengths, pairwise=True)
    assert est.loglik == pytest.approx(ll, rel=1e-12)
    np.testing.assert_allclose(est.theta, gamma @ S[:, :3], atol=1e-9)
    np.testing.assert_allclose(est.xi, xi.sum(axis=0), atol=1e-12)
    # the diagonal of the gram holds Σ_t θ_t (s² = s) and its corner the number of steps
    np.testing.assert_allclose(np.diag(est.gram)[:3], est.theta.sum(axis=0), rtol=1e-10)
    assert est.gram[3, 3] == pytest.approx(70.0, rel=1e-12)


@pytest.mark.parametrize("seed, M, kind", [(0, 2, "full"), (1, 3, "full"), (2, 3, "diag"),
                                           (3, 3, "spherical")])
def test_loglik_never_decreases(seed, M, kind):
    print(f"seed={seed}")
    true = FHMMParams.random(M, 3, random_state=seed, noise=0.5)
    X, _ = true.sample(600, random_state=seed + 100)
    params, history = fit_exact_em(X, n_chains=M, max_iter=25, tol=0.0, random_state=seed,
                                   progress=False, covariance_type=kind)
    ll = np.array([h["loglik"] for h in history])
    print(np.round(ll, 4))
    assert len(ll) == 26
    assert np.all(np.diff(ll) >= -1e-8 * np.abs(ll[:-1])), np.diff(ll)
    assert ll[-1] > ll[0] + 1.0
    # the history's last entry is the returned parameters' log-likelihood
    assert exact.log_likelihood(params, X) == pytest.approx(ll[-1], rel=1e-10)
    S = params.covariance
    if kind != "full":
        assert np.all(S[~np.eye(3, dtype=bool)] == 0.0)
    if kind == "spherical":
        assert np.all(np.diag(S) == S[0, 0])


def test_estimator_method_em_from_the_true_parameters():
    seed = 5
    print(f"seed={seed}")
    true = FHMMParams.random(3, 2, random_state=seed, noise=0.4)
    X, _ = true.sample(1500, random_state=seed + 1)
    m = FHMM.from_params(W=true.W, covariance=true.covariance, transmat=true.transmat,
                         startprob=true.startprob)
    ll_true = m.score(X)
    m.fit(X, method="em", init="params", max_iter=15, progress=False)
    assert m.fit_method_ == "em"
    assert m.history_[0]["loglik"] == pytest.approx(ll_true, rel=1e-12)
    assert m.score(X) >= ll_true                          # maximum likelihood: never worse
    assert m.predict_proba(X).shape == (1500, 3)          # exact posteriors by default


def test_bad_arguments():
    p = FHMMParams.random(2, 2, random_state=0)
    X, _ = p.sample(50, random_state=1)
    with pytest.raises(ValueError, match="n_chains must be given"):
        fit_exact_em(X, progress=False)
    with pytest.raises(ValueError, match="n_chains must be at most 14"):
        exact_e_step(FHMMParams.random(15, 2, random_state=0), X)
    with pytest.raises(ValueError, match="method must be 'svi', 'smf' or 'em'"):
        FHMM(n_chains=2).fit(X, method="exact")
    Xn = X.copy()
    Xn[3, 0] = np.nan
    with pytest.raises(ValueError):
        FHMM(n_chains=2).fit(Xn, method="em", progress=False)
    Xb = X.copy()
    Xb[7, 1] = -1e200        # as FHMM.fit: "W must be finite" after overflow warnings before
    with pytest.raises(ValueError, match=r"X must hold values within .* found -1e\+200 at row 7, column 1"):
        fit_exact_em(Xb, n_chains=2, progress=False)


def test_fit_does_not_depend_on_the_features_units():
    """Exact EM on features of variances 1e-6 and 1e6 of the data's is the rescaled fit
    (the floor on Σ was 1e-9 times the mean variance: the small feature's noise variance,
    1e-7, was floored at 2.8e-4 and the log-likelihood was -4.33 per step, not -1.01)."""
    seed = 11
    print(f"seed={seed}")
    W = np.array([[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]])
    A = np.array([[[0.95, 0.05], [0.10, 0.90]], [[0.90, 0.10], [0.05, 0.95]]])
    true = FHMM.from_params(W=W, covariance=0.1 * np.eye(2), transmat=A)
    X, _ = true.sample(1000, random_state=seed)
    unit = np.array([1e-3, 1e5])   # (product not 1: the bound shifts, see test_smf's twin)
    ref = FHMM(n_chains=2, random_state=5).fit(X, method="em", max_iter=50, tol=1e-9, progress=False)
    got = FHMM(n_chains=2, random_state=5).fit(X * unit, method="em", max_iter=50, tol=1e-9,
                                               progress=False)
    print(f"iterations {len(ref.history_) - 1}")
    assert len(got.history_) == len(ref.history_) < 51
    np.testing.assert_allclose(got.W_ / unit, ref.W_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got.covariance_ / np.outer(unit, unit), ref.covariance_, rtol=1e-6)
    ll = got.score(X * unit) + len(X) * np.log(unit).sum()
    assert ll == pytest.approx(ref.score(X), rel=1e-8)
    assert ref.score(X) / len(X) > true.score(X) / len(X) - 0.01


def test_fhmm_fit_em_refuses_too_many_chains_before_its_start(monkeypatch):
    """FHMM(n_chains=15).fit(method="em") was refused only after its start (k-means and
    a short SMF fit: 12 s on 300,000 rows); now before any of it."""
    from streamfhmm import FHMM

    def no_start(*args, **kw):
        raise AssertionError("the start was computed before the check")
    monkeypatch.setattr(FHMM, "_initial_params", no_start)
    X = np.zeros((50, 2))
    with pytest.raises(ValueError, match="n_chains must be at most 14, got 15"):
        FHMM(n_chains=15).fit(X, method="em", progress=False)


def test_fit_exact_em_refuses_an_n_chains_that_params_contradict():
    """fit_exact_em(params=2 chains, n_chains=5) fitted 2 chains without a word (fit_smf
    refuses it)."""
    seed = 5
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed)
    X, _ = p.sample(50, random_state=seed + 1)
    with pytest.raises(ValueError, match=r"n_chains \(5\) does not match params.n_chains \(2\)"):
        fit_exact_em(X, params=p, n_chains=5, max_iter=1, progress=False)
    with pytest.raises(ValueError, match="n_chains must be at most 14, got 15"):
        fit_exact_em(X, n_chains=15, max_iter=1, progress=False)
    assert fit_exact_em(X, params=p, n_chains=2, max_iter=1, progress=False)[0].n_chains == 2


@pytest.mark.parametrize("seed, offset", [(0, 1e4), (1, 1e4), (1, 1e6)])
def test_one_m_step_is_the_expected_complete_data_maximiser(seed, offset):
    """One EM iteration against its definition, by enumeration of every joint path of two
    sequences (lengths honoured): W solves Σ_t E[ŝŝᵀ] W = Σ_t E[ŝ] yᵀ, Σ is the expected
    residual covariance at that W (taken term by term, not through an identity), the
    transitions are the expected counts, the start probabilities the sequences' first
    marginals. The data's offset must not reach Σ (Cov[ŝ]'s bias row, 0 by definition,
    was taken as the difference of two sums and multiplied by the offset twice)."""
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.7)
    X, _ = p.sample(7, random_state=seed + 20)
    X = X + offset                                # an offset the bias must take exactly
    p = p.replace(W=p.W + np.r_[np.zeros((2, 2)), [[offset, offset]]])
    lengths = [3, 4]
    states = np.c_[naive.joint_states(2), np.ones(4)]
    paths, G, C, xi, first = [], np.zeros((3, 3)), np.zeros((3, 2)), np.zeros((2, 2, 2)), []
    for lo, hi in ((0, 3), (3, 7)):
        Y = X[lo:hi]
        seqs = list(itertools.product(range(4), repeat=len(Y)))
        logs = np.array([naive.log_joint(p, Y, states[list(s), :2]) for s in seqs])
        w = np.exp(logs - np.logaddexp.reduce(logs))
        paths.append((Y, seqs, w))
        for s, wi in zip(seqs, w):
            S = states[list(s)]
            G += wi * S.T @ S
            C += wi * S.T @ Y
            for t in range(1, len(Y)):
                for m in range(2):
                    xi[m, int(S[t - 1, m]), int(S[t, m])] += wi
        first.append(sum(wi * states[s[0], :2] for s, wi in zip(seqs, w)))
    W = np.linalg.solve(G, C)
    Sigma = np.zeros((2, 2))
    for Y, seqs, w in paths:
        for s, wi in zip(seqs, w):
            E = Y - states[list(s)] @ W
            Sigma += wi * E.T @ E
    Sigma /= len(X)
    q, _ = fit_exact_em(X, lengths, params=p, max_iter=1, tol=0.0, progress=False)
    np.testing.assert_allclose(q.W, W, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(q.covariance, Sigma, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(q.transmat, xi / xi.sum(axis=2, keepdims=True), rtol=1e-9)
    np.testing.assert_allclose(q.startprob, np.mean(first, axis=0), rtol=1e-9)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def _em_data(seed=0, T=200):
    p = FHMMParams.random(2, 2, random_state=seed)
    X, _ = p.sample(T, random_state=seed + 1)
    return p, X


def test_14_chains_allowed():
    """Exact EM accepts MAX_EM_CHAINS (14) chains."""
    print("seed=none")
    assert MAX_EM_CHAINS == 14
    assert check_em_chains(14) == 14


def test_large_tol_stops_after_one_iteration():
    """Exact EM stops once the gain is below tol nats per sample."""
    seed = 0
    print(f"seed={seed}")
    p, X = _em_data(seed)
    _, h = fit_exact_em(X, params=p, max_iter=50, tol=10.0, progress=False)
    assert len(h) == 2


def test_zero_budget_no_iteration():
    """Exact EM honours time_budget (0: no iteration)."""
    seed = 0
    print(f"seed={seed}")
    p, X = _em_data(seed)
    _, h = fit_exact_em(X, params=p, max_iter=20, tol=0.0, time_budget=0.0, progress=False)
    assert len(h) == 1


def test_history_iteration_numbers():
    """Exact EM's history numbers its entries 0, 1, 2, ..."""
    seed = 0
    print(f"seed={seed}")
    p, X = _em_data(seed)
    _, h = fit_exact_em(X, params=p, max_iter=3, tol=0.0, progress=False)
    assert [e["iteration"] for e in h] == list(range(len(h)))


def test_start_is_projected():
    """Exact EM projects given params onto covariance_type before anything else."""
    seed = 0
    print(f"seed={seed}")
    p, X = _em_data(seed)
    q, h = fit_exact_em(X, params=p, max_iter=0, covariance_type="diag", progress=False)
    np.testing.assert_allclose(q.covariance, np.diag(np.diag(p.covariance)), rtol=1e-12)
    assert h[0]["loglik"] == exact.log_likelihood(constrain_params(p, "diag"), X)


def test_max_iter_zero():
    """Exact EM accepts max_iter=0 (the start, evaluated)."""
    seed = 0
    print(f"seed={seed}")
    p, X = _em_data(seed)
    q, h = fit_exact_em(X, params=p, max_iter=0, progress=False)
    assert len(h) == 1


def test_negative_tol_refused():
    """Exact EM refuses a negative tol."""
    seed = 0
    print(f"seed={seed}")
    p, X = _em_data(seed)
    with pytest.raises(ValueError, match="tol"):
        fit_exact_em(X, params=p, max_iter=2, tol=-1.0, progress=False)


@pytest.mark.parametrize("progress", [False, True])
def test_no_progress_bar_without_progress(tqdm_calls, progress):
    """fit_exact_em(progress=False) builds no tqdm at all (``tqdm(disable=True)`` still
    starts tqdm's monitor thread, which then runs for the life of the process)."""
    import streamfhmm.learn.em as em_module

    built = tqdm_calls(em_module)
    seed = 8
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed).sample(300, random_state=seed)
    params, history = fit_exact_em(X, n_chains=2, max_iter=3, random_state=seed, progress=progress)
    assert len(built) == int(progress)
    assert len(history) >= 2 and np.isfinite(params.W).all()
