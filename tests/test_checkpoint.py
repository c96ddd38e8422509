"""Checkpoint files: atomic writes, clear errors, and engine round trips (including a
process killed with SIGKILL while it writes checkpoints)."""
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
from streamfhmm.io.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
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
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "junk.npz")
    np.savez(tmp_path / "foreign.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="not a streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "foreign.npz")
    np.savez(tmp_path / "obj.npz", format=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="not a valid streamfhmm checkpoint"):
        load_checkpoint(tmp_path / "obj.npz")
    data = dict(np.load(path))
    data["version"] = np.array(FORMAT_VERSION + 1)
    np.savez(tmp_path / "newer.npz", **data)
    with pytest.raises(ValueError, match="format version 2.*upgrade"):
        load_checkpoint(tmp_path / "newer.npz")
    with pytest.raises(ValueError, match="dtype object"):
        save_checkpoint(tmp_path / "bad.npz", {"o": np.array([None], dtype=object)}, {})
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
                    # kill at a random moment of the next checkpoint interval
                    time.sleep(np.random.default_rng().uniform(0, 0.03))
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
