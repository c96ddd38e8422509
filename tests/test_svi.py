"""SVI learning and the FHMM estimator: learning works, is reproducible, round-trips,
and rejects bad input with clear errors."""
import sys

import numpy as np
import pytest

from streamfhmm import FHMM, FHMMParams
from streamfhmm.evaluation import align_params, posterior_mae, recovery_errors
from streamfhmm.learn.sampler import SubchainSampler
from streamfhmm.learn.svi import RMSprop, SVIState, check_restarts, cosine_lr, count_step, fit_svi
from streamfhmm.learn.smf import init_params
from streamfhmm.network import RecognitionNet

W2 = np.array([[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]])
A2 = np.array([[[0.95, 0.05], [0.10, 0.90]], [[0.90, 0.10], [0.05, 0.95]]])


@pytest.fixture(scope="module")
def two_chain_data():
    seed = 11
    print(f"seed={seed}")
    true = FHMM.from_params(W=W2, covariance=0.1 * np.eye(2), transmat=A2)
    X, _ = true.sample(1000, random_state=seed)
    return true, X


@pytest.fixture(scope="module")
def fitted(two_chain_data):
    true, X = two_chain_data
    m = FHMM(n_chains=2, window=5, n_hidden=16, share_hidden="chain", random_state=3)
    return m.fit(X, max_iter=6000, progress=False, init="kmeans")


def test_fit_increases_likelihood_and_recovers_parameters(two_chain_data, fitted):
    true, X = two_chain_data
    start = init_params(X, 2, random_state=np.random.default_rng(3))
    ll0 = FHMM.from_params(W=start.W, covariance=start.covariance, transmat=start.transmat,
                           startprob=start.startprob).score(X)
    ll = fitted.score(X)
    print(f"loglik/step: start {ll0 / 1000:.4f} fitted {ll / 1000:.4f} true {true.score(X) / 1000:.4f}")
    assert ll > ll0 + 1.0
    assert ll / 1000 > true.score(X) / 1000 - 0.01
    errs = recovery_errors(fitted.params_, true.params_)
    print(errs)
    assert errs["W"] < 0.1
    assert errs["transmat"] < 0.05
    assert errs["covariance"] < 0.02
    h = fitted.history_
    assert len(h) >= 10 and {"iteration", "elbo", "time"} <= set(h[0])
    assert h[-1]["elbo"] > h[0]["elbo"]


def test_elbo_is_below_loglik_and_close(two_chain_data, fitted):
    _, X = two_chain_data
    elbo, ll = fitted.elbo(X), fitted.score(X)
    print(f"elbo {elbo:.3f} loglik {ll:.3f}")
    assert elbo <= ll
    assert (ll - elbo) / len(X) < 0.02


def test_recognition_posterior_matches_exact_on_three_chains():
    seed = 21
    print(f"seed={seed}")
    W = np.array([[2.0, 0.0, 0.5], [0.0, 2.0, 0.5], [1.0, 1.0, -1.5], [0.0, 0.0, 0.0]])
    A = np.array([[[0.97, 0.03], [0.05, 0.95]]] * 3)
    true = FHMM.from_params(W=W, covariance=0.15 * np.eye(3), transmat=A)
    X, _ = true.sample(4000, random_state=seed)
    Xt, _ = true.sample(2000, random_state=seed + 1)
    m = FHMM(n_chains=3, window=5, n_hidden=20, share_hidden="chain", random_state=seed)
    m.fit(X, max_iter=8000, progress=False)
    P = m.predict_proba(Xt)
    mae_own = posterior_mae(P, m.predict_proba(Xt, method="exact"))
    aligned, perm, flip = align_params(m.params_, true.params_)
    Pa = np.where(flip, 1 - P[:, perm], P[:, perm])
    mae_true = posterior_mae(Pa, true.predict_proba(Xt, method="exact"))
    print(f"MAE vs exact (fitted model) {mae_own:.4f}; vs exact (true model) {mae_true:.4f}")
    assert mae_own <= 0.05
    assert mae_true <= 0.05


def test_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, fitted, monkeypatch):
    """A save that fails part-way (a full disk) keeps the previous model file as it was
    and leaves no temporary file (the .tmp-PID file stayed behind)."""
    import errno

    import streamfhmm.estimator as est
    path = tmp_path / "m.npz"
    fitted.save(path)
    before = path.read_bytes()

    def full_disk(fh, **arrays):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(est.np, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        fitted.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]
    assert path.read_bytes() == before


def test_save_load_round_trip(tmp_path, two_chain_data, fitted):
    _, X = two_chain_data
    path = tmp_path / "model.npz"
    fitted.save(path)
    m = FHMM.load(path)
    assert np.array_equal(m.predict_proba(X), fitted.predict_proba(X))
    assert np.array_equal(m.W_, fitted.W_)
    assert m.history_ == fitted.history_
    assert (m.n_chains, m.window, m.n_hidden, m.share_hidden) == (2, 5, 16, "chain")
    np.testing.assert_allclose(m.reconstruct(X), fitted.reconstruct(X))


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="is not a streamfhmm model file") as info:
        FHMM.load(bad)
    # named as not a zip archive, not as numpy's "pickled data ... load it unsafely"
    assert "not a zip archive" in str(info.value) and "pickle" not in str(info.value)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(ValueError, match="no 'streamfhmm.FHMM' tag"):
        FHMM.load(other)
    with pytest.raises(FileNotFoundError):
        FHMM.load(tmp_path / "missing.npz")


def test_reproducible_with_random_state(two_chain_data):
    _, X = two_chain_data
    fits = [FHMM(n_chains=2, window=3, n_hidden=4, random_state=7).fit(X, max_iter=300, progress=False)
            for _ in range(2)]
    assert np.array_equal(fits[0].W_, fits[1].W_)
    assert np.array_equal(fits[0].net_.weights, fits[1].net_.weights)
    other = FHMM(n_chains=2, window=3, n_hidden=4, random_state=8).fit(X, max_iter=300, progress=False)
    assert not np.array_equal(other.net_.weights, fits[0].net_.weights)


def test_missing_values_are_accepted(two_chain_data):
    """A fit on data with every 17th value of one column missing learns the model
    (they are marginalised, not read as zeros), and its posterior with those values
    missing stays close to the one with them."""
    true, X = two_chain_data
    Xm = X.copy()
    Xm[::17, 0] = np.nan
    m = FHMM(n_chains=2, window=5, n_hidden=8, random_state=0).fit(Xm, max_iter=500, progress=False)
    P = m.predict_proba(Xm)
    assert np.isfinite(P).all() and np.isfinite(m.W_).all()
    errs = recovery_errors(m.params_, true.params_)
    mae = np.abs(P - m.predict_proba(X))[::17].mean()
    print(errs, f"MAE at the rows with a missing value {mae:.4f}")
    assert errs["W"] < 0.1 and errs["covariance"] < 0.05
    assert mae < 0.1


def test_several_sequences(two_chain_data):
    """Sequences given by ``lengths`` are read as if each were given alone: no window
    and no transition crosses the boundary."""
    _, X = two_chain_data
    m = FHMM(n_chains=2, window=5, n_hidden=8, random_state=0)
    m.fit(X, lengths=[400, 600], max_iter=500, progress=False)
    P = m.predict_proba(X, lengths=[400, 600])
    np.testing.assert_array_equal(P, np.vstack([m.predict_proba(X[:400]), m.predict_proba(X[400:])]))
    assert np.abs(P - m.predict_proba(X)).max() > 0      # (as one sequence, the windows cross)
    np.testing.assert_allclose(m.elbo(X, lengths=[400, 600]), m.elbo(X[:400]) + m.elbo(X[400:]),
                               rtol=1e-12)
    np.testing.assert_allclose(m.score(X, lengths=[400, 600]), m.score(X[:400]) + m.score(X[400:]),
                               rtol=1e-12)


def test_time_budget_stops_early(two_chain_data):
    import time
    _, X = two_chain_data
    FHMM(n_chains=2, window=5, n_hidden=8, random_state=0).fit(X, max_iter=5, progress=False,
                                                               init="kmeans")   # (compiled)
    m = FHMM(n_chains=2, window=5, n_hidden=8, random_state=0)
    t0 = time.perf_counter()
    m.fit(X, max_iter=10_000_000, time_budget=1.0, progress=False, init="kmeans")
    seconds = time.perf_counter() - t0
    print(f"fit with a 1 s budget took {seconds:.2f} s, {m.history_[-1]['iteration']:,} steps")
    # the whole call, its start included (10^7 steps would take hours); generous for a
    # shared machine
    assert seconds < 10.0 and m.history_[-1]["iteration"] < 10_000_000


def test_continued_fit_keeps_its_networks(tmp_path, two_chain_data, fitted, monkeypatch):
    """A second fit that continues from the model's parameters (init "auto"/"params")
    continues from its recognition networks too: new random ones moved the model
    through an uninformative posterior (ELBO per step -0.86 -> -1.29 in 100 steps)."""
    import streamfhmm.learn.svi as svi
    _, X = two_chain_data
    fitted.save(tmp_path / "m.npz")
    m = FHMM.load(tmp_path / "m.npz")
    T = len(X)
    before = m.elbo(X) / T
    m.fit(X, max_iter=100, progress=False)
    after = m.elbo(X) / T
    print(f"ELBO per step: fitted {before:.4f}, after 100 more steps {after:.4f}")
    assert after > before - 0.01
    # the start of each kind of refit: which networks fit_svi is handed
    seen = []

    class Stop(Exception):
        pass

    def capture(X, bounds, params, net, **kw):
        seen.append(net)
        raise Stop

    monkeypatch.setattr(svi, "fit_svi", capture)
    m = FHMM.load(tmp_path / "m.npz")
    for init in ("auto", "params", "kmeans"):
        with pytest.raises(Stop):
            m.fit(X, max_iter=10, init=init, progress=False)
    m.set_params(n_hidden=8)                     # another architecture: new networks
    with pytest.raises(Stop):
        m.fit(X, max_iter=10, progress=False)
    old = fitted.net_
    for net in seen[:2]:
        assert net is not m.net_                 # a copy: the model's own stay as they are
        np.testing.assert_array_equal(net.weights, old.weights)
        np.testing.assert_array_equal(net.mean, old.mean)
        np.testing.assert_array_equal(net.scale, old.scale)
    assert not np.array_equal(seen[2].weights, old.weights)
    assert seen[3].n_hidden == 8


def test_progress_bar_only_on_a_terminal_by_default(two_chain_data, capsys, monkeypatch):
    """fit's progress bar goes to stderr when it is a terminal, not into a log file or a
    pipe (progress=True was the default); progress=True still shows it; a non-bool is
    refused."""
    _, X = two_chain_data
    kw = dict(max_iter=20, batch_size=2)
    FHMM(n_chains=2, window=3, n_hidden=4, random_state=0).fit(X, **kw)
    assert "svi" not in capsys.readouterr().err           # pytest's stderr is no terminal
    FHMM(n_chains=2, window=3, n_hidden=4, random_state=0).fit(X, progress=True, **kw)
    assert "svi: " in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    FHMM(n_chains=2, window=3, n_hidden=4, random_state=0).fit(X, **kw)
    assert "svi: " in capsys.readouterr().err
    with pytest.raises(ValueError, match="progress must be True or False, got 'no'"):
        FHMM(n_chains=2).fit(X, progress="no")


def test_save_takes_numpy_integer_hyperparameters(tmp_path, two_chain_data):
    _, X = two_chain_data
    m = FHMM(n_chains=np.int64(2), window=np.int64(3), n_hidden=np.int32(4), random_state=np.int64(5))
    m.fit(X, max_iter=20, progress=False)
    m.save(tmp_path / "m.npz")
    back = FHMM.load(tmp_path / "m.npz")
    assert (back.n_chains, back.window, back.n_hidden, back.random_state) == (2, 3, 4, 5)
    np.testing.assert_array_equal(back.predict_proba(X), m.predict_proba(X))


def test_save_refuses_hyperparameters_changed_after_the_fit(tmp_path, fitted):
    """The file would say window 7 and predict with the networks' 5 (or refuse to load)."""
    m = FHMM(**fitted.get_params())
    m._set_params(fitted.params_, fitted.net_)
    for change, message in ((dict(window=7), "window is 7 but its recognition networks have 5"),
                            (dict(n_hidden=3), "n_hidden is 3 but its recognition networks have 16"),
                            (dict(share_hidden="all"),
                             "share_hidden is 'all' but its recognition networks have 'chain'"),
                            (dict(n_chains=3), "n_chains is 3 but the parameters have 2 chains"),
                            # (a correlated Σ saved as 'diag' was a file from_params refuses)
                            (dict(covariance_type="diag"),
                             "covariance_type is 'diag' but the fitted covariance is not diagonal"),
                            (dict(covariance_type="spherical"),
                             "covariance_type is 'spherical' but the fitted covariance is not σ² I")):
        m.set_params(**fitted.get_params())
        m.set_params(**change)
        with pytest.raises(ValueError, match="cannot save: " + message):
            m.save(tmp_path / "m.npz")
        assert not (tmp_path / "m.npz").exists()
    # what load refuses, save refuses: a seed that is not one, a history that is not records
    m.set_params(**fitted.get_params())
    m.set_params(random_state=-1)
    with pytest.raises(ValueError, match="random_state must be None, an int >= 0"):
        m.save(tmp_path / "m.npz")
    m.set_params(random_state=3)
    m.history_ = {"iteration": 1}
    with pytest.raises(ValueError, match="history_ must be a list of records"):
        m.save(tmp_path / "m.npz")
    assert not (tmp_path / "m.npz").exists()
    m.history_ = []
    m.save(tmp_path / "m.npz")
    FHMM.load(tmp_path / "m.npz")
    # a generator is checked, not drawn from (the check took a number from a RandomState)
    rs = np.random.RandomState(5)
    m.set_params(random_state=rs)
    before = rs.get_state()[1].copy(), rs.get_state()[2]
    m.save(tmp_path / "m.npz")
    np.testing.assert_array_equal(rs.get_state()[1], before[0])
    assert rs.get_state()[2] == before[1]


@pytest.mark.parametrize("init", ["kmeans", "smf"])
@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_svi_fit_does_not_depend_on_the_data_units(two_chain_data, covariance_type, init):
    """The SVI fit of affinely rescaled data is the rescaled fit (RMSprop's steps had a
    fixed size in the data's units: W could not move at 1e8 and diverged at 1e-6,
    log-likelihood -1e21). Per-feature units for full and diag Σ, one unit for
    spherical Σ (the family is not closed under per-feature scaling). Also from the
    default start, SMF-EM on the last rows (its stopping rule, relative to the bound's
    magnitude, stopped it after another number of iterations in other units)."""
    _, X = two_chain_data
    seed = 5
    print(f"seed={seed}")
    T, D = X.shape

    def fit(Y):
        m = FHMM(n_chains=2, window=5, n_hidden=8, random_state=seed,
                 covariance_type=covariance_type)
        return m.fit(Y, init=init, max_iter=300, progress=False)

    ref = fit(X)
    # (1e-14: below the scaler's old absolute floor of 1e-12, which took such features
    # for constant and gave the networks inputs of 1e-14)
    units = [np.full(D, 1e-6), np.full(D, 1e8), np.full(D, 1e-14)]
    if covariance_type != "spherical":
        units.append(np.array([1e-6, 1e4]))
    for unit in units:
        shift = np.array([3.0, -2.0]) * unit
        m = fit(X * unit + shift)
        np.testing.assert_allclose(m.W_[:-1] / unit, ref.W_[:-1], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose((m.W_[-1] - shift) / unit, ref.W_[-1], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(m.covariance_ / np.outer(unit, unit), ref.covariance_,
                                   rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(m.transmat_, ref.transmat_, rtol=1e-6, atol=1e-10)
        log_jac = np.log(unit).sum()
        assert m.score(X * unit + shift) + T * log_jac == pytest.approx(ref.score(X), rel=1e-8)
        np.testing.assert_allclose(m.predict_proba(X * unit + shift), ref.predict_proba(X),
                                   rtol=0, atol=1e-7)
        assert m.history_[-1]["elbo"] + log_jac == pytest.approx(ref.history_[-1]["elbo"], rel=1e-8)


def test_a_series_ending_in_a_still_stretch_does_not_collapse_the_default_start():
    """The default start fits SMF-EM on the last init_samples rows, with Σ's floor from
    their variances: where every feature holds still there (a sensor held, a forward-
    filled gap) those are rounding noise (7e-28 for a column of 0.3), the start's Σ
    collapsed and SVI ended at an ELBO of -4e43 per step. The floor comes from all rows."""
    seed = 2
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=1, noise=0.4)
    Xa, _ = p.sample(3000, random_state=seed)
    for tail in (np.array([0.3, -0.7]), Xa.mean(axis=0)):
        X = np.vstack([Xa, np.tile(tail, (5000, 1))])
        m = FHMM(n_chains=2, n_hidden=4, random_state=0).fit(X, max_iter=2000, progress=False)
        per_step = m.elbo(X) / len(X)
        print(f"tail {tail}: ELBO per step {per_step:.4g}, Σ diag {np.diag(m.covariance_)}")
        assert per_step > -2.0 and np.diag(m.covariance_).min() > 1e-3


@pytest.mark.parametrize("method", ["svi", "smf", "em"])
@pytest.mark.parametrize("init", ["kmeans", "smf"])
def test_refit_from_a_fresh_start_may_change_the_number_of_features(method, init):
    """init="kmeans"/"smf" start afresh: a fitted model refits data of another width
    (it raised "X must have 2 features like the model's parameters"), as a new
    estimator would; continuing from the parameters still needs the same width."""
    seed = 6
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    X2, X3 = rng.normal(size=(300, 2)), rng.normal(size=(300, 3))
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    m.fit(X2, max_iter=20, progress=False)
    m.fit(X3, method=method, init=init, max_iter=20, progress=False)
    fresh = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    fresh.fit(X3, method=method, init=init, max_iter=20, progress=False)
    assert m.n_features_in_ == 3 and m.W_.shape == (3, 3)
    assert m.predict_proba(X3).shape == (300, 2)
    np.testing.assert_allclose(m.W_, fresh.W_, rtol=0, atol=0)
    for init in ("auto", "params"):
        with pytest.raises(ValueError, match="X must have 3 features \\(columns\\) like the"):
            m.fit(X2, init=init, max_iter=5, progress=False)


@pytest.mark.parametrize("kwargs,X,message", [
    ({}, np.zeros((10, 2, 2)), "X must be a 2-D array"),
    ({}, np.array([[0.0, np.inf]] * 10), "X must not contain infinities"),
    ({"lengths": [5, 4]}, np.zeros((10, 2)), "lengths must sum to the number of samples in X \\(10\\)"),
    ({"method": "vb"}, np.zeros((10, 2)), "method must be 'svi', 'smf' or 'em', got 'vb'"),
    ({"method": "smf"}, np.array([[0.0, np.nan]] * 10), "must not contain NaN here"),
    ({"init": "random"}, np.zeros((10, 2)), "init must be one of"),
    ({"init": "params"}, np.random.default_rng(0).normal(size=(10, 2)), "init='params' needs a model with parameters"),
    ({}, np.array([[np.nan, np.nan]] + [[0.0, 1.0]] * 9), "has a row with every value missing \\(row 0\\)"),
    ({}, np.zeros((1, 2)), "at least 2 samples"),
    ({"net_warmup": -1}, np.zeros((10, 2)), "net_warmup must be an integer >= 0, got -1"),
    ({"net_warmup": 2.5}, np.zeros((10, 2)), "net_warmup must be an integer >= 0, got 2.5"),
])
def test_fit_errors(kwargs, X, message):
    with pytest.raises(ValueError, match=message):
        FHMM(n_chains=2, window=3, n_hidden=4).fit(X, max_iter=5, progress=False, **kwargs)


def test_negative_seed_is_refused_by_name():
    """numpy's "expected non-negative integer" did not say which argument was wrong."""
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match="random_state must be None, an int >= 0 .*got -1"):
        FHMM(n_chains=2, random_state=-1).fit(X, max_iter=2, progress=False)
    plain = FHMM.from_params(W=W2, covariance=0.1 * np.eye(2), transmat=A2)
    with pytest.raises(ValueError, match="random_state must be None, an int >= 0 .*got -3"):
        plain.sample(5, random_state=-3)


def test_predict_errors(fitted):
    with pytest.raises(ValueError, match="X must have 2 features"):
        fitted.predict_proba(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="method must be one of"):
        fitted.predict_proba(np.zeros((5, 2)), method="viterbi")
    plain = FHMM.from_params(W=W2, covariance=0.1 * np.eye(2), transmat=A2)
    with pytest.raises(ValueError, match="no recognition networks"):
        plain.predict_proba(np.zeros((5, 2)), method="recognition")
    with pytest.raises(ValueError, match="no recognition networks"):
        plain.elbo(np.zeros((5, 2)))


def test_sampler_uses_every_position_once_per_epoch():
    seed = 4
    print(f"seed={seed}")
    bounds = np.array([0, 23, 30, 31])
    s = SubchainSampler(bounds, 5, 3, np.random.default_rng(seed))
    s.ensure(1)
    n_blocks = len(s.q_start)
    # the epoch's blocks partition every sequence: each position exactly once
    counts = np.zeros(31, dtype=int)
    for a, b in zip(s.q_start, s.q_stop):
        counts[a:b] += 1
    assert (counts == 1).all()
    assert (s.q_stop - s.q_start).max() <= 5
    # in a shuffled order, not the order they were cut in (8 blocks: 1 in 40,320 to be sorted)
    assert n_blocks == 8 and not (np.diff(s.q_start) > 0).all()
    # batches hand the blocks out without replacement, context rows in the same sequence
    seen = []
    for _ in range(n_blocks // 3):
        b = s.next_batch()
        for k in range(3):
            r = b.rows[b.offsets[k]:b.offsets[k + 1]]
            assert (r >= b.row_start[b.offsets[k]]).all() and (r < b.row_end[b.offsets[k]]).all()
            seen.append(int(r[0] if b.first_is_start[k] else r[1]))
    assert len(set(seen)) == len(seen)
    # a new epoch moves the block boundaries (fresh random offset)
    s2 = SubchainSampler(bounds, 5, 3, np.random.default_rng(seed + 1))
    s2.ensure(1)
    epochs = {tuple(sorted(s2.q_start))}
    for _ in range(5):
        s2.advance(len(s2.q_start) - s2.cursor)
        s2.ensure(1)
        epochs.add(tuple(sorted(s2.q_start)))
    assert len(epochs) > 1


def test_rmsprop_update_scales_the_leading_entries():
    """rmsprop_update(..., n_head, head_scale): the first n_head entries move head_scale
    times the plain step (0: held), the rest exactly the plain step; g² is tracked for all."""
    from streamfhmm.kernels.svi import rmsprop_update
    seed = 21
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x0, g, sq0 = rng.normal(size=7), rng.normal(size=7), rng.random(7)
    plain_x, plain_sq = x0.copy(), sq0.copy()
    assert rmsprop_update(plain_x, g, plain_sq, 0.9, 1e-8, 0.1, 3)
    for scale in (0.0, 0.5, 1.0):
        x, sq = x0.copy(), sq0.copy()
        assert rmsprop_update(x, g, sq, 0.9, 1e-8, 0.1, 3, 3, scale)
        np.testing.assert_array_equal(sq, plain_sq)
        np.testing.assert_array_equal(x[3:], plain_x[3:])
        np.testing.assert_allclose(x[:3] - x0[:3], scale * (plain_x[:3] - x0[:3]), rtol=1e-12)
    assert (x0[:3] != plain_x[:3]).all()


def _rmsprop_reference(x, grad, sq, decay, eps, lr, step_count, n_head=0, head_scale=1.0):
    """rmsprop_update's docstring (MATH.md §5 with bias correction), whole-array numpy:
    ``g² ← γ g² + (1-γ) ∇²``; ``x ← x + η_i ∇ / (√(g² / (1-γ^k)) + ε)`` with
    ``k = step_count + 1`` and ``η_i = head_scale · η`` for ``i < n_head``, else ``η``."""
    sq = decay * sq + (1.0 - decay) * grad**2
    eta = np.where(np.arange(len(x)) < n_head, head_scale * lr, lr)
    return x + eta * grad / (np.sqrt(sq / (1.0 - decay ** (step_count + 1))) + eps), sq


def test_rmsprop_with_units_is_rmsprop_in_standardised_units():
    """rmsprop_update(..., head_unit=u): the head takes exactly the step plain RMSprop
    takes on x / u with gradient u ∇ and running average u² g² (the parameter in units
    where the data have unit standard deviation); model_units lays u out as the model
    vector (ModelPacker): W[k, d] → scale[d], L[i, j] (j < i) → scale[i], log L_dd, α, β → 1."""
    from streamfhmm.kernels.svi import model_units, rmsprop_update
    from streamfhmm.learn.objective import ModelPacker
    seed = 23
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    M, D = 2, 3
    scale = np.array([1e-6, 2.5, 1e4])
    packer = ModelPacker(M, D)
    nm = packer.size
    u = np.empty(nm)
    model_units(M, D, scale, u)
    tril = packer.tril
    want = np.concatenate([np.tile(scale, M + 1), np.where(tril[0] == tril[1], 1.0, scale[tril[0]]),
                           np.ones(2 * M)])
    np.testing.assert_array_equal(u, want)
    bad = np.array([0.0, np.nan, np.inf])      # (a scaler never has these: counted as 1)
    model_units(M, D, bad, u)
    assert (u == 1.0).all()
    model_units(M, D, scale, u)
    n = nm + 4                                  # the model, then 4 network weights
    x, sq = rng.normal(size=n), rng.uniform(0.01, 2.0, size=n)
    x[:nm] *= u                                 # parameters in the data's units
    decay, eps = 0.8, 1e-2                      # ε comparable to √g²: its place matters
    xz, sqz = x.copy(), sq.copy()
    xz[:nm] /= u
    sqz[:nm] *= u**2
    for step_count in range(3, 7):
        g = rng.normal(size=n)
        g[:nm] /= u                             # ∂/∂x = (1/u) ∂/∂x_z
        gz = g.copy()
        gz[:nm] *= u
        for head_scale in (1.0, 0.5):
            assert rmsprop_update(x, g, sq, decay, eps, 0.05, step_count, nm, head_scale, u)
            assert rmsprop_update(xz, gz, sqz, decay, eps, 0.05, step_count, nm, head_scale)
            np.testing.assert_allclose(x[:nm] / u, xz[:nm], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(sq[:nm] * u**2, sqz[:nm], rtol=1e-12)
            np.testing.assert_allclose(x[nm:], xz[nm:], rtol=1e-13)
    x0 = x.copy()
    assert rmsprop_update(x, g, sq, decay, eps, 0.05, 9, nm, 0.0, u)   # held
    np.testing.assert_array_equal(x[:nm], x0[:nm])


def test_rmsprop_update_consecutive_steps_against_the_formula():
    """Several steps from non-zero running averages at step_count > 0 (the bias
    correction 1-γ^k with k = step_count + 1, ε outside the root, the head's scale),
    and RMSprop.step counting its steps from 0; a non-finite gradient changes nothing."""
    from streamfhmm.kernels.svi import rmsprop_update
    seed = 22
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    n, decay, eps = 9, 0.8, 1e-2          # ε comparable to √g²: its place in the formula matters
    x, sq = rng.normal(size=n), rng.uniform(0.01, 2.0, size=n)
    x_ref, sq_ref = x.copy(), sq.copy()
    for k, step_count in enumerate(range(3, 9)):
        g = rng.normal(scale=rng.uniform(0.1, 3.0), size=n)
        lr = 0.05 * (k + 1)
        n_head, head_scale = (0, 1.0) if k % 2 else (4, 0.25 * k)
        assert rmsprop_update(x, g, sq, decay, eps, lr, step_count, n_head, head_scale)
        x_ref, sq_ref = _rmsprop_reference(x_ref, g, sq_ref, decay, eps, lr, step_count, n_head,
                                           head_scale)
        np.testing.assert_allclose(sq, sq_ref, rtol=1e-14, atol=0)
        np.testing.assert_allclose(x, x_ref, rtol=1e-14, atol=1e-15)
    # a non-finite gradient: False, and neither x nor the running averages change
    for bad in (np.nan, np.inf):
        g = rng.normal(size=n)
        g[5] = bad
        x0, sq0 = x.copy(), sq.copy()
        assert not rmsprop_update(x, g, sq, decay, eps, 0.1, 9)
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(sq, sq0)
    # the optimiser object: fresh accumulators, step_count 0, 1, 2, ...
    opt = RMSprop(n, decay=decay, eps=eps)
    x = rng.normal(size=n)
    x_ref, sq_ref = x.copy(), np.zeros(n)
    for step_count in range(4):
        g = rng.normal(size=n)
        opt.step(x, g, lr=0.1)
        x_ref, sq_ref = _rmsprop_reference(x_ref, g, sq_ref, decay, eps, 0.1, step_count)
        np.testing.assert_allclose(x, x_ref, rtol=1e-14, atol=1e-15)
    assert opt.steps == 4


def test_warmup_trains_the_networks_only(two_chain_data):
    """fit(net_warmup=n): for n steps the model stays where it starts while the networks
    learn its posterior; joint steps follow."""
    _, X = two_chain_data
    start = FHMM(n_chains=2, random_state=0).fit(X, method="smf", max_iter=3, progress=False)

    def model():
        return FHMM.from_params(start.W_, start.covariance_, start.transmat_, window=5,
                                n_hidden=8, random_state=0)
    held = model().fit(X, max_iter=300, net_warmup=300, progress=False)
    np.testing.assert_allclose(held.W_, start.W_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(held.covariance_, start.covariance_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(held.transmat_, start.transmat_, rtol=0, atol=1e-12)
    barely = model().fit(X, max_iter=1, net_warmup=1, progress=False)
    print(f"ELBO/step after 1 and 300 network-only steps: {barely.elbo(X) / len(X):.4f} "
          f"{held.elbo(X) / len(X):.4f}")
    assert held.elbo(X) > barely.elbo(X) + 0.1 * len(X)
    joint = model().fit(X, max_iter=300, net_warmup=100, progress=False)
    assert np.abs(joint.W_ - start.W_).max() > 1e-3


def test_rmsprop_and_schedule():
    opt = RMSprop(2, decay=0.9)
    x = np.zeros(2)
    opt.step(x, np.array([1.0, -4.0]), lr=0.1)
    np.testing.assert_allclose(x, [0.1, -0.1], rtol=1e-6)  # bias-corrected: first step is lr·sign
    assert cosine_lr(1.0, 0.01, 0.0) == 1.0
    assert cosine_lr(1.0, 0.01, 1.0) == pytest.approx(0.01)
    assert cosine_lr(1.0, 0.01, 0.5) == pytest.approx(0.505)


# ----------------------------------------------------------------------------------------
# covariance families ("full", "diag", "spherical")
# ----------------------------------------------------------------------------------------
def _batch_scratch(n, net, M, D):
    return [np.empty((n, k)) for k in (net.n_inputs, net.n_groups * net.n_hidden, M, M, M, M, D)]


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
@pytest.mark.parametrize("mode", ["centred", "causal"])
def test_constrained_gradient_against_finite_differences(covariance_type, mode):
    """The fused kernel's gradient, mapped to the family, equals central differences of
    the ELBO in the family's own parameters (W, every L entry / λ_d / one λ, α, β), and
    its network-weight part equals central differences in the weights (a sample from
    every block) and ``batch_objective``'s network gradient."""
    from streamfhmm.kernels import recognition as rk
    from streamfhmm.kernels import svi as ks
    from streamfhmm.learn.objective import (ModelPacker, Workspace, batch_objective,
                                            constrain_params, covariance_mode)
    from streamfhmm.network import RecognitionNet

    from . import naive_covariance as naive_cov
    seed = 300 + {"diag": 0, "spherical": 2, "full": 4}[covariance_type] + (mode == "causal")
    print(f"seed={seed} covariance_type={covariance_type} mode={mode}")
    full = covariance_type == "full"
    M, D, T = 2, 3, 40
    rng = np.random.default_rng(seed)
    params = FHMMParams.random(M, D, random_state=seed, noise=0.6)
    X, _ = params.sample(T, random_state=seed + 1)
    X[rng.random(X.shape) < 0.1] = np.nan
    X[np.isnan(X).all(axis=1), 0] = 0.5
    net = RecognitionNet(M, D, window=5, n_hidden=4, share="chain", mode=mode)
    net.init(random_state=seed, output_scale=1.0)
    net.weights = net.weights + 0.3 * rng.standard_normal(net.n_weights)
    net.fit_scaler(X)
    packer = ModelPacker(M, D)
    ws = Workspace(packer, net)
    params = constrain_params(params, covariance_type)

    # the family's own coordinates; "full" is the flat model vector itself
    def embed(z):
        return z.copy() if full else naive_cov.embed(z, M, D, covariance_type)

    def restrict(v):
        return v.copy() if full else naive_cov.restrict(v, M, D, covariance_type)

    # move the λ_d (and, full, the off-diagonal L entries) apart so that the test sees each one
    vec = packer.pack(params)
    z0 = restrict(vec)
    nW = (M + 1) * D
    nc = naive_cov.n_free_cov(D, covariance_type)
    z0[nW:nW + nc] += 0.2 * rng.standard_normal(nc)
    vec = embed(z0)
    if full:
        off = packer.L(vec)[np.tril_indices(D, -1)]
        assert (np.abs(off) > 1e-2).all(), off
    sampler = SubchainSampler(np.array([0, 15, T]), 6, 4, np.random.default_rng(seed))
    b = sampler.next_batch()
    x = np.concatenate([vec, net.weights])
    grad = np.empty_like(x)
    value, _ = ks.batch_gradient(X, b.rows, b.row_start, b.row_end, b.offsets, b.first_is_start,
                                 net.window, net.offset, net.mean, net.scale, x, packer.size,
                                 net.layout, M, D, *_batch_scratch(len(b.rows), net, M, D), grad,
                                 covariance_mode(covariance_type))
    w = net.weights.copy()

    def f(z):
        return batch_objective(embed(z), w, X, b.rows, b.row_start, b.row_end, b.offsets,
                               b.first_is_start, ws)[0]

    def f_net(weights):
        return batch_objective(vec, weights, X, b.rows, b.row_start, b.row_end, b.offsets,
                               b.first_is_start, ws)[0]

    assert value == pytest.approx(f(z0), rel=1e-12)
    g_model = grad[:packer.size]
    if not full:
        # the kernel's gradient lies on the family: 0 off the diagonal, equal λ_d (spherical)
        tri = np.tril_indices(D)
        lblock = g_model[packer.sL]
        assert (lblock[tri[0] != tri[1]] == 0.0).all()
        g_diag = lblock[tri[0] == tri[1]]
        if covariance_type == "spherical":
            assert (g_diag == g_diag[0]).all()
    g = restrict(g_model)

    def fd_check(fun, at, gradient, idx, step=1e-3):
        # five-point central differences: with |F| ~ 160 the two-point rule's rounding
        # error (~ε|F|/h ≈ 1e-8 at h = 1e-6) exceeds the 1e-9 floor of the tolerance on
        # small weight gradients; this rule's is ~1e-11 and its O(h⁴) error as small
        for i in idx:
            z = [at.copy() for _ in range(4)]
            for zk, k in zip(z, (2, 1, -1, -2)):
                zk[i] += k * step
            fd = (-fun(z[0]) + 8 * fun(z[1]) - 8 * fun(z[2]) + fun(z[3])) / (12 * step)
            scale = max(abs(fd), abs(gradient[i]), 1e-3)
            assert abs(fd - gradient[i]) / scale <= 1e-6, (i, fd, gradient[i], len(at))

    fd_check(f, z0, g, range(len(z0)))
    # the network weights: a random sample from every block against central differences ...
    g_net = grad[packer.size:]
    assert g_net.shape == (net.n_weights,)
    lay = net.layout
    blocks = [(lay[rk.LAYOUT_OFF_U], lay[rk.LAYOUT_OFF_C]), (lay[rk.LAYOUT_OFF_C], lay[rk.LAYOUT_OFF_V]),
              (lay[rk.LAYOUT_OFF_V], lay[rk.LAYOUT_OFF_E]), (lay[rk.LAYOUT_OFF_E], lay[rk.LAYOUT_N_WEIGHTS])]
    idx = np.concatenate([rng.choice(np.arange(a, b), size=min(8, b - a), replace=False)
                          for a, b in blocks])
    fd_check(f_net, w, g_net, idx)
    # ... and all of them against batch_objective's network gradient (FD-tested in
    # test_objective.py); with "full" the model gradient is batch_objective's as well
    _, gm_ref, gn_ref = batch_objective(vec, w, X, b.rows, b.row_start, b.row_end, b.offsets,
                                        b.first_is_start, ws)
    np.testing.assert_allclose(g_net, gn_ref, rtol=1e-10, atol=1e-12)
    if full:
        np.testing.assert_allclose(g_model, gm_ref, rtol=1e-10, atol=1e-12)


def test_constrain_model_projects_and_equalises_rmsprop_state():
    from streamfhmm.kernels import svi as ks
    from streamfhmm.learn.objective import ModelPacker
    seed = 310
    print(f"seed={seed}")
    p = FHMMParams.random(2, 4, random_state=seed)
    packer = ModelPacker(2, 4)
    Sigma = p.covariance
    for mode, want in ((1, np.diag(np.diag(Sigma))), (2, np.trace(Sigma) / 4 * np.eye(4))):
        vec = packer.pack(p)
        sq = np.random.default_rng(seed).uniform(size=packer.size)
        sq0 = sq.copy()
        ks.constrain_model(vec, sq, 2, 4, mode)
        L = packer.L(vec)
        np.testing.assert_allclose(L @ L.T, want, rtol=1e-13)
        assert (L[np.tril_indices(4, -1)] == 0.0).all()
        np.testing.assert_array_equal(vec[packer.sW], p.W.ravel())
        diag_sq = sq[packer.sL][packer.diag_pos]
        if mode == 2:
            assert (diag_sq == diag_sq[0]).all()
            assert diag_sq[0] == pytest.approx(sq0[packer.sL][packer.diag_pos].mean(), rel=1e-14)
        else:
            np.testing.assert_array_equal(sq, sq0)


@pytest.fixture(scope="module")
def correlated_data():
    seed = 12
    print(f"seed={seed}")
    S = np.array([[0.2, 0.08, 0.0], [0.08, 0.1, 0.03], [0.0, 0.03, 0.15]])
    W = np.array([[1.0, -1.0, 0.5], [1.5, 1.0, 0.0], [0.0, 0.2, 0.0]])
    true = FHMM.from_params(W=W, covariance=S, transmat=A2)
    X, _ = true.sample(800, random_state=seed)
    return X


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
@pytest.mark.parametrize("method,init", [("svi", "kmeans"), ("svi", "smf"), ("smf", "auto")])
def test_fit_keeps_the_covariance_family(correlated_data, covariance_type, method, init):
    X = correlated_data
    print(f"covariance_type={covariance_type} method={method} init={init}")
    m = FHMM(n_chains=2, window=3, n_hidden=6, random_state=5, covariance_type=covariance_type)
    m.fit(X, method=method, init=init, max_iter=400 if method == "svi" else 10, progress=False)
    L = m.params_.L
    off = L[~np.eye(3, dtype=bool)]
    assert (off == 0.0).all()
    C = m.covariance_
    assert (C[~np.eye(3, dtype=bool)] == 0.0).all()
    if covariance_type == "spherical":
        assert (np.diag(L) == L[0, 0]).all()
    else:
        assert np.ptp(np.diag(L)) > 1e-3  # the variances are learnt separately
    # the start was the family's too: a fit from it continues on the family
    m.fit(X, method="svi", init="params", max_iter=50, progress=False)
    assert (m.params_.L[~np.eye(3, dtype=bool)] == 0.0).all()


def test_spherical_svi_learns_the_mean_variance(correlated_data):
    """The spherical fit's σ² is near the mean residual variance per dimension (the
    spherical maximum likelihood), not stuck at its start."""
    X = correlated_data
    m = FHMM(n_chains=2, window=3, n_hidden=8, random_state=5, covariance_type="spherical")
    m.fit(X, init="kmeans", max_iter=3000, progress=False)
    R = X - m.reconstruct(X, method="exact")
    sigma2 = m.covariance_[0, 0]
    print(f"sigma2={sigma2:.4f} mean residual variance={R.var(axis=0).mean():.4f}")
    assert sigma2 == pytest.approx(R.var(axis=0).mean(), rel=0.25)


def test_fit_svi_continues_a_state_with_its_covariance_type(correlated_data):
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    X = correlated_data
    p = init_params(X, 2, random_state=np.random.default_rng(0))
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=0)
    net.fit_scaler(X)
    bounds = np.array([0, len(X)])
    st = fit_svi(X, bounds, p, net, max_iter=30, rng=np.random.default_rng(0), progress=False,
                 covariance_type="spherical")
    assert st.covariance_type == "spherical"
    st = fit_svi(X, bounds, None, None, max_iter=30, rng=np.random.default_rng(1), progress=False,
                 state=st)
    L = st.params.L
    assert (L == L[0, 0] * np.eye(3)).all()
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        fit_svi(X, bounds, p, net, max_iter=1, rng=np.random.default_rng(0), progress=False,
                covariance_type="tied")


def test_a_failed_fit_keeps_its_steps_in_the_state(two_chain_data, monkeypatch):
    """fit_svi that raises part-way (a non-finite ELBO at the 25th step of a continued
    fit) leaves the state at its last good step, consistent with its iteration count and
    RMSprop statistics (the parameters stayed where the call started)."""
    from streamfhmm.kernels import svi as ks
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    X = two_chain_data[1]
    seed = 71
    print(f"seed={seed}")
    params = init_params(X, 2, random_state=np.random.default_rng(seed))
    net = RecognitionNet(2, X.shape[1], window=3, n_hidden=4).init(random_state=seed)
    net.fit_scaler(X)
    bounds = np.array([0, len(X)])
    state = fit_svi(X, bounds, params, net, max_iter=10, rng=np.random.default_rng(seed),
                    progress=False)
    start = state.state_vector().copy()
    step = ks.svi_step
    calls = []

    def failing(*args):
        calls.append(1)
        return np.nan if len(calls) == 25 else step(*args)

    monkeypatch.setattr(ks, "svi_step", failing)
    with pytest.raises(FloatingPointError, match="non-finite ELBO gradient at iteration 35"):
        fit_svi(X, bounds, None, None, max_iter=100, rng=np.random.default_rng(seed),
                progress=False, log_every=1000, state=state)
    assert state.iteration == 34 and state.opt.steps == 34
    assert not np.array_equal(state.state_vector(), start)


@pytest.mark.parametrize("bounds,message", [
    ([0, 0], "bounds must span at least one row, got 0 to 0"),            # next_batch hung
    ([7], r"bounds must be a 1-D integer array .* got an array of shape \(1,\)"),  # hung
    ([0, 10, 5], r"bounds must be non-decreasing, got bounds\[1\] = 10 > bounds\[2\] = 5"),
    ([-5, 10], "bounds must be non-negative row indices, got values from -5 to 10"),
    ([0, 9.7], "bounds must be a 1-D integer array"),
    (np.array([5, 3], dtype=np.uint64), "bounds must be non-decreasing"),
])
def test_sampler_refuses_bad_bounds(bounds, message):
    """Bounds spanning no row made next_batch loop for ever; decreasing or negative ones
    gave rows outside their sequence (negative rows: from the end of the data)."""
    with pytest.raises(ValueError, match=message):
        SubchainSampler(np.array(bounds), 3, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng must be a numpy Generator, got int"):
        SubchainSampler(np.array([0, 10]), 3, 2, 0)


def test_rmsprop_refuses_mismatched_vectors():
    """A vector longer than the optimiser's size was stepped past the end of its g²
    (a segmentation fault later in the process); a shorter gradient was read past its end."""
    opt = RMSprop(3)
    x = np.zeros(6)
    with pytest.raises(ValueError, match=r"x must be a writable float64 array of shape \(3,\)"):
        opt.step(x, np.ones(6), 0.1)
    x = np.zeros(3)
    with pytest.raises(ValueError, match=r"grad must be a real array of shape \(3,\), got shape \(2,\)"):
        opt.step(x, np.ones(2), 0.1)
    with pytest.raises(ValueError, match=r"x must be a writable float64 array"):
        opt.step(np.zeros(3, dtype=np.float32), np.ones(3), 0.1)
    with pytest.raises(ValueError, match=r"lr must be a finite number in \[0, inf\), got nan"):
        opt.step(x, np.ones(3), np.nan)
    np.testing.assert_array_equal(x, 0.0)
    assert opt.steps == 0 and (opt.sq == 0).all()
    for kwargs, message in ((dict(decay=1.5), r"decay must be a finite number in \[0, 1\)"),
                            (dict(decay=np.nan), "decay must be a finite number"),
                            (dict(eps=-1.0), r"eps must be a finite number in \(0, inf\)"),
                            (dict(size=0), "size must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):
            RMSprop(**{"size": 3, **kwargs})


def test_fit_svi_checks_its_inputs():
    """fit_svi passed X, bounds, params and net to the kernels unchecked: bounds past the
    end of X, X narrower than the model, or networks for other chains ran (reading and
    writing out of bounds) and gave a finite ELBO."""
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    seed = 12
    print(f"seed={seed}")
    p = FHMMParams.random(2, 3, random_state=seed)
    X, _ = p.sample(40, random_state=seed + 1)
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=seed)
    Xinf = X.copy()
    Xinf[3, 1] = np.inf

    def fit(X=X, bounds=(0, 40), params=p, net=net, **kw):
        return fit_svi(X, np.array(bounds), params, net, max_iter=2, progress=False,
                       **{"rng": np.random.default_rng(seed), **kw})

    for kwargs, message in [
        (dict(bounds=(0, 60)), r"bounds must lie in \[0, 40\] \(the rows of the data\)"),
        (dict(bounds=(20, 10)), r"bounds must be non-decreasing"),
        (dict(X=X[:, :2]), r"X must have 3 features \(columns\), got 2"),
        (dict(X=Xinf), "X must not contain infinities; found inf at row 3, column 1"),
        (dict(net=RecognitionNet(5, 3, window=3, n_hidden=4)),
         "net must have params' 2 chains and 3 features, got 5 chains and 3 features"),
        (dict(params=None), "params must be an FHMMParams, got NoneType"),
        (dict(rng=0), "rng must be a numpy Generator, got int"),
        (dict(params=None, net=None, state="state"), "state must be an SVIState, got str"),
    ]:
        with pytest.raises(ValueError, match=message):
            fit(**kwargs)
    state = fit()
    before = state.state_vector().copy()
    with pytest.raises(ValueError, match=r"X must have 3 features \(columns\), got 2"):
        fit(X=X[:, :2], params=None, net=None, state=state)
    np.testing.assert_array_equal(state.state_vector(), before)
    # Fortran order and a strided view are the same data
    Xv = np.repeat(X, 2, axis=0)[::2]
    a = fit(X=np.asfortranarray(X)).state_vector()
    np.testing.assert_array_equal(fit(X=Xv).state_vector(), a)
    np.testing.assert_array_equal(fit().state_vector(), a)


def _threaded_fit(X, params, net, n_jobs, steps, seed, **kw):
    from streamfhmm.learn.svi import fit_svi
    return fit_svi(X, np.array([0, len(X)]), params, net, max_iter=steps, batch_size=5,
                   rng=np.random.default_rng(seed), progress=False, n_jobs=n_jobs, **kw)


@pytest.fixture(scope="module")
def three_chain_setup():
    from streamfhmm.network import RecognitionNet
    seed = 81
    print(f"seed={seed}")
    params = FHMMParams.random(3, 2, random_state=seed)
    X, _ = params.sample(600, random_state=seed + 1)
    X[5, 1] = np.nan  # a missing value: its rows go through the other emission path
    net = RecognitionNet(3, 2, window=5, n_hidden=8, share="all").init(random_state=seed)
    net.fit_scaler(X)
    return X, params, net, seed


@pytest.mark.parametrize("n_jobs", [2, 3, 5, 50])
def test_threaded_steps_equal_the_one_thread_step(three_chain_setup, n_jobs):
    """n_jobs threads, each summing the gradient over its share of a step's subchains,
    take the one-thread step to rounding (the sums are added in another order), and the
    same run each time; more threads than subchains are capped at one per subchain."""
    X, params, net, seed = three_chain_setup
    one = _threaded_fit(X, params, net, 1, 4, seed, net_warmup=1).state_vector()
    many = _threaded_fit(X, params, net, n_jobs, 4, seed, net_warmup=1).state_vector()
    rel = np.abs(many - one).max() / np.abs(one).max()
    print(f"n_jobs={n_jobs}: max difference from the one-thread run after 4 steps {rel:.1e}")
    assert 0 < rel <= 1e-13 or np.array_equal(many, one)
    again = _threaded_fit(X, params, net, n_jobs, 4, seed, net_warmup=1).state_vector()
    np.testing.assert_array_equal(again, many)
    if n_jobs > 5:
        capped = _threaded_fit(X, params, net, 5, 4, seed, net_warmup=1).state_vector()
        np.testing.assert_array_equal(capped, many)


def test_threaded_fit_learns_like_the_one_thread_fit(three_chain_setup):
    """Over a whole fit the runs part by rounding, but learn alike."""
    X, params, net, seed = three_chain_setup
    scored = X[10:]  # complete rows (the exact score takes no missing values)

    def loglik(p):
        return FHMM.from_params(W=p.W, covariance=p.covariance,
                                transmat=p.transmat).score(scored) / len(scored)

    fits = {n_jobs: _threaded_fit(X, params, net, n_jobs, 1500, seed, net_warmup=100)
            for n_jobs in (1, 2)}
    ll = {n_jobs: loglik(fit.params) for n_jobs, fit in fits.items()}
    print(f"log-likelihood per step: true parameters {loglik(params):.4f}, "
          f"n_jobs=1 {ll[1]:.4f}, n_jobs=2 {ll[2]:.4f}")
    # the states part (the threads' sums are added in another order), though the scores
    # may agree to every digit (they did on one machine, not on another)
    assert not np.array_equal(fits[1].state_vector(), fits[2].state_vector())
    assert abs(ll[2] - ll[1]) < 0.02


def test_threaded_fit_failure_keeps_its_steps_in_the_state(three_chain_setup, monkeypatch):
    """A non-finite gradient from one thread's share stops the threaded fit as the
    one-thread fit stops: an error naming the step, the state at the step before."""
    from streamfhmm.kernels import svi as ks
    X, params, net, seed = three_chain_setup
    gradient = ks.batch_gradient
    calls = []

    def failing(*args):
        calls.append(1)
        value, counted = gradient(*args)
        return (np.nan if len(calls) == 2 * 7 else value), counted

    monkeypatch.setattr(ks, "batch_gradient", failing)
    state = None
    with pytest.raises(FloatingPointError, match="non-finite ELBO gradient at iteration 7"):
        from streamfhmm.learn.svi import fit_svi, start_state
        state = start_state(None, params, net, 0.9, None)
        fit_svi(X, np.array([0, len(X)]), None, None, max_iter=20, batch_size=5,
                rng=np.random.default_rng(seed), progress=False, n_jobs=2, state=state)
    assert state.iteration == 6 and state.opt.steps == 6
    assert np.isfinite(state.state_vector()).all()


@pytest.mark.parametrize("n_jobs,message", [
    (-1.0, r"n_jobs \(or -1 for every processor\) must be an integer >= 1, got -1.0"),
    (0, r"n_jobs \(or -1 for every processor\) must be an integer >= 1, got 0"),
    (-2, r"n_jobs \(or -1 for every processor\) must be an integer >= 1, got -2"),
    (1.5, r"n_jobs \(or -1 for every processor\) must be an integer >= 1, got 1.5"),
    ("2", r"n_jobs \(or -1 for every processor\) must be an integer >= 1, got '2'"),
])
def test_n_jobs_errors(n_jobs, message):
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(ValueError, match=message):
        FHMM(n_chains=2, window=3, n_hidden=4).fit(X, max_iter=2, progress=False, n_jobs=n_jobs)


@pytest.mark.parametrize("method", ["smf", "em"])
@pytest.mark.parametrize("n_jobs", [2, -1])
def test_n_jobs_is_for_the_local_svi_fit(method, n_jobs, monkeypatch):
    """Refused for SMF and exact EM whatever the processor count (-1 on a machine with
    one processor is refused as well, and named as given)."""
    import os
    if hasattr(os, "sched_getaffinity"):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(ValueError, match=f"n_jobs applies to method='svi' without a client .*"
                                         f"got n_jobs={n_jobs} with method='{method}'"):
        FHMM(n_chains=2, window=3, n_hidden=4).fit(X, method=method, max_iter=2, progress=False,
                                                   n_jobs=n_jobs)


def test_n_jobs_minus_one_counts_the_processors_the_process_may_use(monkeypatch):
    import os
    from streamfhmm.learn.svi import check_n_jobs
    if hasattr(os, "sched_getaffinity"):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5})
        monkeypatch.setattr(os, "cpu_count", lambda: 8)
        assert check_n_jobs(-1) == 3 and check_n_jobs(np.int64(-1)) == 3
    else:
        monkeypatch.setattr(os, "cpu_count", lambda: 8)
        assert check_n_jobs(-1) == 8
    assert check_n_jobs(np.int64(2)) == 2
    X = np.random.default_rng(0).normal(size=(30, 2))
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=1)
    m.fit(X, max_iter=3, progress=False, n_jobs=-1)
    assert m.fit_method_ == "svi" and np.isfinite(m.W_).all()


def test_progress_bar_counts_time_from_after_the_first_step(correlated_data, monkeypatch):
    """A slow first step (a first fit compiles the kernels) does not set the bar's rate:
    its clock restarts after that step, so the ETA is that of the steps after it (tqdm
    showed about a minute per step, and an ETA of days, for most of a first fit)."""
    import time

    import tqdm.auto

    from streamfhmm.learn import svi as svi_mod
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    bars = []

    class Recorded(tqdm.auto.tqdm):
        def close(self):
            if not self.disable:       # tqdm closes again (disabled) when collected
                bars.append((self.n, self.total, self.start_t))
            super().close()

    compiled_step = svi_mod._ks.svi_step
    calls = []

    def slow_first_step(*args):
        calls.append(time.time())
        if len(calls) == 1:
            time.sleep(1.0)        # as a compilation would
        return compiled_step(*args)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    monkeypatch.setattr(svi_mod._ks, "svi_step", slow_first_step)
    X = correlated_data
    p = init_params(X, 2, random_state=np.random.default_rng(0))
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=0)
    net.fit_scaler(X)
    fit_svi(X, np.array([0, len(X)]), p, net, max_iter=40, rng=np.random.default_rng(0),
            progress=True)
    assert len(calls) == 40 and len(bars) == 1
    n, total, start = bars[0]
    assert (n, total) == (40, 40)
    assert start >= calls[0] + 1.0      # the bar's clock started after the slow step


def test_a_run_split_into_calls_follows_one_schedule(correlated_data):
    """fit_svi's schedule_start/schedule_length: 300 + 700 steps log the learning rates
    of one 1,000-step run, and the split run has taken every step."""
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    X = correlated_data
    p = init_params(X, 2, random_state=np.random.default_rng(0))
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=0)
    net.fit_scaler(X)
    bounds = np.array([0, len(X)])
    kw = dict(rng=np.random.default_rng(0), progress=False, log_every=10, learning_rate=1e-2,
              final_lr_ratio=0.01)
    whole = fit_svi(X, bounds, p, net, max_iter=1000, **kw)
    part = fit_svi(X, bounds, p, net, max_iter=300, schedule_length=1000, **kw)
    assert part.history[-1]["lr"] == pytest.approx(cosine_lr(1e-2, 0.01, 0.3), rel=1e-12)
    part = fit_svi(X, bounds, None, None, state=part, max_iter=700, schedule_start=300,
                   schedule_length=1000, **kw)
    assert part.iteration == whole.iteration == part.opt.steps == 1000
    assert [h["iteration"] for h in part.history] == [h["iteration"] for h in whole.history]
    np.testing.assert_allclose([h["lr"] for h in part.history], [h["lr"] for h in whole.history],
                               rtol=1e-12)
    assert part.history[-1]["lr"] == pytest.approx(1e-4, rel=1e-12)
    with pytest.raises(ValueError, match="schedule_start \\+ max_iter must be at most "
                                         "schedule_length, got 300 \\+ 800 > 1,000"):
        fit_svi(X, bounds, p, net, max_iter=800, schedule_start=300, schedule_length=1000, **kw)


def test_restarts_continue_the_run_with_the_highest_elbo(two_chain_data, monkeypatch):
    """Three runs of 100 steps of a 400-step schedule, each from its own start; the one
    whose ELBO on the data is highest (recomputed here) is the state continued for the
    remaining 300 steps, on the same schedule."""
    import streamfhmm.learn.svi as svi
    from streamfhmm.learn.objective import Workspace, sequence_elbo
    _, X = two_chain_data
    calls, real = [], svi.fit_svi

    def recording(*args, **kw):
        continued = kw.get("state")
        out = real(*args, **kw)
        value, _ = sequence_elbo(out.model_vec, out.net.weights, X, np.array([0, len(X)]),
                                 Workspace(out.packer, out.net))
        calls.append(dict(kw, out=out, continued=continued, elbo=value / len(X),
                          start=None if continued else args[2]))
        return out
    monkeypatch.setattr(svi, "fit_svi", recording)
    m = FHMM(n_chains=2, window=5, n_hidden=8, random_state=4)
    m.fit(X, max_iter=400, n_restarts=3, restart_steps=100, init="smf", progress=False)
    runs, last = calls[:3], calls[3]
    assert len(calls) == 4
    assert all(c["max_iter"] == 100 and c["schedule_length"] == 400 and c["continued"] is None
               for c in runs)
    assert not np.array_equal(runs[0]["start"].W, runs[1]["start"].W), "each run its own start"
    np.testing.assert_allclose(m.restart_scores_, [c["elbo"] for c in runs], rtol=1e-10)
    best = int(np.argmax(m.restart_scores_))
    assert last["continued"] is runs[best]["out"]
    assert (last["max_iter"], last["schedule_start"], last["schedule_length"]) == (300, 100, 400)
    assert m.history_[-1]["iteration"] == 400
    np.testing.assert_array_equal(m.W_, last["out"].params.W)


def test_restarts_take_the_start_kind_init_gives_each_run(two_chain_data, monkeypatch):
    """init=("smf", "kmeans", "smf"): the first and third runs start from an SMF-EM
    refinement, the second from the k-means start alone; each run's SVI fit starts from
    the parameters made for it."""
    import streamfhmm.learn.smf as smf
    import streamfhmm.learn.svi as svi
    _, X = two_chain_data
    made, smf_fits, starts = [], [], []
    real_initial, real_smf, real_svi = FHMM._initial_params, smf.fit_smf, svi.fit_svi

    def initial(self, X, init, *args, **kw):
        out = real_initial(self, X, init, *args, **kw)
        made.append((init, out))
        return out

    def counted_smf(*args, **kw):
        smf_fits.append(len(made))
        return real_smf(*args, **kw)

    def recorded_svi(*args, **kw):
        if kw.get("state") is None:
            starts.append(args[2])
        return real_svi(*args, **kw)
    monkeypatch.setattr(FHMM, "_initial_params", initial)
    monkeypatch.setattr(smf, "fit_smf", counted_smf)
    monkeypatch.setattr(svi, "fit_svi", recorded_svi)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=2)
    m.fit(X, max_iter=60, n_restarts=3, init=("smf", "kmeans", "smf"), progress=False)
    assert [k for k, _ in made] == ["smf", "kmeans", "smf"]
    # one SMF-EM refinement inside each "smf" start (made[0] and made[2]), none for "kmeans"
    assert smf_fits == [0, 2]
    assert len(starts) == 3 and all(s is p for s, (_, p) in zip(starts, made))
    assert m.restart_scores_.shape == (3,) and np.isfinite(m.restart_scores_).all()


@pytest.mark.parametrize("kwargs,message", [
    (dict(init=("smf", "kmeans")), "init as a sequence gives each of the n_restarts=3 runs its "
                                   "start: 3 of 'smf', 'kmeans', got \\('smf', 'kmeans'\\)"),
    (dict(init=("smf", "params", "smf")), "3 of 'smf', 'kmeans', got \\('smf', 'params', 'smf'\\)"),
    (dict(init=3), "init must be a str or a sequence of start kinds .*got int"),
    (dict(init=("kmeans", "kmeans", "kmeans"), n_init=2), "n_init applies to init='smf' or 'auto'"),
])
def test_restart_init_sequence_errors(kwargs, message):
    X = np.random.default_rng(0).normal(size=(50, 2))
    with pytest.raises(ValueError, match=message):
        FHMM(n_chains=2, window=3, n_hidden=4).fit(X, max_iter=12, n_restarts=3, progress=False,
                                                   **kwargs)


def test_restart_progress_bars_name_their_run(two_chain_data, monkeypatch):
    import tqdm.auto
    _, X = two_chain_data
    labels = []

    class Recorded(tqdm.auto.tqdm):
        def __init__(self, *args, **kw):
            labels.append(kw.get("desc"))
            super().__init__(*args, **{**kw, "disable": True})
    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=0)
    m.fit(X, max_iter=12, n_restarts=2, init="kmeans", progress=True)
    best = int(np.argmax(m.restart_scores_)) + 1
    assert labels == ["svi run 1/2", "svi run 2/2", f"svi run {best}/2 continued"]
    labels.clear()
    m.fit(X, max_iter=12, init="kmeans", progress=True)
    assert labels == ["svi"]


def test_fill_batch_lays_out_what_the_sampler_hands_out():
    """The compiled batch layout (the fused step's and the Dask shards') against
    ``SubchainSampler.next_batch``, its Python reference, over several epochs of several
    sequences: the same rows, sequence bounds, offsets and start flags (before, only a
    test that needs dask checked it)."""
    from streamfhmm.kernels import svi as ks
    seed = 23
    print(f"seed={seed}")
    lengths = [9, 30, 2, 1, 25, 7]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    L, B = 4, 5
    fast = SubchainSampler(bounds, L, B, np.random.default_rng(seed))
    ref = SubchainSampler(bounds, L, B, np.random.default_rng(seed))
    n_max = fast.max_rows
    rows, rs, re = (np.empty(n_max, dtype=np.int64) for _ in range(3))
    offsets, first = np.empty(B + 1, dtype=np.int64), np.empty(B, dtype=bool)
    for _ in range(40):                            # 200 subchains: several epochs
        fast.ensure(B)
        n = ks.fill_batch(fast.q_start, fast.q_stop, fast.q_lo, fast.q_hi, fast.cursor, B,
                          rows, rs, re, offsets, first)
        fast.advance(B)
        batch = ref.next_batch()
        np.testing.assert_array_equal(rows[:n], batch.rows)
        np.testing.assert_array_equal(rs[:n], batch.row_start)
        np.testing.assert_array_equal(re[:n], batch.row_end)
        np.testing.assert_array_equal(offsets, batch.offsets)
        np.testing.assert_array_equal(first, batch.first_is_start)
        # each row lies in its sequence; a subchain not at its sequence's start carries
        # the row before it as context
        assert ((rs[:n] <= rows[:n]) & (rows[:n] < re[:n])).all()
    assert fast.epoch == ref.epoch >= 3


@pytest.mark.parametrize("log_every", ["10", -5, 2.5, 0, True])
def test_log_every_is_checked(correlated_data, log_every):
    """(-5 and 2.5 were taken as every 5 and 2.5 steps, "10" failed at the first log.)"""
    from streamfhmm.learn.svi import fit_svi
    from streamfhmm.network import RecognitionNet
    X = correlated_data
    p = init_params(X, 2, random_state=np.random.default_rng(0))
    net = RecognitionNet(2, 3, window=3, n_hidden=4).init(random_state=0)
    net.fit_scaler(X)
    with pytest.raises(ValueError, match="log_every must be"):
        fit_svi(X, np.array([0, len(X)]), p, net, max_iter=20, rng=np.random.default_rng(0),
                progress=False, log_every=log_every)


def test_expected_subchains_checks_its_arguments():
    from streamfhmm.learn.sampler import expected_subchains
    # an empty sequence is cut into no block; one of up to L positions into one
    np.testing.assert_array_equal(expected_subchains([0, 3, 5], 5), [0.0, 1.0, 1.0])
    for lengths, L, message in (([5, -1], 3, "lengths must be a 1-d sequence of non-negative integers"),
                                ([[5]], 3, "lengths must be a 1-d sequence"),
                                ([2.5], 3, "lengths must be a 1-d sequence"),
                                ([5], 0, "subchain_length must be"),
                                ([5], 2.5, "subchain_length must be")):
        with pytest.raises(ValueError, match=message):
            expected_subchains(lengths, L)


# ---- S11: a non-finite gradient entry anywhere, the last one included
def test_rmsprop_refuses_a_non_finite_entry_at_every_position():
    """NaN, +inf or -inf at any position, the last included: refused, x and sq as they
    were (the existing check put its bad value at one position only)."""
    from streamfhmm.kernels.svi import rmsprop_update
    seed = 5
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    n = 6
    for pos in range(n):
        for bad in (np.nan, np.inf, -np.inf):
            x, sq, g = rng.normal(size=n), rng.random(n), rng.normal(size=n)
            g[pos] = bad
            x0, sq0 = x.copy(), sq.copy()
            assert not rmsprop_update(x, g, sq, 0.9, 1e-8, 0.1, 2)
            np.testing.assert_array_equal(x, x0)
            np.testing.assert_array_equal(sq, sq0)


def test_fit_svi_refuses_values_a_fit_cannot_square(three_chain_setup):
    """As FHMM.fit: beyond ±1e150 is a ValueError naming the value, before any step (it
    was a FloatingPointError whenever the sampler first reached the row)."""
    X, params, net, seed = three_chain_setup
    Y = X.copy()
    Y[300, 0] = 1e200
    with pytest.raises(ValueError, match=r"X must hold values within ±1e\+150 to fit a model .* "
                                         r"found 1e\+200 at row 300, column 0"):
        _threaded_fit(Y, params, net, 1, 10, seed)


# -- sampler gaps a mutation run found (each test fails on its mutant) ------------------------
def test_sampler_batch_counts_positions_not_context_rows():
    print("seed=2")
    s = SubchainSampler(np.array([0, 20]), 4, 3, np.random.default_rng(2))
    saw_context = False
    for _ in range(5):
        b = s.next_batch()
        counted = sum(b.offsets[k + 1] - b.offsets[k] - (0 if b.first_is_start[k] else 1)
                      for k in range(len(b.first_is_start)))
        assert b.n_positions == counted
        saw_context |= not all(b.first_is_start)
    assert saw_context


def test_sampler_n_positions_spans_bounds_not_starting_at_0():
    s = SubchainSampler(np.array([3, 5, 10]), 2, 1, np.random.default_rng(0))
    assert s.n_positions == 7


def test_sampler_draws_the_next_epoch_only_when_this_one_is_used_up():
    """An early draw bumped ``epoch`` and took the caller's generator's numbers ahead."""
    print("seed=0")
    rng = np.random.default_rng(0)
    s = SubchainSampler(np.array([0, 6]), 6, 1, rng)   # one block per epoch
    s.next_batch()
    assert s.epoch == 1
    ref = np.random.default_rng(0)
    ref.permutation(1)                                  # the draws of exactly one epoch
    assert rng.random() == ref.random()


def test_sampler_carries_an_epoch_s_last_blocks_into_the_next_batch():
    print("seed=1")
    T, B = 7, 3                        # L = 1: 7 blocks per epoch, which B does not divide
    s = SubchainSampler(np.array([0, T]), 1, B, np.random.default_rng(1))
    counts = np.zeros(T, dtype=int)
    for _ in range(7):                 # 21 blocks = 3 epochs
        b = s.next_batch()
        for k in range(B):
            r = b.rows[b.offsets[k]:b.offsets[k + 1]]
            counts[r[0 if b.first_is_start[k] else 1:]] += 1
    np.testing.assert_array_equal(counts, 3)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def _svi_setup(seed=0, T=300):
    """A 2-chain model, T of its samples, their bounds and fresh centred networks."""
    p = FHMMParams.random(2, 2, random_state=seed)
    X, _ = p.sample(T, random_state=seed + 1)
    net = RecognitionNet(2, 2, window=3, n_hidden=4, share="chain", mode="centred")
    net = net.init(random_state=np.random.default_rng(seed))
    net.fit_scaler(X)
    return p, X, np.array([0, T]), net


def test_default_restart_steps_is_a_sixth():
    """``restart_steps`` defaults to a sixth of max_iter."""
    print("seed=none")
    assert check_restarts(2, None, 60, None) == (2, 10)
    assert check_restarts(3, None, None, None) == (3, 20_000 // 6)


def test_cosine_lr_clamps_above_one():
    """``cosine_lr`` clamps progress beyond 1 (a time budget overrun) to the final rate."""
    print("seed=none")
    assert cosine_lr(1.0, 0.01, 1.5) == pytest.approx(0.01)
    assert cosine_lr(1.0, 0.01, 2.0) == pytest.approx(0.01)


def test_running_average_weights():
    """The logged ELBO is a running average with weights 0.98 / 0.02."""
    print("seed=none")
    s = SVIState(packer=None, model_vec=None, net=None, opt=None)
    count_step(s, 1.0)
    assert s.running == 1.0 and s.iteration == 1
    count_step(s, 0.0)
    assert s.running == pytest.approx(0.98) and s.iteration == 2


def test_time_budget_drives_the_schedule():
    """Under a time budget the cosine schedule follows the clock (last lr = final lr)."""
    seed = 0
    print(f"seed={seed}")
    p, X, b, net = _svi_setup(seed)
    s = fit_svi(X, b, p, net, max_iter=10**8, time_budget=0.5, learning_rate=1e-3,
                final_lr_ratio=0.01, rng=np.random.default_rng(seed), progress=False)
    assert s.iteration < 10**8
    assert s.history[-1]["lr"] == pytest.approx(1e-5)


def test_callback_model_vec_is_a_snapshot():
    """The model vector handed to a callback is a snapshot, not a view of the live vector."""
    seed = 0
    print(f"seed={seed}")
    p, X, b, net = _svi_setup(seed)
    snaps = []
    fit_svi(X, b, p, net, max_iter=20, log_every=10, rng=np.random.default_rng(seed),
            progress=False, callback=lambda st: snaps.append((st.model_vec, st.model_vec.copy())))
    first_ref, first_copy = snaps[0]
    np.testing.assert_array_equal(first_ref, first_copy)
