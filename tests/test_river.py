"""The river adapters: river's estimator checks, the stream contract (each sample pushed
once; previews never commit), the exact and approximate predictive scores against
brute-force references, features, pickling with the learner thread, pipelines, and the
anomaly ranking on a simulated stream."""
import gc
import pickle
import threading
import time
import warnings

import numpy as np
import pytest
from scipy.stats import multivariate_normal

river = pytest.importorskip("river")
from river import checks, compose, linear_model, preprocessing  # noqa: E402

from streamfhmm import FHMM  # noqa: E402
from streamfhmm.adapters.river import (FHMMAnomalyScorer, FHMMTransformer,  # noqa: E402
                                       UnknownFeatureWarning, gaussian_logpdf, mixture_logpdf,
                                       predicted_on_probability)
from streamfhmm.model import FHMMParams  # noqa: E402


# --------------------------------------------------------------------------------------
# helpers and brute-force references (no code from the module under test)
# --------------------------------------------------------------------------------------
def _model(M=2, D=3, seed=0, noise=0.4, window=3, n_hidden=6):
    print(f"model seed={seed}")
    p = FHMMParams.random(M, D, random_state=seed, noise=noise, switch=(0.05, 0.2))
    return FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat,
                            startprob=p.startprob, window=window, n_hidden=n_hidden)


def _dicts(X, names=None):
    names = names or [f"x{d}" for d in range(X.shape[1])]
    return [{k: v for k, v in zip(names, row.tolist()) if v == v} for row in X]


def _states(M):
    return (np.arange(1 << M)[:, None] >> np.arange(M)) & 1  # bit m of k is s^m


def _logpdf_obs(y, mean, S):
    obs = ~np.isnan(y)
    if not obs.any():
        return 0.0
    return multivariate_normal(mean[obs], S[np.ix_(obs, obs)]).logpdf(y[obs])


def naive_filter(p, X):
    """Exact filtering by enumerating the joint states with an explicit 2^M x 2^M
    transition matrix and scipy densities over the observed dimensions.

    ``p``: an FHMMParams, or a list of them, the parameters of each step t (the start
    probabilities are those of step 0; step t's transition leads into s_t).

    Returns theta (T, M) = p(s_t^m = 1 | y_1..t) and logc (T,) = log p(y_t | y_<t)."""
    steps = p if isinstance(p, list) else [p] * len(X)
    M = steps[0].n_chains
    st = _states(M)
    K = len(st)
    theta, logc = np.empty((len(X), M)), np.empty(len(X))
    alpha = None
    for t, (y, q) in enumerate(zip(X, steps)):
        A = q.transmat
        T = np.array([[np.prod([A[m, st[i, m], st[j, m]] for m in range(M)])
                       for j in range(K)] for i in range(K)])
        pi = np.prod(np.where(st == 1, q.startprob, 1 - q.startprob), axis=1)
        means = st @ q.W[:-1] + q.W[-1]
        S = q.covariance
        pred = pi if t == 0 else alpha @ T
        lik = np.exp([_logpdf_obs(y, means[k], S) for k in range(K)])
        joint = pred * lik
        logc[t] = np.log(joint.sum())
        alpha = joint / joint.sum()
        theta[t] = alpha @ st
    return theta, logc


def naive_mixture(y, on_prob, p: FHMMParams):
    """log Σ_s Π_m π_m^{s_m}(1-π_m)^{1-s_m} N(y_o; (Wᵀŝ)_o, Σ_oo), by enumeration."""
    st = _states(p.n_chains)
    w = np.prod(np.where(st == 1, on_prob, 1 - on_prob), axis=1)
    means = st @ p.W[:-1] + p.W[-1]
    return float(np.log(sum(w[k] * np.exp(_logpdf_obs(y, means[k], p.covariance))
                            for k in range(len(st)))))


def naive_moment_gaussian(y, on_prob, p: FHMMParams):
    """log N(y_o; μ_o, C_oo) with μ, C the mean and covariance of the enumerated mixture."""
    st = _states(p.n_chains)
    w = np.prod(np.where(st == 1, on_prob, 1 - on_prob), axis=1)
    means = st @ p.W[:-1] + p.W[-1]
    mu = w @ means
    C = p.covariance + (means - mu).T @ ((means - mu) * w[:, None])
    return float(_logpdf_obs(y, mu, C))


def _learner_threads():
    return [t for t in threading.enumerate() if t.name == "streamfhmm-learner" and t.is_alive()]


def _cold(cls, **kw):
    """A small cold-start adapter: 2 chains, window 3, 4 hidden units, a warm-up of 100
    samples and 20 steps."""
    return cls(n_chains=2, window=3, n_hidden=4, warmup=100, warmup_steps=20, **kw)


def _wait_for(cond, timeout=10.0):
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(autouse=True)
def _no_thread_leak():
    yield
    if _learner_threads():
        gc.collect()  # adapters in reference cycles
    assert _wait_for(lambda: not _learner_threads(), 5.0), "a learner thread outlived its test"


# --------------------------------------------------------------------------------------
# river's own checks
# --------------------------------------------------------------------------------------
class _OfflineCreditCard:
    """Stands in for river.datasets.CreditCard (a 150 MB download) in the anomaly checks:
    numeric features named like its columns, binary labels with ~1 % positives, from two
    switching sources plus noise; a positive is a 10-sigma spike in one feature. Eight
    features instead of 30 keep the checks' 20,000 samples fast."""

    def take(self, n):
        rng = np.random.default_rng(7)
        names = ["Time"] + [f"V{i}" for i in range(1, 7)] + ["Amount"]
        D = len(names)
        W = rng.normal(size=(3, D))
        s = np.zeros(2, int)
        for _ in range(n):
            s = np.where(rng.random(2) < 0.05, 1 - s, s)
            y = W[2] + s @ W[:2] + 0.3 * rng.normal(size=D)
            label = bool(rng.random() < 0.01)
            if label:
                y[rng.integers(D)] += 3.0
            yield dict(zip(names, y.tolist())), label


_CHECKED = [pytest.param(cls, i, id=f"{cls.__name__}-{'learn' if p['learn'] else 'fixed'}")
            for cls in (FHMMTransformer, FHMMAnomalyScorer)
            for i, p in enumerate(cls._unit_test_params())]


@pytest.mark.parametrize("cls, i", _CHECKED)
def test_check_estimator(cls, i, monkeypatch):
    monkeypatch.setattr(river.datasets, "CreditCard", _OfflineCreditCard)
    model = cls(**list(cls._unit_test_params())[i])
    print(f"{model!r} skips={sorted(model._unit_test_skips())}")
    # check_emerging_features learns samples missing 3 features, then transforms full
    # ones: the unknown keys warn (once per instance)
    with pytest.warns(UnknownFeatureWarning):
        checks.check_estimator(model)


# --------------------------------------------------------------------------------------
# the stream contract
# --------------------------------------------------------------------------------------
def _settled(engine, pause=0.2):
    """No snapshot was published for ``pause`` seconds."""
    version = engine.version
    time.sleep(pause)
    return engine.version == version


@pytest.mark.parametrize("learn", [False, True], ids=["fixed", "learning"])
@pytest.mark.parametrize("posterior", ["exact", "recognition"])
def test_preview_commits_nothing_and_matches_the_committed_result(posterior, learn):
    """A preview of x equals what learning x commits when the parameters are the same for
    both: always with learn=False; with learning on (a snapshot published after every
    learner step, at full duty) whenever no snapshot was published in between, and for
    every sample once learning is paused. In exact mode the adapter stepped a forward
    message of its own with the snapshot it read after each push: whenever the learner
    published in between, the previews (and committed scores) drifted from the engine's
    filter for many samples."""
    m = _model(seed=1)
    T, pause_at = (1100, 900) if learn else (300, None)
    X, _ = m.params_.sample(T, random_state=2)
    print("data seed=2")
    X[np.random.default_rng(3).random(X.shape) < 0.1] = np.nan  # some missing values
    xs = _dicts(X)
    engine_params = ({"snapshot_interval": 1, "learner_duty": 1.0, "net_burnin": 0} if learn
                     else None)
    tr = FHMMTransformer(model=m, posterior=posterior, learn=learn, warmup=100,
                         warmup_steps=50, seed=0, features=("x0", "x1", "x2"),
                         engine_params=engine_params)
    # nothing learnt yet: a fitted exact model has no warm-up (x is the first sample)
    assert (tr.transform_one(xs[0]) == {}) is (posterior == "recognition")
    gaps, paused = [], []
    for t, x in enumerate(xs):
        if t == pause_at:
            tr.learning = False
            assert _wait_for(lambda: _settled(tr.engine))
        elif learn and t < pause_at:
            if t == 101:   # past the warm-up: the learner publishes (its kernel compiled:
                v0 = tr.engine.version   # on an empty cache that takes a minute)
                assert _wait_for(lambda: tr.engine.version > v0, timeout=600)
            time.sleep(0.002)  # a stream slow enough for the learner to publish in between
        version = tr.engine.version if tr.engine is not None else 0
        first = tr.transform_one(x)
        if first:
            n = tr.engine.n_samples if tr.engine is not None else 0
            again = tr.transform_one(x)
            assert (tr.engine.n_samples if tr.engine is not None else 0) == n  # pure
        assert tr.learn_one(x) is None
        committed = tr.transform_one(x)  # the same dict: the committed posterior
        if first and tr.engine.version == version:  # the same parameters for both
            assert again == first
            gaps.append(max(abs(first[k] - committed[k]) for k in committed))
            if pause_at is not None and t >= pause_at:
                paused.append(t)
        if committed:
            # an equal dict that is not the one learnt is the NEXT sample's preview
            assert tr.transform_one(dict(x)) != committed
    assert tr.engine.metrics()["samples"] == len(xs)  # every sample pushed once
    print(f"posterior={posterior} learn={learn}: {len(gaps)} previews compared, "
          f"{tr.engine.version} snapshots published, max |preview - committed| = "
          f"{max(gaps):.2e}")
    assert len(gaps) >= (len(xs) if posterior == "exact" and not learn else 150)
    if learn:
        assert tr.engine.version >= 100      # the learner published all along
        assert paused == list(range(pause_at, len(xs)))
    assert max(gaps) < 1e-12
    tr.close()


def test_exact_transformer_and_scorer_against_brute_force():
    """Committed results and previews, the first sample's included: a fitted model with
    exact filtering has no warm-up, and with the features given the first sample was
    scored 0.0 (and transformed to {}) before its learn_one, so that the prequential
    scores missed -log p(x_1)."""
    m = _model(M=2, D=3, seed=4)
    X, _ = m.params_.sample(120, random_state=5)
    print("data seed=5")
    X[np.random.default_rng(6).random(X.shape) < 0.15] = np.nan
    X[17] = np.nan  # nothing observed
    theta, logc = naive_filter(m.params_, X)
    xs = _dicts(X)
    feats = ("x0", "x1", "x2")
    tr = FHMMTransformer(model=m, posterior="exact", learn=False, features=feats)
    sc = FHMMAnomalyScorer(model=m, learn=False, features=feats)  # "auto": exact for M <= 12
    got_theta, got_score, previews, theta_previews = [], [], [], []
    for x in xs:
        previews.append(sc.score_one(x))
        theta_previews.append([tr.transform_one(x)[f"chain_{j}"] for j in range(2)])
        tr.learn_one(x)
        sc.learn_one(x)
        got_theta.append([tr.transform_one(x)[f"chain_{j}"] for j in range(2)])
        got_score.append(sc.score_one(x))
    got_theta, got_score = np.array(got_theta), np.array(got_score)
    print("max theta error", np.abs(got_theta - theta).max(),
          "max score error", np.abs(got_score + logc).max())
    np.testing.assert_allclose(got_theta, theta, atol=1e-10)
    np.testing.assert_allclose(got_score, -logc, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(previews, got_score, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(theta_previews, got_theta, rtol=0, atol=1e-12)
    assert got_score[17] == 0.0
    # with nothing missing the scores sum to the exact log-likelihood of the model, the
    # committed ones and the prequential ones (each sample scored before it is learnt)
    Y, _ = m.params_.sample(200, random_state=8)
    print("data seed=8")
    sc2 = FHMMAnomalyScorer(model=m, learn=False)
    sc3 = FHMMAnomalyScorer(model=m, learn=False, features=feats)
    total = prequential = 0.0
    for x in _dicts(Y):
        prequential -= sc3.score_one(x)
        sc3.learn_one(x)
        sc2.learn_one(x)
        total -= sc2.score_one(x)
    print(f"sum of -scores {total:.10f}, prequential {prequential:.10f}, "
          f"FHMM.score {m.score(Y):.10f}")
    assert total == pytest.approx(m.score(Y), rel=1e-10)
    assert prequential == pytest.approx(m.score(Y), rel=1e-10)
    for a in (tr, sc, sc2, sc3):
        a.close()


def test_exact_committed_state_comes_from_the_parameters_of_the_push():
    """Exact filtering while the parameters change: the committed posterior, the
    committed score and the next preview follow the parameters the engine filtered each
    sample with. The learner thread may publish a snapshot at any time, also between the
    engine's push and the adapter's reading of it; here one is published right after
    every push, alternating two parameter sets (as the thread's publish does, by setting
    the engine's snapshot). The adapter stepped a forward message of its own with the
    snapshot it read after the push: the next sample's parameters. Against brute-force
    filtering with the parameters of each step."""
    from streamfhmm.stream.learner import make_snapshot
    m = _model(M=2, D=3, seed=41)
    other = FHMMParams.random(2, 3, random_state=42, noise=0.4, switch=(0.05, 0.2))
    X, _ = m.params_.sample(60, random_state=43)
    print("other parameters seed=42, data seed=43")
    X[np.random.default_rng(44).random(X.shape) < 0.1] = np.nan
    print("missing values seed=44")
    xs = _dicts(X)
    snaps = [make_snapshot(0, m.params_, None, True), make_snapshot(1, other, None, True)]
    feats = ("x0", "x1", "x2")
    tr = FHMMTransformer(model=m, posterior="exact", learn=False, features=feats)
    sc = FHMMAnomalyScorer(model=m, posterior="exact", learn=False, features=feats)
    used = {tr: [], sc: []}   # the parameters each push filtered with

    def publish_after_every_push(adapter):
        engine = adapter.engine
        push = engine.push

        def push_then_publish(x):
            used[adapter].append(engine.snapshot.params)
            out = push(x)
            engine._snapshot = snaps[len(used[adapter]) % 2]
            return out
        engine.push = push_then_publish

    got = {tr: [], sc: []}
    previews = {tr: [], sc: []}
    for t, x in enumerate(xs):
        previews[tr].append([tr.transform_one(x)[f"chain_{j}"] for j in range(2)])
        previews[sc].append(sc.score_one(x))
        if t == 0:  # (no engine before the first learn_one)
            used[tr].append(m.params_)
            used[sc].append(m.params_)
        for a in (tr, sc):
            a.learn_one(x)
            if t == 0:
                publish_after_every_push(a)
                a.engine._snapshot = snaps[1]
        got[tr].append([tr.transform_one(x)[f"chain_{j}"] for j in range(2)])
        got[sc].append(sc.score_one(x))
    assert used[tr][1] is other and used[tr][2] is m.params_  # they did change
    theta, logc = naive_filter(used[tr], X)
    _, logc_sc = naive_filter(used[sc], X)     # (the scorer's own parameters, push by push)
    print("max score error", np.abs(np.array(got[sc]) + logc_sc).max(),
          "max preview error", np.abs(np.array(previews[sc]) + logc_sc).max())
    np.testing.assert_allclose(got[tr], theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got[sc], -logc_sc, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(previews[tr], theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(previews[sc], -logc_sc, rtol=1e-10, atol=1e-10)
    tr.close()
    sc.close()


def test_exact_cold_start_filters_the_whole_warmup():
    """A cold exact scorer: the forward message the first scores after the warm-up come
    from covers every warm-up sample, filtered with the parameters fitted on the
    warm-up. Against brute-force filtering of the stream from its start with the
    engine's starting parameters (held fixed: learn=False)."""
    m = _model(M=2, D=3, seed=45)
    X, _ = m.params_.sample(130, random_state=46)
    print("data seed=46, adapter seed=0")
    sc = _cold(FHMMAnomalyScorer, learn=False, seed=0)
    previews, committed = [], []
    for t, x in enumerate(_dicts(X)):
        previews.append(sc.score_one(x))
        sc.learn_one(x)
        committed.append(sc.score_one(x))
        if t == 99:
            version = sc.engine.version  # the warm-up's fit
    assert sc.engine.version == version  # the starting parameters all along
    _, logc = naive_filter(sc.engine.params, X)
    print("first scores after the warm-up", np.round(committed[99:104], 4),
          "reference", np.round(-logc[99:104], 4))
    assert previews[:100] == [0.0] * 100 and committed[:99] == [0.0] * 99
    np.testing.assert_allclose(committed[99:], -logc[99:], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(previews[100:], -logc[100:], rtol=1e-10, atol=1e-10)
    sc.close()


def test_exact_scores_with_missing_values_and_ill_conditioned_L():
    """A valid L with rows 1 and 2 parallel up to 1e-9 and dimension 0 missing: the
    formed Σ_oo is singular in float64 and its Cholesky made the missing-value emission
    NaN: score_one gave inf (the filter took it for an overflow), mixture_logpdf NaN.
    Against enumeration with the densities in exact rational arithmetic from L."""
    from scipy.special import logsumexp

    from .naive_stream import filtered_dense, log_emission_exact, loglik_dense
    seed = 59
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    L = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.6, 0.8, 1e-9]])
    W = rng.standard_normal((3, 3))
    W[:, 2] = W[:, 1]  # the states' densities differ by O(1) along Σ_oo's good direction
    p = FHMMParams(W=W, L=L, alpha=np.array([-1.0, -2.0]), beta=np.array([-1.5, -0.5]),
                   startprob=np.array([0.3, 0.6]))
    m = FHMM(n_chains=2, window=3, n_hidden=4)
    m._set_params(p)
    X, _ = p.sample(8, random_state=rng)
    X[[1, 2, 5], 0] = np.nan
    ll = [0.0] + [loglik_dense(p.W, None, p.transmat, p.startprob, X[:t + 1], L=p.L)
                  for t in range(len(X))]
    theta = filtered_dense(p.W, None, p.transmat, p.startprob, X, L=p.L)
    feats = ("x0", "x1", "x2")
    tr = FHMMTransformer(model=m, posterior="exact", learn=False, features=feats)
    sc = FHMMAnomalyScorer(model=m, posterior="exact", learn=False, features=feats)
    for t, x in enumerate(_dicts(X)):
        tr.learn_one(x)
        sc.learn_one(x)
        got = [tr.transform_one(x)[f"chain_{j}"] for j in range(2)]
        np.testing.assert_allclose(got, theta[t], rtol=0, atol=1e-6)
        assert sc.score_one(x) == pytest.approx(-(ll[t + 1] - ll[t]), rel=0, abs=1e-5)
    tr.close()
    sc.close()
    on = np.array([0.3, 0.7])
    w = np.log(np.where(_states(2) == 1, on, 1 - on)).sum(axis=1)
    for y in X[[1, 2, 5]]:
        want = float(logsumexp(w + log_emission_exact(p.W, p.L, y)))
        assert mixture_logpdf(y, on, p) == pytest.approx(want, rel=0, abs=1e-6)


@pytest.mark.parametrize("eps", [1e-7, 1e-8, 1e-9])
def test_gaussian_predictive_with_an_ill_conditioned_L(eps):
    """The moment-matched predictive for a valid L whose Σ = L Lᵀ has eigenvalues ~1 and
    ~eps²: the Cholesky of the formed covariance failed (LinAlgError from score_one for
    eps ≤ 1e-8, even with every value observed, and 1e-2 off at eps = 1e-7). Against
    exact rational arithmetic: C = L Lᵀ + Σ_m π_m(1-π_m) w_m w_mᵀ formed as fractions."""
    from fractions import Fraction

    from .naive_elbo import log_gauss_fraction
    seed = 61
    print(f"seed={seed} eps={eps}")
    rng = np.random.default_rng(seed)
    L = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.6, 0.8, eps]])
    W = rng.standard_normal((3, 3))
    W[:, 2] = W[:, 1]       # the chains move along Σ's well-conditioned direction
    p = FHMMParams(W=W, L=L, alpha=np.zeros(2), beta=np.zeros(2), startprob=np.full(2, 0.5))
    F = np.vectorize(lambda v: Fraction(float(v)), otypes=[object])
    for on in ([1.0, 0.0], [0.3, 0.6]):
        on = np.array(on)
        y = W[-1] + on @ W[:-1] + L @ rng.standard_normal(3)
        v = F(on) * (1 - F(on))
        C = F(L) @ F(L).T + (F(W[:-1]).T * v) @ F(W[:-1])
        mu = F(W[-1]) + F(on) @ F(W[:-1])
        for obs in ([0, 1, 2], [1, 2]):
            yy = np.full(3, np.nan)
            yy[obs] = y[obs]
            want = log_gauss_fraction(list(F(y[obs]) - mu[obs]), C[np.ix_(obs, obs)].tolist())
            assert gaussian_logpdf(yy, on, p) == pytest.approx(want, rel=0, abs=1e-6)


def test_predictive_densities_against_enumeration():
    rng = np.random.default_rng(11)
    print("seed=11")
    for M, D in ((1, 2), (3, 4), (4, 3)):
        p = FHMMParams.random(M, D, random_state=rng)
        for trial in range(3):
            y = p.sample(1, random_state=rng)[0][0] + rng.normal(0, 0.5, D)
            if trial == 2:
                y[rng.integers(D)] = np.nan
            theta = rng.random(M)
            pi = predicted_on_probability(theta, p)
            A = p.transmat
            want = np.array([[1 - t, t] @ A[m] for m, t in enumerate(theta)])[:, 1]
            np.testing.assert_allclose(pi, want, rtol=1e-14)
            assert mixture_logpdf(y, pi, p) == pytest.approx(naive_mixture(y, pi, p), rel=1e-10)
            assert gaussian_logpdf(y, pi, p) == pytest.approx(naive_moment_gaussian(y, pi, p),
                                                              rel=1e-10)
        np.testing.assert_allclose(predicted_on_probability(None, p), p.startprob)
        # nothing observed: density 1
        assert mixture_logpdf(np.full(D, np.nan), pi, p) == 0.0
        assert gaussian_logpdf(np.full(D, np.nan), pi, p) == 0.0


@pytest.mark.parametrize("predictive", ["mixture", "gaussian"])
@pytest.mark.parametrize("committed", [False, True], ids=["preview", "committed"])
def test_recognition_scorer_uses_the_predicted_chain_probabilities(predictive, committed):
    """score_one(x) = -log p̂(x | θ_{t-1}) with θ_{t-1} the filtered (recognition)
    posterior of the sample before x, read from a transformer with the same engine: both
    before x is learnt (a preview) and after (x is the dict just learnt: its committed
    score, given the samples before it, not θ_t, which has seen x already)."""
    m = _model(M=2, D=3, seed=12)
    X, _ = m.params_.sample(160, random_state=13)
    print("data seed=13, adapter seed=3")
    kw = dict(model=m, posterior="recognition", learn=False, warmup=80, warmup_steps=30, seed=3)
    tr = FHMMTransformer(**kw)
    sc = FHMMAnomalyScorer(predictive=predictive, **kw)
    ref = naive_mixture if predictive == "mixture" else naive_moment_gaussian
    theta_prev, errs = None, []
    for x, row in zip(_dicts(X), X):
        if committed:
            tr.learn_one(x)
            sc.learn_one(x)
        if theta_prev is not None:
            params = sc.engine.params
            want = -ref(row, predicted_on_probability(theta_prev, params), params)
            errs.append(abs(sc.score_one(x) - want))
        if not committed:
            tr.learn_one(x)
            sc.learn_one(x)
        if tr.ready:
            out = tr.transform_one(x)
            theta_prev = np.array([out["chain_0"], out["chain_1"]])
    tr.close()
    sc.close()
    print(f"{predictive}, {'committed' if committed else 'preview'}: {len(errs)} scores, "
          f"max error {max(errs):.2e}")
    assert len(errs) > 70 and max(errs) < 1e-9


# --------------------------------------------------------------------------------------
# features
# --------------------------------------------------------------------------------------
def test_feature_order_missing_and_extra_keys():
    m = _model(M=2, D=3, seed=14)
    X, _ = m.params_.sample(60, random_state=15)
    print("data seed=15")
    theta, _ = naive_filter(m.params_, X)
    names = ["b", "c", "a"]  # the model's columns 0, 1, 2
    # `features` fixes the column order; the dicts list their keys in any order
    tr = FHMMTransformer(model=m, posterior="exact", learn=False, features=tuple(names))
    rng = np.random.default_rng(16)
    got = []
    for row in X:
        x = {names[j]: row[j] for j in rng.permutation(3)}
        tr.learn_one(x)
        got.append([tr.transform_one(x)[f"chain_{j}"] for j in range(2)])
    assert tr.features_ == ("b", "c", "a")
    np.testing.assert_allclose(got, theta, atol=1e-10)
    tr.close()

    # default order: the first dict's keys sorted; a missing key is a missing value
    Xm = X.copy()
    Xm[5, 1] = Xm[9, 0] = np.nan
    theta_m, _ = naive_filter(m.params_, Xm)
    perm = m.params_.replace(W=m.params_.W[:, [2, 0, 1]])  # columns in order a, b, c
    tr2 = FHMMTransformer(model=FHMM.from_params(W=perm.W, covariance=m.covariance_[
        np.ix_([2, 0, 1], [2, 0, 1])], transmat=perm.transmat, startprob=perm.startprob,
        window=3), posterior="exact", learn=False)
    got = []
    for t, row in enumerate(Xm):
        x = {"c": row[1], "b": row[0], "a": row[2]}
        if t == 5:
            x = {"b": row[0], "a": row[2]}  # key "c" missing
        if t == 9:
            x = {"c": row[1], "b": None, "a": row[2]}  # None: missing
        tr2.learn_one(x)
        got.append([tr2.transform_one(x)[f"chain_{j}"] for j in range(2)])
    assert tr2.features_ == ("a", "b", "c")
    np.testing.assert_allclose(got, theta_m, atol=1e-10)
    assert tr2.metrics()["missing_value_samples"] == 2

    # an unknown key: one warning, then counted; the value is ignored
    y = {"a": 0.1, "b": 0.2, "c": 0.3}
    base = tr2.transform_one(y)
    with pytest.warns(UnknownFeatureWarning, match="'zz'"):
        assert tr2.transform_one(dict(y, zz=5.0)) == base
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        tr2.learn_one(dict(y, zz=5.0))
        tr2.learn_one(dict(y, yy=1.0, zz=2.0))
    assert tr2.metrics()["unknown_key_samples"] == 2
    with pytest.raises(ValueError, match="'a' has a value of type str"):
        tr2.learn_one({"a": "1.5", "b": 0.0, "c": 0.0})
    with pytest.raises(ValueError, match="finite"):
        tr2.transform_one({"a": float("inf"), "b": 0.0, "c": 0.0})
    assert tr2.metrics()["learned"] == len(Xm) + 2
    tr2.close()
    with pytest.raises(RuntimeError, match="closed"):
        tr2.learn_one(y)


def test_a_sample_with_nothing_observed_scores_exactly_zero():
    """The exact scorer gave ±2.2e-16 for a sample with nothing observed (the filter's
    sum of the prediction rounds off 1); the docstring says it scores 0, as the
    recognition scorers' do."""
    m = _model(M=2, D=2, seed=58)
    print("data seed=59")
    X, _ = m.params_.sample(300, random_state=59)
    with FHMMAnomalyScorer(model=m, posterior="exact", learn=False) as sc:
        empty = []
        for i, row in enumerate(X):
            x = {"a": None, "b": None} if i % 2 else {"a": float(row[0]), "b": float(row[1])}
            before = sc.score_one(x)
            sc.learn_one(x)
            after = sc.score_one(x)
            if i % 2:
                empty += [before, after, sc.score_one({})]
        assert len(empty) == 450 and all(v == 0.0 for v in empty), sorted(set(empty))


def test_a_model_file_with_quoted_feature_names_takes_them_as_read_now():
    """A model fitted before the CSV reader skipped the space after a comma kept a
    header's quotes ('"b"'): its feature names are read as the command line reads them
    ("b"), so the key "b" reaches its column (it was an unknown key, every value missing,
    and features=['a', 'b'] was refused)."""
    m = _model(M=2, D=2, seed=56)
    m.feature_names_in_ = np.array(["a", '"b"'])
    print("data seed=57")
    X, _ = m.params_.sample(30, random_state=57)
    _, logc = naive_filter(m.params_, X)
    for kw in ({}, {"features": ["a", "b"]}):
        with FHMMAnomalyScorer(model=m, posterior="exact", learn=False, **kw) as sc:
            scores = []
            for row in X:
                x = {"a": float(row[0]), "b": float(row[1])}
                scores.append(sc.score_one(x))
                sc.learn_one(x)
            assert sc.features_ == ("a", "b") and sc.metrics()["unknown_key_samples"] == 0
            np.testing.assert_allclose(scores, -logc, atol=1e-9)


def test_a_model_with_feature_names_takes_its_columns_by_name():
    """A model that names its features (feature_names_in_, as `streamfhmm fit` saves
    them) gets each dict's values in its own column order; before, without `features`
    the keys were sorted and its columns reached it swapped (only their number was
    checked). A `features` argument against the model's names is refused."""
    m = _model(M=2, D=3, seed=53)
    m.feature_names_in_ = np.array(["voltage", "current", "power"])   # not sorted
    names = ["voltage", "current", "power"]
    X, _ = m.params_.sample(80, random_state=54)
    print("data seed=54, shuffle seed=55")
    theta, logc = naive_filter(m.params_, X)
    rng = np.random.default_rng(55)
    xs = [{names[j]: float(row[j]) for j in rng.permutation(3)} for row in X]
    tr = FHMMTransformer(model=m, posterior="exact", learn=False)
    sc = FHMMAnomalyScorer(model=m, posterior="exact", learn=False)
    got, scores = [], []
    for x in xs:
        tr.learn_one(x)
        sc.learn_one(x)
        got.append([tr.transform_one(x)[f"chain_{j}"] for j in range(2)])
        scores.append(sc.score_one(x))
    assert tr.features_ == sc.features_ == ("voltage", "current", "power")
    np.testing.assert_allclose(got, theta, atol=1e-10)
    np.testing.assert_allclose(scores, -logc, atol=1e-9)
    # the order is known before the first sample: the first one is evaluated at once
    with FHMMTransformer(model=m, posterior="exact", learn=False) as t0, \
            FHMMAnomalyScorer(model=m, posterior="exact", learn=False) as s0:
        first = t0.transform_one(xs[0])
        np.testing.assert_allclose([first["chain_0"], first["chain_1"]], theta[0], atol=1e-10)
        assert s0.score_one(xs[0]) == pytest.approx(-logc[0], abs=1e-9)
    # copies (pickled, cloned with their state, cloned afresh) keep the model's order
    y = {"power": 0.3, "voltage": -0.2, "current": 1.1}
    for copy in (pickle.loads(pickle.dumps(tr)), tr.clone(include_attributes=True)):
        assert copy.features_ == tr.features_
        assert copy.transform_one(y) == tr.transform_one(y)
        copy.close()
    fresh = tr.clone()
    fresh.learn_one(xs[0])
    assert fresh.features_ == tr.features_
    assert [fresh.transform_one(xs[0])[f"chain_{j}"] for j in range(2)] == pytest.approx(
        theta[0], abs=1e-10)
    for adapter in (tr, sc, fresh):
        adapter.close()
    # the model's names in its order are accepted; any other order or set is refused
    FHMMTransformer(model=m, posterior="exact", learn=False, features=names).close()
    for bad in (["current", "power", "voltage"], ["a", "b", "c"], ["voltage", "current"]):
        for cls in (FHMMTransformer, FHMMAnomalyScorer):
            with pytest.raises(ValueError, match=r"features \[.*\] contradict the model's "
                                                 r"feature names \['voltage', 'current', "
                                                 r"'power'\]"):
                cls(model=m, posterior="exact", learn=False, features=bad)
    # a first dict with none of the model's names is refused, and fixes nothing
    tr = FHMMTransformer(model=m, posterior="exact", learn=False)
    with pytest.raises(ValueError, match=r"keys \['a', 'b', 'c'\] name none of the model's "
                                         r"features"):
        tr.learn_one({"a": 1.0, "b": 2.0, "c": 3.0})
    assert tr.features_ is None and tr.engine is None
    tr.learn_one({"voltage": 1.0, "power": 2.0})   # a missing key is a missing value
    assert tr.features_ == ("voltage", "current", "power")
    assert tr.metrics()["missing_value_samples"] == 1
    tr.close()


def test_shuffled_dicts_give_identical_outputs():
    """With learn=False the outputs are reproducible and do not depend on the order in
    which a dict lists its keys (feature order = sorted keys)."""
    m = _model(M=2, D=4, seed=17)
    X, _ = m.params_.sample(200, random_state=18)
    print("data seed=18, shuffle seed=19")
    rng = np.random.default_rng(19)
    kw = dict(n_chains=2, window=3, n_hidden=5, warmup=80, warmup_steps=30, learn=False, seed=5)
    a, b = FHMMTransformer(**kw), FHMMTransformer(**kw)
    outs_a, outs_b = [], []
    for x in _dicts(X):
        xs = {k: x[k] for k in rng.permutation(list(x))}
        outs_a.append(a.transform_one(x))
        outs_b.append(b.transform_one(xs))
        a.learn_one(x)
        b.learn_one(xs)
    assert a.features_ == b.features_ == ("x0", "x1", "x2", "x3")
    assert outs_a == outs_b and len(outs_a[-1]) == 2
    a.close()
    b.close()


def test_cold_start_before_a_feature_is_ever_seen():
    """A fixed feature absent for the whole warm-up (a sensor that comes online later):
    the start imputes it and learn_one never raises (for a while the engine's imputed
    start wanted every feature seen once, and 21 learn_one calls raised)."""
    seed = 22
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(120, 3))
    sc = FHMMAnomalyScorer(n_chains=2, window=3, n_hidden=4, warmup=60, warmup_steps=20,
                           learn=False, seed=1, features=("x0", "x1", "x2"))
    for i, x in enumerate(X):
        sc.learn_one({"x0": x[0], "x1": x[1]} if i < 80 else {"x0": x[0], "x1": x[1], "x2": x[2]})
    met = sc.metrics()
    assert sc.ready and met["imputed_starts"] == 1 and met["samples"] == 120
    assert np.isfinite(sc.score_one({"x0": 0.0, "x1": 0.0, "x2": 0.0}))
    sc.close()


def test_cold_start_when_no_warmup_sample_is_complete():
    """Every sample misses one feature: the parameters start from the mean-imputed warm-up
    (the engine's imputed start) and the adapter initialises."""
    m = _model(M=2, D=4, seed=20)
    X, _ = m.params_.sample(150, random_state=21)
    print("data seed=21")
    X[np.arange(len(X)), np.arange(len(X)) % 4] = np.nan
    sc = FHMMAnomalyScorer(n_chains=2, window=3, n_hidden=4, warmup=60, warmup_steps=20,
                           learn=False, seed=1, features=("x0", "x1", "x2", "x3"))
    scores = []
    for x in _dicts(X):
        scores.append(sc.score_one(x))
        sc.learn_one(x)
    met = sc.metrics()
    assert sc.ready and met["imputed_starts"] == 1 and met["samples"] == len(X)
    assert np.isfinite(scores).all() and scores[-1] != 0.0
    sc.close()


# --------------------------------------------------------------------------------------
# pickling and the learner thread
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [FHMMTransformer, FHMMAnomalyScorer])
def test_pickle_round_trip_after_learning(cls):
    m = _model(M=2, D=3, seed=22)
    X, _ = m.params_.sample(700, random_state=23)
    print("data seed=23")
    xs = _dicts(X)
    a = cls(n_chains=2, window=3, n_hidden=6, warmup=200, warmup_steps=50, learn=True, seed=2,
            engine_params={"snapshot_interval": 5, "net_burnin": 20})
    for x in xs[:400]:
        a.learn_one(x)
    assert _wait_for(lambda: a.metrics()["learner_steps"] > 50)
    a.learning = False  # freeze, so that the two copies can be compared
    blob = pickle.dumps(a)
    assert pickle.dumps(a) == blob  # idle: the same bytes
    b = pickle.loads(blob)
    assert b.engine is not a.engine and b.learning is False
    ma, mb = a.metrics(), b.metrics()
    for k in ("samples", "learner_steps", "discarded_steps", "snapshot_version", "reservoir_size",
              "learned", "phase"):
        assert ma[k] == mb[k], k
    pa, pb = a.engine.params, b.engine.params
    for f in ("W", "L", "alpha", "beta", "startprob"):
        np.testing.assert_array_equal(getattr(pa, f), getattr(pb, f))
    if cls is FHMMTransformer:
        np.testing.assert_array_equal(a.engine.net.weights, b.engine.net.weights)
        np.testing.assert_array_equal(a.engine.net.mean, b.engine.net.mean)
    assert b.features_ == a.features_
    out = "transform_one" if cls is FHMMTransformer else "score_one"
    for x in xs[400:500]:
        assert getattr(a, out)(x) == getattr(b, out)(x)  # previews
        a.learn_one(x)
        b.learn_one(x)
        assert getattr(a, out)(x) == getattr(b, out)(x)  # committed
    # the copy's learner thread runs once learning is switched on again
    steps = b.metrics()["learner_steps"]
    b.learning = True
    for x in xs[500:]:
        b.learn_one(x)
    assert _wait_for(lambda: b.metrics()["learner_steps"] > steps + 20)
    # a copy taken while learning learns without being told
    c = pickle.loads(pickle.dumps(b))
    assert c.learning is True
    steps_c = c.metrics()["learner_steps"]
    assert _wait_for(lambda: c.metrics()["learner_steps"] > steps_c + 20)
    print(f"{cls.__name__}: steps a={a.metrics()['learner_steps']} "
          f"b={b.metrics()['learner_steps']} c={c.metrics()['learner_steps']}")
    # a closed adapter pickles its final state; the copy is open
    b.close()
    d = pickle.loads(pickle.dumps(b))
    assert d.metrics()["samples"] == b.metrics()["learned"] == len(xs)
    getattr(d, out)(xs[0])
    for adapter in (a, c, d):
        adapter.close()
    assert not _learner_threads()


def test_learner_thread_stops_when_collected():
    X, _ = _model(seed=24).params_.sample(150, random_state=25)
    print("data seed=25")
    a = FHMMAnomalyScorer(n_chains=2, window=3, n_hidden=4, warmup=60, warmup_steps=10,
                          learn=True, seed=3)
    for x in _dicts(X):
        a.learn_one(x)
    assert len(_learner_threads()) == 1
    del a
    gc.collect()
    assert _wait_for(lambda: not _learner_threads(), 5.0)


# --------------------------------------------------------------------------------------
# pipelines
# --------------------------------------------------------------------------------------
def test_pipeline_with_standard_scaler():
    m = _model(M=2, D=3, seed=26)
    X, S = m.params_.sample(400, random_state=27)
    print("data seed=27")
    xs = _dicts(X)
    kw = dict(n_chains=2, window=3, n_hidden=6, warmup=150, warmup_steps=40, learn=False,
              seed=4)
    pipe = preprocessing.StandardScaler() | FHMMTransformer(**kw)
    scaler, alone = preprocessing.StandardScaler(), FHMMTransformer(**kw)
    for x in xs:
        pipe.learn_one(x)  # learn_one then transform_one on each step
        scaler.learn_one(x)
        z = scaler.transform_one(x)
        alone.learn_one(z)
        assert pipe.transform_one(x) == alone.transform_one(scaler.transform_one(x))
    tr = pipe["FHMMTransformer"]
    assert tr.engine.metrics()["samples"] == len(xs)  # each sample pushed once
    assert set(pipe.transform_one(xs[-1])) == {"chain_0", "chain_1"}
    tr.close()
    alone.close()

    # a supervised pipeline, evaluated prequentially: predict_one previews, learn_one commits
    model = (preprocessing.StandardScaler() | FHMMTransformer(**kw)
             | linear_model.LinearRegression())
    preds = []
    for x, s in zip(xs, S):
        preds.append(model.predict_one(x))
        model.learn_one(x, float(s[0]))
    tr = model["FHMMTransformer"]
    assert tr.engine.metrics()["samples"] == len(xs)
    assert np.isfinite(preds).all()
    mae = float(np.abs(np.array(preds) - S[:, 0]).mean())
    print(f"MAE of chain 0's state from the chain posteriors (not asserted): {mae:.3f}")
    tr.close()


# --------------------------------------------------------------------------------------
# anomaly ranking
# --------------------------------------------------------------------------------------
def _anomaly_stream(seed, T=4000, start=1000, rate=0.02, spike=4.0):
    """Three chains, five channels, diagonal noise. After ``start``, a fraction ``rate`` of
    the samples are anomalies: half a spike of ``spike`` noise standard deviations in one
    channel (random sign), half half a chain's contribution (a half-on or half-off chain,
    which no joint state explains)."""
    rng = np.random.default_rng(seed)
    M, D = 3, 5
    W = np.zeros((M + 1, D))
    W[:M] = rng.uniform(0.8, 2.0, size=(M, D)) * (rng.random((M, D)) < 0.6)
    W[:M, :M] += 1.5 * np.eye(M)
    W[M] = rng.normal(0.0, 1.0, D)
    sd = rng.uniform(0.2, 0.4, D)
    A = np.array([[[0.97, 0.03], [0.05, 0.95]]] * M)
    p = FHMMParams.from_natural(W, np.diag(sd ** 2), A)
    X, Z = p.sample(T, random_state=seed + 1)
    label = np.zeros(T, bool)
    idx = rng.choice(np.arange(start, T), size=int(rate * (T - start)), replace=False)
    label[idx] = True
    for i, t in enumerate(idx):
        if i % 2 == 0:
            d = rng.integers(D)
            X[t, d] += rng.choice([-1.0, 1.0]) * spike * sd[d]
        else:
            m = rng.integers(M)
            X[t] += (0.5 if Z[t, m] == 0 else -0.5) * W[m]
    return X, label, p


def _auc(labels, scores):
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties counted one half."""
    labels, scores = np.asarray(labels, bool), np.asarray(scores, float)
    pos, neg = scores[labels], scores[~labels]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return greater / (len(pos) * len(neg))


def _prequential(scorer, X):
    scores = np.empty(len(X))
    for t, x in enumerate(_dicts(X)):
        scores[t] = scorer.score_one(x)
        scorer.learn_one(x)
    scorer.close()
    return scores


def test_auc_helper():
    sk_metrics = pytest.importorskip("sklearn.metrics")  # river.checks needs it too
    rng = np.random.default_rng(28)
    print("seed=28")
    labels, scores = rng.random(300) < 0.2, rng.normal(size=300).round(1)  # with ties
    scores[labels] += 1.0
    assert _auc(labels, scores) == pytest.approx(sk_metrics.roc_auc_score(labels, scores),
                                                 rel=1e-12)


def test_scorer_ranks_injected_anomalies_cold_start():
    """Cold start (warm-up fit), then online learning in the background thread; scores
    before learning each sample (prequential). Anomalies: 4-sigma spikes in one channel
    and half-on chains."""
    seed = 0
    X, label, _ = _anomaly_stream(seed)
    post = np.arange(len(X)) >= 1000
    scorer = FHMMAnomalyScorer(n_chains=3, window=5, n_hidden=16, warmup=1000,
                               warmup_steps=500, learn=True, seed=seed)
    assert scorer._resolved_posterior() == "exact"  # "auto" with M <= 12
    auc = _auc(label[post], _prequential(scorer, X)[post])
    print(f"seed={seed} exact scorer, cold start + online learning: AUC={auc:.3f} "
          f"({label.sum()} anomalies in {post.sum()} samples)")
    assert auc >= 0.9


@pytest.mark.parametrize("posterior, predictive, bound", [
    ("exact", "auto", 0.9), ("recognition", "mixture", 0.9), ("recognition", "gaussian", 0.75)])
def test_scorer_ranks_injected_anomalies_true_model(posterior, predictive, bound):
    """The scoring rule itself, with the true parameters (learn=False; a recognition
    network is still trained on the warm-up). The moment-matched Gaussian loses the
    mixture's modes: the half-on anomalies fall between them."""
    seed = 1
    X, label, p = _anomaly_stream(seed)
    post = np.arange(len(X)) >= 1000
    truth = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat,
                             startprob=p.startprob, window=5, n_hidden=16)
    scorer = FHMMAnomalyScorer(model=truth, posterior=posterior, predictive=predictive,
                               learn=False, warmup=1000, warmup_steps=500, seed=seed)
    auc = _auc(label[post], _prequential(scorer, X)[post])
    print(f"seed={seed} true model, posterior={posterior} predictive={predictive}: AUC={auc:.3f}")
    assert auc >= bound


def test_invalid_arguments():
    with pytest.raises(ValueError, match="posterior"):
        FHMMTransformer(posterior="auto")
    with pytest.raises(ValueError, match="window"):
        FHMMAnomalyScorer(window=4)
    with pytest.raises(ValueError, match="engine_params"):
        FHMMTransformer(engine_params={"mode": "smooth"})
    with pytest.raises(ValueError, match="features"):
        FHMMTransformer(features=("a", "a"))
    with pytest.raises(ValueError, match="n_chains <= 20"):
        FHMMAnomalyScorer(n_chains=21, posterior="exact")
    for bad in ("x", 1.5, True):  # refused when built, not at the first learn_one
        with pytest.raises(ValueError, match="seed must be an int or None"):
            FHMMTransformer(seed=bad)
    assert FHMMAnomalyScorer(n_chains=13)._resolved_posterior() == "recognition"
    assert FHMMAnomalyScorer(n_chains=11, posterior="recognition")._predictive() == "gaussian"
    m = _model(M=2, D=3, seed=29)
    for cls in (FHMMTransformer, FHMMAnomalyScorer):   # the model passed as the first argument
        with pytest.raises(ValueError, match=r"got an FHMM: pass a fitted model as model=\.\.\."):
            cls(m)
    tr = FHMMTransformer(model=m, posterior="exact", learn=False)
    with pytest.raises(ValueError, match="3 features"):
        tr.learn_one({"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="empty"):
        FHMMTransformer().learn_one({})


def test_the_last_learnt_dict_is_known_by_identity_not_by_id():
    """score_one/transform_one of the dict just learnt give its committed result; any
    other dict is the next sample. The adapter kept only id(x): a temporary dict with the
    same values, given the freed id, was taken for the learnt one."""
    m = _model(M=2, D=2, seed=31)
    sc = FHMMAnomalyScorer(model=m, posterior="exact", learn=False, warmup=10)
    X, _ = m.params_.sample(30, random_state=32)
    print("data seed=32")
    for x in _dicts(X):
        sc.learn_one(x)
    # a repeated value, in temporaries, as river streams hand them over: each freed dict's
    # id is free again at once, and the next dict may get it
    sc.learn_one({"x0": 4.0, "x1": 4.0})
    kept = {"x0": 4.0, "x1": 4.0}           # equal values, another dict: the next sample
    scores = [sc.score_one(kept), sc.score_one({"x0": 4.0, "x1": 4.0})]
    scores += [sc.score_one({"x0": 4.0, "x1": 4.0}) for _ in range(3)]
    print(f"scores as the next sample {scores}")
    assert len(set(scores)) == 1
    sc.close()


@pytest.mark.parametrize("adapter_seed", [1, None])
def test_unpickling_in_the_warmup_is_reproducible(adapter_seed):
    """A pickle taken during the warm-up: the copy's warm-up fit draws from where the
    original's generator had got to (the engine checkpoint keeps it), so the copy goes on
    as the original, seeded or not (unseeded, it drew from fresh entropy)."""
    seed = 33
    print(f"seed={seed}")
    X = np.random.default_rng(seed).normal(size=(60, 2))
    xs = _dicts(X)
    a = FHMMTransformer(n_chains=2, window=3, n_hidden=4, warmup=50, warmup_steps=10,
                        learn=False, seed=adapter_seed)
    for x in xs[:30]:
        a.learn_one(x)
    a.engine._rng.random(3)      # (draws before the pickle: the state is no longer the seed's)
    b = pickle.loads(pickle.dumps(a))
    outs = []
    for tr in (a, b):
        out = []
        for x in xs[30:]:
            tr.learn_one(x)
            out.append(tr.transform_one(x))
        tr.close()
        outs.append(out)
    assert outs[0] == outs[1]


def test_values_beyond_the_float_range_and_iterator_features():
    from fractions import Fraction
    tr = FHMMTransformer(n_chains=2, window=3, n_hidden=4, learn=False)
    for big in (10**400, Fraction(10**400, 3)):
        with pytest.raises(ValueError, match="feature 'a' is .*: a value must be finite"):
            tr.learn_one({"a": big, "b": 1.0})
    tr.close()
    with pytest.raises(ValueError, match="features must be a non-empty sequence .* got generator"):
        FHMMTransformer(features=(k for k in ("a", "b")))


def test_bad_samples_raise_value_error_and_change_nothing():
    """A sample that is not a dict (a list, an array, None) raised AttributeError ('list'
    object has no attribute 'items'; None on a fresh adapter: "got an empty dict"), and a
    value that is not a real number TypeError: every public entry raises ValueError. A
    numpy bool counts as a number, as a Python bool does."""
    m = _model(M=2, D=3, seed=34)
    X, _ = m.params_.sample(20, random_state=35)
    print("data seed=35")
    xs = _dicts(X)
    tr = FHMMTransformer(model=m, posterior="exact", learn=False)
    sc = FHMMAnomalyScorer(model=m, posterior="exact", learn=False)
    bad_samples = ([1.0, 2.0, 3.0], np.array([1.0, 2.0, 3.0]), None, "x0")
    for bad in bad_samples:  # before the first learn_one: no feature set is fixed
        with pytest.raises(ValueError, match="learn_one takes a dict of feature name"):
            tr.learn_one(bad)
        with pytest.raises(ValueError, match="transform_one takes a dict"):
            tr.transform_one(bad)
        with pytest.raises(ValueError, match="score_one takes a dict"):
            sc.score_one(bad)
    assert tr.features_ is None and tr.engine is None
    for x in xs[:10]:
        tr.learn_one(x)
        sc.learn_one(x)
    last = tr.transform_one(xs[9]), sc.score_one(xs[9])
    for bad in bad_samples + ({"x0": "1.5", "x1": 0.0, "x2": 0.0},
                              {"x0": 1j, "x1": 0.0, "x2": 0.0}):
        for a, meth in ((tr, "learn_one"), (tr, "transform_one"), (sc, "learn_one"),
                        (sc, "score_one")):
            with pytest.raises(ValueError, match="takes a dict|take real numbers"):
                getattr(a, meth)(bad)
    assert (tr.transform_one(xs[9]), sc.score_one(xs[9])) == last  # nothing changed
    assert tr.metrics()["samples"] == sc.metrics()["samples"] == 10
    y = {"x0": True, "x1": 0.5, "x2": -0.5}
    assert sc.score_one(dict(y, x0=np.bool_(True))) == sc.score_one(y)
    tr.close()
    sc.close()


def test_engine_params_and_features_are_checked_when_built():
    """A misspelt engine argument raised TypeError from StreamEngine at the first learn_one
    (after the adapter had been built and used in a pipeline); an unhashable feature key a
    bare TypeError ('unhashable type: list')."""
    with pytest.raises(ValueError, match=r"unknown StreamEngine arguments \['snapshot_intervl'\]"):
        FHMMTransformer(engine_params={"snapshot_intervl": 5})
    with pytest.raises(ValueError, match="features must be hashable keys"):
        FHMMAnomalyScorer(features=[["a"], ["b"]])
    tr = FHMMTransformer(n_chains=2, window=3, n_hidden=4, learn=False,
                         engine_params={"snapshot_interval": 5, "net_burnin": 10,
                                        "learner_duty": 0.5})
    tr.learn_one({"a": 1.0, "b": 2.0})  # the documented ones still pass
    tr.close()


def test_learning_switch_takes_booleans_only_and_not_once_closed():
    """`learning = "false"` switched learning ON (bool("false") is True). A closed adapter
    refused learn_one but took `learning = ...`, which its pickled copy then did not keep:
    the switch is refused as well, and the copy learns as the adapter did when closed."""
    X, _ = _model(seed=36).params_.sample(80, random_state=37)
    print("data seed=37")
    tr = FHMMTransformer(n_chains=2, window=3, n_hidden=4, warmup=40, warmup_steps=10,
                         learn=True, seed=6)
    for x in _dicts(X):
        tr.learn_one(x)
    tr.learning = False
    for bad in ("false", 0.5, None):
        with pytest.raises(ValueError, match="learning must be True or False"):
            tr.learning = bad
        assert tr.learning is False
    tr.learning = np.bool_(True)
    assert tr.learning is True
    tr.close()
    for value in (False, True):
        with pytest.raises(RuntimeError, match="this FHMMTransformer is closed"):
            tr.learning = value
    assert tr.learning is True
    copy = pickle.loads(pickle.dumps(tr))
    learning = copy.learning
    copy.close()
    assert learning is True


@pytest.mark.parametrize("learn", [False, True])
def test_clone_with_attributes_and_transformer_union(learn):
    """river's clone(include_attributes=True), which TransformerUnion applies to every
    transformer added to it, deep-copied the engine attribute by attribute: TypeError
    "cannot pickle '_thread.lock' object" once the engine had a learner thread (also with
    learn=False, whose warm-up fit runs in it). The copy is now the pickle round trip's."""
    m = _model(M=2, D=3, seed=38)
    X, _ = m.params_.sample(260, random_state=39)
    print("data seed=39")
    xs = _dicts(X)
    tr = _cold(FHMMTransformer, learn=learn, seed=7)
    u = tr + preprocessing.StandardScaler()  # clones the unstarted transformer
    assert isinstance(u, compose.TransformerUnion)
    for x in xs[:200]:
        tr.learn_one(x)
    c = tr.clone(include_attributes=True)
    assert c.engine is not tr.engine and c.features_ == tr.features_ and c.ready
    assert c.metrics()["samples"] == 200 and c.learning is learn
    if not learn:  # the parameters are fixed: the copy continues as the original does
        for x in xs[200:230]:
            tr.learn_one(x)
            c.learn_one(x)
            assert c.transform_one(x) == tr.transform_one(x)
    c.learn_one(xs[230])
    assert c.metrics()["samples"] == tr.metrics()["samples"] + 1  # independent engines
    assert c.clone().engine is None  # a plain clone is fresh
    u2 = tr + preprocessing.StandardScaler()  # clones the running transformer
    z = u2.transform_one(xs[231])
    assert {"chain_0", "chain_1", "x0"} <= set(z)
    for a in (tr, c, u2["FHMMTransformer"], u["FHMMTransformer"]):
        a.close()


@pytest.mark.parametrize("cls, posterior", [(FHMMTransformer, "exact"),
                                            (FHMMTransformer, "recognition"),
                                            (FHMMAnomalyScorer, "exact")])
def test_clone_with_attributes_has_a_state_of_its_own(cls, posterior):
    """clone(include_attributes=True) gave the clone the original's window, forward
    message and warm-up buffer themselves (a shallow copy of the state), which both then
    updated: each saw the other's samples (in what the previews read: the recognition
    window, the exact forward message). An original and its clones (one taken in the
    warm-up, one after it), fed different streams, against pickled copies fed the same."""
    m = _model(M=2, D=3, seed=48)
    X, _ = m.params_.sample(200, random_state=49)
    Y, _ = m.params_.sample(200, random_state=50)
    print("data seeds=49, 50; adapter seed=7")
    xs, ys = _dicts(X), _dicts(Y)
    a = _cold(cls, learn=False, posterior=posterior, seed=7)
    pairs = [(a, pickle.loads(pickle.dumps(a)))]
    streams = [xs]
    out = "transform_one" if cls is FHMMTransformer else "score_one"
    probe = {"x0": 0.3, "x1": -0.2, "x2": 0.5}
    for t in range(200):
        if t in (50, 150):   # in the warm-up, and after it
            assert a.ready is (t == 150)
            pairs.append((a.clone(include_attributes=True), pickle.loads(pickle.dumps(a))))
            streams.append(ys)
        for (c, ref), stream in zip(pairs, streams):
            c.learn_one(stream[t])
            ref.learn_one(stream[t])
            assert getattr(c, out)(stream[t]) == getattr(ref, out)(stream[t])  # committed
            assert getattr(c, out)(probe) == getattr(ref, out)(probe)          # preview
    assert all(c.ready for c, _ in pairs)
    for c, ref in pairs:
        c.close()
        ref.close()


def test_clone_with_attributes_writes_no_checkpoints(tmp_path):
    """engine_params' checkpoint_path and checkpoint_every went into the engine of
    clone(include_attributes=True): the original and the clone wrote their checkpoints
    to one file, each overwriting the other's. The clone's engine writes none."""
    from streamfhmm.io.checkpoint import load_checkpoint
    m = _model(M=2, D=3, seed=51)
    X, _ = m.params_.sample(300, random_state=52)
    print("data seed=52")
    xs = _dicts(X)
    path = tmp_path / "engine.npz"

    def position():  # the stream position of the checkpoint in the file
        return int(load_checkpoint(path)[1]["state"][0])

    a = FHMMTransformer(model=m, posterior="exact", learn=False,
                        engine_params={"checkpoint_path": str(path), "checkpoint_every": 50})
    for x in xs[:120]:
        a.learn_one(x)
    written = position()
    assert 50 <= written <= 120
    c = a.clone(include_attributes=True)
    for x in xs[120:]:  # past the positions of three more periodic checkpoints
        c.learn_one(x)
    c.close()
    assert position() == written
    a.close()  # the original's last checkpoint
    assert position() == 120


def test_pickling_leaves_the_checkpoint_count_alone(tmp_path):
    """Pickling (or cloning with the state) checkpoints the engine to a temporary file:
    that copy counted as a checkpoint written, metrics()["checkpoints"] went up by one
    at each pickle, and the copies carried the count on."""
    m = _model(M=2, D=3, seed=56)
    X, _ = m.params_.sample(300, random_state=57)
    print("data seed=57")
    xs = _dicts(X)
    a = _cold(FHMMTransformer, learn=False, seed=0)
    for x in xs:
        a.learn_one(x)
    assert a.metrics()["checkpoints"] == 0
    pickle.dumps(a)
    pickle.dumps(a)
    a.learn_one(xs[0])
    b = pickle.loads(pickle.dumps(a))
    c = pickle.loads(pickle.dumps(b))
    d = a.clone(include_attributes=True)
    assert [e.metrics()["checkpoints"] for e in (a, b, c, d)] == [0, 0, 0, 0]
    for e in (a, b, c, d):
        e.close()
    # checkpoints the engine did write are counted, in the copies too
    path = tmp_path / "engine.npz"
    f = FHMMTransformer(model=m, posterior="exact", learn=False,
                        engine_params={"checkpoint_path": str(path), "checkpoint_every": 50})
    for x in xs[:120]:   # two periodic checkpoints, after 50 and 100 samples
        f.learn_one(x)
    assert f.metrics()["checkpoints"] == 2
    blob = pickle.dumps(f)
    assert pickle.dumps(f) == blob
    g = pickle.loads(blob)
    assert f.metrics()["checkpoints"] == g.metrics()["checkpoints"] == 2
    g.close()
    f.close()


def test_a_refused_first_sample_fixes_nothing():
    """A first learn_one the engine refuses (a warm-up value beyond 1e150: the start fit
    would overflow) raised ValueError, but had fixed the feature set from the refused
    dict: the next sample's other keys were ignored as unknown."""
    tr = FHMMTransformer(n_chains=2, window=3, n_hidden=4, warmup=20, warmup_steps=5,
                         learn=False, seed=0)
    with pytest.raises(ValueError, match=r"at most 1e\+150 in magnitude"):
        tr.learn_one({"a": 1e200})
    assert tr.features_ is None and tr.engine is None and tr.metrics()["learned"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no UnknownFeatureWarning for "b"
        tr.learn_one({"a": 1.0, "b": 2.0})
    assert tr.features_ == ("a", "b") and tr.metrics()["samples"] == 1
    tr.close()


def test_a_closed_adapter_reports_the_engines_final_state():
    """After close(), `learning` read the adapter's own flag, stale once the engine had
    switched learning off by itself (learn_samples), and metrics() lost every engine
    counter. A closed adapter reports what the engine last had, as its pickled copy
    does."""
    X, _ = _model(seed=36).params_.sample(200, random_state=37)
    print("data seed=37")
    tr = FHMMTransformer(n_chains=2, window=3, n_hidden=4, warmup=40, warmup_steps=10,
                         learn=True, seed=6, engine_params={"learn_samples": 100})
    for x in _dicts(X):
        tr.learn_one(x)
    assert tr.learning is False  # switched off by the engine
    assert _wait_for(lambda: _settled(tr.engine))  # (a round of steps under way ends)
    before = tr.metrics()
    tr.close()
    after = tr.metrics()
    copy = pickle.loads(pickle.dumps(tr))
    assert tr.learning is False and copy.learning is False
    pickled = copy.metrics()
    copy.close()
    for k in ("samples", "emitted", "learner_steps", "snapshot_version", "learning",
              "phase", "learned", "ready"):
        assert after[k] == before[k] == pickled[k], k


def test_predictive_densities_check_their_arguments():
    """The public densities passed y to the emission kernels unchecked: a y one value
    short gave a finite log-density read past the end of the array (-11.79 here), one
    too long NaN; an on-probability of exactly 0 or 1 (a known state) raised 'math domain
    error' from the mixture. Hard states against the component density itself."""
    seed = 40
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed)
    rng = np.random.default_rng(seed)
    on = np.array([0.5, 0.5])
    for f in (mixture_logpdf, gaussian_logpdf):
        for y in (np.zeros(2), np.zeros(4), np.array([0.0, np.nan])):
            with pytest.raises(ValueError, match=r"y must have shape \(3,\)"):
                f(y, on, p)
        with pytest.raises(ValueError, match="y must be finite"):
            f(np.array([np.inf, 0.0, 0.0]), on, p)
        for bad in ([0.5], [0.5, 0.5, 0.5]):
            with pytest.raises(ValueError, match=r"on_prob must have shape \(2,\)"):
                f(np.zeros(3), np.array(bad), p)
        for bad in ([1.5, 0.5], [np.nan, 0.5]):
            with pytest.raises(ValueError, match=r"on_prob must lie in \[0, 1\]"):
                f(np.zeros(3), np.array(bad), p)
    with pytest.raises(ValueError, match=r"theta must have shape \(2,\)"):
        predicted_on_probability([0.5], p)
    with pytest.raises(ValueError, match=r"theta must lie in \[0, 1\]"):
        predicted_on_probability([2.0, 0.5], p)
    for state in ([1, 0], [0, 1], [1, 1], [0, 0]):
        s = np.array(state, float)
        y = p.W[-1] + s @ p.W[:-1] + p.L @ rng.standard_normal(3)
        want = float(multivariate_normal(p.W[-1] + s @ p.W[:-1], p.covariance).logpdf(y))
        assert mixture_logpdf(y, s, p) == pytest.approx(want, rel=1e-10)
        assert gaussian_logpdf(y, s, p) == pytest.approx(want, rel=1e-10)
        y[0] = np.nan
        assert mixture_logpdf(y, s, p) == pytest.approx(naive_mixture(y, s, p), rel=1e-10)


# --------------------------------------------------------------------------------------
# close, clone and the public densities on the edges of their input
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("learn", [False, True])
def test_a_close_that_cannot_save_the_state_still_closes(monkeypatch, learn):
    """close() checkpoints the engine to keep the final state; when that raised, the
    adapter was left neither open nor closed (its engine gone, not closed): later calls
    failed with raw AttributeError, IndexError or TypeError, and learn_one started a new
    engine. It now ends closed, says the state could not be saved (RuntimeError, the
    error as its cause), keeps the engine's final metrics, and refuses to be copied (a
    copy would be ready without an engine)."""
    X, _ = _model(seed=53).params_.sample(60, random_state=54)
    print("data seed=54; adapter seed=0")
    xs = _dicts(X)
    tr = FHMMTransformer(n_chains=2, window=3, n_hidden=4, warmup=20, warmup_steps=5,
                         learn=learn, seed=0)
    for x in xs[:40]:
        tr.learn_one(x)

    def no_space(path=None, counted=True):
        raise OSError(28, "No space left on device (simulated)")

    monkeypatch.setattr(tr.engine, "_checkpoint", no_space)   # (the adapter's copy of its state)
    with pytest.raises(RuntimeError, match=r"^FHMMTransformer closed, but its final state could "
                                           r"not be saved \(OSError: .*No space left") as err:
        tr.close()
    assert isinstance(err.value.__cause__, OSError)
    assert tr.engine is None and tr.ready
    met = tr.metrics()
    assert met["samples"] == met["learned"] == 40
    for call in (lambda: tr.learn_one(xs[41]), lambda: tr.transform_one(xs[41])):
        with pytest.raises(RuntimeError, match="^this FHMMTransformer is closed$"):
            call()
    for copy in (lambda: pickle.dumps(tr), lambda: tr.clone(include_attributes=True)):
        with pytest.raises(RuntimeError, match="cannot be copied: its final state could not be "
                                               "saved when it was closed"):
            copy()
    tr.close()   # idempotent
    assert tr.metrics()["samples"] == 40


def test_an_adapter_whose_checkpoint_directory_is_gone(tmp_path):
    """Pickling, clone(include_attributes=True) and close() checkpoint the engine to a
    temporary directory; the engine compared that path with its configured
    checkpoint_path through a check that the directory of the latter exists, so all
    three raised FileNotFoundError once it was removed (and close() left the adapter
    half open). They work; the engine's own last checkpoint, which cannot be written,
    is reported in metrics()["checkpoint_error"]. A checkpoint_path in a directory that
    does not exist is refused at the first learn_one (the engine is built then)."""
    import shutil
    m = _model(M=2, D=3, seed=59)
    X, _ = m.params_.sample(60, random_state=60)
    print("data seed=60")
    xs = _dicts(X)
    with pytest.raises(ValueError, match=r"checkpoint_path '.*nowhere.*' cannot be written: its "
                                         r"directory .* does not exist"):
        FHMMTransformer(model=m, posterior="exact", learn=False, engine_params={
            "checkpoint_path": str(tmp_path / "nowhere" / "e.npz")}).learn_one(xs[0])
    d = tmp_path / "ck"
    d.mkdir()
    tr = FHMMTransformer(model=m, posterior="exact", learn=False,
                         engine_params={"checkpoint_path": str(d / "engine.npz")})
    for x in xs[:40]:
        tr.learn_one(x)
    want = tr.transform_one(xs[40])
    shutil.rmtree(d)
    copy = pickle.loads(pickle.dumps(tr))
    clone = tr.clone(include_attributes=True)
    assert copy.transform_one(xs[40]) == clone.transform_one(xs[40]) == want
    tr.close()
    assert tr.metrics()["samples"] == 40
    assert "does not exist" in tr.metrics()["checkpoint_error"]
    copy.close()
    clone.close()


@pytest.mark.parametrize("cls", [FHMMTransformer, FHMMAnomalyScorer])
def test_clone_with_attributes_refuses_parameters_its_state_contradicts(cls):
    """clone(new_params, include_attributes=True) kept the copied engine and state while
    reporting the new parameters: a new n_chains, features or model was silently
    ignored, a new posterior failed at the first transform_one (AttributeError). What
    contradicts the copied engine is refused, naming it, and nothing is copied or
    started; what the copy can take (its learner's step size and seed, the scorer's
    predictive density, the engine's run-time settings) is applied, values equal to the
    current ones are no change, and before the first sample any parameters go."""
    import re
    m = _model(M=2, D=3, seed=55)
    X, _ = m.params_.sample(80, random_state=56)
    print("data seed=56; adapter seed=0")
    xs = _dicts(X)
    out = "transform_one" if cls is FHMMTransformer else "score_one"
    kw = dict(n_chains=2, window=3, n_hidden=4, posterior="exact", learn=False, warmup=20,
              warmup_steps=5, seed=0)
    a = cls(**kw)
    # nothing learnt yet: the clone's parameters are its own
    b = a.clone({"n_chains": 3}, include_attributes=True)
    for x in xs[:30]:
        b.learn_one(x)
    assert b.engine.params.n_chains == 3
    if cls is FHMMTransformer:
        assert sorted(b.transform_one(xs[30])) == ["chain_0", "chain_1", "chain_2"]
    b.close()
    for x in xs[:40]:
        a.learn_one(x)
    threads = len(_learner_threads())
    before = getattr(a, out)(xs[40])
    refused = [({"n_chains": 3}, "n_chains"), ({"posterior": "recognition"}, "posterior"),
               ({"features": ("x1", "x0", "x2")}, "features"), ({"model": m}, "model"),
               ({"learn": True}, "learn"), ({"warmup": 30, "batch_size": 4}, "warmup, batch_size"),
               ({"engine_params": {"decay": 0.5}}, "engine_params['decay']")]
    for new, names in refused:
        with pytest.raises(ValueError, match=rf"^{cls.__name__}\.clone\(new_params, include_"
                                             rf"attributes=True\) cannot change "
                                             rf"{re.escape(names)}: the copied state"):
            a.clone(new, include_attributes=True)
    with pytest.raises(ValueError, match="`learning` property"):
        a.clone({"learn": True}, include_attributes=True)
    with pytest.raises(ValueError, match=r"new_params has unknown parameters \['n_chain'\]"):
        a.clone({"n_chain": 3}, include_attributes=True)
    assert len(_learner_threads()) == threads   # nothing started
    assert getattr(a, out)(xs[40]) == before
    # the same values, however given, are no change: the copy continues as the original
    same = a.clone({"features": ["x0", "x1", "x2"], "n_chains": 2, "posterior": "exact",
                    "warmup": 20, "warmup_time": 30}, include_attributes=True)
    # run-time settings the copied engine takes
    tuned = a.clone({"learning_rate": 0.05, "seed": 3,
                     "engine_params": {"snapshot_interval": 7, "learner_duty": 0.5}},
                    include_attributes=True)
    assert tuned.learning_rate == 0.05 and tuned.engine_params["snapshot_interval"] == 7
    cfg = tuned.engine._cfg
    assert (cfg["learning_rate"], cfg["snapshot_interval"], cfg["learner_duty"]) == (0.05, 7, 0.5)
    assert a.engine._cfg["learning_rate"] == 1e-3 and same.engine._cfg["learning_rate"] == 1e-3
    for x in xs[40:60]:
        for c in (a, same, tuned):
            c.learn_one(x)
        assert getattr(same, out)(x) == getattr(a, out)(x)
        assert getattr(tuned, out)(x) == getattr(a, out)(x)   # (learn=False: fixed parameters)
    for c in (a, same, tuned):
        c.close()


def test_clone_with_attributes_may_change_the_predictive_density():
    """The scorer's predictive density is read at each score: a copy may change it."""
    m = _model(M=2, D=3, seed=61)
    X, _ = m.params_.sample(60, random_state=62)
    print("data seed=62")
    xs = _dicts(X)
    a = FHMMAnomalyScorer(model=m, posterior="recognition", predictive="mixture", learn=False,
                          warmup=30, warmup_steps=10, seed=0)
    for x in xs[:40]:
        a.learn_one(x)
    c = a.clone({"predictive": "gaussian"}, include_attributes=True)
    assert c.predictive == "gaussian"
    v = np.array([xs[40][k] for k in ("x0", "x1", "x2")])
    params = a.engine.snapshot.params
    pi = predicted_on_probability(a._last_theta, params)
    assert a.score_one(xs[40]) == pytest.approx(-mixture_logpdf(v, pi, params), rel=1e-12)
    assert c.score_one(xs[40]) == pytest.approx(-gaussian_logpdf(v, pi, params), rel=1e-12)
    a.close()
    c.close()


def test_densities_and_scores_near_the_float_range():
    """mixture_logpdf was NaN for finite values near the float range (1.7e308: y - μ
    overflows, then inf - inf), so the recognition scorer scored such a sample NaN
    (never flagged) where the exact scorer gives inf. A density below the float range
    is -inf (a score of +inf) for both densities and every scorer, with values missing
    too; large values within range keep their finite density."""
    p = _model(M=2, D=2, seed=57).params_
    on = np.array([0.3, 0.6])
    huge = np.finfo(np.float64).max
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for big in (1e200, 1.7e308, -1.7e308, huge, -huge):
            for y in ([big, 0.0], [big, big], [0.0, big], [big, np.nan]):
                y = np.array(y)
                assert mixture_logpdf(y, on, p) == -np.inf, y
                assert gaussian_logpdf(y, on, p) == -np.inf, y
    from scipy.special import logsumexp
    st = _states(2)
    lw = np.log(np.where(st == 1, on, 1 - on)).sum(axis=1)
    for y in (np.array([1e100, 0.0]), np.array([1e100, np.nan])):   # within range: finite
        want = logsumexp([lw[k] + _logpdf_obs(y, st[k] @ p.W[:-1] + p.W[-1], p.covariance)
                          for k in range(4)])
        assert np.isfinite(want)
        assert mixture_logpdf(y, on, p) == pytest.approx(want, rel=1e-10)
        assert np.isfinite(gaussian_logpdf(y, on, p))
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat,
                         startprob=p.startprob, window=3, n_hidden=4)
    X, _ = p.sample(40, random_state=58)
    print("data seed=58")
    xs = _dicts(X)
    for posterior, predictive in (("exact", "auto"), ("recognition", "mixture"),
                                  ("recognition", "gaussian")):
        sc = FHMMAnomalyScorer(model=m, posterior=posterior, predictive=predictive, learn=False,
                               warmup=20, warmup_steps=5, seed=0)
        for x in xs[:30]:
            sc.learn_one(x)
        for big in (1e200, 1.7e308, -huge):
            for x in ({"x0": big, "x1": 0.0}, {"x0": big}):
                assert sc.score_one(x) == np.inf, (posterior, predictive, x)
        assert np.isfinite(sc.score_one(xs[30]))
        sc.close()


def test_predictive_densities_name_a_wrong_params_or_tables():
    """The public densities took anything as params and tables: an FHMM estimator (not
    its params_) raised AttributeError from inside, a tables of the wrong kind 'too many
    values to unpack', of the wrong shapes read past the arrays in the compiled kernel;
    a y of strings named nothing."""
    from streamfhmm.kernels.exact import prepare_emission
    m = _model(M=2, D=3, seed=63)
    p = m.params_
    y = np.array([0.1, 0.2, 0.3])
    on = np.array([0.5, 0.5])
    for f, args in ((mixture_logpdf, (y, on)), (gaussian_logpdf, (y, on)),
                    (predicted_on_probability, (on,)), (predicted_on_probability, (None,))):
        with pytest.raises(ValueError, match=r"^params must be FHMMParams: pass model.params_ "
                                             r"of a fitted FHMM, not the estimator, got FHMM$"):
            f(*args, m)
        with pytest.raises(ValueError, match=r"^params must be FHMMParams \(e.g. model.params_\), "
                                             r"got NoneType$"):
            f(*args, None)
    tables = prepare_emission(p.W, p.L)
    assert mixture_logpdf(y, on, p, tables) == mixture_logpdf(y, on, p)
    Linv, Ut, half_c, const = tables
    bad_tables = [
        ("tables", "got str 'tables'"), ((1, 2), r"got tuple \(1, 2\)"),
        (list(tables), "got list"),
        ((Linv[:2, :2], Ut, half_c, const), r"its Linv must be a float64 array of shape \(3, 3\) "
                                            r"for this model, got float64 array of shape \(2, 2\)"),
        ((Linv, Ut.astype(np.float32), half_c, const), r"its Ut must be a float64 array of shape "
                                                       r"\(2, 3\) for this model, got float32"),
        ((Linv, Ut, half_c[:2], const), r"its half_c must be a float64 array of shape \(4,\)"),
        ((Linv, Ut, half_c, "c"), "its const must be a real number, got str")]
    for bad, what in bad_tables:
        with pytest.raises(ValueError, match=r"^tables must be kernels.exact.prepare_emission\("
                                             rf"params.W, params.L\): .*{what}"):
            mixture_logpdf(y, on, p, bad)
    for f, args, name in ((mixture_logpdf, (["a", "b", "c"], on, p), "y"),
                          (gaussian_logpdf, (y, ["a", "b"], p), "on_prob"),
                          (predicted_on_probability, (["a", 0.5], p), "theta"),
                          (mixture_logpdf, ({"x0": 1.0}, on, p), "y")):
        with pytest.raises(ValueError, match=f"^{name} must be an array of real numbers, got"):
            f(*args)
