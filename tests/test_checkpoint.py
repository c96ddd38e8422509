"""Checkpoint files: atomic writes, clear errors, and engine round trips (including a
process killed with SIGKILL while it writes checkpoints)."""
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

from pathlib import Path

import numpy as np
import pytest

import streamfhmm

from streamfhmm import FHMM
from streamfhmm.io.checkpoint import FORMAT_TAG, FORMAT_VERSION, load_checkpoint, save_checkpoint
from streamfhmm.model import FHMMParams
from streamfhmm.network import RecognitionNet
from streamfhmm.stream.engine import PosteriorBatch, StreamEngine


def _model(seed, M=3, D=3, window=5, n_hidden=6):
    print(f"model seed={seed}")
    p = FHMMParams.random(M, D, random_state=seed, noise=0.5, switch=(0.05, 0.3))
    return FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=window,
                            n_hidden=n_hidden, share_hidden="all")


def _with_net(model, X, seed, mode="centred"):
    net = RecognitionNet(model.n_chains, X.shape[1], window=model.window, n_hidden=model.n_hidden,
                         share="all", mode=mode).init(random_state=seed)
    net.weights = 0.6 * np.random.default_rng(seed).standard_normal(net.n_weights)
    return net.fit_scaler(X)


# ------------------------------------------------------------------ the file format
def test_round_trip_and_atomic_replace(tmp_path):
    path = tmp_path / "c.npz"
    a = {"x": np.arange(5.0), "s": np.array("text")}
    assert save_checkpoint(path, a, {"k": [1, 2]}) == str(path)
    meta, arrays = load_checkpoint(path)
    assert meta == {"k": [1, 2]}
    np.testing.assert_array_equal(arrays["x"], a["x"])
    assert str(arrays["s"]) == "text"
    save_checkpoint(tmp_path / "c", {"x": np.ones(2)}, {})  # .npz appended, replaced
    np.testing.assert_array_equal(load_checkpoint(path)[1]["x"], np.ones(2))
    assert sorted(os.listdir(tmp_path)) == ["c.npz"]  # no temporary file left


def test_clear_errors(tmp_path):
    path = tmp_path / "c.npz"
    save_checkpoint(path, {"x": np.arange(1000.0)}, {"a": 1})
    raw = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "trunc.npz")
    (tmp_path / "junk.npz").write_bytes(b"hello world" * 10)
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint.*not a zip archive") as info:
        load_checkpoint(tmp_path / "junk.npz")
    assert "pickle" not in str(info.value)     # numpy's advice to unpickle is not passed on
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint.*the file is empty"):
        load_checkpoint(tmp_path / "empty.npz")
    np.savez(tmp_path / "foreign.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="not a streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "foreign.npz")
    np.savez(tmp_path / "obj.npz", format=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "obj.npz")
    data = dict(np.load(path))
    data["version"] = np.array(FORMAT_VERSION + 1)
    np.savez(tmp_path / "newer.npz", **data)
    with pytest.raises(ValueError, match=f"format version {FORMAT_VERSION + 1}.*upgrade"):
        load_checkpoint(tmp_path / "newer.npz")
    with pytest.raises(ValueError, match="dtype object"):
        save_checkpoint(tmp_path / "bad.npz", {"o": np.array([None], dtype=object)}, {})
    # damaged version and description fields: ValueError too, not OverflowError / a list
    data["version"] = np.array(np.inf)
    np.savez(tmp_path / "infinite.npz", **data)
    with pytest.raises(ValueError, match="damaged streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "infinite.npz")
    data["version"], data["meta"] = np.array(FORMAT_VERSION), np.array("[1, 2]")
    np.savez(tmp_path / "listmeta.npz", **data)
    with pytest.raises(ValueError, match="damaged streamfhmm checkpoint.*not an object"):
        load_checkpoint(tmp_path / "listmeta.npz")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint"):
        StreamEngine.resume(tmp_path / "trunc.npz")
    with pytest.raises(ValueError, match="not a streamfhmm checkpoint"):
        StreamEngine.resume(tmp_path / "foreign.npz")
    # a checkpoint file with an engine's keys missing
    save_checkpoint(tmp_path / "hollow.npz", {"x": np.ones(1)}, {"config": {}})
    with pytest.raises(ValueError, match="damaged streamfhmm checkpoint"):
        StreamEngine.resume(tmp_path / "hollow.npz")


# ------------------------------------------------------------------ engine round trips
@pytest.mark.parametrize("posterior", ["recognition", "exact"])
@pytest.mark.parametrize("mode", ["smooth", "filter"])
def test_resume_continues_with_identical_outputs(tmp_path, posterior, mode):
    seed = 30
    model = _model(seed)
    X, _ = model.sample(600, random_state=seed + 1)
    X[np.random.default_rng(seed).random(X.shape) < 0.03] = np.nan
    net = (_with_net(model, X, seed, "centred" if mode == "smooth" else "causal")
           if posterior == "recognition" else None)
    kw = dict(mode=mode, learn=False, posterior=posterior, net=net)
    with StreamEngine(model, **kw) as ref:
        full = [p for x in X[:250] for p in ref.push(x)] + list(ref.push_many(X[250:])) + ref.flush()
    with StreamEngine(model, **kw) as eng:
        first = [p for x in X[:250] for p in eng.push(x)]
        path = eng.checkpoint(tmp_path / "ck")
    with StreamEngine.resume(path) as back:
        assert back.n_samples == 250 and back.mode == mode and back.posterior == posterior
        rest = list(back.push_many(X[250:])) + back.flush()
        m = back.metrics()
    got = first + rest
    assert [p.t for p in got] == [p.t for p in full] == list(range(600))
    np.testing.assert_array_equal(np.array([p.theta for p in got]), np.array([p.theta for p in full]))
    np.testing.assert_array_equal(np.array([p.flags for p in got]), np.array([p.flags for p in full]))
    assert m["samples"] == 600 and m["emitted"] == 600


def test_resume_with_paused_learner_restores_learner_state(tmp_path):
    seed = 31
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(4000, random_state=seed)
    with StreamEngine(model, mode="smooth", learn=True, warmup=400, warmup_steps=40,
                      snapshot_interval=5, random_state=seed) as eng:
        eng.push_many(X[:3000])
        t0 = time.perf_counter()
        while eng.metrics()["learner_steps"] < 60 and time.perf_counter() - t0 < 20:
            time.sleep(0.01)
        eng.learning = False
        time.sleep(0.05)
        path = eng.checkpoint(tmp_path / "ck.npz")
        lr = eng._learner
        x, sq, steps, res = lr.x.copy(), lr.sq.copy(), lr.steps, lr.reservoir.data[:lr.reservoir.size].copy()
        after = eng.push_many(X[3000:])
        snap_version = eng.version
    with StreamEngine.resume(path, learn=True) as back:
        assert not back.learning  # paused when checkpointed, paused when resumed
        lb = back._learner
        np.testing.assert_array_equal(lb.x, x)
        np.testing.assert_array_equal(lb.sq, sq)
        assert lb.steps == steps
        np.testing.assert_array_equal(lb.reservoir.data[:lb.reservoir.size], res)
        assert back.version == snap_version  # no snapshot was published after the pause
        again = back.push_many(X[3000:])
    np.testing.assert_array_equal(again.theta, after.theta)
    np.testing.assert_array_equal(again.t, after.t)


def test_resume_during_warmup(tmp_path):
    seed = 32
    model = FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed)
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.3)
    X, _ = p.sample(900, random_state=seed)
    with StreamEngine(model, mode="filter", learn=False, posterior="exact", warmup=500,
                      random_state=seed) as eng:
        assert len(eng.push_many(X[:300])) == 0
        path = eng.checkpoint(tmp_path / "w")
    with StreamEngine.resume(path, random_state=seed) as back:
        assert back.metrics()["phase"] == "warmup" and back.n_samples == 300
        b = back.push_many(X[300:])
    assert len(b) == 900 and b.t[0] == 0 and (b.flags[:500] & 2).all()
    assert np.isfinite(b.theta).all()


def test_resume_override_errors(tmp_path):
    model = _model(33)
    X, _ = model.sample(20, random_state=1)
    with StreamEngine(model, mode="filter", learn=False, posterior="exact") as eng:
        eng.push_many(X)
        path = eng.checkpoint(tmp_path / "ck")
    with pytest.raises(ValueError, match=r"cannot override \['mode'\]"):
        StreamEngine.resume(path, mode="smooth")


# ------------------------------------------------------------------ crash safety
_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from streamfhmm import FHMM
    from streamfhmm.model import FHMMParams
    from streamfhmm.network import RecognitionNet
    from streamfhmm.stream.engine import StreamEngine

    path = sys.argv[1]
    p = FHMMParams.random(3, 3, random_state=40, noise=0.5, switch=(0.05, 0.3))
    X, _ = p.sample(200_000, random_state=41)
    model = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=5,
                             n_hidden=6, share_hidden="all")
    net = RecognitionNet(3, 3, window=5, n_hidden=6, share="all").init(random_state=42)
    net.fit_scaler(X[:1000])
    model.net_ = net
    eng = StreamEngine(model, mode="smooth", learn=True, reservoir_size=3000,
                       checkpoint_path=path, checkpoint_every=500, snapshot_interval=5,
                       random_state=43)
    t = 0
    while True:
        for x in X[t:t + 100]:
            eng.push(x)
        t += 100
        print(eng.metrics()["checkpoints"], t, flush=True)
""")


@pytest.mark.slow
def test_sigkill_during_periodic_checkpoints_leaves_an_intact_checkpoint(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    path = tmp_path / "stream.npz"
    # the child imports the same package copy as this process (and shares its kernel cache)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(streamfhmm.__file__).resolve().parents[1])
    seen, err = 0, ""
    with subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as proc:
        # generous deadline: on a cold cache the child compiles the engine's kernels first
        deadline = time.perf_counter() + 600
        try:
            while time.perf_counter() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if not ready:
                    if proc.poll() is not None:
                        break
                    continue
                line = proc.stdout.readline()
                if not line:
                    break
                seen = int(line.split()[0])
                if seen >= 3:
                    # kill within the next checkpoint interval, after a seeded (fixed) delay
                    kill_seed = 44
                    delay = np.random.default_rng(kill_seed).uniform(0, 0.03)
                    print(f"kill seed={kill_seed} delay={delay:.4f} s")
                    time.sleep(delay)
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
    assert seen >= 3, err
    assert proc.returncode == -signal.SIGKILL
    # the file is a complete checkpoint from one of the periodic writes
    with StreamEngine.resume(path, learn=False) as eng:
        P = eng.n_samples
        assert P > 0 and P % 500 == 0
        p = FHMMParams.random(3, 3, random_state=40, noise=0.5, switch=(0.05, 0.3))
        X, _ = p.sample(200_000, random_state=41)
        # the ring holds the stream's last samples
        C = eng._ring.capacity
        np.testing.assert_array_equal(eng._ring.last(P - 1, C), X[P - C:P])
        # and the stream continues: the resumed posteriors are those of the batch path
        # with the resumed network
        net = eng.net
        out = eng.push_many(X[P:P + 300])
    h = net.half_window
    assert out.t[0] == P - h and len(out) == 300
    ref = net.forward(X[P - 50:P + 300])[0]
    np.testing.assert_allclose(out.theta, ref[50 - h:350 - h], rtol=0, atol=1e-12)
    leftovers = [f for f in os.listdir(tmp_path) if f.startswith(".stream.npz.tmp")]
    print(f"resumed at {P}; temporary files left by the kill: {leftovers}")
    assert isinstance(out, PosteriorBatch)


def test_close_writes_a_last_checkpoint_and_periodic_ones_count(tmp_path):
    model = _model(34)
    X, _ = model.sample(1000, random_state=2)
    path = tmp_path / "last.npz"
    eng = StreamEngine(model, mode="filter", learn=False, posterior="exact", checkpoint_path=path,
                       checkpoint_every=300)
    for x in X[:700]:
        eng.push(x)
    assert eng.metrics()["checkpoints"] == 2  # after samples 300 and 600
    with StreamEngine.resume(path, checkpoint_path=None, checkpoint_every=None) as mid:
        assert mid.n_samples == 600 and mid.metrics()["checkpoints"] == 2
    eng.push_many(X[700:])
    eng.close()
    with StreamEngine.resume(path, checkpoint_path=None, checkpoint_every=None) as back:
        assert back.n_samples == 1000 and back.metrics()["checkpoints"] == 4


# ------------------------------------------------------------------ regressions
def test_resume_with_an_explicit_learn_samples_already_passed(tmp_path):
    """resume(path, learn_samples=N) at a position past N switches learning off (it
    stayed on: the passed limit was dropped); the checkpoint's own passed limit is not
    applied again (test_engine.test_learn_samples_holds_the_model_fixed)."""
    model = _model(60, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(300, random_state=61)
    with StreamEngine(model, mode="filter", posterior="exact", learn=True,
                      learner_duty=1e-3, random_state=60) as eng:
        eng.push_many(X[:200])
        path = eng.checkpoint(tmp_path / "ck")
    with StreamEngine.resume(path, learn_samples=100) as back:
        assert not back.learning and back.n_samples == 200
        back.push_many(X[200:])
        assert not back.learning
    with StreamEngine.resume(path, learn_samples=250) as back:   # not passed yet
        assert back.learning
        back.push_many(X[200:260])
        assert not back.learning
    with StreamEngine.resume(path) as back:
        assert back.learning


@pytest.mark.parametrize("bit_generator", ["MT19937", "Philox", "SFC64"])
def test_checkpoints_with_any_bit_generator(tmp_path, bit_generator):
    """random_state may be any numpy Generator: its state (arrays for these) is
    written into the reservoir's description; checkpoint() raised TypeError and the
    periodic ones failed."""
    seed = 62
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(400, random_state=seed)
    rs = np.random.Generator(getattr(np.random, bit_generator)(seed))
    path = tmp_path / "ck.npz"
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, random_state=rs,
                      learner_duty=1e-3, checkpoint_path=path, checkpoint_every=100) as eng:
        eng.push_many(X[:50])
        eng.checkpoint()
        eng.push_many(X[50:])
    assert eng.metrics()["checkpoint_error"] is None
    with StreamEngine.resume(path) as back:
        assert back.n_samples == 400
        assert type(back._learner.reservoir.rng.bit_generator).__name__ == bit_generator


def test_checkpoint_count_in_a_file_written_by_the_learner_thread(tmp_path, monkeypatch):
    """A periodic checkpoint captured while the learner thread was still writing the
    previous one recorded the count as of its capture (the earlier write not yet
    counted): the engine said 2 written, the newest file 1. The count is now taken when
    the file is written. The first write is held until the second checkpoint has been
    captured."""
    import threading

    from streamfhmm.stream import engine as engine_mod

    real_save = engine_mod._save_newest
    entered, release = threading.Event(), threading.Event()
    calls = []

    def held_save(*args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            entered.set()
            assert release.wait(60)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "_save_newest", held_save)
    seed = 64
    print(f"seed={seed}")
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(300, random_state=seed)
    path = tmp_path / "ck.npz"
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, random_state=seed,
                      checkpoint_path=path, checkpoint_every=100) as eng:
        eng.push_many(X[:100])                 # the first falls due: the thread writes it
        assert entered.wait(60)
        eng.push_many(X[100:200])              # the second is captured meanwhile
        release.set()
        deadline = time.monotonic() + 60
        while eng.metrics()["checkpoints"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls == [eng._thread.name] * 2
        with StreamEngine.resume(path, checkpoint_path=None, checkpoint_every=None) as back:
            assert back.n_samples == 200
            assert back.metrics()["checkpoints"] == 2 == eng.metrics()["checkpoints"]
        monkeypatch.setattr(engine_mod, "_save_newest", real_save)


def test_exact_mode_learner_network_survives_a_resume_without_learning(tmp_path):
    """Exact posteriors with learning: the learner trains a network of its own, whose
    weights live in its state (lnet.* holds the network it started from). Resumed with
    learn=False the state was left, and a checkpoint of that engine resumed with
    learning again started from the untrained network, without the burn-in that protects
    the model from one. The trained weights are kept."""
    seed = 65
    print(f"seed={seed}")
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(3000, random_state=seed)
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, learner_duty=1.0,
                      net_burnin=50, random_state=seed) as eng:
        eng.push_many(X[:2000])
        deadline = time.monotonic() + 60
        while eng.learner_steps < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        a = eng.checkpoint(tmp_path / "a.npz")
        initial = eng._learner_net.weights.copy()
    _, arrays = load_checkpoint(a)
    nm = arrays["learner.x"].shape[0] - initial.shape[0]
    trained = arrays["learner.x"][nm:]
    assert not np.allclose(trained, initial)
    with StreamEngine.resume(a, learn=False) as off:
        off.push_many(X[2000:2010])
        b = off.checkpoint(tmp_path / "b.npz")
    with StreamEngine.resume(b, learn=True) as again:
        lr = again._learner
        with lr.lock:
            np.testing.assert_array_equal(lr.x[lr.nm:], trained)
    # a learner state of another layout is refused without learning too (it was copied,
    # its last values taken as the network's weights)
    meta, arrays = load_checkpoint(a)
    bad = _damaged(tmp_path, meta, arrays, array_changes=[("learner.x", arrays["learner.x"][1:])])
    with pytest.raises(ValueError, match=r"learner.x must hold \d+ finite numbers"):
        StreamEngine.resume(bad, learn=False)


def test_a_failing_checkpoint_is_recorded_and_does_not_fail_the_warmup(tmp_path, monkeypatch):
    """A periodic checkpoint that fails on the learner thread is recorded in
    checkpoint_error (it was swallowed); one that falls due in the warm-up's replay
    (written synchronously) no longer escapes from push, losing the posteriors and
    leaving the learner thread unstarted."""
    from streamfhmm.stream import learner as learner_mod

    def broken(self, before=None):
        raise TypeError("broken learner state")
    monkeypatch.setattr(learner_mod.Learner, "to_arrays", broken)
    seed = 63
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(400, random_state=seed)
    eng = StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), mode="filter", posterior="exact",
                       learn=True, warmup=100, warmup_steps=5, random_state=seed,
                       checkpoint_path=tmp_path / "ck", checkpoint_every=50)
    with eng:
        n = sum(len(eng.push(x)) for x in X[:150])
        assert n == 150 and eng._thread is not None and eng._thread.is_alive()
        assert "broken learner state" in eng.metrics()["checkpoint_error"]
        eng._ckpt_error = None
        eng.push_many(X[150:])     # due on the learner thread
        deadline = time.monotonic() + 60
        while eng.metrics()["checkpoint_error"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "broken learner state" in eng.metrics()["checkpoint_error"]
    assert eng.learner_error is None


def test_resume_refuses_a_non_finite_exact_filter_state(tmp_path):
    model = _model(64, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(100, random_state=65)
    with StreamEngine(model, mode="smooth", posterior="exact", learn=False) as eng:
        eng.push_many(X)
        path = eng.checkpoint(tmp_path / "ck.npz")
    meta, arrays = load_checkpoint(path)
    for name, value in (("exact.alpha", np.nan), ("exact.alpha", -1.0), ("exact.le", np.inf),
                        ("exact.logc", np.nan)):
        bad = dict(arrays)
        bad[name] = np.full_like(arrays[name], value)
        save_checkpoint(tmp_path / "bad.npz", bad, meta)
        with pytest.raises(ValueError, match=f"{name} holds non-finite or negative values"):
            StreamEngine.resume(tmp_path / "bad.npz")


def test_resume_refuses_arrays_of_the_wrong_shape(tmp_path):
    """A checkpoint whose arrays disagree with its n_features / n_chains / network: a
    clear error at resume (before, some resumed and then refused every sample, others ran
    on a ring of another width)."""
    model = _model(67, M=2, D=3, window=3, n_hidden=4)
    X, _ = model.sample(80, random_state=68)
    with StreamEngine(model, mode="smooth", learn=False, net=_with_net(model, X, 67)) as eng:
        eng.push_many(X)
        path = eng.checkpoint(tmp_path / "ck.npz")
    meta, arrays = load_checkpoint(path)
    n = arrays["snapshot.weights"].shape[0]
    cases = [
        ("snapshot.weights", arrays["snapshot.weights"][:-7], r"snapshot.weights has shape"),
        ("snapshot.weights", np.r_[arrays["snapshot.weights"], 0.0], rf"expected \({n},\)"),
        ("ring.buf", np.c_[arrays["ring.buf"], arrays["ring.buf"][:, :1]],
         r"ring.buf has shape \(\d+, 4\), expected \(capacity, 3\)"),
        ("state", arrays["state"][:5], "state holds 5 counters"),
        ("state", np.r_[arrays["state"][:2], [10**6], arrays["state"][3:]],
         "state counters out of range"),
    ]
    for name, value, message in cases:
        bad = dict(arrays)
        bad[name] = value
        save_checkpoint(tmp_path / "bad.npz", bad, meta)
        with pytest.raises(ValueError, match=message):
            StreamEngine.resume(tmp_path / "bad.npz")
    wide = dict(meta, n_features=4)
    save_checkpoint(tmp_path / "bad.npz", arrays, wide)
    with pytest.raises(ValueError, match="have 2 chains and 3 features, the engine 2 and 4"):
        StreamEngine.resume(tmp_path / "bad.npz")


def test_resume_turns_any_damage_into_a_value_error(tmp_path):
    """Fields of another type or an infinite counter raised AttributeError or
    OverflowError out of resume (and a service printed a traceback instead of its
    CheckpointError); n_features null beside parameters resumed an engine whose first
    push failed."""
    model = _model(69, M=2, D=3, window=3, n_hidden=4)
    X, _ = model.sample(80, random_state=70)
    with StreamEngine(model, mode="smooth", learn=True, learner_duty=0.2,
                      net=_with_net(model, X, 69), random_state=69) as eng:
        eng.push_many(X)
        path = eng.checkpoint(tmp_path / "ck.npz")
    meta, arrays = load_checkpoint(path)
    damaged = "bad.npz is a damaged streamfhmm checkpoint: "
    cases = [(dict(meta, shared_net=None), arrays, damaged + "AttributeError"),
             (dict(meta, n_features=None), arrays, "n_features is null, but the checkpoint is in "
                                                   "phase 'running' with parameters"),
             (meta, dict(arrays, loglik=np.full_like(arrays["loglik"], np.inf)),
              damaged + "OverflowError")]
    for bad_meta, bad_arrays, message in cases:
        save_checkpoint(tmp_path / "bad.npz", bad_arrays, bad_meta)
        with pytest.raises(ValueError, match=message):
            StreamEngine.resume(tmp_path / "bad.npz")
    StreamEngine.resume(path).close()


def test_a_periodic_checkpoint_is_a_consistent_cut(tmp_path):
    """The engine state of a periodic checkpoint is captured at t, the learner's later
    (on its thread): segments fed meanwhile went into the checkpoint's reservoir, and a
    stream resumed from it stored them twice. The learner holds back (fence) those
    ending at or after t until the job captured its state."""
    seed = 66
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(2000, random_state=seed)
    path = tmp_path / "ck.npz"
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, learner_duty=1.0,
                      reservoir_size=5000, checkpoint_path=path, checkpoint_every=1000,
                      random_state=seed) as eng:
        eng.push_many(X[:900])
        with eng._learner.lock:        # the learner thread cannot take the job yet
            for x in X[900:1500]:      # the checkpoint falls due at 1000
                eng.push(x)
        deadline = time.monotonic() + 60
        while eng.metrics()["checkpoints"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.metrics()["checkpoints"] == 1
        meta, arrays = load_checkpoint(path)
        t = int(arrays["state"][0])
        assert t == 1000
        ends = arrays["learner.reservoir.end"]
        assert ends.max() < t and ends.max() >= t - eng._L
        # the held-back segments reach the reservoir afterwards
        deadline = time.monotonic() + 60
        while eng._learner.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        with eng._learner.lock:
            assert eng._learner.reservoir.end[:eng._learner.reservoir.size].max() >= 1400
    with StreamEngine.resume(path, learn=True, checkpoint_path=None, checkpoint_every=None) as b:
        b.learning = False
        b.push_many(X[t:1500])
        r = b._learner
        with r.lock:
            r.drain()
        _, counts = np.unique(r.reservoir.end[:r.reservoir.size], return_counts=True)
        assert (counts == 1).all()


def _damaged(tmp_path, meta, arrays, meta_changes=(), array_changes=()):
    meta = dict(meta, config=dict(meta["config"]))
    arrays = dict(arrays)
    for key, value in meta_changes:
        if key.startswith("config."):
            meta["config"][key[7:]] = value
        else:
            meta[key] = value
    for key, value in array_changes:
        arrays[key] = value
    return save_checkpoint(tmp_path / "bad.npz", arrays, meta)


def test_damaged_files_are_refused_by_name_without_a_large_allocation(tmp_path):
    """Three ways a damaged file escaped the rule "a ValueError naming the file": JSON
    nested 100,000 deep raised RecursionError (checkpoint meta, model hyper-parameters);
    a compressed member was inflated before any check (534 kB read as 512 MB); the
    engine's own checks of a checkpoint said what was wrong but not in which file."""
    seed = 73
    print(f"seed={seed}")
    model = _model(seed, M=2, D=2, window=3, n_hidden=4)
    X, _ = model.sample(100, random_state=seed)
    with StreamEngine(model, mode="smooth", learn=False, posterior="exact") as eng:
        eng.push_many(X)
        meta, arrays = load_checkpoint(eng.checkpoint(tmp_path / "ok.npz"))
    model.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as f:
        model_arrays = dict(f)
    deep = np.array("[" * 100_000 + "]" * 100_000)
    cases = []
    bad = dict(arrays, format=np.array(FORMAT_TAG), version=np.array(FORMAT_VERSION), meta=deep)
    np.savez(tmp_path / "deep.npz", **bad)
    cases.append((tmp_path / "deep.npz", StreamEngine.resume, "damaged streamfhmm checkpoint: maximum recursion"))
    np.savez(tmp_path / "deep_model.npz", **dict(model_arrays, hyper=deep))
    cases.append((tmp_path / "deep_model.npz", FHMM.load, "damaged streamfhmm model file: maximum recursion"))
    good = dict(arrays, format=np.array(FORMAT_TAG), version=np.array(FORMAT_VERSION),
                meta=np.array(json.dumps(meta)))
    np.savez_compressed(tmp_path / "zipped.npz", **good)
    cases.append((tmp_path / "zipped.npz", StreamEngine.resume, "is compressed; streamfhmm writes its files "
                                                                "uncompressed"))
    np.savez_compressed(tmp_path / "zipped_model.npz", **model_arrays)
    cases.append((tmp_path / "zipped_model.npz", FHMM.load, "is compressed"))
    np.savez(tmp_path / "mode.npz", **dict(good, meta=np.array(json.dumps(
        dict(meta, config=dict(meta["config"], mode="bogus"))))))
    cases.append((tmp_path / "mode.npz", StreamEngine.resume, "mode must be one of"))
    for path, load, message in cases:
        with pytest.raises(ValueError) as info:
            load(path)
        assert str(path) in str(info.value) and message in str(info.value), str(info.value)[:300]
    np.savez(tmp_path / "same.npz", **good)       # the same, uncompressed: resumes
    with StreamEngine.resume(tmp_path / "same.npz") as back:
        assert back.n_samples == 100


def test_resume_refuses_a_checkpoint_that_contradicts_its_configuration(tmp_path):
    """Sizes, mode, posterior, window, phase and networks of a checkpoint must agree with
    its configuration. Before: a segment length S beyond the ring made the block kernel
    read outside the ring and a centred network ran in filter mode (both resumed and gave
    other posteriors than the checkpointed engine, silently), a recognition configuration
    without a network failed at every push with AttributeError, NaN snapshot weights gave
    NaN posteriors, an exact configuration with 40 chains asked for 24 TiB."""
    model = _model(71, M=2, D=3, window=3, n_hidden=4)
    X, _ = model.sample(150, random_state=72)
    with StreamEngine(model, mode="smooth", learn=False, net=_with_net(model, X, 71)) as eng:
        eng.push_many(X[:80])
        rec = load_checkpoint(eng.checkpoint(tmp_path / "rec.npz"))
    with StreamEngine(model, mode="smooth", learn=False, posterior="exact") as eng:
        eng.push_many(X[:80])
        ex = load_checkpoint(eng.checkpoint(tmp_path / "ex.npz"))
    S, C, D = rec[0]["S"], rec[0]["C"], 3
    ring = rec[1]["ring.buf"]
    cases = [
        (rec, [("S", 1000)], [], r"\(L, S, C\) = \(\d+, 1000, \d+\) do not match"),
        (rec, [("C", 4)], [("ring.buf", ring[:8])], r"\(L, S, C\) = \(\d+, \d+, 4\) do not match"),
        (rec, [("config.mode", "filter")], [], "mode='filter' needs a 'causal' recognition network"),
        (rec, [("window", 7)], [], "window is 7, its network's 3"),
        (rec, [("config.posterior", "exact")], [], "exact-posterior checkpoint has no inference"),
        (rec, [("phase", "later")], [], "phase must be 'warmup' or 'running'"),
        (rec, [("config.mode", "both")], [], "mode must be one of"),
        (rec, [], [("snapshot.weights", np.full_like(rec[1]["snapshot.weights"], np.nan))],
         "snapshot.weights must be finite"),
        (rec, [], [("ring.buf", np.where(np.arange(2 * C)[:, None] == 3, np.inf, ring))],
         "ring.buf must hold real numbers without infinities"),
        (rec, [], [("ring.buf", ring + 1j)], "ring.buf must hold real numbers"),
        (ex, [("config.posterior", "recognition")], [], "has no recognition network"),
        (ex, [("config.n_chains", 40)], [], "must have 1 to 20 chains, its configuration says 40"),
        (ex, [("shared_net", True), ("config.learn", True)], [],
         "shares the inference network, and it has none"),
        (rec, [("config.learn", "no")], [], "learn must be True or False, got 'no'"),
        # (a warm-up's end after the position flagged every later posterior and kept the
        # serving lane off for good)
        (rec, [("warm_end", 81)], [], "warm_end 81 lies after the stream position 80"),
        (rec, [("warm_end", -1)], [], "warm_end must be a stream position"),
        (rec, [("feeding", "yes")], [], "feeding must be true or false, got 'yes'"),
    ]
    assert S < 1000 and (ring.shape == (2 * C, D))
    for (meta, arrays), meta_changes, array_changes, message in cases:
        path = _damaged(tmp_path, meta, arrays, meta_changes, array_changes)
        with pytest.raises(ValueError, match=message):
            StreamEngine.resume(path)
    # the intact checkpoints still resume and continue as the engine would have
    with StreamEngine(model, mode="smooth", learn=False, net=_with_net(model, X, 71)) as eng:
        eng.push_many(X[:80])
        expected = eng.push_many(X[80:]).theta
    with StreamEngine.resume(tmp_path / "rec.npz") as again:
        np.testing.assert_allclose(again.push_many(X[80:]).theta, expected, atol=1e-12)


def test_a_late_periodic_checkpoint_does_not_replace_a_newer_explicit_one(tmp_path, monkeypatch):
    """The learner thread writes a periodic checkpoint after capturing it; an explicit
    checkpoint() of a later position to the same file that finished first was then
    replaced by the older one (resume went back to sample 100 of 150). Here the learner
    thread's write is held until the explicit checkpoint has returned."""
    import threading
    import streamfhmm.stream.engine as engine_module
    real = engine_module._save_newest
    explicit_done = threading.Event()
    order = []

    def held(guard, path, position, arrays, meta):
        if threading.current_thread().name == "streamfhmm-learner":
            assert explicit_done.wait(30)
        out = real(guard, path, position, arrays, meta)
        order.append((threading.current_thread().name, position, out is not None))
        return out
    monkeypatch.setattr(engine_module, "_save_newest", held)
    seed = 71
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.3)
    model = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3, n_hidden=4)
    X, _ = p.sample(150, random_state=seed)
    path = str(tmp_path / "ck.npz")
    eng = StreamEngine(model, mode="filter", posterior="exact", learn=True, learner_duty=1.0,
                       checkpoint_path=path, checkpoint_every=100, random_state=seed)
    try:
        for x in X:            # a periodic checkpoint falls due at 100, on the learner thread
            eng.push(x)
        deadline = time.monotonic() + 30
        while eng._learner.fence is not None and time.monotonic() < deadline:
            time.sleep(0.001)  # the thread has taken the job (its write now waits)
        assert eng.checkpoint(path) == path
        explicit_done.set()
        deadline = time.monotonic() + 30
        while len(order) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert order == [("MainThread", 150, True), ("streamfhmm-learner", 100, False)], order
        assert int(load_checkpoint(path)[1]["state"][0]) == 150
        with StreamEngine.resume(path, checkpoint_path=None, checkpoint_every=None, learn=False) as back:
            assert back.n_samples == 150
    finally:
        explicit_done.set()
        eng._ckpt_path = None
        eng.close()


@pytest.mark.parametrize("value", [np.inf, 1e200])
def test_resume_refuses_warmup_samples_push_would_refuse(tmp_path, value):
    """A warm-up row holding inf or 1e200 resumed, then every block that would end the
    warm-up was refused with an error blaming the caller's clean data."""
    seed = 72
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.3)
    X, _ = p.sample(300, random_state=seed)
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4, random_state=seed), mode="filter",
                      learn=False, posterior="exact", warmup=200, random_state=seed) as eng:
        eng.push_many(X[:100])
        path = eng.checkpoint(tmp_path / "w")
    meta, arrays = load_checkpoint(path)
    rows = arrays["warmup.rows"].copy()
    rows[10, 0] = value
    save_checkpoint(tmp_path / "bad.npz", dict(arrays, **{"warmup.rows": rows}), meta)
    with pytest.raises(ValueError, match=r"warmup.rows must hold values within ±1e\+150 .* found .* at "
                                         r"row 10, column 0"):
        StreamEngine.resume(tmp_path / "bad.npz")


def test_a_seeded_engine_resumed_mid_warmup_continues_identically(tmp_path):
    """The engine's generator (the warm-up's start and networks draw from it) is in the
    checkpoint: resumed without random_state, a seeded engine ends its warm-up as the
    uninterrupted one (a fresh unseeded generator gave another start: θ off by 6e-4)."""
    seed = 73
    print(f"seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.3)
    X, _ = p.sample(400, random_state=seed)
    kw = dict(mode="filter", learn=False, posterior="exact", warmup=200, random_state=5)

    def model():
        return FHMM(n_chains=2, window=3, n_hidden=4, random_state=7)
    with StreamEngine(model(), **kw) as ref:
        ref.push_many(X[:50])
        ref._rng.random(3)       # (draws before the cut: the saved state is not the seed's)
        ref.push_many(X[50:100])
        path = ref.checkpoint(tmp_path / "w")
        full = ref.push_many(X[100:])
    for _ in range(2):
        with StreamEngine.resume(path) as back:
            b = back.push_many(X[100:])
        np.testing.assert_array_equal(b.theta, full.theta)


def test_checkpoints_to_other_files_are_not_tracked(tmp_path):
    """Only the engine's own checkpoint_path, the file a late periodic write can target,
    has its newest position kept: every other path written (a river adapter pickles
    through a new temporary file each time) added an entry for good."""
    p = FHMMParams.random(2, 2, random_state=74, noise=0.3)
    model = FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3, n_hidden=4)
    X, _ = p.sample(30, random_state=74)
    own = tmp_path / "own"
    with StreamEngine(model, mode="filter", posterior="exact", learn=False,
                      checkpoint_path=own) as eng:
        eng.push_many(X)
        for k in range(20):
            eng.checkpoint(tmp_path / f"copy{k}")
        assert eng._ckpt_guard[1] == [-1]     # (nothing kept for the other files)
        eng.checkpoint(own)
        assert eng._ckpt_guard[1] == [30]


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------
def test_load_finds_the_npz_of_the_name_it_was_saved_as(tmp_path):
    written = save_checkpoint(tmp_path / "ck", {"a": np.arange(3)}, {"k": 1})
    assert written.endswith("ck.npz")
    meta, arrays = load_checkpoint(tmp_path / "ck")
    assert meta == {"k": 1} and sorted(arrays) == ["a"]     # (the format tag is not an array)
    np.testing.assert_array_equal(arrays["a"], np.arange(3))
    with np.load(written, allow_pickle=False) as f:
        assert int(f["version"]) == FORMAT_VERSION


def test_a_damaged_file_that_starts_as_a_zip_is_not_called_no_zip(tmp_path):
    p = tmp_path / "ck.npz"
    p.write_bytes(b"PK\x05\x06" + b"\x00" * 6)          # an empty archive's end record, cut
    with pytest.raises(ValueError) as e:
        load_checkpoint(p)
    assert "not a zip archive" not in str(e.value)


@pytest.mark.parametrize("bad", [123, None])
def test_a_path_that_is_no_file_name_is_a_value_error(bad):
    with pytest.raises(ValueError, match="must be a file name"):
        save_checkpoint(bad, {"a": np.arange(3)}, {})


def test_save_refuses_a_directory_and_names_a_missing_one(tmp_path):
    with pytest.raises(ValueError, match="must name a file"):   # (a trailing separator)
        save_checkpoint(str(tmp_path / "missing") + os.sep, {"a": np.arange(3)}, {})
    (tmp_path / "ck.npz").mkdir()
    with pytest.raises(ValueError, match="which is a directory"):
        save_checkpoint(tmp_path / "ck", {"a": np.arange(3)}, {})
    with pytest.raises(FileNotFoundError, match="its directory .* does not exist"):
        save_checkpoint(tmp_path / "nope" / "ck.npz", {"a": np.arange(3)}, {})


def test_write_atomically_fsyncs_the_file_and_cleans_up_a_failed_write(tmp_path, monkeypatch):
    import stat
    from streamfhmm.io.checkpoint import write_atomically
    kinds = []
    real = os.fsync

    def spy(fd):
        kinds.append("file" if stat.S_ISREG(os.fstat(fd).st_mode) else "other")
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_atomically(str(tmp_path / "f.bin"), lambda fh: fh.write(b"x"))
    assert "file" in kinds        # (durability: the data itself, not only the directory entry)
    target = tmp_path / "f.txt"
    target.write_text("old")

    def boom(fh):
        fh.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomically(str(target), boom)
    assert sorted(os.listdir(tmp_path)) == ["f.bin", "f.txt"] and target.read_text() == "old"



# -- write_atomically: permissions and long names --------------------------------------
@pytest.fixture
def umask022():
    """The process umask set to 022 (the usual one) for the test, then restored."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("perms", [0o600, 0o640, 0o664, 0o400], ids=oct)
def test_write_atomically_keeps_the_permissions_of_the_file_it_replaces(tmp_path, umask022, perms):
    """Replacing a file gave the new one 0666 less the umask: a 0600 model or posteriors
    file became world-readable. The temporary file has the bits before anything is
    written to it."""
    from streamfhmm.io.checkpoint import write_atomically
    target = tmp_path / "private.csv"
    target.write_text("old")
    os.chmod(target, perms)
    seen = []

    def write(fh):
        seen.extend(os.stat(os.path.join(tmp_path, n)).st_mode & 0o7777
                    for n in os.listdir(tmp_path) if n != "private.csv")
        fh.write("new")

    write_atomically(str(target), write, mode="w")
    assert target.read_text() == "new"
    assert oct(os.stat(target).st_mode & 0o7777) == oct(perms)
    assert len(seen) == 1 and seen[0] & ~perms == 0      # (never wider, even while written)
    assert sorted(os.listdir(tmp_path)) == ["private.csv"]
    # FHMM.save goes through it too
    model = tmp_path / "m.npz"
    save_checkpoint(model, {"a": np.arange(3)}, {})
    os.chmod(model, perms | 0o200)
    save_checkpoint(model, {"a": np.arange(4)}, {})
    assert oct(os.stat(model).st_mode & 0o7777) == oct(perms | 0o200)


ACL_XATTR = "system.posix_acl_access"


def _posix_acl(entries) -> bytes:
    """A system.posix_acl_access value: version 2, then (tag, permissions, id) entries."""
    import struct
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


@pytest.mark.parametrize("copies", [True, False], ids=["acl copied", "acl refused"])
def test_write_atomically_keeps_a_posix_acl(tmp_path, umask022, monkeypatch, copies):
    """On a file with an access ACL the group bits are the ACL's mask, not the owning
    group's rights: copied onto a new file without the ACL, they gave the owning group
    (group::---) read and write access. The ACL is copied; where it cannot be, the
    group bits are dropped."""
    from streamfhmm.io import checkpoint as ck
    anyone = 0xFFFFFFFF
    acl = _posix_acl([(0x01, 6, anyone), (0x02, 6, 4321), (0x04, 0, anyone), (0x10, 6, anyone),
                      (0x20, 0, anyone)])   # user::rw- user:4321:rw- group::--- mask::rw- other::---
    target = tmp_path / "model.npz"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    try:
        os.setxattr(target, ACL_XATTR, acl)
    except (AttributeError, OSError) as exc:
        pytest.skip(f"no POSIX ACLs here: {exc}")
    assert os.stat(target).st_mode & 0o070 == 0o060   # (the mask)
    if not copies:
        def refuse(*args, **kwargs):
            raise OSError(95, "Operation not supported")
        monkeypatch.setattr(ck.os, "setxattr", refuse)
    ck.write_atomically(str(target), lambda fh: fh.write(b"new"))
    assert target.read_bytes() == b"new"
    if copies:
        assert os.getxattr(target, ACL_XATTR) == acl
        assert os.stat(target).st_mode & 0o777 == 0o660
    else:
        try:
            has_acl = bool(os.getxattr(target, ACL_XATTR))
        except OSError:
            has_acl = False
        assert not has_acl and os.stat(target).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_write_atomically_creates_a_new_file_as_open_would(tmp_path, umask):
    from streamfhmm.io.checkpoint import write_atomically
    old = os.umask(umask)
    try:
        write_atomically(str(tmp_path / "new.bin"), lambda fh: fh.write(b"x"))
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "new.bin").st_mode & 0o777) == oct(0o666 & ~umask)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (chown)")
def test_write_atomically_keeps_owner_and_group_or_drops_the_group_bits(tmp_path, umask022, monkeypatch):
    """Run as root, a rewritten file kept neither its owner nor its group; where the
    group cannot be kept, the new group must not get the old one's access."""
    from streamfhmm.io.checkpoint import write_atomically
    target = tmp_path / "shared.bin"
    target.write_bytes(b"old")
    os.chown(target, 4243, 4242)
    os.chmod(target, 0o640)
    write_atomically(str(target), lambda fh: fh.write(b"new"))
    st = os.stat(target)
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (4243, 4242, oct(0o640))

    def refused(fd, uid, gid):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "fchown", refused)
    write_atomically(str(target), lambda fh: fh.write(b"newer"))
    st = os.stat(target)
    assert target.read_bytes() == b"newer" and oct(st.st_mode & 0o7777) == oct(0o600)
    assert sorted(os.listdir(tmp_path)) == ["shared.bin"]


@pytest.mark.parametrize("name", ["y" * 246 + ".npz", "\u00e9" * 125 + ".csv", "z" * 255])
def test_write_atomically_writes_a_name_as_long_as_the_file_system_takes(tmp_path, name):
    """The temporary file's name was the target's plus about 30 characters: a valid
    name of 230-255 bytes failed with "File name too long" (after a whole fit)."""
    from streamfhmm.io.checkpoint import write_atomically
    print(f"name of {len(os.fsencode(name))} bytes")
    target = tmp_path / name
    during = []

    def write(fh):
        during.extend(os.listdir(tmp_path))
        fh.write(b"payload")

    write_atomically(str(target), write)
    assert target.read_bytes() == b"payload"
    assert sorted(os.listdir(tmp_path)) == [name]
    assert len(during) == 1 and during[0].startswith(".") and len(os.fsencode(during[0])) <= 255
    save_checkpoint(tmp_path / ("c" * 251), {"a": np.arange(3)}, {"k": 1})   # (+ ".npz": 255)
    meta, arrays = load_checkpoint(tmp_path / ("c" * 251 + ".npz"))
    assert meta == {"k": 1} and arrays["a"].tolist() == [0, 1, 2]


def test_write_atomically_refuses_a_name_too_long_before_writing(tmp_path):
    import errno
    from streamfhmm.io.checkpoint import write_atomically
    called = []
    with pytest.raises(OSError) as e:
        write_atomically(str(tmp_path / ("n" * 256)), called.append)
    assert e.value.errno == errno.ENAMETOOLONG and not called and os.listdir(tmp_path) == []


def test_write_atomically_temporary_names_and_no_shared_temporary(tmp_path, monkeypatch):
    """A short name keeps the ``.NAME.tmp-<pid>-<n>`` pattern (the service removes a
    crash's leftovers by it); a file already there under the next name (another
    writer's) is neither truncated nor taken over."""
    import itertools
    import re
    import streamfhmm.io.checkpoint as ck
    monkeypatch.setattr(ck, "_TMP_COUNTER", itertools.count(7))
    other = tmp_path / f".stream-73.3.npz.tmp-{os.getpid()}-7"
    other.write_bytes(b"another writer's")
    during = []

    def write(fh):
        during.extend(n for n in os.listdir(tmp_path) if n != other.name)
        fh.write(b"mine")

    ck.write_atomically(str(tmp_path / "stream-73.3.npz"), write)
    assert len(during) == 1 and re.fullmatch(r"\.stream-73\.3\.npz\.tmp-\d+-\d+", during[0]), during
    assert other.read_bytes() == b"another writer's"
    assert (tmp_path / "stream-73.3.npz").read_bytes() == b"mine"
    assert sorted(os.listdir(tmp_path)) == sorted([other.name, "stream-73.3.npz"])

# -- resume: overrides, paths and states a review found taken (each test failed before) -----
def _exact_checkpoint(tmp_path, mode="smooth", n=100, learn=False, seed=70, name="ck", **kw):
    print(f"seed={seed}")
    model = _model(seed, M=2, D=3, window=3, n_hidden=4)
    X, _ = model.sample(n + 200, random_state=seed + 1)
    with StreamEngine(model, mode=mode, posterior="exact", learn=learn, **kw) as eng:
        eng.push_many(X[:n])
        path = eng.checkpoint(tmp_path / name)
    return path, X


def test_resume_stores_numpy_scalar_overrides_as_python_numbers(tmp_path):
    """Numpy-scalar overrides were stored as they were: the next checkpoint (explicit or
    periodic) failed with "Object of type int64 is not JSON serializable"."""
    path, X = _exact_checkpoint(tmp_path)
    overrides = dict(checkpoint_every=np.int64(50), checkpoint_path=tmp_path / "periodic",
                     learning_rate=np.float32(0.01), latency_window=np.int64(100),
                     snapshot_interval=np.int32(5), checkpoint_seconds=np.float64(1e6))
    with StreamEngine.resume(path, **overrides) as eng:
        eng.push_many(X[100:220])
        again = eng.checkpoint(tmp_path / "again")
        assert eng.metrics()["checkpoint_error"] is None
        assert eng.metrics()["checkpoints"] >= 2     # the explicit one, and periodic ones (merged
                                                     # when the learner thread writes them late)
        for key in overrides:
            if key != "checkpoint_path":
                assert type(eng._cfg[key]) is type(overrides[key].item()), key
    assert eng.metrics()["checkpoint_error"] is None   # (the last one, at close)
    meta, _ = load_checkpoint(again)
    assert meta["config"]["checkpoint_every"] == 50 and meta["config"]["latency_window"] == 100
    StreamEngine.resume(again).close()


def test_resume_takes_a_bytes_path_and_refuses_a_non_path(tmp_path):
    """resume(b"ck") raised TypeError (str + bytes), resume(5) / resume(None) TypeError
    from os.fspath: bytes now work as in checkpoint(), a non-path is a ValueError."""
    path, X = _exact_checkpoint(tmp_path)
    stem = os.fsencode(str(path)[:-len(".npz")])
    for p in (stem, os.fsencode(str(path))):
        with StreamEngine.resume(p) as eng:
            assert eng.n_samples == 100
    for bad in (5, None, 2.5):
        with pytest.raises(ValueError, match="path must be a file name"):
            StreamEngine.resume(bad)
        with pytest.raises(ValueError, match="path must be a file name"):
            load_checkpoint(bad)


def test_resume_refuses_learn_samples_without_learning(tmp_path):
    """The constructor refuses learn_samples with learn=False; resume took it, as an
    override with learn=False or on a checkpoint without a learner."""
    quiet, _ = _exact_checkpoint(tmp_path, name="quiet")
    with pytest.raises(ValueError, match="learn_samples needs learn=True"):
        StreamEngine.resume(quiet, learn_samples=10)
    with pytest.raises(ValueError, match="learn_samples needs learn=True"):
        StreamEngine.resume(quiet, learn=False, learn_samples=np.int64(10))
    learning, _ = _exact_checkpoint(tmp_path, learn=True, learn_samples=1000, learner_duty=0.1,
                                    name="learning")
    with pytest.raises(ValueError, match="learn_samples needs learn=True"):
        StreamEngine.resume(learning, learn=False, learn_samples=500)
    # still taken: learning switched off, the checkpoint's own limit then inert
    with StreamEngine.resume(learning, learn=False) as eng:
        assert not eng.learning
    with StreamEngine.resume(quiet, learn=True, learn_samples=500) as eng:
        assert eng.learning


@pytest.mark.parametrize("mode", ["filter", "smooth"])
@pytest.mark.parametrize("damage", ["zeros", "half", "double"])
def test_resume_refuses_exact_messages_that_are_no_probability_vectors(tmp_path, mode, damage):
    """exact.alpha all zeros (or not summing to 1) passed the finite / non-negative check,
    and every later posterior was NaN."""
    path, X = _exact_checkpoint(tmp_path, mode=mode)
    meta, arrays = load_checkpoint(path)
    alpha = arrays["exact.alpha"]
    np.testing.assert_allclose(alpha.sum(axis=1), 1.0, atol=1e-12)   # what the engine writes
    if damage == "zeros":
        bad = np.zeros_like(alpha)
    else:
        bad = alpha.copy()
        bad[-1] *= {"half": 0.5, "double": 2.0}[damage]      # one slot only
    p = _damaged(tmp_path, meta, arrays, array_changes=[("exact.alpha", bad)])
    with pytest.raises(ValueError, match="exact.alpha must hold probability vectors"):
        StreamEngine.resume(p)


def test_resume_reads_only_the_exact_messages_of_the_open_sequence(tmp_path):
    """Slots the filter has not written (a sequence shorter than the lag, or closed by
    flush) are zeros in a valid checkpoint: still taken, and the posteriors continue as
    the uninterrupted engine's."""
    model = _model(72, M=2, D=3, window=5, n_hidden=4)
    X, _ = model.sample(60, random_state=73)
    for n, flush in ((1, False), (2, False), (30, True)):
        with StreamEngine(model, posterior="exact", learn=False) as ref:
            ref.push_many(X[:n])
            if flush:
                ref.flush()
            p = ref.checkpoint(tmp_path / f"ck{n}")
            want = ref.push_many(X[n:])
        meta, arrays = load_checkpoint(p)
        if not flush:
            assert (arrays["exact.alpha"].sum(axis=1) == 0).any()   # an unwritten slot
        with StreamEngine.resume(p) as eng:
            got = eng.push_many(X[n:])
        np.testing.assert_array_equal(got.theta, want.theta)
        np.testing.assert_array_equal(got.t, want.t)


@pytest.mark.parametrize("key, value, message", [
    ("n_hidden", -1, "n_hidden must be an integer >= 1"),
    ("n_hidden", 2.5, "n_hidden must be an integer >= 1"),
    ("share_hidden", "x", "share_hidden must be one of"),
    ("covariance_type", "bogus", "covariance_type must be one of"),
    ("n_chains", 1.5, "n_chains must be an integer >= 1"),
    ("n_chains", True, "n_chains must be an integer >= 1"),
    ("n_chains", 0, "n_chains must be an integer >= 1"),
])
def test_resume_checks_a_warmup_checkpoints_model_hyperparameters(tmp_path, key, value, message):
    """A warm-up checkpoint's model hyperparameters were not checked: n_hidden=-1 or
    covariance_type='bogus' were taken and the warm-up could then never end (every block
    that ended it was refused); n_chains=1.5 became a model of one chain."""
    model = _model(74, M=2, D=3, window=3, n_hidden=4)
    X, _ = model.sample(60, random_state=75)
    with StreamEngine(FHMM(n_chains=2, window=3, n_hidden=4), learn=True, warmup=100,
                      warmup_steps=20, random_state=0) as eng:
        eng.push_many(X[:50])
        path = eng.checkpoint(tmp_path / "ck")
    meta, arrays = load_checkpoint(path)
    p = _damaged(tmp_path, meta, arrays, meta_changes=[(f"config.{key}", value)])
    with pytest.raises(ValueError, match=message):
        StreamEngine.resume(p)
    with StreamEngine.resume(path) as eng:            # the undamaged one
        assert eng.warming_up


def test_resume_refuses_a_learner_state_that_contradicts_its_configuration(tmp_path):
    """The learner's and reservoir's state was taken as it was: segments of 1e200 (every
    step discarded), a capacity, half-life or stride of its own (replacing the
    configuration's reservoir_size / recency_half_life), an infinite ELBO, or more
    frozen steps than net_burnin."""
    import json
    seed = 76
    model = _model(seed, M=2, D=3, window=3, n_hidden=4)
    X, _ = model.sample(400, random_state=seed + 1)
    net = _with_net(model, X, seed)
    with StreamEngine(model, learn=True, net=net, batch_size=4, reservoir_size=30,
                      learner_duty=0.1, random_state=seed) as eng:
        eng.learning = False
        eng.push_many(X[:300])
        path = eng.checkpoint(tmp_path / "ck")
    meta, arrays = load_checkpoint(path)
    rmeta = json.loads(str(arrays["learner.reservoir.meta"]))
    assert rmeta["size"] > 0 and rmeta["capacity"] == 30

    def res_meta(**changes):
        return np.array(json.dumps(dict(rmeta, **changes)))

    data = arrays["learner.reservoir.data"].copy()
    data[0, 0, 0] = 1e200
    counters = arrays["learner.counters"].copy()
    counters[3] = 10 ** 15
    for changes, message in (
            ([("learner.reservoir.data", data)], r"values within ±1e\+150"),
            ([("learner.reservoir.meta", res_meta(capacity=1000))], "contradict the configuration"),
            ([("learner.reservoir.meta", res_meta(capacity=10 ** 12))], "contradict the configuration"),
            ([("learner.reservoir.meta", res_meta(half_life=5.0))], "contradict the configuration"),
            ([("learner.reservoir.meta", res_meta(stride=7))], "contradict the configuration"),
            ([("learner.counters", counters)], "steps left with the model frozen"),
            ([("learner.elbo", np.array(np.inf))], "elbo must be finite")):
        p = _damaged(tmp_path, meta, arrays, array_changes=changes)
        with pytest.raises(ValueError, match=message):
            StreamEngine.resume(p)
    with StreamEngine.resume(path) as eng:            # the undamaged one
        assert eng._learner.reservoir.capacity == 30
