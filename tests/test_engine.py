"""The streaming engine: push against the batch path, exact mode against the exact
smoother, cold start, drift, stress, bad input, the learner thread."""
import gc
import os
import sys
import threading
import time

import numpy as np
import pytest

from streamfhmm import FHMM, exact
from streamfhmm.evaluation import align_params
from streamfhmm.model import FHMMParams
from streamfhmm.network import RecognitionNet
from streamfhmm.stream.engine import PosteriorBatch, StreamEngine
from streamfhmm.stream.posterior import FLAG_EDGE, FLAG_IMPUTED, FLAG_WARMUP, Posterior

from . import naive_stream as naive


def _model(M=3, D=3, window=5, n_hidden=6, share="all", seed=0, noise=0.5):
    print(f"model seed={seed}")
    p = FHMMParams.random(M, D, random_state=seed, noise=noise, switch=(0.05, 0.3))
    return FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat,
                            window=window, n_hidden=n_hidden, share_hidden=share)


def _net(model, mode, X, seed):
    print(f"net seed={seed}")
    net = RecognitionNet(model.n_chains, X.shape[1], window=model.window, n_hidden=model.n_hidden,
                         share=model.share_hidden, mode=mode).init(random_state=seed)
    rng = np.random.default_rng(seed)
    net.weights = 0.6 * rng.standard_normal(net.n_weights)
    return net.fit_scaler(X[~np.isnan(X).all(axis=1)])


def _data(model, n, seed, nan_fraction=0.0, all_missing=()):
    print(f"data seed={seed}")
    X, _ = model.sample(n, random_state=seed)
    if nan_fraction:
        rng = np.random.default_rng(seed)
        mask = rng.random(X.shape) < nan_fraction
        mask[mask.all(axis=1), 0] = False
        X[mask] = np.nan
    for r in all_missing:
        X[r] = np.nan  # a sample with nothing observed
    return X


def _stack(posts):
    return (np.array([p.t for p in posts]), np.array([p.theta for p in posts]),
            np.array([p.rho for p in posts]), np.array([p.mean for p in posts]),
            np.array([p.flags for p in posts]))


def _expected_flags(X, starts, ends, t, window, off, lag, exact=False):
    """Edge and imputed flags by their definition, for positions t of sequences: the
    recognition window of tau reads tau - off .. tau - off + window - 1, clipped to its
    sequence (edges are padded with the edge sample); imputed when those hold a NaN.
    ``exact``: imputed when a NaN lies in the ``window`` samples ending at the newest
    sample the fixed-lag (at the end: whole-sequence) smoothing of tau used."""
    flags = np.zeros(len(t), np.int64)
    nan = np.isnan(X).any(axis=1)
    for i, tau in enumerate(t):
        s = starts[np.searchsorted(starts, tau, side="right") - 1]
        e = ends[np.searchsorted(starts, tau, side="right") - 1]
        a, b = tau - off, tau - off + window - 1
        if a < s or b > e - 1:
            flags[i] |= FLAG_EDGE
        if exact:
            b = min(tau + lag, e - 1)
            a = b - window + 1
        if nan[max(s, a):min(b, e - 1) + 1].any():
            flags[i] |= FLAG_IMPUTED
    return flags


# ------------------------------------------------------------------ push = batch path
@pytest.mark.parametrize("mode", ["smooth", "filter"])
@pytest.mark.parametrize("share", ["all", "chain"])
def test_push_equals_batch_path(mode, share):
    model = _model(share=share, seed=1)
    X = _data(model, 157, seed=2, nan_fraction=0.05)
    # at each sequence's end, whatever the seed: a NaN that the window of the first
    # flushed posterior reads and the second's does not (98: 96..99, 99: 97..99 and
    # padding), and one just before the flushed windows of the second sequence
    clean, _ = model.sample(157, random_state=2)
    X[95:100], X[151:157] = clean[95:100], clean[151:157]
    X[96, 0] = X[152, 1] = np.nan
    net = _net(model, "centred" if mode == "smooth" else "causal", X, seed=3)
    lengths = [100, 57]
    with StreamEngine(model, mode=mode, learn=False, net=net) as eng:
        posts = []
        for x in X[:100]:
            got = eng.push(x)
            assert len(got) <= 1
            posts += got
        posts += eng.flush()
        for x in X[100:]:
            posts += eng.push(list(x))  # lists are accepted too
        posts += eng.flush()
        m = eng.metrics()
    t, theta, rho, mean, flags = _stack(posts)
    theta_ref, rho_ref = net.forward(X, lengths)
    np.testing.assert_array_equal(t, np.arange(157))
    np.testing.assert_allclose(theta, theta_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rho, rho_ref, rtol=0, atol=1e-12)
    W = model.params_.W
    np.testing.assert_allclose(mean, theta @ W[:-1] + W[-1], rtol=0, atol=1e-12)
    assert all(p.version == 0 for p in posts)
    starts, ends = np.array([0, 100]), np.array([100, 157])
    np.testing.assert_array_equal(flags, _expected_flags(X, starts, ends, t, net.window,
                                                         net.offset, net.lag))
    if mode == "smooth":   # the flushed posteriors: 98, 99 and 155, 156
        assert flags[98] & FLAG_IMPUTED and not flags[99] & FLAG_IMPUTED
        assert not (flags[155:] & FLAG_IMPUTED).any() and flags[154] & FLAG_IMPUTED
    assert m["samples"] == 157 and m["emitted"] == 157
    assert m["imputed"] == int(np.isnan(X).any(axis=1).sum())

    # the batch path, in blocks of any size, gives the same posteriors
    with StreamEngine(model, mode=mode, learn=False, net=net) as eng:
        parts = [eng.push_many(X[:1]), eng.push_many(X[1:37]), eng.push_many(X[37:100])]
        tail = eng.flush()
        parts.append(eng.push_many(X[100:]))
        tail2 = eng.flush()
    b = PosteriorBatch.concat(parts)
    t2 = np.concatenate([b.t, [p.t for p in tail], [p.t for p in tail2]]).astype(int)
    order = np.argsort(t2, kind="stable")
    theta2 = np.concatenate([b.theta] + [np.array([p.theta for p in q]).reshape(-1, 3)
                                         for q in (tail, tail2)])[order]
    flags2 = np.concatenate([b.flags, [p.flags for p in tail], [p.flags for p in tail2]])[order]
    rho2 = np.concatenate([b.rho] + [np.array([p.rho for p in q]).reshape(-1, 3)
                                     for q in (tail, tail2)])[order]
    mean2 = np.concatenate([b.mean] + [np.array([p.mean for p in q]).reshape(-1, W.shape[1])
                                       for q in (tail, tail2)])[order]
    np.testing.assert_array_equal(t2[order], np.arange(157))
    np.testing.assert_allclose(theta2, theta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rho2, rho, rtol=0, atol=1e-12)
    # (the block kernel writes its own means: one from another row passed unnoticed)
    np.testing.assert_allclose(mean2, mean, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(flags2, flags)


@pytest.mark.parametrize("mode", ["smooth", "filter"])
def test_push_with_empty_samples_matches_naive_windows(mode):
    model = _model(seed=27)
    X = _data(model, 30, seed=28, nan_fraction=0.1, all_missing=(0, 3, 29))
    net = _net(model, "centred" if mode == "smooth" else "causal", X, seed=29)
    with StreamEngine(model, mode=mode, learn=False, net=net) as eng:
        posts = [p for x in X for p in eng.push(x)] + eng.flush()
    t, theta, rho, _, flags = _stack(posts)
    wins = naive.windows(X, net.window, net.offset)
    ref = np.array([net.forward_window(w)[0] for w in wins])
    np.testing.assert_array_equal(t, np.arange(30))
    np.testing.assert_allclose(theta, ref, rtol=0, atol=1e-12)
    assert (flags[:3] & FLAG_IMPUTED).all()


def test_smooth_posterior_arrives_h_samples_late():
    model = _model(window=7, seed=4)
    X = _data(model, 20, seed=5)
    net = _net(model, "centred", X, seed=6)
    with StreamEngine(model, learn=False, net=net) as eng:
        got = [eng.push(x) for x in X]
        assert [len(g) for g in got] == [0, 0, 0] + [1] * 17
        assert [g[0].t for g in got[3:]] == list(range(17))
        assert eng.lag == 3
        tail = eng.flush()
        assert [p.t for p in tail] == [17, 18, 19] and all(p.edge for p in tail)
        assert eng.flush() == []


def test_posterior_arrays_are_not_overwritten():
    model = _model(seed=7)
    X = _data(model, 5000, seed=8)
    net = _net(model, "causal", X, seed=9)
    with StreamEngine(model, mode="filter", learn=False, net=net) as eng:
        first = eng.push(X[0])[0]
        keep = first.theta.copy()
        for x in X[1:]:
            eng.push(x)
    np.testing.assert_array_equal(first.theta, keep)
    assert isinstance(first, Posterior) and first.t == 0


# ------------------------------------------------------------------ exact mode
def test_exact_filter_equals_filtered_marginals():
    model = _model(M=4, seed=10)
    X = _data(model, 400, seed=11)
    with StreamEngine(model, mode="filter", learn=False, posterior="exact") as eng:
        posts = [p for x in X[:150] for p in eng.push(x)]
        batch = eng.push_many(X[150:])
        m = eng.metrics()
    ll, ref = exact.filtered_marginals(model.params_, X)
    theta = np.concatenate([np.array([p.theta for p in posts]), batch.theta])
    np.testing.assert_allclose(theta, ref, rtol=0, atol=1e-12)
    assert all((p.rho == 0).all() and p.flags == 0 for p in posts)
    np.testing.assert_allclose(m["loglik_per_sample"] * 400, ll, rtol=1e-10)


def test_exact_loglik_per_sample_is_over_the_samples_with_a_value():
    """An empty sample's log p(y_t | y_<t) is 0: counted, an outage raised the mean
    towards 0 (a dead sensor looked like a better fit). Push and push_many, against
    the dense forward pass."""
    model = _model(M=3, D=2, seed=74)
    X = _data(model, 300, seed=75, nan_fraction=0.1, all_missing=range(100, 220))
    p = model.params_
    n_valued = int((~np.isnan(X).all(axis=1)).sum())
    ll = naive.loglik_dense(p.W, None, p.transmat, p.startprob, X, L=p.L)
    print(f"valued samples {n_valued} of {len(X)}, loglik {ll!r}")
    for name, feed in (("push", lambda e: [e.push(x) for x in X]),
                       ("push_many", lambda e: e.push_many(X))):
        with StreamEngine(model, mode="filter", learn=False, posterior="exact") as eng:
            feed(eng)
            got = eng.metrics()["loglik_per_sample"]
        print(f"{name}: loglik_per_sample {got!r}")
        assert got == pytest.approx(ll / n_valued, rel=1e-9)


def test_exact_smooth_is_fixed_lag_and_flush_is_smoothing():
    model = _model(M=2, D=2, window=7, seed=12)
    X = _data(model, 40, seed=13, nan_fraction=0.1, all_missing=(5,))
    clean, _ = model.sample(40, random_state=13)
    X[33:40] = clean[33:40]
    X[33, 0] = np.nan   # the oldest of the 7 samples ending at the last: all 4 flagged
    with StreamEngine(model, mode="smooth", learn=False, posterior="exact") as eng:
        posts = [p for x in X for p in eng.push(x)]
        assert [p.t for p in posts] == list(range(37))
        tail = eng.flush()
    p = model.params_
    ref = naive.fixed_lag_dense(p.W, p.covariance, p.transmat, p.startprob, X, 3)
    t, theta, _, mean, flags = _stack(posts + tail)
    np.testing.assert_array_equal(t, np.arange(40))
    np.testing.assert_allclose(theta, ref, rtol=0, atol=1e-10)
    smooth = naive.smooth_dense(p.W, p.covariance, p.transmat, p.startprob, X)
    np.testing.assert_allclose(theta[-3:], smooth[-3:], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(flags & FLAG_EDGE, [0] * 37 + [FLAG_EDGE] * 3)
    np.testing.assert_array_equal(flags & FLAG_IMPUTED, _expected_flags(
        X, np.array([0]), np.array([40]), t, 7, 3, 3, exact=True) & FLAG_IMPUTED)
    assert (flags[36:] & FLAG_IMPUTED).all()   # (36 from push, 37-39 from flush)


def test_exact_smooth_flush_on_long_sequence():
    model = _model(M=5, D=3, window=11, seed=14)
    X = _data(model, 500, seed=15)
    with StreamEngine(model, mode="smooth", learn=False, posterior="exact") as eng:
        eng.push_many(X)
        tail = eng.flush()
    _, smooth = exact.smoothed_marginals(model.params_, X)
    np.testing.assert_allclose(np.array([q.theta for q in tail]), smooth[-5:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("eps", [1e-8, 1e-9])
def test_exact_posteriors_with_missing_value_and_ill_conditioned_L(eps):
    """A valid L with rows 1 and 2 parallel up to eps (Σ = L Lᵀ has an eigenvalue of
    order eps²) and dimension 0 missing: the formed Σ_oo is singular in float64, the
    missing-value emission was NaN for every state and filter_step left it out as an
    overflow (the posteriors were the predictions, loglik_per_sample -inf). Push and
    push_many, filtering and fixed-lag smoothing, against the dense smoother with the
    emissions in exact rational arithmetic from L."""
    seed = 57
    print(f"seed={seed} eps={eps}")
    rng = np.random.default_rng(seed)
    M = 2
    L = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.6, 0.8, eps]])
    W = rng.standard_normal((M + 1, 3))
    W[:, 2] = W[:, 1]  # the states' densities differ by O(1) along Σ_oo's good direction
    p = FHMMParams(W=W, L=L, alpha=np.array([-1.0, -2.0]), beta=np.array([-1.5, -0.5]),
                   startprob=np.array([0.3, 0.6]))
    model = FHMM(n_chains=M, window=3, n_hidden=4)
    model._set_params(p)
    X, _ = p.sample(12, random_state=rng)
    X[[2, 3, 7, 8, 9], 0] = np.nan
    X[5] = np.nan
    ll_ref = naive.loglik_dense(p.W, None, p.transmat, p.startprob, X, L=p.L)
    for mode, lag in (("filter", 0), ("smooth", 1)):
        ref = naive.fixed_lag_dense(p.W, None, p.transmat, p.startprob, X, lag, L=p.L)
        with StreamEngine(model, mode=mode, posterior="exact", learn=False) as e:
            a = PosteriorBatch.from_posteriors([q for y in X for q in e.push(y)] + e.flush())
            ll_a = e.metrics()["loglik_per_sample"] * (len(X) - 1)   # (X[5] holds no value)
        with StreamEngine(model, mode=mode, posterior="exact", learn=False) as e:
            b = PosteriorBatch.from_posteriors(list(e.push_many(X)) + e.flush())
            ll_b = e.metrics()["loglik_per_sample"] * (len(X) - 1)
        print(f"mode={mode} loglik push {ll_a!r} push_many {ll_b!r} exact {ll_ref!r}")
        for got, ll in ((a, ll_a), (b, ll_b)):
            np.testing.assert_array_equal(got.t, np.arange(len(X)))
            np.testing.assert_allclose(got.theta, ref, rtol=0, atol=1e-6)
            assert ll == pytest.approx(ll_ref, rel=0, abs=1e-5)


# ------------------------------------------------------------------ bad input
def test_bad_input_messages_and_counts():
    model = _model(D=3, seed=16)
    X = _data(model, 50, seed=17)
    with StreamEngine(model, mode="filter", learn=False, posterior="exact") as eng:
        eng.push_many(X[:10])
        before = eng.metrics()
        state = eng._ring.buf.copy()
        with pytest.raises(ValueError, match=r"D=3 numbers .*shape \(2,\)"):
            eng.push([1.0, 2.0])
        with pytest.raises(ValueError, match=r"D=3 numbers .*shape \(2, 3\)"):
            eng.push(np.zeros((2, 3)))
        with pytest.raises(ValueError, match="D=3 numbers, got str"):
            eng.push("1,2,3")
        with pytest.raises(ValueError, match="D=3 numbers, got NoneType"):
            eng.push(None)
        with pytest.raises(ValueError, match="D=3 numbers, got an array of dtype <U1"):
            eng.push(["a", "b", "c"])
        with pytest.raises(ValueError, match="D=3 numbers.*dtype object"):
            eng.push([1.0, None, {}])
        with pytest.raises(ValueError, match=r"infinities .*found inf at index 1 of the D=3"):
            eng.push([0.0, np.inf, 1.0])
        with pytest.raises(ValueError, match=r"infinities .*found -inf at row 2, column 0"):
            bad = X[10:15].copy()
            bad[2, 0] = -np.inf
            eng.push_many(bad)
        with pytest.raises(ValueError, match=r"shape \(n, D=3\), got shape \(4,\)"):
            eng.push_many(np.zeros(4))
        with pytest.raises(ValueError, match="numeric array of shape"):
            eng.push_many([["x", "y", "z"]])
        after = eng.metrics()
        np.testing.assert_array_equal(eng._ring.buf, state)  # nothing reached the state
        assert after["samples"] == before["samples"] == 10
        assert after["rejected"] == 7 + 5 + 4 + 1
        # a NaN is a missing value, not an error
        got = eng.push([np.nan, np.nan, np.nan])
        assert got[0].imputed and np.isfinite(got[0].theta).all()
    with pytest.raises(RuntimeError, match="closed"):
        eng.push(X[0])


def test_constructor_errors():
    model = _model(seed=18)
    X = _data(model, 30, seed=19)
    with pytest.raises(ValueError, match="mode must be one of"):
        StreamEngine(model, mode="centred")
    with pytest.raises(ValueError, match="posterior must be one of"):
        StreamEngine(model, posterior="smf")
    with pytest.raises(ValueError, match=r"causal recognition network .*learn=True.*'exact'"):
        StreamEngine(model, mode="filter", learn=False)
    with pytest.raises(ValueError, match=r"centred recognition network .*learn=True"):
        StreamEngine(model, mode="smooth", learn=False)
    with pytest.raises(ValueError, match="needs a 'causal' recognition network, got a 'centred'"):
        StreamEngine(model, mode="filter", learn=False, net=_net(model, "centred", X, 1))
    with pytest.raises(ValueError, match="unfitted FHMM in recognition mode needs learn=True"):
        StreamEngine(FHMM(n_chains=2), learn=False)
    with pytest.raises(ValueError, match="need checkpoint_path"):
        StreamEngine(model, learn=False, posterior="exact", checkpoint_every=10)
    with pytest.raises(ValueError, match="n_chains <= 20"):
        StreamEngine(FHMM(n_chains=21), learn=False, posterior="exact")
    eng = StreamEngine(model, learn=False, posterior="exact")
    with pytest.raises(ValueError, match="learn=False"):
        eng.learning = True
    eng.close()
    eng.close()  # idempotent


# ------------------------------------------------------------------ the learner
def _push_in(eng, X, blocks=None):
    """Stream X: one push per sample, or push_many over consecutive blocks of the
    given sizes."""
    if blocks is None:
        for x in X:
            eng.push(x)
        return
    s = 0
    for b in blocks:
        eng.push_many(X[s:s + b])
        s += b


def _full_learner_round(eng, timeout=30.0):
    """Wait until the learner thread has gone through a whole round of its loop (drain
    the pending samples, run a job, decide whether to step) that began after this call:
    two jobs run one after the other; the first one's round has ended when the second
    runs. A sleep cannot show that the learner took no steps; this can."""
    for _ in range(2):
        done = threading.Event()
        eng._thread.request(done.set)
        assert done.wait(timeout), "the learner thread did not run a job"


def _pace(eng, X, chunk, steps_per_sample, timeout=10.0, collect=None):
    """Stream X in chunks, waiting after each chunk until the learner has taken
    ``steps_per_sample`` steps per sample streamed (a stream at a fixed rate)."""
    for s in range(0, len(X), chunk):
        b = eng.push_many(X[s:s + chunk])
        if collect is not None:
            collect.append(b)
        target = steps_per_sample * (s + chunk)
        t0 = time.perf_counter()
        while (eng.metrics()["learner_steps"] < target and time.perf_counter() - t0 < timeout
               and eng.learner_error is None):
            time.sleep(0.002)
    assert eng.learner_error is None


def _cold_start_params():
    W = np.array([[1.5, 0.0, 0.5, 0.0],
                  [0.0, 1.5, -0.5, 0.5],
                  [0.5, -0.5, 0.0, 1.5],
                  [1.0, 1.0, 1.0, 1.0]])
    A = np.array([[[0.97, 0.03], [0.05, 0.95]], [[0.95, 0.05], [0.04, 0.96]],
                  [[0.96, 0.04], [0.06, 0.94]]])
    return FHMMParams.from_natural(W, 0.5 ** 2 * np.eye(4), A)


@pytest.mark.parametrize("learn", [False, True])
def test_pickle_and_copy_say_how_to_save_an_engine(learn, tmp_path):
    """pickle, copy.copy and copy.deepcopy failed on a lock with "cannot pickle
    '_thread.lock' object"; the error now names checkpoint() and resume(), and the engine
    goes on working."""
    import copy
    import pickle

    model = _model(seed=3)
    X, _ = model.sample(300, random_state=3)
    print("seed=3")
    with StreamEngine(model, mode="filter", posterior="exact", learn=learn, random_state=0) as eng:
        eng.push_many(X[:100])
        for attempt in (lambda: pickle.dumps(eng), lambda: copy.copy(eng), lambda: copy.deepcopy(eng)):
            with pytest.raises(TypeError, match=r"cannot be pickled or copied .*engine\.checkpoint\(path\).*"
                                                r"StreamEngine\.resume\(path\)"):
                attempt()
        assert len(eng.push_many(X[100:])) == 200
        path = eng.checkpoint(tmp_path / "e")
    with StreamEngine.resume(path) as back:
        assert back.n_samples == 300


@pytest.mark.slow
def test_cold_start_reaches_exact_smoothing():
    seed = 20
    print(f"seed={seed}")
    true = _cold_start_params()
    X, _ = true.sample(50_000, random_state=seed)
    model = FHMM(n_chains=3, window=5, n_hidden=20, share_hidden="chain", random_state=seed)
    out = []
    with StreamEngine(model, mode="smooth", learn=True, warmup=2000, warmup_steps=1500,
                      learning_rate=2e-3, random_state=seed) as eng:
        _pace(eng, X, 1000, 0.1, collect=out)
        tail = eng.flush()
        params = eng.params
        m = eng.metrics()
    b = PosteriorBatch.concat(out)
    # every warm-up sample's posterior, the last lag's (emitted by later pushes) too
    assert (b.flags[:2000] & FLAG_WARMUP).all() and not (b.flags[2000:] & FLAG_WARMUP).any()
    t = np.concatenate([b.t, [p.t for p in tail]])
    theta = np.concatenate([b.theta, [p.theta for p in tail]])
    np.testing.assert_array_equal(t, np.arange(50_000))
    _, ref = exact.smoothed_marginals(true, X)
    _, perm, flip = align_params(params, true)
    aligned = theta[:, perm]
    aligned[:, flip] = 1 - aligned[:, flip]
    mae_last = np.abs(aligned[-10_000:] - ref[-10_000:]).mean()
    mae_all = np.abs(aligned - ref).mean()
    print(f"seed={seed} MAE last 10k={mae_last:.4f} all={mae_all:.4f} steps={m['learner_steps']} "
          f"version={m['snapshot_version']}")
    assert mae_last <= 0.05
    assert m["snapshot_version"] > 10 and m["discarded_steps"] == 0


def _drift_pair():
    W_a = np.array([[1.5, 0.0, 0.3], [0.0, 1.5, -0.3], [0.5, 0.5, 0.5]])
    W_b = np.array([[1.5, 0.8, 0.3], [-0.6, 1.5, -0.3], [1.5, 0.0, 1.0]])
    A = np.array([[[0.95, 0.05], [0.05, 0.95]], [[0.96, 0.04], [0.06, 0.94]]])
    S = 0.4 ** 2 * np.eye(3)
    return FHMMParams.from_natural(W_a, S, A), FHMMParams.from_natural(W_b, S, A)


@pytest.mark.slow
def test_recency_learner_follows_drift_better_than_uniform():
    seed = 21
    print(f"seed={seed}")
    pa, pb = _drift_pair()
    Xa, _ = pa.sample(20_000, random_state=seed)
    Xb, _ = pb.sample(20_000, random_state=seed + 1)
    fresh, _ = pb.sample(20_000, random_state=seed + 2)
    X = np.concatenate([Xa, Xb])
    ll_true = exact.log_likelihood(pb, fresh) / len(fresh)
    gaps = {}
    for name, half_life in (("recency", 3000.0), ("uniform", None)):
        model = FHMM.from_params(W=pa.W, covariance=pa.covariance, transmat=pa.transmat,
                                 window=5, n_hidden=16, share_hidden="chain")
        with StreamEngine(model, mode="filter", posterior="exact", learn=True,
                          reservoir_size=600, recency_half_life=half_life, learning_rate=3e-3,
                          net_burnin=500, random_state=seed) as eng:
            _pace(eng, X, 500, 0.15)
            params = eng.params
        gaps[name] = ll_true - exact.log_likelihood(params, fresh) / len(fresh)
        print(f"{name}: loglik per step gap to the new true parameters = {gaps[name]:.4f}")
    gap_a = ll_true - exact.log_likelihood(pa, fresh) / len(fresh)
    print(f"old parameters: gap {gap_a:.4f}")
    assert gaps["recency"] < 0.05
    assert gaps["recency"] < 0.5 * gaps["uniform"]
    assert gaps["uniform"] < gap_a


@pytest.mark.slow
def test_stress_million_samples_with_learner():
    seed = 22
    print(f"seed={seed}")
    model = _model(M=3, D=3, window=5, n_hidden=8, seed=seed)
    X, _ = model.params_.sample(1_000_000, random_state=seed)
    rng = np.random.default_rng(seed)
    X[rng.random(X.shape) < 0.01] = np.nan
    versions, n_out = [], 0
    with StreamEngine(model, mode="smooth", learn=True, warmup=1000, warmup_steps=200,
                      snapshot_interval=5, random_state=seed) as eng:
        s = 0
        while s < len(X):
            kind = rng.integers(0, 10)
            if kind == 0:  # single pushes
                for x in X[s:s + 2000]:
                    for p in eng.push(x):
                        assert np.isfinite(p.theta).all() and np.isfinite(p.mean).all()
                        versions.append(np.array([p.version]))
                        n_out += 1
                s += 2000
            else:
                n = int(rng.integers(1, 20_000))
                b = eng.push_many(X[s:s + n])
                assert np.isfinite(b.theta).all() and np.isfinite(b.rho).all()
                assert np.isfinite(b.mean).all()
                assert ((b.theta >= 0) & (b.theta <= 1)).all()
                versions.append(b.version)
                n_out += len(b)
                s += n
            if kind == 1:
                eng.learning = not eng.learning
            if kind == 2:
                n_out += len(eng.flush())
        eng.learning = True
        n_out += len(eng.flush())
        m = eng.metrics()
    v = np.concatenate(versions)
    assert (np.diff(v) >= 0).all()
    assert m["samples"] == 1_000_000 and m["emitted"] == n_out == 1_000_000
    assert m["learner_error"] is None and m["learner_steps"] > 100
    assert v[-1] == m["snapshot_version"] or v[-1] < m["snapshot_version"]
    assert np.isfinite(m["elbo"])
    print(m)


def test_learner_toggle_and_metrics():
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=23)
    X = _data(model, 6000, seed=24)
    with StreamEngine(model, mode="smooth", learn=True, warmup=500, warmup_steps=50,
                      snapshot_interval=5, random_state=0) as eng:
        assert eng.push(X[0]) == [] and eng.metrics()["phase"] == "warmup"
        assert eng.version == -1 and eng.params is None
        posts = eng.push_many(X[1:500])  # completes the warm-up: posteriors 0..498
        assert len(posts) == 499 and all(p.warmup for p in posts)
        assert posts.t[0] == 0 and posts[0].edge
        _pace(eng, X[500:3000], 500, 0.02)
        m1 = eng.metrics()
        assert m1["learner_steps"] > 0 and m1["snapshot_version"] > 0 and m1["learning"]
        eng.learning = False
        with eng._learner.lock:     # the round that was running, if any, has ended
            pass
        s = eng.metrics()["learner_steps"]
        for x in X[3000:3500]:
            eng.push(x)
        _full_learner_round(eng)    # (it drained those samples and looked at the switch)
        assert eng.metrics()["learner_steps"] == s
        eng.learning = True
        t0 = time.perf_counter()
        while eng.metrics()["learner_steps"] == s and time.perf_counter() - t0 < 10:
            time.sleep(0.01)
        m = eng.metrics()
    assert m["learner_steps"] > s
    for key in ("samples", "emitted", "imputed", "rejected", "learner_steps", "discarded_steps",
                "snapshot_version", "elbo", "push_p50_us", "push_p99_us"):
        assert key in m
    assert m["samples"] == 3500
    assert 0 < m["push_p50_us"] <= m["push_p99_us"] <= m["push_max_us"]
    assert np.isfinite(m["elbo"]) and m["elbo"] < 0



def test_a_paused_learner_takes_no_steps_and_learning_stays_as_set(tmp_path):
    """What the service does to the engines of ended streams: held, the learner takes no
    step; ``learning`` and a checkpoint still say True; let go, it steps again. Held
    while ``learning`` is off, it stays off when let go."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=23)
    X = _data(model, 4000, seed=24)
    with StreamEngine(model, mode="smooth", learn=True, learner_duty=1.0, random_state=0) as eng:
        eng.push_many(X[:2000])
        t0 = time.perf_counter()
        while eng.metrics()["learner_steps"] == 0 and time.perf_counter() - t0 < 30:
            time.sleep(0.01)
        assert eng.metrics()["learner_steps"] > 0 and eng.learner_error is None
        eng._pause_learner(True)
        with eng._learner.lock:     # the round that was running, if any, has ended
            pass
        s = eng.metrics()["learner_steps"]
        eng.push_many(X[2000:2500])
        _full_learner_round(eng)
        assert eng.metrics()["learner_steps"] == s and eng.learning and eng.metrics()["learning"]
        eng.checkpoint(str(tmp_path / "e.npz"))
        eng._pause_learner(False)
        t0 = time.perf_counter()
        while eng.metrics()["learner_steps"] == s and time.perf_counter() - t0 < 10:
            time.sleep(0.01)
        assert eng.metrics()["learner_steps"] > s
        eng.learning = False
        eng._pause_learner(True)
        eng._pause_learner(False)
        assert not eng.learning and not eng._learner.enabled
    with StreamEngine.resume(str(tmp_path / "e.npz")) as back:
        assert back.learning and back._learner.enabled


@pytest.mark.parametrize("path", ["push", "push_many", "warm-up"])
def test_learn_samples_holds_the_model_fixed(path, tmp_path):
    """learn_samples: learning turns itself off once that many samples were accepted
    (warm-up included); the posteriors after it carry one snapshot version, and a
    checkpoint resumes with learning off."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=25)
    X = _data(model, 3000, seed=26)
    cold = path == "warm-up"
    limit = 400 if cold else 1500
    eng = StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4) if cold else model, learn=True,
                       net=None if cold else _net(model, "centred", X, seed=27),
                       warmup=500, warmup_steps=20, learn_samples=limit, learner_duty=1.0,
                       snapshot_interval=5, random_state=0)
    with eng:
        assert eng.learning
        if cold:
            eng.push_many(X[:500])      # the warm-up alone passes the limit
        elif path == "push":
            _pace(eng, X[:limit - 1], 100, 0.05)
            assert eng.learning and eng.n_samples == limit - 1
            eng.push(X[limit - 1])
        else:
            _pace(eng, X[:1000], 100, 0.05)
            assert eng.learning and eng.learner_steps > 0
            eng.push_many(X[1000:1700])   # reaches the limit inside the block
        assert not eng.learning and not eng.metrics()["learning"]
        with eng._learner.lock:   # the round it was in has ended (and published)
            pass
        steps, version = eng.learner_steps, eng.version
        later = eng.push_many(X[1700:2500])
        _full_learner_round(eng)
        assert eng.learner_steps == steps and eng.version == version
        assert set(later.version.tolist()) == {version}
        n = eng.n_samples
        path_ck = eng.checkpoint(tmp_path / "ck.npz")
    with StreamEngine.resume(path_ck) as again:
        assert not again.learning and again.n_samples == n
        again.learning = True        # the limit was reached once; the host may learn again
        assert again.learning
        again.push_many(X[2500:2600])
        assert again.learning        # and the passed limit does not turn it off again


@pytest.mark.parametrize("overrides", [{}, {"learn_samples": 40}])
def test_learn_samples_passed_inside_a_warm_up_checkpoint_still_applies(overrides, tmp_path):
    """A warm-up checkpoint that already counts more samples than learn_samples (60 of a
    100-sample warm-up, limit 40): resume took the limit as passed and dropped it, so the
    start's fit took the whole warm-up and learning never turned off (1,630 steps after
    20,000 samples, against 50 uninterrupted); with the limit given again, the fit still
    took all 100 rows. It resumes as the uninterrupted engine goes on."""
    model = _model(M=2, D=2, window=5, n_hidden=8, seed=28)
    X = _data(model, 3000, seed=29)

    def make():
        return StreamEngine(FHMM(n_chains=2, window=5, n_hidden=8, random_state=0), learn=True,
                            warmup=100, warmup_steps=50, learn_samples=40, random_state=0)

    with make() as ref:
        ref.push_many(X[:100])
        assert not ref.learning
        W_ref, steps_ref = ref.params.W.copy(), ref.learner_steps
    with make() as eng:
        eng.push_many(X[:60])
        path = eng.checkpoint(tmp_path / "warm.npz")
    with StreamEngine.resume(path, **overrides) as back:
        assert back.warming_up and back.learning
        back.push_many(X[60:100])
        assert not back.learning and back.learner_steps == steps_ref
        np.testing.assert_array_equal(back.params.W, W_ref)
        back.push_many(X[100:3000])
        _full_learner_round(back)
        assert back.learner_steps == steps_ref and not back.learning


@pytest.mark.parametrize("path", ["push", "push_many"])
def test_learn_samples_stops_feeding_the_learner(path, tmp_path):
    """Once learn_samples turned learning off for good the learner is handed no more
    subchains (it took no step on them, but copying them into its reservoir made
    push_many ten times dearer than learn=False's and every checkpoint differ); a host
    that turns learning on again feeds it again, and a resumed engine stays as it was."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=30)
    X = _data(model, 4000, seed=31)
    eng = StreamEngine(model, learn=True, net=_net(model, "centred", X, seed=32),
                       learn_samples=1000, random_state=0)

    def seen(e):   # subchains handed to the learner so far
        _full_learner_round(e)
        lr = e._learner
        return lr.reservoir.n_seen + len(lr.pending) + lr.dropped

    push = (lambda e, Y: [e.push(x) for x in Y]) if path == "push" else StreamEngine.push_many
    with eng:
        push(eng, X[:1500])
        assert not eng.learning
        before = seen(eng)
        push(eng, X[1500:2500])
        assert seen(eng) == before
        path_ck = eng.checkpoint(tmp_path / "stopped.npz")
        eng.learning = True
        push(eng, X[2500:3000])
        assert seen(eng) > before
    with StreamEngine.resume(path_ck) as back:
        assert not back.learning
        n = seen(back)
        push(back, X[2500:3500])
        assert seen(back) == n


@pytest.mark.parametrize("posterior", ["exact", "recognition"])
@pytest.mark.parametrize("how", ["push", "push_many", "flush", "resume"])
def test_every_warm_up_posterior_is_flagged(posterior, how, tmp_path):
    """FLAG_WARMUP marks the posteriors of every warm-up sample: the last h of a smooth
    engine's warm-up wait for h more samples (or a flush) and came without it (and with
    a warm-up shorter than h, none had it)."""
    model = _model(M=2, D=2, window=9, n_hidden=4, seed=33)
    X = _data(model, 120, seed=34)
    eng = StreamEngine(FHMM(n_chains=2, window=9, n_hidden=4, random_state=0), mode="smooth",
                       posterior=posterior, learn=True, warmup=30, warmup_steps=5, random_state=0)
    out = []
    with eng:
        if how == "push":
            for x in X:
                out += eng.push(x)
        elif how == "flush":
            out += eng.push_many(X[:20])
            out += eng.flush()            # ends the warm-up early: all 20 are warm-up's
            out += eng.push_many(X[20:])
        else:
            out += eng.push_many(X[:30])    # completes the warm-up; 4 posteriors wait
            if how == "resume":
                path = eng.checkpoint(tmp_path / "ck.npz")
                eng.close()
                eng = StreamEngine.resume(path)
            out += eng.push_many(X[30:32])
            out += eng.push_many(X[32:])
        out += eng.flush()
    n_warm = 20 if how == "flush" else 30
    assert [p.t for p in out] == list(range(120))
    assert [p.t for p in out if p.flags & FLAG_WARMUP] == list(range(n_warm))


@pytest.mark.parametrize("blocks", [[3000], [999, 2001], [7] * 428 + [4]])
def test_learn_samples_ends_the_subchains_where_push_does(blocks):
    """push_many hands the learner the subchains push does, up to the sample that
    reaches learn_samples (it handed those of the rest of its 4,096-row chunk too)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=35)
    X = _data(model, 3000, seed=36)
    net = _net(model, "centred", X, seed=37)

    def ends(use_blocks):
        with StreamEngine(model, learn=True, net=net, learn_samples=1000, learner_duty=1e-3) as eng:
            got = []
            eng._learner.feed = lambda seg, t: got.append(t)
            _push_in(eng, X, blocks if use_blocks else None)
            assert not eng.learning
        return got

    one = ends(False)
    assert one == ends(True) and one[-1] < 1000 <= one[-1] + 3


def test_a_paused_learner_after_learn_samples_is_fed_after_a_resume(tmp_path):
    """Past learn_samples, a host that turns learning on and then pauses it: the engine
    still hands the paused learner its subchains (as any paused engine), and so does
    the engine resumed from its checkpoint (it took the limit's stop for its own)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=38)
    X = _data(model, 3000, seed=39)

    def fed_during(e, Y):
        got = []
        e._learner.feed = lambda seg, t: got.append(t)
        e.push_many(Y)
        return len(got)

    with StreamEngine(model, learn=True, net=_net(model, "centred", X, seed=40), learn_samples=500,
                      random_state=0) as eng:
        eng.push_many(X[:1000])
        eng.learning = True
        eng.learning = False
        path = eng.checkpoint(tmp_path / "paused.npz")
        n = fed_during(eng, X[1000:2000])
    assert n > 0
    with StreamEngine.resume(path) as back:
        assert not back.learning and fed_during(back, X[1000:2000]) == n
    with StreamEngine.resume(path, learn_samples=700) as again:   # an explicit limit, passed
        assert not again.learning and fed_during(again, X[1000:2000]) == 0


def test_learn_samples_errors():
    model = _model(seed=28)
    with pytest.raises(ValueError, match="learn_samples needs learn=True"):
        StreamEngine(model, learn=False, posterior="exact", learn_samples=10)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="learn_samples must be an integer >= 1"):
            StreamEngine(model, learn=True, posterior="exact", learn_samples=bad)

def test_learner_discards_non_finite_steps_and_keeps_parameters_finite():
    """Subchains whose ELBO overflows (values of 1e200: the engine serves such samples
    but keeps them out of the reservoir, so here they are fed to the learner directly)
    make steps that are discarded; the parameters stay finite."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=25)
    X = _data(model, 3000, seed=26)
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, reservoir_size=100,
                      snapshot_interval=5, random_state=1) as eng:
        _pace(eng, X[:1000], 200, 0.05)
        for t in range(1000, 1400, eng._L):
            eng._learner.feed(np.full((eng._S, 2), 1e200), t)
        _pace(eng, X[1000:], 200, 0.05)
        m = eng.metrics()
        p = eng.params
    assert m["discarded_steps"] > 0
    assert all(np.isfinite(a).all() for a in (p.W, p.L, p.alpha, p.beta))
    assert m["learner_error"] is None


@pytest.mark.parametrize("blocks", [[1] * 60, [7, 1, 13, 39], [60]])
def test_learner_gets_the_same_subchains_from_push_and_push_many(blocks):
    """A subchain of S samples every L samples of a sequence (ending at τ with
    τ - start + 1 - S ≥ 0 and divisible by L), whichever path the samples took."""
    model = _model(seed=41)
    X = _data(model, 120, seed=42, nan_fraction=0.05)
    net = _net(model, "centred", X, seed=43)
    print("seeds 41 42 43, blocks", blocks)

    def fed(use_blocks):
        with StreamEngine(model, learn=True, net=net, learner_duty=1e-3) as eng:
            got = []
            eng._learner.feed = lambda seg, t: got.append((t, seg.copy()))
            for part in (X[:60], X[60:]):
                _push_in(eng, part, blocks if use_blocks else None)
                eng.flush()    # a new sequence starts at 60
            S, L = eng._S, eng._L
        return got, S, L

    a, S, L = fed(False)
    b, _, _ = fed(True)
    ends = [t for t, _ in a]
    expect = [t for t in range(120) if (t - (0 if t < 60 else 60) + 1 - S) >= 0
              and (t - (0 if t < 60 else 60) + 1 - S) % L == 0]
    assert ends == expect and len(ends) >= 4
    assert [t for t, _ in b] == ends
    for (t, seg), (_, seg2) in zip(a, b):
        np.testing.assert_array_equal(seg, X[t - S + 1:t + 1])
        np.testing.assert_array_equal(seg2, seg)


@pytest.mark.parametrize("use_blocks", [False, True])
def test_subchains_with_values_beyond_1e150_stay_out_of_the_reservoir(use_blocks):
    """A running engine serves such a sample, but its gradient overflows: in a
    uniform reservoir the subchain spoiled a fifth of the learner's steps for long."""
    model = _model(seed=47)
    X = _data(model, 120, seed=48)
    net = _net(model, "centred", X, seed=49)
    print("seeds 47 48 49, blocks", use_blocks)
    Y = X.copy()
    Y[30, 1], Y[90, 0] = 1e200, -1e300

    def fed(Z):
        with StreamEngine(model, learn=True, net=net, learner_duty=1e-3) as eng:
            got = []
            eng._learner.feed = lambda seg, t: got.append((t, seg.copy()))
            posts = eng.push_many(Z) if use_blocks else [p for z in Z for p in eng.push(z)]
            S = eng._S
        return got, S, posts

    clean, S, _ = fed(X)
    got, _, posts = fed(Y)
    assert len(posts) > 100 and all(np.isfinite(p.theta).all() for p in posts)   # (served)
    expect = [t for t, _ in clean if not (t - S < 30 <= t or t - S < 90 <= t)]
    assert [t for t, _ in got] == expect and len(expect) < len(clean)
    assert all(np.abs(seg).max() < 1e150 for _, seg in got)


def test_learner_steps_property_is_the_metric():
    model = _model(seed=44)
    X = _data(model, 400, seed=45)
    net = _net(model, "centred", X, seed=46)
    with StreamEngine(model, learn=False, net=net) as eng:
        eng.push_many(X[:50])
        assert eng.learner_steps == eng.metrics()["learner_steps"] == 0
    with StreamEngine(model, learn=True, net=net, learner_duty=1.0) as eng:
        eng.push_many(X)
        deadline = time.monotonic() + 60
        while eng.metrics()["learner_steps"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = eng.metrics()["learner_steps"]
        assert 0 < before <= eng.learner_steps <= eng.metrics()["learner_steps"]


# ------------------------------------------------------------------ regressions
def test_a_rejected_first_sample_does_not_fix_D():
    """push([inf]) on an engine that does not know D yet, an (n, 0) block, or a
    warm-up value beyond 1e150: refused, and D is still open (it was set from the
    rejected sample, or to 0)."""
    for how, bad in (("push", [np.inf]), ("push_many", [[np.inf]]),
                     ("push_many", np.empty((3, 0))), ("push", []),
                     ("push", [1e200, 0.0]), ("push_many", [[0.0, -1e200]])):
        eng = StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), learn=False,
                           posterior="exact", warmup=50)
        with eng:
            with pytest.raises(ValueError, match=r"infinities|D >= 1|at most 1e\+150"):
                getattr(eng, how)(bad)
            assert eng.metrics()["samples"] == 0 and eng.metrics()["rejected"] >= 1
            assert eng.push([0.0, 1.0, 2.0]) == []      # D = 3 now
            with pytest.raises(ValueError, match="D=3"):
                eng.push([0.0, 1.0])


@pytest.mark.parametrize("posterior", ["recognition", "exact"])
def test_a_network_of_another_D_is_refused(posterior):
    """A cold engine's ``net`` (the inference network, or in exact mode the learner's
    start) must read the stream's D: given by ``n_features`` or by the first sample.
    It was taken: the warm-up replay then failed inside the kernels at every push (and
    each retry left a learner thread running), and in exact mode the learner trained the
    network of D=3 on samples of D=2."""
    seed = 64
    print(f"seed={seed}")
    net = RecognitionNet(2, 3, window=3, n_hidden=4, mode="centred").init(random_state=seed)
    kw = dict(net=net, posterior=posterior, learn=True, warmup=20, warmup_steps=5)
    with pytest.raises(ValueError, match=r"reads samples of D=3 values, n_features is 2: pass "
                                         r"a network of n_features=2"):
        StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), n_features=2, **kw)
    X = np.random.default_rng(seed).standard_normal((30, 3))
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), **kw) as eng:
        with pytest.raises(ValueError, match=r"push: the network \(net\) reads samples of "
                                             r"D=3 values, the first sample holds 2"):
            eng.push(X[0, :2])
        with pytest.raises(ValueError, match=r"push_many: .*D=3 values, the first block's "
                                             r"rows hold 2"):
            eng.push_many(X[:5, :2])
        m = eng.metrics()
        assert eng.n_features is None and m["samples"] == 0 and m["rejected"] == 6
        out = eng.push_many(X)          # the network's D: accepted
        assert eng.n_features == 3 and len(out) == 30 - eng.lag


def test_n_features_must_be_the_fitted_models():
    """n_features beside a fitted model of another D was ignored (the first push of its
    D then failed); it is refused, and the model's own D is taken."""
    p = FHMMParams.random(2, 2, random_state=0)
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat)
    with pytest.raises(ValueError, match=r"n_features is 3, but the model has 2 features"):
        StreamEngine(m, n_features=3, posterior="exact")
    with StreamEngine(m, n_features=2, posterior="exact") as eng:
        assert eng.n_features == 2


@pytest.mark.parametrize("where", ["replay", "block"])
def test_a_refused_end_of_warmup_leaves_no_learner_thread(where, monkeypatch):
    """A push_many that ends the warm-up and then fails (in the warm-up's replay, or in
    the block's rows after it) puts the warm-up back and stops the learner thread it
    started: the thread ran on, and each retry of the block started another."""
    seed = 66
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 60, seed=seed + 1)
    real = StreamEngine._process

    def failing(self, Y, extra_flags, feed):
        if feed == (where == "block"):
            raise ValueError("the batch path failed")
        return real(self, Y, extra_flags, feed)

    def learners():
        return sum(t.name == "streamfhmm-learner" and t.is_alive() for t in threading.enumerate())

    before = learners()
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), posterior="exact", learn=True,
                      warmup=50, warmup_steps=5, random_state=seed) as eng:
        monkeypatch.setattr(StreamEngine, "_process", failing)
        for _ in range(3):
            with pytest.raises(ValueError, match="the batch path failed"):
                eng.push_many(X)
            assert eng.warming_up and eng._thread is None and learners() == before
        monkeypatch.setattr(StreamEngine, "_process", real)
        assert len(eng.push_many(X)) == 59 and learners() == before + 1
    assert learners() == before


@pytest.mark.parametrize("setting,value,match", [
    ("learning_rate", None, "learning_rate must be a finite number in \\(0, inf\\)"),
    ("learning_rate", 0.0, "learning_rate must be"),
    ("warmup_time", None, r"warmup_time \(seconds\) must be a finite number in \[0, inf\)"),
    ("warmup_time", -1.0, "warmup_time"),
    ("decay", None, r"decay must be a finite number in \[0, 1\)"),
    ("decay", 1.0, "decay must be"),
    ("lr_decay_steps", 0, r"lr_decay_steps \(learner steps, or None\) must be a finite number in \(0"),
    ("lr_decay_steps", -10, "lr_decay_steps"),
    ("lr_decay_steps", np.inf, "lr_decay_steps"),
    ("min_learning_rate", -1.0, r"min_learning_rate must be a finite number in \[0, inf\)"),
    ("min_learning_rate", np.nan, "min_learning_rate"),
    ("recency_half_life", -5, r"recency_half_life \(samples, or None\) must be a finite number in \(0"),
    ("recency_half_life", 0, "recency_half_life"),
    ("checkpoint_seconds", "x", "checkpoint_seconds must be a finite number"),
    ("reservoir_size", 5, r"reservoir_size must be >= batch_size \(.*\), got reservoir_size=5 "
                          r"< batch_size=10"),
])
@pytest.mark.parametrize("fitted", [True, False])
def test_constructor_checks_every_numeric_setting(setting, value, match, fitted, tmp_path):
    """Checked before anything is built: TypeError before, or accepted and failing
    later (recency_half_life=-5 on a cold engine: every push after the warm-up
    raised), or accepted silently (lr_decay_steps=0: NaN step sizes)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=47) if fitted else \
        FHMM(n_chains=2, window=3, n_hidden=4)
    kw = {setting: value}
    if setting == "checkpoint_seconds":
        kw["checkpoint_path"] = tmp_path / "ck"
    with pytest.raises(ValueError, match=match):
        StreamEngine(model, mode="filter", posterior="exact", learn=True, warmup=30,
                     warmup_steps=2, **kw)


def test_a_reservoir_smaller_than_a_batch_is_refused_on_resume(tmp_path):
    """The learner waits for ``batch_size`` segments before its first step: a reservoir
    that holds fewer is refused where the learner would run (it never took a step, and
    nothing said so), also when a checkpoint of an engine without one is resumed with
    ``learn=True``; without a learner it does not matter."""
    seed = 68
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 50, seed=seed + 1)
    with StreamEngine(model, posterior="exact", learn=False, reservoir_size=5,
                      batch_size=10) as eng:
        eng.push_many(X)
        path = eng.checkpoint(tmp_path / "c.npz")
    StreamEngine.resume(path).close()
    with pytest.raises(ValueError, match=r"reservoir_size must be >= batch_size .*got "
                                         r"reservoir_size=5 < batch_size=10"):
        StreamEngine.resume(path, learn=True)


@pytest.mark.parametrize("fitted", [False, True])
def test_resume_refuses_learn_false_while_a_new_network_waits_for_its_warmup(fitted, tmp_path):
    """A warm-up checkpoint of an engine that creates its recognition network (a cold
    model, or a fitted one in filter mode without a causal network) resumed with
    ``learn=False``: refused with the constructor's message (it was taken, and streamed
    posteriors from the untrained, randomly initialised network)."""
    seed = 70
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 40, seed=seed + 1)
    start = model if fitted else FHMM(n_chains=2, window=3, n_hidden=4)
    mode = "filter" if fitted else "smooth"
    match = (r"mode='filter' with posterior='recognition' needs a causal recognition network"
             if fitted else "an unfitted FHMM in recognition mode needs learn=True")
    with pytest.raises(ValueError, match=match):
        StreamEngine(start, mode=mode, learn=False)
    with StreamEngine(start, mode=mode, learn=True, warmup=100, random_state=seed) as eng:
        eng.push_many(X)
        assert eng.warming_up
        path = eng.checkpoint(tmp_path / "w.npz")
    with pytest.raises(ValueError, match=match):
        StreamEngine.resume(path, learn=False)
    with StreamEngine.resume(path) as back:
        assert back.warming_up and back.learning


def test_learn_samples_limits_what_the_warmup_learns(monkeypatch):
    """learn_samples < warmup: the start fit and the reservoir see only the first
    learn_samples samples (they saw the whole warm-up); the replay sees them all."""
    from streamfhmm.learn import smf
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=48)
    X = _data(model, 400, seed=49)
    X[100:] += 50.0
    seen = []
    real = smf.init_params
    monkeypatch.setattr(smf, "init_params", lambda Y, *a, **k: seen.append(Y.copy()) or real(Y, *a, **k))
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=True, warmup=400, warmup_steps=20, learn_samples=100,
                      learner_duty=1e-3, random_state=0) as eng:
        posts = [p for x in X for p in eng.push(x)]
        res = eng._learner.reservoir
        ends = res.end[:res.size]
        assert not eng.learning and res.size > 0 and ends.max() < 100
        for j, e in enumerate(ends):
            np.testing.assert_array_equal(res.data[j], X[e - eng._S + 1:e + 1])
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], X[:100])
    assert len(posts) == 400 and [p.t for p in posts] == list(range(400))
    # the samples before the limit cannot start the model (2 of the first 10 hold a
    # value): the whole warm-up does (every push was refused for good: the rows are past)
    Y = X[:50].copy()
    Y[:8] = np.nan
    seen.clear()
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=True, warmup=42, warmup_steps=5, learn_samples=10,
                      random_state=0) as eng:   # (42 samples with a value end the warm-up)
        out = eng.push_many(Y)
        assert eng.metrics()["phase"] == "running" and len(out) == 50
    assert len(seen) == 1 and len(seen[0]) == 42      # the complete rows of all 50
    for limit in (1, 3):  # (refused when built before: the fallback makes it needless)
        StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), posterior="exact", learn=True,
                     learn_samples=limit).close()


def test_periodic_checkpoints_during_the_warmup(tmp_path):
    """checkpoint_every counts warm-up samples too (no checkpoint before the warm-up
    ended); a warm-up checkpoint resumes in the warm-up."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=50)
    X = _data(model, 300, seed=51)
    path = tmp_path / "w.npz"
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=False, warmup=250, checkpoint_path=path, checkpoint_every=10) as eng:
        for x in X[:200]:
            eng.push(x)
        assert eng.metrics()["checkpoints"] == 20
        with StreamEngine.resume(path, checkpoint_path=None, checkpoint_every=None) as back:
            assert back.metrics()["phase"] == "warmup" and back.n_samples == 200
        eng.push_many(X[200:245])        # one due-check per block
        assert eng.metrics()["checkpoints"] == 21
        eng.push_many(X[245:])
        assert eng.metrics()["phase"] == "running" and eng.metrics()["checkpoint_error"] is None


@pytest.mark.parametrize("due", ["every", "seconds"])
def test_a_checkpoint_due_in_the_warmup_replay_is_written_after_it(due, tmp_path):
    """A periodic checkpoint that falls due while the warm-up is replayed (through the
    batch path, 4,096 samples a chunk) is written once the replay is over and its
    counters restored: written inside it, it counted the warm-up twice (samples with a
    NaN: 1000 of 5000, not 500) or recorded position 4,096 of a 5,000-sample warm-up.
    The resumed engine goes on as the uninterrupted one."""
    seed = 60
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 5200, seed=seed + 1)
    X[::10, 0] = np.nan
    path, kept = tmp_path / "c.npz", tmp_path / "kept.npz"
    # the warm-up fit's SVI runs for 0.5 s: the 0.2 s checkpoint falls due in the replay
    kw = (dict(checkpoint_every=5000, warmup_steps=20) if due == "every" else
          dict(checkpoint_seconds=0.2, warmup_steps=10 ** 6, warmup_time=0.5))
    # learning ends with the warm-up (learn_samples): both go on with the same snapshot
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), posterior="exact", learn=True,
                      warmup=5000, learn_samples=5000, checkpoint_path=path, random_state=seed,
                      **kw) as eng:
        eng.push_many(X[:5000])
        assert eng.metrics()["checkpoints"] == 1   # (before the learner started)
        kept.write_bytes(path.read_bytes())
        with StreamEngine.resume(kept, checkpoint_path=None, checkpoint_every=None,
                                 checkpoint_seconds=None) as back:
            for k in ("samples", "emitted", "imputed", "learning"):
                assert back.metrics()[k] == eng.metrics()[k], k
            assert back.metrics()["imputed"] == 500 and not back.learning
            a, b = back.push_many(X[5000:]), eng.push_many(X[5000:])
    for k in PosteriorBatch.__slots__:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    assert len(a) == 200


def test_a_checkpoint_at_the_end_of_the_warmup_keeps_learn_samples(tmp_path):
    """Resumed from the checkpoint that fell due as the warm-up ended, the engine stops
    learning after ``learn_samples`` samples as the uninterrupted one does (written in
    the replay, the checkpoint counted 400 samples after 200, and learning never
    stopped)."""
    seed = 62
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 300, seed=seed + 1)
    path, kept = tmp_path / "c.npz", tmp_path / "kept.npz"
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), posterior="exact", learn=True,
                      warmup=200, warmup_steps=20, learn_samples=300, checkpoint_path=path,
                      checkpoint_every=200, random_state=seed) as eng:
        for x in X[:200]:
            eng.push(x)
        assert eng.metrics()["checkpoints"] == 1   # (before the learner started)
        kept.write_bytes(path.read_bytes())
        with StreamEngine.resume(kept, checkpoint_path=None, checkpoint_every=None) as back:
            assert back.n_samples == 200 and back.metrics()["samples"] == 200
            for engine in (eng, back):
                for x in X[200:299]:
                    engine.push(x)
                assert engine.learning
                engine.push(X[299])
                assert not engine.learning


def test_a_cold_start_takes_a_feature_tiny_in_its_warmup():
    """The batch fit's refusal of a feature whose values all lie below 1e-150 (their
    squares underflow) applies to a whole series only: a cold start whose warm-up saw
    such a feature (tiny there, or zeros and one 1e-200 reading) refused the push that
    ended the warm-up, again and again, and its resume from a warm-up checkpoint."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=58)
    X = _data(model, 200, seed=59)
    for label, col in (("tiny at the start", np.where(np.arange(200) < 60, 1e-160 * X[:, 1], X[:, 1])),
                       ("zeros and a lone 1e-200", np.where(np.arange(200) == 5, 1e-200, 0.0))):
        Y = np.column_stack([X[:, 0], col])
        with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter",
                          posterior="exact", learn=False, warmup=60) as eng:
            out = eng.push_many(Y)
        print(f"{label}: {len(out)} posteriors")
        assert len(out) == 200 and np.isfinite(out.theta).all()


def test_a_warmup_with_too_few_values_goes_on():
    """A warm-up whose samples mostly hold no value (dead sensors) goes on past
    ``warmup`` until a start is possible: every sample is kept once, none refused.
    (Raising there made the service retry the rows one by one, buffering them twice;
    refusing them instead left the warm-up where it was for good: a demo with
    --warmup 2 and 6 chains never started.)"""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=52)
    X = _data(model, 40, seed=53)
    Y = X.copy()
    Y[3:] = np.nan                     # 3 samples with a value, then every sensor dead
    eng = StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter",
                       posterior="exact", learn=False, warmup=4)   # (4 samples with a value)
    with eng:
        assert len(eng.push_many(Y[:25])) == 0
        m = eng.metrics()
        assert m["phase"] == "warmup" and m["samples"] == 25 and m["rejected"] == 0
        np.testing.assert_array_equal(eng._warmup_samples(), Y[:25])
        assert eng.push(Y[25]) == []
        out = eng.push(X[26])          # a 4th sample with a value: the warm-up starts
        assert eng.metrics()["imputed_start"] is False   # its 4 samples are complete
    assert [p.t for p in out] == list(range(27)) and all(p.flags & FLAG_WARMUP for p in out)
    assert eng.metrics()["samples"] == 27 and eng.metrics()["rejected"] == 0


def test_a_stream_that_starts_with_dead_sensors_warms_up_on_warmup_samples_with_a_value():
    """Samples without a value counted towards ``warmup``: a stream whose sensors were
    dead for its first ``warmup`` samples was started from the first few valued ones
    after them (4 here, 5 for 3 chains: its start fit collapsed the covariance), now
    that the wire carries such samples to every served stream."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=56)
    X = _data(model, 80, seed=57)
    Y = X.copy()
    Y[:30] = np.nan                    # dead for the first 30 samples
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=False, warmup=20) as eng:
        assert len(eng.push_many(Y[:49])) == 0 and eng.warming_up   # 19 with a value
        out = eng.push(Y[49])                                       # the 20th
        assert not eng.warming_up
    assert [p.t for p in out] == list(range(50)) and all(p.flags & FLAG_WARMUP for p in out)
    assert all(p.flags & 1 for p in out[:30])                       # (imputed)


def test_the_learner_gets_no_subchain_without_a_value():
    """A subchain with no value where its ELBO counts (the L positions after the first)
    tells nothing of the model (no emission term: its ELBO is at most the prior's 0):
    neither the warm-up's reservoir nor the running stream hands one to the learner,
    whose running ELBO an outage raised towards 0. Subchains with some values there go
    in, missing ones and all; outages at every phase of the subchains' stride."""
    seed = 76
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 3000, seed=seed + 1)
    X[:400:2] = np.nan                 # the warm-up: every other sample empty ...
    X[200:300] = np.nan                # ... and an outage of 100 samples
    for a in range(1000, 2900, 50):    # outages of 20 samples while running, at 3 phases
        X[a + (a // 50) % 3:a + 20 + (a // 50) % 3] = np.nan
    fed = []
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", learn=True,
                      warmup=300, warmup_steps=20, reservoir_size=5000,
                      random_state=seed) as eng:
        eng.push_many(X[:700])
        assert not eng.warming_up
        lr = eng._learner
        with lr.lock:
            seeded = lr.reservoir.data[:lr.reservoir.size].copy()
        feed = lr.feed
        lr.feed = lambda seg, t: (fed.append(seg), feed(seg, t))
        for x in X[700:1200]:
            eng.push(x)
        eng.push_many(X[1200:])
        off, L = lr.net.offset, lr.subchain_length
    S = seeded.shape[1]
    print(f"subchains of {S} (counted rows {off + 1}..{off + L}): {len(seeded)} from the "
          f"warm-up, {len(fed)} fed while running")
    assert S == off + L + 1 and len(seeded) > 50 and len(fed) > 100
    for segs in (seeded, np.array(fed)):
        empty = np.isnan(segs).all(axis=2)                    # (n, S): rows without a value
        assert not empty[:, off + 1:].all(axis=1).any()
        assert empty[:, off + 1:].any(axis=1).any()           # (partly empty ones go in)
        assert empty[:, :off + 1].all(axis=1).any()           # (empty context, counted values)


def test_a_warmup_keeps_only_its_samples_with_a_value(tmp_path, monkeypatch):
    """A warm-up that lacks samples with a value goes on, and kept every sample: 1M
    all-NaN samples grew its buffer to 50 MB, written whole into each warm-up
    checkpoint. It keeps the samples with a value and their positions (a checkpoint:
    ``warmup.rows``, ``warmup.at``); the others are counted, and the start and its
    replay get every sample back, as from a checkpoint of the old form
    (``warmup.buf``, every sample)."""
    from streamfhmm.io.checkpoint import load_checkpoint, save_checkpoint
    seed = 72
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 80_100, seed=seed + 1)
    Y = np.full_like(X, np.nan)
    for r in (0, 1, 40_000, 80_000):    # 4 with a value: the 4th starts the model
        Y[r] = X[r]
    Y[40_000, 1] = np.nan                # (one value of two)
    Y[80_000:] = X[80_000:]
    replayed = []
    real = StreamEngine._process
    monkeypatch.setattr(StreamEngine, "_process", lambda self, Z, flags, feed: (
        replayed.append(Z.copy()) if flags & FLAG_WARMUP else None) or real(self, Z, flags, feed))
    kw = dict(mode="filter", posterior="exact", learn=False, warmup=4)
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), **kw) as eng:
        eng.push_many(Y[:80_000])
        m = eng.metrics()
        assert eng.warming_up and m["samples"] == 80_000 and m["imputed"] == 80_000 - 2
        assert eng._wbuf.shape == (4, 2) and eng._wn_valued == 3   # (not grown)
        path = eng.checkpoint(tmp_path / "w.npz")
        meta, arrays = load_checkpoint(path)
        old = {k: v for k, v in arrays.items() if not k.startswith("warmup.")}
        old["warmup.buf"] = Y[:80_000]
        save_checkpoint(tmp_path / "old.npz", old, meta)
        bad = dict(arrays, **{"warmup.at": arrays["warmup.at"][::-1].copy()})
        save_checkpoint(tmp_path / "bad.npz", bad, meta)
        with pytest.raises(ValueError, match=r"warmup.at must hold the increasing positions "
                                             r"\(0 to 79999\)"):
            StreamEngine.resume(tmp_path / "bad.npz")
        outs = [eng.push_many(Y[80_000:])]
    assert os.path.getsize(path) < 20_000        # (every sample: over 1.28 MB)
    for kept in (path, tmp_path / "old.npz"):
        with StreamEngine.resume(kept) as back:
            assert back.warming_up and back.n_samples == 80_000
            assert back.metrics()["imputed"] == 80_000 - 2
            outs.append(back.push_many(Y[80_000:]))
    assert len(replayed) == 3
    for Z, out in zip(replayed, outs):
        np.testing.assert_array_equal(Z, Y[:80_001])
        np.testing.assert_array_equal(out.t, np.arange(80_100))


def test_an_extended_warmup_keeps_its_checkpoints_and_its_count(tmp_path):
    """Past ``warmup`` samples with too few values, each push is an ordinary warm-up
    push: its periodic checkpoint is written (it was skipped there: every such push went
    through the all-or-nothing path, which also copied the engine and rescanned the
    whole buffer, O(n) per sample), and a resumed warm-up starts on the same sample as
    the original (the count of samples with a value is restored with the buffer)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=54)
    X = _data(model, 60, seed=55)
    Y = X.copy()
    Y[3:50] = np.nan                   # 3 samples with a value, then dead sensors
    path = tmp_path / "x.npz"
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=False, warmup=4, checkpoint_path=path, checkpoint_every=5) as eng:
        for x in Y[:40]:
            assert eng.push(x) == []
        m = eng.metrics()
        assert m["phase"] == "warmup" and m["checkpoints"] == 8 and m["rejected"] == 0
        eng.checkpoint(tmp_path / "at40.npz")
        out = [p for x in Y[40:51] for p in eng.push(x)]   # the 4th value: row 50
    assert [p.t for p in out] == list(range(51))
    with StreamEngine.resume(tmp_path / "at40.npz", checkpoint_path=None, checkpoint_every=None) as back:
        assert back.metrics()["phase"] == "warmup" and back.n_samples == 40
        resumed = [p for x in Y[40:51] for p in back.push(x)]
        assert [p.t for p in resumed] == list(range(51))
    # (not the same posteriors: the start fit's random initialisation is not part of a
    # checkpoint, and from four samples it may land elsewhere)
    assert np.isfinite([p.theta for p in resumed]).all()


def test_only_a_warmup_too_short_to_start_is_retried_whole(monkeypatch):
    """With ``learn_samples`` shorter than the warm-up, the whole warm-up starts the
    model only when the first ``learn_samples`` hold too few values; any other error of
    the start propagates at once (any ValueError was retried on the whole warm-up)."""
    from streamfhmm.learn import smf
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=48)
    X = _data(model, 50, seed=49)
    calls = []

    def failing(Y, *a, **k):
        calls.append(len(Y))
        raise ValueError("the start failed")
    monkeypatch.setattr(smf, "init_params", failing)
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=True, warmup=50, warmup_steps=5, learn_samples=20,
                      random_state=0) as eng:
        with pytest.raises(ValueError, match="the start failed"):
            eng.push_many(X)
        assert eng.metrics()["phase"] == "warmup" and eng.metrics()["rejected"] == 50
    assert calls == [20]


def test_too_few_complete_samples_start_from_imputed_ones(tmp_path):
    """A sensor missing for most of the warm-up: the start is fitted to the samples with
    a value, each missing one replaced by its feature's mean (the engine waited for
    complete samples before and, with the all-or-nothing rule, would never start)."""
    seed = 56
    print(f"seed={seed}")
    model = _model(M=2, D=3, window=3, n_hidden=4, seed=seed)
    X = _data(model, 200, seed=seed + 1)
    Y = X.copy()
    Y[np.arange(len(Y)), np.arange(len(Y)) % 3] = np.nan   # no sample is complete
    eng = StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="smooth", learn=True,
                       warmup=60, warmup_steps=20, random_state=seed)
    with eng:
        eng.push_many(Y[:100])
        m = eng.metrics()
        assert m["phase"] == "running" and m["imputed_start"] is True and m["samples"] == 100
        eng.checkpoint(tmp_path / "c.npz")
    with StreamEngine.resume(tmp_path / "c.npz", learn=False) as back:
        assert back.metrics()["imputed_start"] is True
        out = back.push_many(Y[100:])
        assert np.isfinite(out.theta).all()
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                      learn=False, warmup=60) as full:
        full.push_many(X[:100])
        assert full.metrics()["imputed_start"] is False


def test_huge_finite_sample_does_not_poison_exact_posteriors():
    """A finite 1e200 made every later exact posterior NaN (push and push_many); its
    emission is now left out (see kernels.online.filter_step)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=54)
    X = _data(model, 30, seed=55)
    Y = X.copy()
    Y[10, 0] = 1e200
    Z = X.copy()
    Z[10] = np.nan
    for mode in ("filter", "smooth"):
        with StreamEngine(model, mode=mode, posterior="exact", learn=False) as e:
            a = PosteriorBatch.from_posteriors([p for y in Y for p in e.push(y)] + e.flush())
            assert e.metrics()["loglik_per_sample"] == -np.inf
        with StreamEngine(model, mode=mode, posterior="exact", learn=False) as e:
            b = e.push_many(Y)
        with StreamEngine(model, mode=mode, posterior="exact", learn=False) as e:
            ref = e.push_many(Z)
        assert np.isfinite(a.theta).all() and np.isfinite(b.theta).all()
        np.testing.assert_allclose(a.theta[:len(ref)], ref.theta, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b.theta, ref.theta, rtol=0, atol=1e-12)


def test_an_unclosed_engine_collected_on_its_learner_thread_stops_it(monkeypatch):
    """An engine left unclosed in a reference cycle is freed by whichever thread the
    garbage collector runs on, its learner thread included: its finalizer then stopped
    the thread by joining it from itself (RuntimeError, printed as unraisable)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=31)
    X = _data(model, 300, seed=32)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    eng = StreamEngine(model, mode="filter", posterior="exact", learn=True, blas_threads=None,
                       random_state=0)     # (never closed: no BLAS limit left behind)
    eng.push_many(X)
    thread = eng._thread
    eng.cycle = eng          # only the cyclic garbage collector frees it
    del eng
    ran = threading.Event()

    def collect_here():      # runs on the learner thread
        gc.collect()
        ran.set()
    thread.request(collect_here)
    assert ran.wait(60)
    thread.join(60)
    assert not thread.is_alive() and thread.error is None
    assert not unraisable, [(u.exc_value, u.object) for u in unraisable]


def test_a_huge_warmup_value_is_refused_and_does_not_wedge_the_warmup():
    """A warm-up value whose square overflows is refused (before, it was buffered, the
    start fit failed with "W must be finite" and refused every later sample: the engine
    never left the warm-up)."""
    model = _model(seed=91)
    X = _data(model, 200, seed=92)
    for big in (1e160, -1e300):
        eng = StreamEngine(FHMM(n_chains=3, window=5, n_hidden=6), mode="filter", learn=False,
                           posterior="exact", warmup=50, random_state=93)
        with eng:
            eng.push_many(X[:10])
            bad = X[10:20].copy()
            bad[4, 2] = big
            with pytest.raises(ValueError, match=r"push_many: a warm-up sample's values must be "
                                                 r"at most 1e\+150 .* at row 4, column 2"):
                eng.push_many(bad)
            with pytest.raises(ValueError, match=r"push: a warm-up .* at index 2"):
                eng.push(bad[4])
            assert eng.metrics()["rejected"] == 11 and eng.n_samples == 10
            batch = eng.push_many(X[10:100])
            assert eng.metrics()["phase"] == "running" and len(batch) == 100  # warm-up included
            assert np.isfinite(batch.theta).all()
            eng.push(np.array([big, 0.0, 0.0]))   # once running, the model copes (loglik -inf)


def test_resume_keeps_a_recorded_pause_until_the_host_ends_it(tmp_path):
    """A checkpoint of a paused learner resumes paused, with learn=True too (``learn``
    says whether a learner runs; a service restarted with --learn must not undo the
    pause that learn_samples recorded), and ``learning = True`` ends the pause."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=31)
    X = _data(model, 1200, seed=32)
    with StreamEngine(model, mode="smooth", learn=True, warmup=300, warmup_steps=20,
                      random_state=0) as eng:
        eng.push_many(X[:600])
        eng.learning = False
        path = eng.checkpoint(tmp_path / "paused")
    for overrides, learning in (({}, False), ({"learn": True}, False), ({"learn": False}, False)):
        with StreamEngine.resume(path, **overrides) as back:
            assert back.learning is learning and back.metrics()["learning"] is learning, overrides
            back.push_many(X[600:700])
    with StreamEngine.resume(path, learn=True) as back:
        back.learning = True
        s = back.metrics()["learner_steps"]
        _pace(back, X[600:1200], 600, 0.02)
        t0 = time.perf_counter()
        while back.metrics()["learner_steps"] == s and time.perf_counter() - t0 < 10:
            time.sleep(0.01)
        assert back.metrics()["learner_steps"] > s


def test_switches_must_be_booleans_and_mode_is_read_only():
    """``learn`` and :attr:`learning` take True or False (``"false"`` switched learning
    on); mode and posterior cannot be reassigned (``eng.mode = "filter"`` ran a centred
    network with no lag)."""
    model = _model(seed=94)
    X = _data(model, 60, seed=95)
    for bad in ("false", "no", None, 0.0, 2, [0]):
        with pytest.raises(ValueError, match="learn must be True or False"):
            StreamEngine(model, learn=bad, net=_net(model, "centred", X, 94))
    with StreamEngine(model, learn=True, net=_net(model, "centred", X, 94)) as eng:
        eng.learning = False
        for bad in ("false", "true", None, 1, np.float64(1.0)):
            with pytest.raises(ValueError, match="learning must be True or False"):
                eng.learning = bad
            assert eng.learning is False
        eng.learning = np.bool_(True)
        assert eng.learning is True
        with pytest.raises(AttributeError):
            eng.mode = "filter"
        with pytest.raises(AttributeError):
            eng.posterior = "exact"
        assert (eng.mode, eng.posterior, eng.lag) == ("smooth", "recognition", 2)
        assert len(eng.push_many(X)) == 58


def test_masked_entries_are_missing_values():
    """push and push_many read a numpy masked array's masked entries as missing values
    (np.asarray kept the values under the mask and used them as observed)."""
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=57)
    X = _data(model, 120, seed=58)
    mask = np.zeros(X.shape, bool)
    mask[[60, 61, 90, 100], [0, 1, 1, 0]] = True
    Xg = X + 1e3 * mask                                   # garbage under the mask
    runs = {}
    for name, how in (("masked", "ma"), ("nan", "nan")):
        with StreamEngine(model, mode="filter", posterior="exact", learn=False, warmup=50) as eng:
            if how == "ma":
                out = list(eng.push_many(np.ma.masked_array(Xg[:80], mask=mask[:80])))
                out += [p for k in range(80, 120)
                        for p in eng.push(np.ma.masked_array(Xg[k], mask=mask[k]))]
            else:
                Xn = np.where(mask, np.nan, X)
                out = list(eng.push_many(Xn[:80])) + [p for x in Xn[80:] for p in eng.push(x)]
            runs[name] = (np.array([p.theta for p in out]), [p.flags for p in out],
                          eng.metrics()["imputed"])
    np.testing.assert_array_equal(runs["masked"][0], runs["nan"][0])
    assert runs["masked"][1:] == runs["nan"][1:] and runs["nan"][2] == 4


def test_snapshot_weights_are_read_only_and_kernels_get_one_array_type():
    """A snapshot's weights stay read-only; the kernels read the same memory typed
    writeable, so that Numba compiles the network's forward pass once for the learner
    and the inference path (a read-only array is another type: it was compiled twice,
    4-15 s of a first run)."""
    from streamfhmm.stream.learner import make_snapshot
    w = np.arange(6.0)
    snap = make_snapshot(3, _model().params_, w)
    w[0] = 99.0
    assert not snap.weights.flags.writeable and snap.weights[0] == 0.0
    assert snap.kernel_weights.flags.writeable and np.shares_memory(snap.weights, snap.kernel_weights)
    with pytest.raises(ValueError, match="read-only"):
        snap.weights[0] = 1.0
    # the inference kernels get that writeable alias (the learner's weights are writeable)
    from streamfhmm.stream import engine as engine_module
    model = _model(seed=50)
    X = _data(model, 300, seed=51)
    net = _net(model, "centred", X, seed=52)
    seen = []

    def spy(name):
        kernel = getattr(engine_module._ko, name)

        def call(*args):
            seen.append([a for a in args if isinstance(a, np.ndarray) and a.shape == (net.n_weights,)])
            return kernel(*args)
        return call
    with pytest.MonkeyPatch.context() as mp:
        for name in ("recognition_push", "recognition_block"):
            mp.setattr(engine_module._ko, name, spy(name))
        with StreamEngine(model, learn=False, net=net) as eng:
            for x in X[:50]:
                eng.push(x)
            eng.push_many(X[50:])
            weights = eng.snapshot.weights
    assert len(seen) >= 51 and all(len(ws) == 1 for ws in seen)
    assert all(ws[0].flags.writeable and np.shares_memory(ws[0], weights) for ws in seen)


@pytest.mark.parametrize("mode", ["filter", "smooth"])
def test_filtered_is_the_newest_samples_forward_message(mode):
    """filtered(): p(s_t | x_1..x_t) over the joint states and log p(x_t | x_<t) of the
    newest sample, against a dense forward pass (the river adapter reads its exact
    scores from it, not from the engine's internals)."""
    model = _model(M=2, D=2, seed=60)
    X = _data(model, 40, seed=61)
    p = model.params_
    print("seeds 60 61")
    with StreamEngine(model, mode=mode, learn=False, posterior="exact") as eng:
        with pytest.raises(ValueError, match="no sample has been filtered yet"):
            eng.filtered()
        for t in range(25):
            eng.push(X[t])
            alpha, logc = eng.filtered()
            T_ = naive.dense_transition(p.transmat)
            a = naive.dense_start(p.startprob)
            e = np.array([np.exp(naive.log_emission_exact(p.W, p.L, x)) for x in X[:t + 1]])
            for k in range(t + 1):
                a = (a @ T_ if k else a) * e[k]
                a = a / a.sum()
            np.testing.assert_allclose(alpha, a, rtol=1e-9, atol=1e-12)
            want = (naive.loglik_dense(p.W, p.covariance, p.transmat, p.startprob, X[:t + 1], L=p.L)
                    - (naive.loglik_dense(p.W, p.covariance, p.transmat, p.startprob, X[:t], L=p.L)
                       if t else 0.0))
            assert logc == pytest.approx(want, rel=1e-9, abs=1e-9)
        eng.push_many(X[25:])
        alpha, logc = eng.filtered()
        assert alpha.shape == (4,) and alpha.sum() == pytest.approx(1.0)
        buf = np.empty(4)
        assert eng.filtered(out=buf) == logc and np.array_equal(buf, alpha)
    with StreamEngine(model, learn=False, net=_net(model, "centred", X, seed=62)) as eng:
        eng.push(X[0])
        with pytest.raises(ValueError, match="needs an exact-mode engine"):
            eng.filtered()


def test_the_blas_limit_is_held_while_any_engine_is_open():
    """The thread limit is process-wide: each engine restored what it had found, so with
    two open, closing the first lifted the second's limit, closing the second left the
    process limited, and an engine freed unclosed never gave it back."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    p = FHMMParams.random(2, 2, random_state=0, noise=0.3)
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3, n_hidden=4)
    outer = threadpool_limits(limits=2, user_api="blas")
    try:
        if blas() != {2}:
            pytest.skip("this BLAS does not run two threads here")
        a = StreamEngine(m, mode="filter", learn=False, posterior="exact")
        b = StreamEngine(m, mode="filter", learn=False, posterior="exact")
        assert blas() == {1}
        a.close()
        assert blas() == {1}           # b is still open
        b.close()
        assert blas() == {2}
        c = StreamEngine(m, mode="filter", learn=False, posterior="exact")
        assert blas() == {1}
        del c
        gc.collect()
        assert blas() == {2}
    finally:
        outer.restore_original_limits()


def test_filtered_out_and_checkpoint_path_are_checked(tmp_path):
    """filtered(out=) takes a writable float64 array of 2^M entries (a list raised
    TypeError, a (3, 2^M) array had every row filled); checkpoint paths are str or
    path-like (checkpoint_path=5 wrote ./5.npz at close)."""
    p = FHMMParams.random(2, 2, random_state=0, noise=0.3)
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3, n_hidden=4)
    X, _ = p.sample(5, random_state=1)
    with StreamEngine(m, mode="filter", learn=False, posterior="exact") as eng:
        eng.push_many(X)
        for bad in ([0.0] * 4, np.zeros(4, dtype=int), np.zeros((3, 4)), np.zeros(5)):
            with pytest.raises(ValueError, match=r"out must be a writable float64 array of shape \(4,\)"):
                eng.filtered(out=bad)
        out = np.empty(4)
        assert eng.filtered(out=out) == eng.filtered()[1] and np.isclose(out.sum(), 1.0)
        with pytest.raises(ValueError, match=r"^path must be a file name \(str or path-like\), got int"):
            eng.checkpoint(123)
        assert eng.checkpoint(os.fsencode(tmp_path / "b")) == str(tmp_path / "b.npz")   # (bytes)
    with pytest.raises(ValueError, match=r"checkpoint_path must be a file name \(str or path-like\), got int"):
        StreamEngine(m, mode="filter", learn=False, posterior="exact", checkpoint_path=5)
    with pytest.raises(ValueError, match="latency_window must be at most 10,000,000 pushes"):
        StreamEngine(m, mode="filter", learn=False, posterior="exact", latency_window=10**13)


def test_values_near_the_float_range_keep_recognition_posteriors_finite():
    """Two adjacent 1e308 (finite, accepted once the engine runs): standardised they
    overflowed to inf, and inf·w - inf·w made every window holding them NaN in the
    block, one-by-one and batch paths. The standardised input is clipped at ±1e150."""
    seed = 57
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed, noise=0.3)
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=5, n_hidden=4)
    X, _ = p.sample(60, random_state=seed)
    net = RecognitionNet(2, 3, window=5, n_hidden=4, share="all", mode="centred").init(
        random_state=seed).fit_scaler(X)
    Y = X.copy()
    Y[30:32] = 1e308
    Y[40, 1] = -1e308
    with StreamEngine(m, mode="smooth", learn=False, net=net) as eng:
        block = eng.push_many(Y)
    with StreamEngine(m, mode="smooth", learn=False, net=net) as eng:
        ones = PosteriorBatch.from_posteriors([q for y in Y for q in eng.push(y)] + eng.flush())
    theta, rho = net.forward(Y)
    for got in (block.theta, block.rho, block.mean, ones.theta, ones.rho, theta, rho):
        assert np.isfinite(got).all()
    np.testing.assert_allclose(ones.theta[:len(block)], block.theta, rtol=0, atol=1e-12)


def test_an_engine_collected_inside_a_blas_hold_does_not_deadlock():
    """An unclosed engine in a reference cycle is freed by the cyclic collector, which
    may run inside the next engine's BlasHold (threadpoolctl allocates while the hold's
    lock is taken): its finalizer then waited on that lock for ever. In a subprocess,
    with the collector set to run a few allocations into the next hold."""
    import subprocess
    import textwrap
    code = textwrap.dedent("""
        import gc, sys
        from streamfhmm import FHMM, _blas
        from streamfhmm.stream.engine import StreamEngine

        class Holder:                      # an object in a reference cycle holding an engine
            def __init__(self, engine):
                self.engine = engine
                self.callback = self.on_sample
            def on_sample(self, *a):
                pass

        model = FHMM(n_chains=2, window=5, random_state=0)
        for n in (2, 5, 20, 100):
            gc.disable()
            h = Holder(StreamEngine(model, n_features=2, posterior="exact", learn=False))
            del h
            gc.set_threshold(gc.get_count()[0] + n, 10, 10)
            gc.enable()
            hold = _blas.BlasHold(1)       # what the next engine does
            hold.release()
        gc.set_threshold(700, 10, 10)
        gc.collect()
        print("held", len(_blas._holds), len(_blas._orphans))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "held 0 0", out.stdout


def test_an_engine_opened_during_a_fit_and_closed_after_it_restores_the_blas_limit():
    """The SVI learner held the process-wide limit with its own limiter: an engine opened
    during the fit took the fit's limit for the original, the fit's end lifted the
    engine's, and the engine's close then left the process at one thread."""
    from threadpoolctl import threadpool_info, threadpool_limits
    from streamfhmm.learn.svi import fit_svi

    def blas():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    seed = 58
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.3)
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3, n_hidden=4)
    X, _ = p.sample(300, random_state=seed)
    net = RecognitionNet(2, 2, window=3, n_hidden=4, share="all").init(random_state=seed).fit_scaler(X)
    outer = threadpool_limits(limits=2, user_api="blas")
    opened = []
    try:
        if blas() != {2}:
            pytest.skip("this BLAS does not run two threads here")

        def open_engine(state):
            if not opened:
                opened.append(StreamEngine(m, mode="filter", learn=False, posterior="exact"))
        fit_svi(X, np.array([0, len(X)]), p, net, max_iter=20, log_every=5, progress=False,
                rng=np.random.default_rng(seed), callback=open_engine)
        assert opened and blas() == {1}      # the engine is still open
        opened[0].close()
        assert blas() == {2}
    finally:
        for e in opened:
            e.close()
        outer.restore_original_limits()


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


@pytest.mark.parametrize("posterior", ["recognition", "exact"])
def test_flush_of_a_sequence_shorter_than_the_lag(posterior):
    """Flush of a sequence shorter than the lag must emit only positions of
that sequence (tau0 = max(seq_start, t - lag)); the mutant drops the max and emits
posteriors for positions before the sequence start (negative t / previous sequence)."""
    seed = 7
    print(f"seed={seed}")
    model = _model(seed=seed)
    X = _data(model, 40, seed=seed)
    net = _net(model, "centred", X, seed) if posterior == "recognition" else None
    with StreamEngine(model, mode="smooth", learn=False, posterior=posterior, net=net) as eng:
        assert eng.lag == 2
        assert eng.push(X[0]) == []
        posts = eng.flush()
        assert [p.t for p in posts] == [0]
        # a second sequence of one sample, after a longer one
        eng.push_many(X[1:20])
        eng.flush()
        assert eng.push(X[20]) == []
        posts = eng.flush()
        assert [p.t for p in posts] == [20]
        assert eng.metrics()["emitted"] == 21


def test_learning_cannot_be_switched_on_without_a_learner():
    """An engine built with learn=False must refuse ``learning = True``."""
    seed = 11
    print(f"seed={seed}")
    model = _model(seed=seed)
    X = _data(model, 30, seed=seed)
    with StreamEngine(model, learn=False, net=_net(model, "centred", X, seed)) as eng:
        with pytest.raises(ValueError, match="learn=False"):
            eng.learning = True
        assert eng.learning is False
        assert eng.metrics()["learning"] is False
        eng.learning = False   # switching off stays allowed


def test_resumed_latency_percentiles_cover_only_real_pushes(tmp_path):
    """A resumed engine starts a fresh latency ring (lat_n reset to 0); keeping
the checkpoint's push count made metrics() read the fresh ring's zeros as latencies."""
    seed = 16
    print(f"seed={seed}")
    model = _model(seed=seed)
    X = _data(model, 120, seed=seed)
    with StreamEngine(model, mode="filter", learn=False, posterior="exact") as eng:
        for x in X[:100]:
            eng.push(x)
        path = eng.checkpoint(tmp_path / "c.npz")
    back = StreamEngine.resume(path)
    try:
        for x in X[100:110]:
            back.push(x)
        m = back.metrics()
        print(m["push_p50_us"], m["push_p99_us"], m["push_max_us"])
        assert 0 < m["push_p50_us"] <= m["push_p99_us"] <= m["push_max_us"]
    finally:
        back.close()


def test_versions_do_not_go_back_when_a_learner_is_added_on_resume(tmp_path):
    """A learner created on resume (the checkpoint had none) continues the
snapshot versions; the mutant restarted them at 1, so posterior versions went back."""
    seed = 21
    print(f"seed={seed}")
    model = _model(M=2, D=2, window=3, n_hidden=4, seed=seed)
    X = _data(model, 3000, seed=seed)
    with StreamEngine(model, mode="smooth", learn=True, warmup=500, warmup_steps=50,
                      snapshot_interval=5, random_state=seed) as eng:
        eng.push_many(X[:500])
        a = eng.checkpoint(tmp_path / "a.npz")
    with StreamEngine.resume(a, learn=False) as mid:
        V = mid.version
        b = mid.checkpoint(tmp_path / "b.npz")
    print("V", V)
    assert V >= 2
    with StreamEngine.resume(b, learn=True, snapshot_interval=50, learner_duty=0.05) as back:
        assert back.version == V
        # deterministic: the new learner's next snapshot is V + 1
        assert back._learner.version == V, back._learner.version
        back.push_many(X[500:1500])
        t0 = time.perf_counter()
        while back.version == V and time.perf_counter() - t0 < 20:
            time.sleep(0.0005)
        first = back.version
        print("first published version", first)
        assert back.learner_error is None
        assert first > V, first


def test_changing_the_returned_net_leaves_the_engine_alone(tmp_path):
    """``StreamEngine.net`` returns a copy; changing it must not change the
engine's inference network (whose scaler goes into checkpoints)."""
    seed = 22
    print(f"seed={seed}")
    model = _model(seed=seed)
    X = _data(model, 60, seed=seed)
    with StreamEngine(model, learn=False, net=_net(model, "centred", X, seed)) as eng:
        a = eng.net
        assert a is not eng.net
        scale0 = a.scale.copy()
        a.set_scaler(np.zeros(3), np.full(3, 7.0))
        np.testing.assert_array_equal(eng.net.scale, scale0)
        eng.push_many(X[:30])
        path = eng.checkpoint(tmp_path / "c.npz")
    with StreamEngine.resume(path) as back:
        np.testing.assert_array_equal(back.net.scale, scale0)


@pytest.mark.parametrize("use_blocks", [False, True])
def test_pending_subchains_keep_their_samples(use_blocks):
    """The engine hands the learner a *copy* of each subchain (Learner.feed keeps
the array as is until its thread drains it). Without the copy the pending segment is a
view of the ring / the batch scratch buffer, overwritten by later samples."""
    seed = 23
    print(f"seed={seed}")
    model = _model(seed=seed)
    X = _data(model, 400, seed=seed)
    net = _net(model, "centred", X, seed)
    with StreamEngine(model, learn=True, net=net, learner_duty=1e-3) as eng:
        got = []
        eng._learner.feed = lambda seg, t: got.append((t, seg))   # kept as handed over
        if use_blocks:
            for s in range(0, 400, 50):
                eng.push_many(X[s:s + 50])
        else:
            for x in X:
                eng.push(x)
        S = eng._S
    assert len(got) >= 10
    for t, seg in got:
        np.testing.assert_array_equal(seg, X[t - S + 1:t + 1])


def test_a_missing_checkpoint_directory(tmp_path):
    """checkpoint(path) compared path with the configured checkpoint_path through
    npz_target, which checks that a file can be written there: once the configured
    path's directory was gone, every checkpoint to any other file (a river adapter's
    pickling, clone and close write to a temporary directory) raised FileNotFoundError
    about that unrelated path. Only the path being written is checked now. A
    checkpoint_path whose directory does not exist (or a directory) is refused when
    given (the engine failed every periodic checkpoint and the last one at close); the
    path a resumed checkpoint recorded is taken as it is."""
    import shutil
    seed = 24
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.3)
    m = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3, n_hidden=4)
    X, _ = p.sample(40, random_state=seed)
    missing = tmp_path / "missing" / "ck"
    kw = dict(mode="filter", learn=False, posterior="exact")
    with pytest.raises(ValueError, match=r"checkpoint_path '.*missing/ck' cannot be written: its "
                                         r"directory '.*missing' does not exist"):
        StreamEngine(m, checkpoint_path=missing, **kw)
    with pytest.raises(ValueError, match="checkpoint_path must name a file"):
        StreamEngine(m, checkpoint_path=tmp_path, **kw)
    own_dir = tmp_path / "own"
    own_dir.mkdir()
    eng = StreamEngine(m, checkpoint_path=own_dir / "ck", checkpoint_every=10, **kw)
    eng.push_many(X[:20])
    assert (own_dir / "ck.npz").exists()
    shutil.rmtree(own_dir)
    copy = eng.checkpoint(tmp_path / "copy")   # another file: written
    assert copy == str(tmp_path / "copy.npz")
    with pytest.raises(FileNotFoundError, match="its directory .*own' does not exist"):
        eng.checkpoint(own_dir / "ck")         # the file being written is still checked
    eng.push_many(X[20:30])                    # a periodic checkpoint fails: reported
    assert "does not exist" in eng.metrics()["checkpoint_error"]
    eng.close()                                # the last one too, without raising
    # a resumed checkpoint keeps the path it recorded (gone here); a path given is checked
    with StreamEngine.resume(copy) as back:
        assert back.checkpoint(tmp_path / "again") == str(tmp_path / "again.npz")
    with pytest.raises(ValueError, match=r"checkpoint_path '.*missing/ck' cannot be written"):
        StreamEngine.resume(copy, checkpoint_path=missing)


def test_a_huge_warmup_grows_its_buffer_and_huge_sizes_are_value_errors(tmp_path):
    """warmup=10**13 was taken, then every push raised MemoryError (the buffer was
    allocated for the whole warm-up up front); reservoir_size=10**12 and
    subchain_length=10**9 were a MemoryError at construction."""
    from streamfhmm.stream.engine import MAX_RESERVOIR_SIZE, MAX_SUBCHAIN_LENGTH
    m = _model(M=2, D=3, window=3, n_hidden=4, seed=80)
    X = _data(m, 300, seed=81)
    for n_features in (None, 3):
        with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), learn=True, warmup=10**13,
                          n_features=n_features, random_state=0) as eng:
            for x in X[:5]:
                assert eng.push(x) == []
            assert eng.push_many(X[5:300]).t.size == 0 and eng.warming_up
            assert eng.metrics()["rejected"] == 0
            assert eng._wbuf.shape[0] < 10_000                  # grown, not preallocated
            np.testing.assert_array_equal(eng._warmup_samples(), X[:300])
            path = eng.checkpoint(tmp_path / "warm")
        with StreamEngine.resume(path) as back:
            back.push_many(X[:10])
            assert back._wbuf.shape[0] < 10_000 and back.metrics()["rejected"] == 0
    for kw, message in ((dict(reservoir_size=10**12), "reservoir_size must be at most 1,000,000"),
                        (dict(reservoir_size=MAX_RESERVOIR_SIZE + 1), "reservoir_size must be at most"),
                        (dict(subchain_length=10**9), "subchain_length must be at most 10,000"),
                        (dict(subchain_length=MAX_SUBCHAIN_LENGTH + 1), "subchain_length must be at most")):
        with pytest.raises(ValueError, match=message):
            StreamEngine(m, learn=True, posterior="exact", **kw)
    StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), learn=True,
                 reservoir_size=MAX_RESERVOIR_SIZE, subchain_length=MAX_SUBCHAIN_LENGTH).close()


def test_the_size_bounds_do_not_refuse_a_checkpoint_written_with_larger_sizes(tmp_path, monkeypatch):
    """The bounds on reservoir_size and subchain_length are for engines being built: a
    checkpoint written with larger ones (before the bounds, 1.5 million segments ran
    fine) was refused at resume, and its stream could not go on in any way. Here the
    bounds are lowered below a checkpoint's sizes instead."""
    import streamfhmm.stream.engine as engine_module
    m = _model(M=2, D=2, window=3, n_hidden=4, seed=82)
    X = _data(m, 400, seed=83)
    with StreamEngine(m, mode="filter", posterior="exact", learn=True, reservoir_size=60,
                      subchain_length=6, random_state=0) as eng:
        eng.push_many(X[:200])
        path = eng.checkpoint(tmp_path / "big")
    monkeypatch.setattr(engine_module, "MAX_RESERVOIR_SIZE", 50)
    monkeypatch.setattr(engine_module, "MAX_SUBCHAIN_LENGTH", 5)
    with pytest.raises(ValueError, match="reservoir_size must be at most 50"):
        StreamEngine(m, mode="filter", posterior="exact", learn=True, reservoir_size=60)
    with StreamEngine.resume(path) as back:
        assert back.push_many(X[200:]).t.size == 200
