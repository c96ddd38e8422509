"""FHMMParams and the public FHMM: construction, validation, sampling statistics."""
import io
import json
import os
import re

import numpy as np
import pytest

from streamfhmm import FHMM, FHMMParams, exact
from streamfhmm.model import PROB_FLOOR, logit, sigmoid
from streamfhmm._validation import check_bool, check_bounds, check_observations, check_random_state, check_transmat
import streamfhmm.estimator as estimator_module

A2 = np.array([[[0.9, 0.1], [0.2, 0.8]], [[0.95, 0.05], [0.3, 0.7]]])
W2 = np.array([[1.0, 0.0], [0.0, 2.0], [0.5, -0.5]])
S2 = np.array([[0.2, 0.05], [0.05, 0.1]])


def test_from_params_round_trip():
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, startprob=[0.3, 0.6])
    np.testing.assert_allclose(m.W_, W2)
    np.testing.assert_allclose(m.covariance_, S2, atol=1e-14)
    np.testing.assert_allclose(m.transmat_, A2, atol=1e-14)
    np.testing.assert_allclose(m.startprob_, [0.3, 0.6])
    assert m.transmat_.shape == (2, 2, 2)


def test_default_startprob_is_stationary():
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    np.testing.assert_allclose(m.startprob_, [0.1 / 0.3, 0.05 / 0.35])


def test_stationary_when_both_switch_probabilities_underflow():
    """σ(α) and σ(β) are both exactly 0.0 in float64 for logits below -745, and
    a / (a + b) was 0/0 = NaN; the ratio is fine. Reference: 50-digit decimal arithmetic."""
    from decimal import Decimal, localcontext
    alpha = np.array([-800.0, -800.0, -1e5, -760.0, 3.0, -2.0, 760.0, 0.3])
    beta = np.array([-790.0, -800.0, -1e5 + 5.0, -790.0, -800.0, 1.5, 800.0, -0.7])
    M = alpha.shape[0]
    p = FHMMParams(W=np.zeros((M + 1, 1)), L=[[1.0]], alpha=alpha, beta=beta,
                   startprob=np.full(M, 0.5))
    ref = []
    with localcontext() as ctx:
        ctx.prec = 50
        for a_, b_ in zip(alpha, beta):
            a = 1 / (1 + Decimal(-float(a_)).exp())
            b = 1 / (1 + Decimal(-float(b_)).exp())
            ref.append(float(a / (a + b)))
    with np.errstate(invalid="raise", divide="raise"):
        got = p.stationary
    np.testing.assert_allclose(got, ref, rtol=1e-14, atol=0)
    assert got[0] == pytest.approx(1.0 / (1.0 + np.exp(10.0)), rel=1e-14)


def test_sigmoid_logit():
    x = np.array([-800.0, -3.0, 0.0, 2.0, 800.0])
    s = sigmoid(x)
    assert np.isfinite(s).all() and s[0] == 0.0 and s[-1] == 1.0
    np.testing.assert_allclose(logit(sigmoid(np.array([-5.0, 0.3, 7.0]))), [-5.0, 0.3, 7.0], rtol=1e-12)


def test_log_transmat_matches_transmat():
    p = FHMMParams.random(5, 3, random_state=3)
    np.testing.assert_allclose(np.exp(p.log_transmat), p.transmat, rtol=1e-13)


def test_transmat_keeps_small_switch_probabilities():
    """Logits far from 0: 1.0 - σ(40) is exactly 0, which once made exact.log_likelihood
    wrong by 4,900 nats (and below the ELBO) for a chain that almost never leaves a state."""
    from streamfhmm import exact
    base = FHMMParams.random(1, 1, random_state=0)
    for logit_ in (20.0, 37.0, 40.0, -40.0, 700.0):
        p = base.replace(alpha=np.array([logit_]), beta=np.array([-logit_]))
        np.testing.assert_allclose(p.transmat, np.exp(p.log_transmat), rtol=1e-13, atol=0)
        assert (p.transmat > 0).all()
    # one chain stuck off (α = 40: P(off -> off) = σ(-40) = 4.2e-18) and W = 50 switching it
    # on: p(x) = Σ over the 2^3 paths, each Gaussian, here computed in closed form
    W = np.array([[50.0], [0.0]])
    p = FHMMParams(W=W, L=[[0.5]], alpha=[40.0], beta=[0.0], startprob=[0.5])
    X = np.zeros((3, 1))
    log_a = -np.logaddexp(0.0, -40.0)                    # log P(0 -> 1) ~ 0
    log_stay = -np.logaddexp(0.0, 40.0)                  # log P(0 -> 0) = -40
    log_n0 = -0.5 * np.log(2 * np.pi * 0.25)             # N(0; 0, 0.5²)
    log_n1 = log_n0 - 0.5 * 50.0**2 / 0.25               # N(0; 50, 0.5²)
    half = np.log(0.5)
    # every path; the transition out of the on state is σ(0) = 1/2 either way
    terms = []
    for s in np.ndindex(2, 2, 2):
        lp = half + sum(log_n1 if k else log_n0 for k in s)
        for a, b in zip(s, s[1:]):
            lp += half if a == 1 else (log_a if b == 1 else log_stay)
        terms.append(lp)
    want = np.logaddexp.reduce(terms)
    assert exact.log_likelihood(p, X) == pytest.approx(want, rel=1e-12)


def test_params_are_immutable():
    p = FHMMParams.random(2, 2, random_state=0)
    with pytest.raises(ValueError):
        p.W[0, 0] = 1.0
    q = p.replace(W=p.W + 1)
    assert q is not p and np.allclose(q.W, p.W + 1)

    # so are copies: pickle (the river adapter pickles its engine) and deepcopy made the
    # arrays writeable, and parameters the constructor refuses could be written into them
    import copy
    import pickle
    for c in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p)):
        assert isinstance(c, FHMMParams)
        for name in ("W", "L", "alpha", "beta", "startprob"):
            np.testing.assert_array_equal(getattr(c, name), getattr(p, name))
            with pytest.raises(ValueError, match="read-only"):
                getattr(c, name)[0] = 7.0


def test_sample_reproduces_statistics():
    seed = 7
    print(f"seed={seed}")
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, startprob=[0.3, 0.6])
    X, S = m.sample(200_000, random_state=seed)
    assert X.shape == (200_000, 2) and S.shape == (200_000, 2)
    # transition frequencies
    for c in range(2):
        prev, nxt = S[:-1, c], S[1:, c]
        for i in range(2):
            freq = nxt[prev == i].mean()
            assert freq == pytest.approx(A2[c, i, 1], abs=0.01)
    # least squares of X on [S, 1] recovers W; residual covariance recovers Σ
    design = np.column_stack([S, np.ones(len(S))])
    W_hat, *_ = np.linalg.lstsq(design, X, rcond=None)
    np.testing.assert_allclose(W_hat, W2, atol=0.01)
    resid = X - design @ W_hat
    np.testing.assert_allclose(np.cov(resid.T), S2, atol=0.005)
    # reproducible
    X2, S2_ = m.sample(200_000, random_state=seed)
    assert np.array_equal(X, X2) and np.array_equal(S, S2_)


def test_score_and_predict_proba_shapes():
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    X, S = m.sample(500, random_state=1)
    assert np.isfinite(m.score(X))
    P = m.predict_proba(X, lengths=[200, 300])
    assert P.shape == (500, 2) and ((P >= 0) & (P <= 1)).all()
    # the posterior follows the true states on well-separated data
    assert np.mean((P > 0.5) == S) > 0.9


def test_length_one_parameters_may_be_numbers():
    """One chain's start probability, one feature's scaler: a number is a length-1 array
    (a scalar X or covariance is refused, as the errors above say)."""
    from streamfhmm.network import RecognitionNet
    m = FHMM.from_params(W=[[1.0], [0.0]], covariance=[[0.1]], transmat=[[[0.9, 0.1], [0.2, 0.8]]],
                         startprob=0.3)
    np.testing.assert_array_equal(m.startprob_, [0.3])
    net = RecognitionNet(1, 1, window=3, n_hidden=2).set_scaler(2.0, 0.5)
    np.testing.assert_array_equal(net.mean, [2.0])
    np.testing.assert_array_equal(net.scale, [0.5])


@pytest.mark.parametrize("kwargs,message", [
    (dict(W=np.zeros(3)), "W must be a 2-D array of shape \\(n_chains \\+ 1, n_features\\)"),
    (dict(W=[[np.nan, 0], [0, 0], [0, 0]]), "W must be finite"),
    (dict(W=[["a", "b"], ["c", "d"]]), "W must be a numeric array"),
    (dict(covariance=np.eye(3)), "covariance must have shape \\(2, 2\\)"),
    (dict(covariance=0.1), "covariance must have shape \\(2, 2\\), got \\(\\)"),   # (a scalar, not (1,))
    (dict(covariance=[[1.0, 0.5], [0.4, 1.0]]), "covariance must be symmetric"),
    (dict(covariance=[[1.0, 2.0], [2.0, 1.0]]), "covariance must be positive definite"),
    (dict(covariance=[[np.inf, 0], [0, 1.0]]), "covariance must be finite"),
    (dict(transmat=np.ones((2, 2, 2))), "transmat rows must sum to 1"),
    (dict(transmat=np.ones((3, 2, 2)) / 2), "transmat must have shape \\(2, 2, 2\\)"),
    (dict(transmat=np.ones((4, 2, 2)) / 2), "transmat must have shape \\(2, 2, 2\\), one 2x2 matrix "
                                            "per chain, got \\(4, 2, 2\\)$"),
    # W without its bias row: the message says what W's rows are
    (dict(W=W2[:2]), "transmat must have shape \\(1, 2, 2\\), one 2x2 matrix per chain, got \\(2, 2, 2\\): "
                     "W's 2 rows are 1 chain and the bias row \\(the last\\); for 2 chains W needs 3 rows"),
    (dict(transmat=[[[0.5, 0.5], [0.5]]] * 2), "transmat"),
    (dict(transmat=np.array([[[1.5, -0.5], [0.5, 0.5]]] * 2)), "transmat entries must be probabilities"),
    (dict(startprob=[0.5]), "startprob must have shape \\(2,\\)"),
    (dict(startprob=[0.5, 1.5]), "startprob entries must be probabilities"),
])
def test_from_params_errors(kwargs, message):
    args = dict(W=W2, covariance=S2, transmat=A2, startprob=[0.5, 0.5])
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        FHMM.from_params(**args)


@pytest.mark.parametrize("kwargs,message", [
    (dict(window=4), "window must be odd"),
    (dict(window=0), "window must be an integer >= 1"),
    (dict(n_hidden=2.5), "n_hidden must be an integer >= 1"),
    (dict(share_hidden="none"), "share_hidden must be one of"),
])
def test_hyperparameter_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FHMM.from_params(W=W2, covariance=S2, transmat=A2, **kwargs)


def test_input_errors():
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    with pytest.raises(ValueError, match="no parameters yet"):
        FHMM(n_chains=2).score(np.zeros((3, 2)))
    # unfitted: an AttributeError too (it was a ValueError only: hasattr raised)
    assert not hasattr(FHMM(n_chains=2), "W_") and getattr(FHMM(n_chains=2), "covariance_", None) is None
    with pytest.raises(AttributeError, match="no recognition networks"):
        m.elbo(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="pairwise must be True or False, got 'no'"):
        exact.smoothed_marginals(m.params_, np.zeros((3, 2)), pairwise="no")
    # a refused fit of an unfitted model leaves it without fitted-looking attributes
    fresh = FHMM(n_chains=2)
    attrs = set(vars(fresh))
    with pytest.raises(ValueError, match="too few complete rows"):
        fresh.fit(np.arange(6.0).reshape(3, 2), progress=False)
    assert set(vars(fresh)) == attrs
    # sizes past the compiled layout's integers: OverflowError from deep inside
    with pytest.raises(ValueError, match="the networks would hold about .* weights"):
        FHMM(n_chains=2, window=2**62 + 1).fit(np.zeros((5, 2)), max_iter=2, progress=False)
    with pytest.raises(ValueError, match="X must be a 2-D array"):
        m.score(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="X must not contain infinities; found inf at row 1, column 0"):
        m.score(np.array([[0.0, 0.0], [np.inf, 0.0]]))
    # a fit squares the data: beyond 1e150 it failed with "W must be finite"; inference
    # with fitted parameters takes such values (as the streaming engine does)
    with pytest.raises(ValueError, match=re.escape("X must hold values within ±1e+150 to fit a model (its "
                                                   "statistics square them); found -2e+160 at row 1, "
                                                   "column 1")):
        FHMM(n_chains=2).fit(np.array([[0.0, 1e150], [0.0, -2e160], [np.nan, 1.0]]), progress=False)
    FHMM(n_chains=1).fit(np.array([[1e150], [-1e150], [0.0]]), max_iter=2, progress=False)   # (the bound)
    # and below 1e-150 its squares underflow: SVI's first gradient was non-finite at
    # 1e-155, and at 1e-170 every method "fitted" loadings of 1e169
    tiny = np.array([[0.0, 1.0], [3e-155, 2.0], [-1e-160, 0.5], [np.nan, 1.0]])
    for method in ("svi", "smf", "em"):
        with pytest.raises(ValueError, match=re.escape("X's column 0 holds no value larger than 3e-155 "
                                                       "in magnitude")):
            FHMM(n_chains=1).fit(tiny if method == "svi" else tiny[:3], method=method, progress=False)
    FHMM(n_chains=1).fit(np.array([[1e-150], [0.0], [2e-150]]), max_iter=2, progress=False)   # (the bound)
    # a column of zeros and one tiny value is constant to the fit, as zeros are: taken
    spike = np.column_stack([np.arange(40.0) % 3, np.where(np.arange(40) == 5, 1e-200, 0.0)])
    for method in ("svi", "smf", "em"):
        FHMM(n_chains=1, window=3, n_hidden=2).fit(spike, method=method, max_iter=2, progress=False)
    assert np.isfinite(m.predict_proba(np.array([[0.0, 1e151]]), method="exact")).all()
    with pytest.raises(ValueError, match="lengths must all be positive"):
        m.score(np.zeros((4, 2)), lengths=[4, 0])
    with pytest.raises(ValueError, match="lengths must hold integers"):
        m.score(np.zeros((4, 2)), lengths=[1.5, 2.5])
    with pytest.raises(ValueError, match="method must be one of"):
        m.predict_proba(np.zeros((4, 2)), method="magic")
    with pytest.raises(ValueError, match="n_samples must be an integer >= 1"):
        m.sample(0)
    with pytest.raises(ValueError, match="random_state must be None, an int or a numpy Generator"):
        m.sample(5, random_state="seed")


# ----------------------------------------------------------------------------------------
# covariance_type
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["tied", "Full", None, 1])
def test_covariance_type_errors(bad):
    with pytest.raises(ValueError, match=r"covariance_type must be one of \('full', 'diag', 'spherical'\)"):
        FHMM.from_params(W=W2, covariance=np.diag([0.2, 0.1]), transmat=A2, covariance_type=bad)
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        FHMM(n_chains=2, window=3, n_hidden=4, covariance_type=bad).fit(
            np.random.default_rng(0).normal(size=(20, 2)), max_iter=2, progress=False)


def test_from_params_checks_the_covariance_family():
    m = FHMM.from_params(W=W2, covariance=np.diag([0.2, 0.1]), transmat=A2, covariance_type="diag")
    np.testing.assert_allclose(m.covariance_, np.diag([0.2, 0.1]), rtol=1e-15, atol=0)
    assert m.params_.L[1, 0] == 0.0
    m = FHMM.from_params(W=W2, covariance=0.3 * np.eye(2), transmat=A2, covariance_type="spherical")
    assert m.params_.L[0, 0] == m.params_.L[1, 1]
    with pytest.raises(ValueError, match="covariance_type='diag' needs a covariance that is diagonal"):
        FHMM.from_params(W=W2, covariance=S2, transmat=A2, covariance_type="diag")
    with pytest.raises(ValueError, match="'spherical' needs a covariance that is a multiple of the identity"):
        FHMM.from_params(W=W2, covariance=np.diag([0.2, 0.1]), transmat=A2,
                         covariance_type="spherical")


def test_get_params_and_set_params():
    m = FHMM(n_chains=3, covariance_type="spherical", random_state=4)
    p = m.get_params()
    assert p == {"n_chains": 3, "window": 5, "n_hidden": 30, "share_hidden": "chain",
                 "random_state": 4, "covariance_type": "spherical"}
    clone = FHMM(**p)
    assert clone.get_params() == p
    assert m.set_params(covariance_type="diag") is m and m.covariance_type == "diag"
    with pytest.raises(ValueError, match="invalid hyper-parameters"):
        m.set_params(covariance="diag")
    assert "covariance_type='diag'" in repr(m)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_save_load_keeps_covariance_type(tmp_path, covariance_type):
    S = {"full": S2, "diag": np.diag([0.2, 0.1]), "spherical": 0.2 * np.eye(2)}[covariance_type]
    m = FHMM.from_params(W=W2, covariance=S, transmat=A2, covariance_type=covariance_type)
    m.save(tmp_path / "m.npz")
    back = FHMM.load(tmp_path / "m.npz")
    assert back.covariance_type == covariance_type
    np.testing.assert_array_equal(back.params_.L, m.params_.L)
    with np.load(tmp_path / "m.npz") as f:
        assert int(f["version"]) == 2


def test_version_1_file_loads_as_full(tmp_path):
    """A file written before covariance_type existed: version 1, no key in the hyper-parameters."""
    import json
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    m.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as f:
        data = {k: f[k] for k in f.files}
    hyper = json.loads(str(data["hyper"]))
    del hyper["covariance_type"]
    data["hyper"] = np.array(json.dumps(hyper))
    data["version"] = np.array(1)
    np.savez(tmp_path / "old.npz", **data)
    old = FHMM.load(tmp_path / "old.npz")
    assert old.covariance_type == "full"
    np.testing.assert_array_equal(old.covariance_, m.covariance_)
    hyper["covariance_type"] = "tied"
    data["hyper"] = np.array(json.dumps(hyper))
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(ValueError, match="damaged streamfhmm model file: covariance_type 'tied'"):
        FHMM.load(tmp_path / "bad.npz")


def test_lengths_that_overflow_int64_are_refused():
    """Lengths whose int64 sum wraps round to len(X) once reached the kernels (a crash)."""
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    X = np.zeros((60, 2))
    wraps = [2**62, 2**62, 2**62, 2**62 + 60]
    assert np.array(wraps, dtype=np.int64).sum() == 60  # the wrap this guards against
    for bad in (wraps, [1e30, 10.0], [61], [1] * 61):
        with pytest.raises(ValueError, match=r"lengths must sum to the number of samples in X \(60\)"):
            m.score(X, lengths=bad)
    assert np.isfinite(m.score(X, lengths=[30.0, 30.0]))


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_iter=0), "max_iter must be an integer >= 1, got 0"),
    (dict(max_iter=2.5), "max_iter must be an integer >= 1, got 2.5"),
    (dict(learning_rate=-1.0), r"learning_rate must be a finite number in \(0, inf\), got -1.0"),
    (dict(learning_rate="a"), "learning_rate must be a finite number"),
    (dict(decay=1.0), r"decay must be a finite number in \[0, 1\), got 1.0"),
    (dict(final_lr_ratio=-3), r"final_lr_ratio must be a finite number in \[0, 1\]"),
    (dict(subchain_length=0), "subchain_length must be an integer >= 1, got 0"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(time_budget=-1.0), r"time_budget must be a finite number in \(0, inf\)"),
    (dict(time_budget=float("nan")), "time_budget must be a finite number"),
    (dict(init_samples=0), "init_samples must be an integer >= 1, got 0"),
    (dict(n_init=0), "n_init must be an integer >= 1, got 0"),
    (dict(n_init=2, init="kmeans"), "n_init applies to init='smf' or 'auto'"),
    (dict(n_restarts=0), "n_restarts must be an integer >= 1, got 0"),
    (dict(n_restarts=2, time_budget=5.0), "n_restarts needs a schedule of max_iter steps"),
    (dict(n_restarts=2, max_iter=60, restart_steps=60),
     r"restart_steps must be an integer in \[1, max_iter\) = \[1, 60\), got 60"),
    (dict(n_restarts=2, max_iter=5), "max_iter=5 is too few steps for n_restarts: the runs are "
                                     "compared after a sixth of them"),
    (dict(restart_steps=10), "restart_steps applies with n_restarts > 1"),
    (dict(n_restarts=2, method="em", max_iter=5), "n_restarts applies to method='svi'"),
    (dict(n_restarts=2, restart_steps=0), "restart_steps must be an integer >= 1, got 0"),
    (dict(n_restarts=2, method="smf"), "n_restarts applies to method='svi' without a client"),
    (dict(n_restarts=2, client=object()), "without a client, got method='svi' and a client"),
    (dict(method="smf", max_iter=0), "max_iter must be an integer >= 1, got 0"),
    (dict(method="em", time_budget="x"), "time_budget must be a finite number"),
])
def test_fit_setting_errors(kwargs, message, monkeypatch):
    """Every learner's settings are checked before any work (no SMF start is run)."""
    import streamfhmm.learn.smf as smf

    def no_start(*a, **k):
        raise AssertionError("the fit started before its settings were checked")
    monkeypatch.setattr(smf, "init_params", no_start)
    X = np.random.default_rng(0).normal(size=(40, 2))
    with pytest.raises(ValueError, match=message):
        FHMM(n_chains=2, window=3, n_hidden=4).fit(X, progress=False, **kwargs)


def test_refit_without_networks_drops_the_old_ones():
    """An SMF/EM refit after SVI: networks trained for other parameters (or another chain
    count) must not stay the default posterior."""
    X = np.random.default_rng(1).normal(size=(120, 2))
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=0).fit(X, max_iter=5, progress=False)
    assert m.net_ is not None and m._default_method() == "recognition"
    m.set_params(n_chains=3).fit(X, method="smf", init="kmeans", max_iter=3, progress=False)
    assert m.net_ is None
    assert m.predict_proba(X).shape == (120, 3)
    np.testing.assert_array_equal(m.predict_proba(X), m.predict_proba(X, method="exact"))
    with pytest.raises(ValueError, match="method must be one of"):
        m.predict_proba(X, method="")


def test_sample_defaults_to_the_models_random_state():
    """As hmmlearn: sample() without a random_state uses the model's."""
    a = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=0)
    b = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=0)
    np.testing.assert_array_equal(a.sample(20)[0], b.sample(20)[0])
    np.testing.assert_array_equal(a.sample(20)[1], a.sample(20)[1])
    c = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=1)
    assert not np.array_equal(a.sample(20)[0], c.sample(20)[0])
    with pytest.raises(ValueError, match="from_params takes the constructor's arguments except n_chains"):
        FHMM.from_params(W=W2, covariance=S2, transmat=A2, n_chains=3)


def test_save_load_keeps_the_seed_and_finds_the_npz(tmp_path):
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=7)
    m.save(tmp_path / "model")  # save adds .npz
    back = FHMM.load(tmp_path / "model")
    assert back.get_params() == m.get_params()
    g = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=np.random.default_rng(3))
    g.save(tmp_path / "g.npz")
    assert FHMM.load(tmp_path / "g.npz").random_state is None  # a Generator is not stored


@pytest.mark.parametrize("seed_sequence", [np.random.SeedSequence(42),
                                           np.random.SeedSequence([1, 2**70], pool_size=8),
                                           np.random.SeedSequence(5).spawn(2)[1]])
def test_save_load_keeps_a_seed_sequence(tmp_path, seed_sequence):
    """A SeedSequence random_state is as deterministic as an int seed: it was dropped (saved
    as null), so the loaded model's sample() no longer repeated the original's."""
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=seed_sequence)
    m.save(tmp_path / "s.npz")
    back = FHMM.load(tmp_path / "s.npz")
    assert isinstance(back.random_state, np.random.SeedSequence)
    assert (back.random_state.spawn_key, back.random_state.pool_size) == \
        (seed_sequence.spawn_key, seed_sequence.pool_size)
    np.testing.assert_array_equal(back.random_state.generate_state(4), seed_sequence.generate_state(4))
    np.testing.assert_array_equal(back.sample(30)[0], m.sample(30)[0])


@pytest.mark.parametrize("stored", [{"entropy": -1, "spawn_key": [], "pool_size": 4},
                                    {"entropy": 3, "spawn_key": [], "pool_size": 2},
                                    {"entropy": [], "spawn_key": [], "pool_size": 4},
                                    {"entropy": 3, "spawn_key": "x", "pool_size": 4},
                                    {"entropy": 3, "spawn_key": []},
                                    {"entropy": 3.5, "spawn_key": [], "pool_size": 4}])
def test_load_refuses_a_damaged_seed_sequence(tmp_path, stored):
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, random_state=np.random.SeedSequence(1))
    m.save(tmp_path / "s.npz")
    with np.load(tmp_path / "s.npz") as f:
        data = dict(f)
    hyper = json.loads(str(data["hyper"]))
    hyper["random_state"] = stored
    data["hyper"] = np.array(json.dumps(hyper))
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(ValueError, match=r"bad\.npz.*random_state"):
        FHMM.load(tmp_path / "bad.npz")


def test_save_refuses_a_directory_and_names_a_missing_one(tmp_path):
    """A directory, a path ending in a separator or an existing ``<dir>.npz`` directory
    is a ValueError (save("sub") wrote sub.npz beside the directory, save("sub/") a
    hidden sub/.npz); a missing directory is named (the error named the temporary
    file). The engine's checkpoints take the same path rules; nothing is written."""
    from streamfhmm.io.checkpoint import save_checkpoint
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    (tmp_path / "sub").mkdir()
    (tmp_path / "box.npz").mkdir()
    for bad in (tmp_path / "sub", str(tmp_path / "sub") + "/", tmp_path / "box", ""):
        with pytest.raises(ValueError, match="must name a file|which is a directory"):
            m.save(bad)
        with pytest.raises(ValueError, match="must name a file|which is a directory"):
            save_checkpoint(bad, {"x": np.zeros(2)}, {})
    missing = tmp_path / "nowhere" / "m"
    with pytest.raises(FileNotFoundError, match=f"its directory '{tmp_path / 'nowhere'}' does not exist"):
        m.save(missing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box.npz", "sub"]
    assert list((tmp_path / "sub").iterdir()) == []


def test_save_load_keeps_the_fits_start_and_run_scores(tmp_path):
    """n_init's and n_restarts' scores travel with the model file; a file without them
    (a model never fitted with them, or written before they were kept) loads without."""
    seed = 12
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed, noise=0.4).sample(600, random_state=seed)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    m.fit(X, max_iter=12, n_restarts=2, init="smf", n_init=2, progress=False)
    assert m.init_scores_.shape == (2,) and m.restart_scores_.shape == (2,)
    m.restart_scores_ = np.array([m.restart_scores_[0], np.nan])    # a run that failed
    m.save(tmp_path / "m.npz")
    back = FHMM.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(back.init_scores_, m.init_scores_)
    np.testing.assert_array_equal(back.restart_scores_, m.restart_scores_)
    FHMM.from_params(W=W2, covariance=S2, transmat=A2).save(tmp_path / "p.npz")
    plain = FHMM.load(tmp_path / "p.npz")
    assert not hasattr(plain, "init_scores_") and not hasattr(plain, "restart_scores_")
    plain.init_scores_ = np.zeros((2, 2))        # what load would refuse, save refuses
    with pytest.raises(ValueError, match=r"init_scores_ must be a 1-D float array, got dtype "
                                         r"float64 and shape \(2, 2\)"):
        plain.save(tmp_path / "q.npz")
    assert not (tmp_path / "q.npz").exists()


def test_save_load_keeps_feature_names_and_a_fit_clears_them(tmp_path):
    """feature_names_in_ travels with the model file (one string per feature); save refuses
    other names, load a file holding them, and a fit leaves none (names of earlier data)."""
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    m.save(tmp_path / "plain.npz")
    assert not hasattr(FHMM.load(tmp_path / "plain.npz"), "feature_names_in_")
    m.feature_names_in_ = ["power", "voltage"]
    m.save(tmp_path / "named.npz")
    back = FHMM.load(tmp_path / "named.npz")
    assert back.feature_names_in_.tolist() == ["power", "voltage"]
    m.feature_names_in_ = ["power"]
    with pytest.raises(ValueError, match=r"feature_names_in_ must be 2 strings \(one name per feature\), "
                                         r"got dtype <U5 and shape \(1,\): \['power'\]"):
        m.save(tmp_path / "bad.npz")
    m.feature_names_in_ = [1.0, 2.0]
    with pytest.raises(ValueError, match="feature_names_in_ must be 2 strings"):
        m.save(tmp_path / "bad.npz")
    assert not (tmp_path / "bad.npz").exists()
    seed = 13
    print(f"seed={seed}")
    X, _ = back.sample(300, random_state=seed)
    back.fit(X, method="smf", max_iter=2, progress=False)
    assert not hasattr(back, "feature_names_in_")


def _rewrite(tmp_path, name, change):
    import json
    FHMM.from_params(W=W2, covariance=S2, transmat=A2).save(tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as f:
        data = {k: f[k] for k in f.files}
    hyper = json.loads(str(data["hyper"]))
    change(data, hyper)
    data["hyper"] = np.array(json.dumps(hyper))
    np.savez(tmp_path / name, **data)
    return tmp_path / name


@pytest.mark.parametrize("change,message", [
    (lambda d, h: d.pop("version"), "no readable format version"),
    (lambda d, h: d.update(version=np.array("two")), "no readable format version"),
    (lambda d, h: h.update(foo=1), r"unknown hyper-parameters \['foo'\]"),
    (lambda d, h: h.pop("n_chains"), "n_chains None but the parameters have 2 chains"),
    (lambda d, h: h.update(window=4), "window must be odd"),
    (lambda d, h: d.update(init_scores=np.array(["a"])),
     r"init_scores must be a 1-D float array, got dtype <U1 and shape \(1,\)"),
    (lambda d, h: d.update(restart_scores=np.zeros((2, 2))),
     r"restart_scores must be a 1-D float array, got dtype float64 and shape \(2, 2\)"),
    (lambda d, h: h.update(random_state="abc"),
     "random_state 'abc' \\(expected an integer seed or null\\)"),
    (lambda d, h: h.update(random_state=-1), "random_state must be None, an int >= 0 .* got -1"),
    (lambda d, h: d.update(history=np.array('{"iteration": 1}')),
     "its fit history is not a list of records"),
    # these loaded (int() took 1.9 as 1; any fit_method became fit_method_)
    (lambda d, h: d.update(version=np.array(0)), r"format version 0 \(expected an integer from 1\)"),
    (lambda d, h: d.update(version=np.array(-7)), r"format version -7 \(expected an integer from 1\)"),
    (lambda d, h: d.update(version=np.array(1.9)), r"format version 1.9 \(expected an integer from 1\)"),
    (lambda d, h: h.update(fit_method="nonsense"), "fit_method 'nonsense' \\(expected 'svi' with"),
    (lambda d, h: h.update(fit_method=[1, 2]), r"fit_method \[1, 2\] \(expected"),
    (lambda d, h: h.update(fit_method="svi"), "fit_method 'svi' \\(expected 'svi' with recognition networks"),
    (lambda d, h: d.update(feature_names=np.array(["a", "b", "c"])),
     r"feature_names_in_ must be 2 strings \(one name per feature\), got dtype <U1 and shape \(3,\)"),
    (lambda d, h: d.update(feature_names=np.array([1, 2])), "feature_names_in_ must be 2 strings"),
])
def test_load_refuses_damaged_files(tmp_path, change, message):
    path = _rewrite(tmp_path, "bad.npz", change)
    with pytest.raises(ValueError, match="damaged streamfhmm model file: " + message):
        FHMM.load(path)


@pytest.mark.parametrize("field", ["L", "alpha", "beta"])
def test_params_refuse_complex_and_text(field):
    base = FHMM.from_params(W=W2, covariance=S2, transmat=A2).params_
    args = dict(W=base.W, L=base.L, alpha=base.alpha, beta=base.beta, startprob=base.startprob)
    with pytest.raises(ValueError, match=f"{field} must be real-valued"):
        FHMMParams(**{**args, field: args[field] + 0j})
    with pytest.raises(ValueError, match=f"{field} must be numeric"):
        FHMMParams(**{**args, field: "ab"})


def test_load_refuses_networks_that_do_not_match_the_parameters(tmp_path):
    """A file whose recognition networks have other chains (or features) than its
    parameters loaded, and predict_proba gave their 5 columns for a 2-chain model while
    elbo() wrote past the end of the workspace's θ."""
    from streamfhmm.network import RecognitionNet
    for M, D in ((5, 2), (2, 3)):
        m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, window=3, n_hidden=4)
        m.net_ = RecognitionNet(M, D, window=3, n_hidden=4, share="chain").init(random_state=0)
        m.save(tmp_path / "bad.npz")
        with pytest.raises(ValueError, match=f"damaged streamfhmm model file: its recognition "
                                             f"networks have {M} chains and {D} features, its "
                                             f"parameters 2 chains and 2 features"):
            FHMM.load(tmp_path / "bad.npz")


def test_load_refuses_networks_that_do_not_match_the_hyperparameters(tmp_path):
    """The file said window 5 and the model predicted with its networks' 3; or read
    causal windows where predict_proba promises centred ones."""
    import json
    from streamfhmm.network import RecognitionNet
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2, window=3, n_hidden=4)
    m.net_ = RecognitionNet(2, 2, window=3, n_hidden=4, share="chain").init(random_state=0)
    m.save(tmp_path / "good.npz")
    for key, value, message in (("window", 5, "window is 5 but its recognition networks have 3"),
                                ("n_hidden", 6, "n_hidden is 6 but its recognition networks have 4")):
        with np.load(tmp_path / "good.npz") as f:
            data = {k: f[k] for k in f.files}
        hyper = json.loads(str(data["hyper"]))
        hyper[key] = value
        data["hyper"] = np.array(json.dumps(hyper))
        np.savez(tmp_path / "bad.npz", **data)
        with pytest.raises(ValueError, match="damaged streamfhmm model file: " + message):
            FHMM.load(tmp_path / "bad.npz")
    causal = RecognitionNet(2, 2, window=3, n_hidden=4, share="chain", mode="causal").init(random_state=0)
    with np.load(tmp_path / "good.npz") as f:
        data = {k: f[k] for k in f.files if not k.startswith("net.")}
    data.update({f"net.{k}": v for k, v in causal.to_arrays().items()})
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(ValueError, match="damaged streamfhmm model file: its recognition networks "
                                         "read 'causal' windows, not centred ones"):
        FHMM.load(tmp_path / "bad.npz")
    FHMM.load(tmp_path / "good.npz")


def test_params_refuse_what_they_would_change_silently():
    """At a small scale the absolute tolerances let a non-triangular L lose its upper
    entries and an asymmetric covariance be averaged with its transpose, unnoticed."""
    W = 1e-6 * W2
    with pytest.raises(ValueError, match="L must be finite and lower triangular"):
        FHMMParams(W=W, L=[[1e-6, 5e-9], [0.0, 1e-6]], alpha=[0.0, 0.0], beta=[0.0, 0.0],
                   startprob=[0.5, 0.5])
    with pytest.raises(ValueError, match="covariance must be symmetric"):
        FHMMParams.from_natural(W, [[2e-14, 1e-14], [0.0, 2e-14]], A2)
    # rounding is not asymmetry, at any scale
    for scale in (1e-14, 1.0, 1e8):
        S = scale * S2
        S[0, 1] *= 1 + 1e-13
        np.testing.assert_allclose(FHMMParams.from_natural(W2, S, A2).covariance, scale * S2,
                                   rtol=1e-12)


@pytest.mark.parametrize("kwargs,message", [
    (dict(switch=0.1), r"switch must be a pair \(low, high\) of probabilities, got 0.1"),
    (dict(switch=(0.1, 0.2, 0.3)), r"switch must be a pair"),
    (dict(switch=(0.2, 1.5)), r"switch\[1\] must be a finite number in \[0.2, 1\]"),
    (dict(switch=(0.3, 0.2)), r"switch\[1\] must be a finite number in \[0.3, 1\]"),
    (dict(noise=0.0), r"noise must be a finite number in \[1e-150, 1e\+150\], got 0.0"),
    # (noise² overflowed to a raw OverflowError, or underflowed to an error about the
    # covariance, an argument not given)
    (dict(noise=1e200), r"noise must be a finite number in \[1e-150, 1e\+150\], got 1e\+200"),
    (dict(noise=1e-200), r"noise must be a finite number in \[1e-150, 1e\+150\], got 1e-200"),
    (dict(scale=1e200), r"scale must be a finite number in \[0, 1e\+150\], got 1e\+200"),
    (dict(scale="a"), r"scale must be a finite number in \[0, 1e\+150\], got 'a'"),
    (dict(scale=np.nan), r"scale must be a finite number"),
])
def test_random_params_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FHMMParams.random(2, 3, random_state=0, **kwargs)


def test_replace_refuses_unknown_fields():
    p = FHMMParams.random(2, 3, random_state=0)
    with pytest.raises(ValueError, match=r"replace takes the fields \['W', 'L', 'alpha', 'beta', "
                                         r"'startprob'\], got \['covariance'\]"):
        p.replace(covariance=np.eye(3))


def test_time_spans_are_not_observations():
    """timedelta64 is a numpy integer type: X of time spans was scored as numbers."""
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    with pytest.raises(ValueError, match=r"X must be a numeric array, got an array of shape "
                                         r"\(3, 2\) and dtype timedelta64\[s\]"):
        m.score(np.ones((3, 2)).astype("m8[s]"))


def test_masked_entries_are_missing_values():
    """A numpy masked array's masked entries are missing values (np.asarray kept the
    values under the mask and used them as observed): the recognition posterior reads
    them as NaN, the exact methods (which take no missing value) refuse them; a masked
    array without masked entries, or of integers, is read as its data."""
    seed = 41
    print(f"seed={seed}")
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    X, _ = m.sample(300, random_state=seed)
    mask = np.zeros(X.shape, bool)
    mask[[3, 10, 11, 40], [0, 1, 0, 1]] = True
    Xm = np.ma.masked_array(X + 1e3 * mask, mask=mask)   # garbage under the mask
    Xn = np.where(mask, np.nan, X)
    with pytest.raises(ValueError, match="must not contain NaN here"):
        m.score(Xm)
    assert m.score(np.ma.masked_array(X)) == m.score(X)
    fitted = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed).fit(X, max_iter=30)
    got = fitted.predict_proba(Xm)
    np.testing.assert_array_equal(got, fitted.predict_proba(Xn))
    assert not np.allclose(got, fitted.predict_proba(X + 1e3 * mask))
    assert fitted.elbo(Xm) == fitted.elbo(Xn)
    Xi = np.round(X * 10).astype(int)
    np.testing.assert_array_equal(fitted.predict_proba(np.ma.masked_array(Xi, mask=mask)),
                                  fitted.predict_proba(np.where(mask, np.nan, Xi)))


def test_n_init_keeps_the_start_most_likely_on_the_data():
    """``n_init`` starts: the first is the one-start fit's, each is scored by its exact
    log-likelihood on X, and the most likely is kept."""
    from streamfhmm._validation import check_random_state
    from streamfhmm.estimator import _start_score
    seed = 3
    print(f"seed={seed}")
    truth = FHMMParams.random(3, 2, random_state=seed)
    X, _ = truth.sample(600, random_state=seed)
    m = FHMM(n_chains=3, random_state=seed)
    one = m._initial_params(X, "smf", 200, 1, check_random_state(seed))
    assert m.init_scores_.shape == (0,)
    kept = m._initial_params(X, "smf", 200, 4, check_random_state(seed))
    scores = m.init_scores_
    assert scores.shape == (4,) and np.isfinite(scores).all()
    assert _start_score(one, X, np.array([600]), None) == pytest.approx(scores[0], rel=1e-12)
    assert _start_score(kept, X, np.array([600]), None) == pytest.approx(scores.max(), rel=1e-12)
    assert len(np.unique(np.round(scores, 9))) > 1, "the starts should differ"
    fitted = FHMM(n_chains=3, random_state=seed).fit(X, method="smf", n_init=4, init_samples=200, max_iter=2,
                                                     progress=False)
    np.testing.assert_array_equal(fitted.init_scores_, scores)


def test_scores_of_an_earlier_fit_do_not_describe_the_next():
    X = np.random.default_rng(0).normal(size=(80, 2))
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=0)
    m.fit(X, max_iter=12, n_restarts=2, init="smf", n_init=2, progress=False)
    assert m.restart_scores_.shape == (2,) and m.init_scores_.shape == (2,)
    m.fit(X, method="smf", init="smf", max_iter=2, progress=False)
    assert m.restart_scores_.shape == (0,) and m.init_scores_.shape == (0,)


def test_n_init_refuses_a_model_that_continues_from_its_parameters():
    X = np.random.default_rng(0).normal(size=(80, 2))
    m = FHMM(n_chains=2, random_state=0).fit(X, method="smf", max_iter=2, progress=False)
    with pytest.raises(ValueError, match="n_init applies to a fresh start.*pass init='smf'"):
        m.fit(X, method="smf", n_init=3, max_iter=2, progress=False)
    m.fit(X, method="smf", init="smf", n_init=3, max_iter=2, progress=False)
    assert m.init_scores_.shape == (3,)


def test_start_scores_on_random_blocks_of_long_data():
    """Beyond 20,000 samples a start is scored on 20 contiguous blocks of 1,000."""
    from streamfhmm.estimator import _score_blocks
    X = np.arange(50_000, dtype=float)[:, None] * [1.0, -1.0]
    rows, lengths = _score_blocks(X, np.random.default_rng(0))
    assert rows.shape == (20_000, 2) and lengths.tolist() == [1000] * 20
    blocks = rows[:, 0].reshape(20, 1000)
    assert (np.diff(blocks, axis=1) == 1).all()          # each block contiguous in X
    assert (np.diff(blocks[:, 0]) >= 1000).all()           # in order, not overlapping
    short = X[:20_000]
    rows, lengths = _score_blocks(short, np.random.default_rng(0))
    assert rows is short and lengths.tolist() == [20_000]


def test_score_blocks_stay_within_sequences():
    """With several sequences each block lies inside one of them (a block across a
    boundary was scored as if the sequences were one)."""
    from streamfhmm.estimator import _score_blocks
    lengths = np.array([2_500, 30_500, 1_999, 15_000, 999])
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    X = np.arange(bounds[-1], dtype=float)[:, None]
    seq_of = np.repeat(np.arange(len(lengths)), lengths)
    for seed in range(20):
        rows, block_lengths = _score_blocks(X, np.random.default_rng(seed), bounds)
        assert block_lengths.tolist() == [1000] * 20
        idx = rows[:, 0].astype(int).reshape(20, 1000)
        assert (np.diff(idx, axis=1) == 1).all()
        assert (seq_of[idx[:, 0]] == seq_of[idx[:, -1]]).all(), f"seed={seed}"
        assert (np.diff(idx[:, 0]) >= 1000).all()
        assert not np.isin(seq_of[idx[:, 0]], [4]).any()      # 999 rows hold no block
    # sequences that hold fewer than 20 blocks: blocks and whole short sequences, drawn
    # until they hold 20,000 rows (all of X cost 50 times that at 10^6 rows)
    many = np.arange(1_001) * 999                # 1,000 sequences of 999: no block
    Y = np.arange(many[-1], dtype=float)[:, None]
    for seed in range(5):
        rows, block_lengths = _score_blocks(Y, np.random.default_rng(seed), many)
        assert 20_000 <= len(rows) < 21_000 and (block_lengths == 999).all(), f"seed={seed}"
        idx = rows[:, 0].astype(int)
        starts = idx[np.concatenate([[0], np.cumsum(block_lengths)[:-1]])]
        assert np.isin(starts, many[:-1]).all()                      # whole sequences
        assert (np.diff(starts) > 0).all()                           # in X's order
    # 5 + 7 + 7 blocks and sequences of 500, 900 and 999 rows
    mixed = np.array([0, 5_500, 6_000, 6_900, 14_000, 14_999, 22_000])
    seq_of = np.repeat(np.arange(len(mixed) - 1), np.diff(mixed))
    Z = np.arange(mixed[-1], dtype=float)[:, None]
    for seed in range(10):
        rows, block_lengths = _score_blocks(Z, np.random.default_rng(seed), mixed)
        assert 20_000 <= len(rows) < 21_000, f"seed={seed}"
        edges = np.concatenate([[0], np.cumsum(block_lengths)])
        for a, b in zip(edges[:-1], edges[1:]):
            piece = rows[a:b, 0].astype(int)
            assert (np.diff(piece) == 1).all() and seq_of[piece[0]] == seq_of[piece[-1]]
            whole = piece[0] in mixed and piece[-1] + 1 in mixed
            assert b - a == 1000 or (whole and b - a < 1000), (seed, piece[0], b - a)
    # 13 sequences of 1,999 (one block each, 13,000 rows): all of X, under 40,000 rows
    few = np.arange(14) * 1_999
    rows, block_lengths = _score_blocks(X[:few[-1]], np.random.default_rng(0), few)
    assert len(rows) == few[-1] > 20_000 and block_lengths.tolist() == [1_999] * 13


def test_complete_rows_split_runs_at_gaps_and_boundaries():
    from streamfhmm.estimator import _complete_rows
    X = np.arange(12, dtype=float)[:, None] * [1.0, 1.0]
    X[[3, 4, 9], 1] = np.nan
    Xc, runs = _complete_rows(X, np.array([0, 6, 12]))
    assert Xc[:, 0].tolist() == [0, 1, 2, 5, 6, 7, 8, 10, 11]
    # runs: 0-2 | 5 (gap before; sequence ends after) | 6-8 (new sequence) | 10-11 (gap)
    assert runs.tolist() == [0, 3, 4, 7, 9]
    full = np.ones((5, 2))
    Xc, runs = _complete_rows(full, np.array([0, 2, 5]))
    assert Xc is full and runs.tolist() == [0, 2, 5]


def test_smf_start_sees_sequences_and_gaps(monkeypatch):
    """The SMF start's slice of the last samples keeps X's sequences and the gaps left by
    incomplete rows as sequence breaks."""
    import streamfhmm.learn.smf as smf_mod
    seen = []
    real = smf_mod.fit_smf

    def spy(X, lengths=None, **kw):
        seen.append((len(X), None if lengths is None else np.asarray(lengths).tolist()))
        return real(X, lengths, **kw)
    monkeypatch.setattr(smf_mod, "fit_smf", spy)
    seed = 3
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((400, 2))
    X[350, 1] = np.nan                      # an incomplete row
    m = FHMM(n_chains=2, random_state=seed)
    m.fit(X, lengths=[300, 100], max_iter=2, init="smf", init_samples=150, progress=False)
    # the last 150 complete rows: 249-299 (first sequence) | 300-349 | 351-399 (the gap)
    assert seen[0] == (150, [51, 50, 49])


def test_start_score_beyond_12_chains_is_the_smf_bound_below_the_likelihood():
    from streamfhmm.estimator import _start_score
    from streamfhmm import exact
    seed = 5
    print(f"seed={seed}")
    p = FHMMParams.random(13, 2, random_state=seed)
    X, _ = p.sample(60, random_state=seed)
    bound = _start_score(p, X, np.array([60]), np.random.default_rng(seed))
    ll = exact.log_likelihood(p, X) / 60
    assert np.isfinite(bound) and bound <= ll + 1e-9
    assert bound > ll - 5.0


def test_sample_starts_from_startprob():
    """The first state of a sample is drawn from startprob, not from the stationary
    probabilities (here far apart)."""
    seed = 21
    print(f"seed={seed}")
    A = np.array([[[0.9, 0.1], [0.1, 0.9]], [[0.9, 0.1], [0.1, 0.9]]])    # stationary 0.5
    p = FHMMParams.from_natural(np.zeros((3, 1)), np.eye(1), A, startprob=[0.05, 0.9])
    rng = np.random.default_rng(seed)
    first = np.array([p.sample(1, random_state=rng)[1][0] for _ in range(4000)])
    np.testing.assert_allclose(first.mean(axis=0), [0.05, 0.9], atol=0.02)   # 5 SD: 0.017


def test_fit_method_survives_save_and_load(tmp_path):
    seed = 31
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed, noise=0.4).sample(300, random_state=seed)
    for method in ("smf", "em", "svi"):
        m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
        m.fit(X, method=method, max_iter=5, progress=False)
        m.save(tmp_path / f"{method}.npz")
        assert FHMM.load(tmp_path / f"{method}.npz").fit_method_ == method


def test_a_refused_fit_keeps_the_earlier_fits_scores():
    """A fit refused by an argument check cleared init_scores_ and restart_scores_ and
    left them empty beside the earlier fit's parameters (which save() then wrote)."""
    seed = 32
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed, noise=0.4).sample(600, random_state=seed)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    m.fit(X, max_iter=12, n_restarts=2, init="smf", n_init=2, progress=False)
    scores = (m.init_scores_.copy(), m.restart_scores_.copy())
    # (the last two are refused inside the start, after the scores were cleared; and a
    # method's settings are checked whichever method runs)
    for bad in (dict(method="bogus"), dict(n_jobs=0), dict(X=X[:, :1]),
                dict(method="smf", learning_rate=-5.0), dict(method="em", batch_size=0),
                dict(method="svi", tol="x"), dict(init="auto", n_init=3),
                dict(init="kmeans", X=np.r_[X[:3], np.full((5, 2), np.nan)])):
        with pytest.raises(ValueError):
            m.fit(**{"X": X, "max_iter": 5, "progress": False, **bad})
        np.testing.assert_array_equal(m.init_scores_, scores[0])
        np.testing.assert_array_equal(m.restart_scores_, scores[1])
    m.fit(X, method="smf", max_iter=3, progress=False)     # a fit that runs clears them
    assert m.init_scores_.size == 0 and m.restart_scores_.size == 0


def test_history_runs_on_where_the_best_restart_continues():
    """The continued run's history went back to time ~0 and restarted its running ELBO
    average at the continuation."""
    seed = 33
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed, noise=0.3).sample(800, random_state=seed)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    m.fit(X, max_iter=300, n_restarts=2, restart_steps=100, progress=False)
    h = m.history_
    its, times = [e["iteration"] for e in h], [e["time"] for e in h]
    assert its == sorted(its) and its[-1] == 300 and times == sorted(times)
    k = next(i for i, e in enumerate(h) if e["iteration"] > 100)
    # the average goes on: its first value after the continuation is near the last one
    # before (a new average started from the single step's value)
    assert abs(h[k]["elbo"] - h[k - 1]["elbo"]) < 0.2 * abs(h[k - 1]["elbo"]), h[k - 1:k + 1]


def test_the_smf_start_reads_no_clock_without_a_time_budget(monkeypatch):
    """Without a time budget the start's SMF-EM runs its 30 iterations whatever the
    machine's speed: a 30 s cap made a fit with random_state depend on it."""
    import streamfhmm.learn.smf as smf
    seed = 34
    print(f"seed={seed}")
    X, _ = FHMMParams.random(3, 2, random_state=seed, noise=0.4).sample(2000, random_state=seed)
    budgets = []
    real = smf.fit_smf

    def spy(*a, **kw):
        budgets.append(kw.get("time_budget"))
        return real(*a, **kw)
    monkeypatch.setattr(smf, "fit_smf", spy)
    a = FHMM(n_chains=3, random_state=seed).fit(X, method="smf", max_iter=2, progress=False)
    clock = iter(range(0, 10**9, 100))      # every reading 100 s after the last
    monkeypatch.setattr(smf.time, "perf_counter", lambda: float(next(clock)))
    b = FHMM(n_chains=3, random_state=seed).fit(X, method="smf", max_iter=2, progress=False)
    assert budgets[0] is None and budgets[2] is None      # (the start's runs)
    np.testing.assert_array_equal(a.W_, b.W_)


def test_lengths_reach_every_learner_and_the_smf_posterior(monkeypatch):
    """fit(X, lengths) hands the sequences to each learner (mutants that fitted the
    concatenation as one sequence passed every estimator test), and the SMF posterior
    of several sequences is theirs, stacked."""
    import streamfhmm.learn.em as em
    import streamfhmm.learn.smf as smf
    import streamfhmm.learn.svi as svi
    seed = 35
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed, noise=0.4).sample(700, random_state=seed)
    lengths = [300, 400]
    seen = {}

    def spy(module, name, key):
        real = getattr(module, name)

        def call(*a, **kw):
            seen.setdefault(key, []).append(np.asarray(a[1]).tolist())
            return real(*a, **kw)
        monkeypatch.setattr(module, name, call)
    spy(em, "fit_exact_em", "em")
    spy(smf, "fit_smf", "smf")
    spy(svi, "fit_svi", "svi")
    for method in ("em", "smf", "svi"):
        FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed).fit(
            X, lengths=lengths, method=method, max_iter=3, progress=False)
    assert seen["em"] == [lengths]
    assert seen["smf"][-1] == lengths            # (the first: the start's SMF-EM on the last rows)
    assert seen["svi"] == [[0, 300, 700]]        # (fit_svi takes the sequences' bounds)
    monkeypatch.undo()
    # and what the learners make of them: from the same start, the estimator's fit is the
    # learner's on the sequences, not on their concatenation
    start = FHMMParams.random(2, 2, random_state=seed + 1, noise=0.5)
    for method, learner in (("em", em.fit_exact_em), ("smf", smf.fit_smf)):
        m = FHMM.from_params(W=start.W, covariance=start.covariance, transmat=start.transmat,
                             startprob=start.startprob)
        m.fit(X, lengths=lengths, method=method, init="params", max_iter=3, progress=False)
        kw = dict(params=start, max_iter=3, progress=False)
        if method == "smf":
            kw["random_state"] = check_random_state(m.random_state)
        want, _ = learner(X, lengths, **kw)
        whole, _ = learner(X, None, **dict(kw, random_state=check_random_state(m.random_state))
                           if method == "smf" else kw)
        np.testing.assert_allclose(m.W_, want.W, rtol=1e-12, err_msg=method)
        assert not np.allclose(m.W_, whole.W, rtol=1e-9), method
    m = FHMM(n_chains=2, random_state=seed).fit(X, lengths=lengths, method="smf", max_iter=3,
                                                progress=False)
    both = m.predict_proba(X, lengths, method="smf")
    # (to the SMF sweeps' tolerance: their stopping test spans every sequence given)
    np.testing.assert_allclose(both, np.vstack([m.predict_proba(X[:300], method="smf"),
                                                m.predict_proba(X[300:], method="smf")]), atol=1e-6)
    assert not np.allclose(both, m.predict_proba(X, method="smf"), atol=1e-6)


def test_restarts_that_all_diverge_are_an_error_that_keeps_the_model(monkeypatch):
    """Every run's ELBO non-finite: a FloatingPointError saying so (the best of no run
    was continued and failed with "L must be finite", and its scores stayed on the model
    and in its file)."""
    import streamfhmm.learn.objective as objective
    seed = 34
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed, noise=0.4).sample(600, random_state=seed)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    m.fit(X, method="smf", max_iter=3, progress=False)
    W = m.W_.copy()
    monkeypatch.setattr(objective, "sequence_elbo", lambda *a: (np.nan, None))
    with pytest.raises(FloatingPointError, match="every one of the 2 runs diverged"):
        m.fit(X, max_iter=12, n_restarts=2, init="smf", progress=False)
    np.testing.assert_array_equal(m.W_, W)
    assert m.fit_method_ == "smf" and m.restart_scores_.size == 0 and m.init_scores_.size == 0


def test_save_and_load_refuse_a_path_that_is_no_file_name(tmp_path):
    """None, a number or a file object: ValueError (TypeError from os.fspath), and a
    bytes path works as its decoded str (load's '.npz' test failed on bytes)."""
    m = FHMM.from_params(W=W2, covariance=S2, transmat=A2)
    for bad in (None, 123, io.BytesIO()):
        with pytest.raises(ValueError, match="path must be a file name"):
            m.save(bad)
        with pytest.raises(ValueError, match="path must be a file name"):
            FHMM.load(bad)
    m.save(os.fsencode(tmp_path / "m"))
    np.testing.assert_array_equal(FHMM.load(os.fsencode(tmp_path / "m")).W_, m.W_)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


@pytest.mark.parametrize("v", [0, 1, 2])
def test_check_bool_refuses_int(v):
    """check_bool refuses plain integers (0/1 are not True/False)."""
    with pytest.raises(ValueError, match="must be True or False"):
        check_bool(v, "flag")


def test_check_bool_accepts_bools():
    assert check_bool(True, "flag") is True and check_bool(False, "flag") is False


def test_1d_without_n_features_refused():
    """a 1-D X is only taken as one column when n_features == 1; otherwise ValueError."""
    with pytest.raises(ValueError, match="2-D"):
        check_observations(np.zeros(5))


def test_1d_with_one_feature_is_a_column():
    assert check_observations(np.zeros(5), n_features=1).shape == (5, 1)


def test_zero_columns_refused():
    """X with no columns is refused when n_features is not given."""
    with pytest.raises(ValueError, match="at least one feature"):
        check_observations(np.zeros((5, 0)))


@pytest.mark.parametrize("b", [[0, 0], [3, 3, 3]])
def test_empty_span_refused(b):
    """bounds must span at least one row."""
    with pytest.raises(ValueError, match="span at least one row"):
        check_bounds(np.array(b, dtype=np.int64), 10)


def test_valid_bounds_accepted():
    assert check_bounds(np.array([0, 0, 4]), 10).tolist() == [0, 0, 4]


def test_equal_neighbouring_bounds_accepted():
    """bounds need only be non-decreasing: an empty sequence (equal neighbours) is accepted."""
    assert check_bounds(np.array([0, 0, 4, 4, 10]), 10).tolist() == [0, 0, 4, 4, 10]


def test_rows_off_by_1e_3_refused():
    """transmat rows must sum to 1 to within 1e-8: 1.001 is refused."""
    A = np.array([[[0.9, 0.101], [0.2, 0.8]]])
    with pytest.raises(ValueError, match="rows must sum to 1"):
        check_transmat(A, 1)
    with pytest.raises(ValueError, match="rows must sum to 1"):
        FHMMParams.from_natural(np.ones((2, 1)), np.eye(1), A)


def test_float32_transmat_accepted():
    """Rows of a float32 matrix sum to 1 only to float32 precision (0.95 + 0.05 is off by
    1.1e-8 in float64, 0.1 + 0.9 by 2.2e-8): such a matrix was refused by the float64
    tolerance. The tolerance follows the given type; 1.001 is still refused in float32."""
    A64 = np.array([[[0.95, 0.05], [0.1, 0.9]], [[0.7, 0.3], [0.99, 0.01]]])
    A32 = A64.astype(np.float32)
    assert np.abs(A32.astype(np.float64).sum(axis=2) - 1).max() > 1e-8
    np.testing.assert_array_equal(check_transmat(A32, 2), A32.astype(np.float64))
    m = FHMM.from_params(np.ones((3, 2)), np.eye(2), A32)
    np.testing.assert_allclose(m.transmat_, A64, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="rows must sum to 1"):
        check_transmat(np.array([[[0.9, 0.101], [0.2, 0.8]]], dtype=np.float32), 1)


def test_logit_of_one_is_finite():
    """logit clips p to 1 - PROB_FLOOR, so a transition probability of exactly 1 is accepted."""
    assert np.isfinite(logit(1.0))
    assert abs(logit(1.0) + logit(0.0)) < 1e-4   # (1 - 1e-12 is not exact in float64)


def test_from_natural_with_certain_switch():
    A = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    p = FHMMParams.from_natural(np.array([[1.0], [0.0]]), np.eye(1), A, startprob=[0.5])
    np.testing.assert_allclose(p.transmat, [[[PROB_FLOOR, 1 - PROB_FLOOR], [1 - PROB_FLOOR, PROB_FLOOR]]],
                               atol=1e-15)


def test_tiny_upper_entries_are_dropped():
    """FHMMParams stores L lower triangular: upper entries within the tolerance are zeroed."""
    L = np.array([[1.0, 1e-14], [0.5, 2.0]])
    p = FHMMParams(W=np.ones((2, 2)), L=L, alpha=[0.0], beta=[0.0], startprob=[0.5])
    assert np.all(np.triu(p.L, 1) == 0.0)
    np.testing.assert_array_equal(p.covariance, np.tril(L) @ np.tril(L).T)


def test_log_startprob_columns():
    """log_startprob column 0 is log(1 - pi), column 1 is log(pi)."""
    p = FHMMParams(W=np.ones((3, 1)), L=np.eye(1), alpha=[0.0, 0.0], beta=[0.0, 0.0],
                   startprob=[0.2, 0.9])
    np.testing.assert_allclose(p.log_startprob, np.log([[0.8, 0.2], [0.1, 0.9]]), rtol=1e-12)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_init_scores_follow_the_best_run(monkeypatch):
    """With n_restarts, init_scores_ must be those of the run that continued (the best)."""
    X, _ = FHMMParams.random(2, 2, random_state=0).sample(300, random_state=1)
    recorded = []
    orig = estimator_module.FHMM._initial_params

    def spy(self, *a, **k):
        out = orig(self, *a, **k)
        recorded.append(self.init_scores_.copy())
        return out
    monkeypatch.setattr(estimator_module.FHMM, "_initial_params", spy)
    for seed in range(20):
        recorded.clear()
        m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
        m.fit(X, max_iter=12, n_restarts=3, init="smf", n_init=2, progress=False)
        best = int(np.nanargmax(m.restart_scores_))
        if best != 0 and not np.array_equal(recorded[best], recorded[0]):
            print(f"seed={seed} best={best}")
            np.testing.assert_array_equal(m.init_scores_, recorded[best])
            return
    raise AssertionError("no seed with best run != 0")


def test_continued_run_warms_up_only_the_remaining_steps():
    """The continued best run gets only the warm-up steps left (net_warmup - restart_steps)."""
    seed = 0
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed)
    X, _ = p.sample(300, random_state=seed + 1)
    m = FHMM.from_params(p.W, p.covariance, p.transmat, window=3, n_hidden=4, random_state=seed)
    W0 = m.W_
    # 8 steps, runs compared after 4, warm-up 7: the last step moves the model
    m.fit(X, init="params", max_iter=8, n_restarts=2, restart_steps=4, net_warmup=7,
          progress=False)
    assert np.abs(m.W_ - W0).max() > 1e-6


@pytest.mark.parametrize("method", ["smf", "svi"])
def test_too_few_rows_refused(method):
    """A fresh start needs at least n_chains + 2 complete rows."""
    seed = 0
    print(f"seed={seed}")
    X = np.random.default_rng(seed).standard_normal((3, 2))
    with pytest.raises(ValueError, match="too few complete rows"):
        FHMM(n_chains=2, random_state=seed).fit(X, method=method, max_iter=2, progress=False)


@pytest.mark.parametrize("method", ["smf", "svi", "em"])
def test_auto_init_checks_width(method):
    """Init='auto' (continuing a fitted model) checks X's width up front with a clear message."""
    seed = 0
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed).sample(200, random_state=1)
    m = FHMM(n_chains=2, random_state=seed).fit(X, method="smf", max_iter=2, progress=False)
    X3 = np.random.default_rng(seed).standard_normal((200, 3))
    with pytest.raises(ValueError, match="X must have 2 features"):
        m.fit(X3, method=method, max_iter=2, progress=False)


def test_elbo_refuses_non_stationary_start():
    """FHMM.elbo refuses a model whose startprob is not the stationary distribution."""
    seed = 0
    print(f"seed={seed}")
    X, _ = FHMMParams.random(2, 2, random_state=seed).sample(200, random_state=1)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed).fit(X, max_iter=5, progress=False)
    m.elbo(X)
    m._set_params(m.params_.replace(startprob=np.array([0.999, 0.001])), m.net_)
    with pytest.raises(ValueError, match="stationary"):
        m.elbo(X)


def test_default_method_is_exact_at_12_chains():
    """Without networks, predict_proba's default is exact inference up to 12 chains inclusive."""
    seed = 0
    print(f"seed={seed}")
    p = FHMMParams.random(12, 3, random_state=seed)
    m = FHMM.from_params(p.W, p.covariance, p.transmat, p.startprob)
    X, _ = m.sample(15, random_state=1)
    np.testing.assert_array_equal(m.predict_proba(X), m.predict_proba(X, method="exact"))
