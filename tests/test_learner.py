"""The background learner's rate control: the duty bound, run-time changes, prompt
stop and jobs during a pause, argument checks, the setting in engine checkpoints."""
import json
import math
import time

import numpy as np
import pytest

from streamfhmm import FHMM
from streamfhmm.io.checkpoint import load_checkpoint, save_checkpoint
from streamfhmm.model import FHMMParams
from streamfhmm.network import RecognitionNet
from streamfhmm.stream.engine import StreamEngine
from streamfhmm.stream.learner import (DEFAULT_LEARNER_DUTY, Learner, LearnerThread,
                                       check_duty)
from streamfhmm.stream.reservoir import Reservoir

SEED = 7
# numeric strings and numpy's bools too, as every other numeric setting (float() took them)
BAD_DUTIES = [0, 0.0, -0.5, 1.0001, 2, math.nan, math.inf, "half", None, True, "0.5", b"1",
              np.bool_(True)]


def _learner(seed=SEED, M=2, D=3, window=3, L=6, scale=1.0, **kw):
    """A learner whose reservoir is full of segments of a random model's samples (times
    ``scale``, after the networks' scaler was fitted); ``kw`` go to Learner."""
    print(f"seed={seed}")
    params = FHMMParams.random(M, D, random_state=seed, noise=0.4, switch=(0.05, 0.3))
    X, _ = params.sample(4000, random_state=seed + 1)
    net = RecognitionNet(M, D, window=window, n_hidden=8, share="chain").init(random_state=seed)
    net.fit_scaler(X)
    X = X * scale
    S = L + net.window
    res = Reservoir(200, S, D, stride=L, random_state=seed)
    for end in range(S - 1, len(X), L):
        res.offer(X[end - S + 1:end + 1].copy(), end)
    kw.setdefault("learning_rate", 1e-3)
    return Learner(params, net, res, batch_size=10, subchain_length=L, **kw)


def _thread(learner, duty, interval=20, steps_per_call=1):
    snaps = []
    th = LearnerThread(learner, snaps.append, snapshot_interval=interval, min_fill=10, duty=duty,
                       steps_per_call=steps_per_call)
    return th, snaps


def _cpu_share(th, seconds):
    """(CPU seconds / wall seconds, steps) of the running thread over ``seconds``."""
    c0, s0, t0 = th.cpu_seconds, th.learner.steps, time.monotonic()
    time.sleep(seconds)
    c1, s1, t1 = th.cpu_seconds, th.learner.steps, time.monotonic()
    return (c1 - c0) / (t1 - t0), s1 - s0


def _round_cpu(learner, interval=20, n=5):
    """The CPU time of one round of ``interval`` steps (warms the compiled kernel)."""
    with learner.lock:
        learner.run_steps(interval)
        c0 = time.thread_time()
        for _ in range(n):
            learner.run_steps(interval)
        return (time.thread_time() - c0) / n


@pytest.fixture(scope="module")
def round_cpu():
    return _round_cpu(_learner())


def test_check_duty():
    assert check_duty(1) == 1.0 and check_duty(0.5) == 0.5 and check_duty(np.float32(0.25)) == 0.25
    assert type(check_duty(np.float32(0.25))) is float and type(check_duty(1)) is float
    for bad in BAD_DUTIES:
        with pytest.raises(ValueError, match=r"learner_duty must be a number in \(0, 1\]"):
            check_duty(bad)
    with pytest.raises(ValueError, match=r"^duty must be"):
        LearnerThread(_learner(), print, duty=0)
    th, _ = _thread(_learner(), 0.5)
    with pytest.raises(ValueError, match=r"^duty must be"):
        th.duty = 1.5
    assert th.duty == 0.5


def test_duty_bounds_the_learner_cpu_share(round_cpu):
    """CPU time over a stretch of learning <= duty * wall time + one round; the unthrottled
    thread, measured the same way, is far above that bound."""
    duty, seconds = 0.1, 1.5
    print(f"one round of 20 steps: {round_cpu * 1e3:.2f} ms CPU")
    # a round per compiled call: a thread that yields the CPU after every step gets a
    # small share of a loaded machine (0.06 of a core beside two busy processes), too
    # small to show the contrast; the duty throttles rounds either way
    th, snaps = _thread(_learner(), 1.0, steps_per_call=20)
    th.start()
    try:
        time.sleep(0.1)
        full, steps_full = _cpu_share(th, 0.75)
        th.duty = duty
        time.sleep(0.1 + 2 * round_cpu / duty)        # the pause after the last full-speed round
        share, steps = _cpu_share(th, seconds)
    finally:
        th.stop()
    rate_full, rate = steps_full / 0.75, steps / seconds
    print(f"unthrottled: {full:.3f} of a core, {rate_full:,.0f} steps/s; duty {duty}: "
          f"{share:.3f} of a core, {rate:,.0f} steps/s; {len(snaps)} snapshots")
    assert th.error is None and not th.is_alive()
    bound = duty + 3 * round_cpu / seconds + 0.02     # (rounds are cut at the window's ends)
    assert share <= bound, (share, bound)
    assert full > 2 * bound, f"the unthrottled learner got only {full:.2f} of a core"
    # steps per CPU second do not depend on the duty: the step rate falls with the share
    assert 0 < rate <= (rate_full / full) * bound * 1.5
    # each round's CPU time shows in the counters
    assert th.rounds > 0 and th.cpu_seconds > 0


def test_duty_change_takes_effect_at_once(round_cpu):
    """A long pause (duty 0.001: ~1,000 rounds of waiting) ends as soon as the duty is
    raised: the next round starts within a quarter of it."""
    duty = 0.001
    th, _ = _thread(_learner(), duty, steps_per_call=20)
    th.start()
    try:
        t0 = time.monotonic()
        while th.rounds < 1 and time.monotonic() - t0 < 30:
            time.sleep(0.005)
        time.sleep(0.05)                               # now inside the pause
        r0 = th.rounds
        assert r0 == 1, r0
        t1 = time.monotonic()
        th.duty = 1.0
        while th.rounds < r0 + 1 and time.monotonic() - t1 < 30:
            time.sleep(0.001)
        dt = time.monotonic() - t1
    finally:
        th.stop()
    pause = round_cpu * (1 - duty) / duty
    print(f"pause at duty {duty} ~{pause:.2f} s; the next round ended {dt:.3f} s after the change")
    assert dt < pause / 4, (dt, pause)


def test_stop_and_jobs_are_prompt_during_a_pause(round_cpu):
    th, _ = _thread(_learner(), 0.002)
    th.start()
    t0 = time.monotonic()
    while th.rounds < 1 and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    ran = []
    t1 = time.monotonic()
    th.request(lambda: ran.append(time.monotonic()))
    while not ran and time.monotonic() - t1 < 5:
        time.sleep(0.001)
    rounds = th.rounds
    t2 = time.monotonic()
    th.stop()
    t_stop = time.monotonic() - t2
    pause = round_cpu * (1 - 0.002) / 0.002
    print(f"pause ~{pause:.2f} s; job after {ran[0] - t1 if ran else None} s, stop in {t_stop:.3f} s")
    assert ran and ran[0] - t1 < 0.2
    assert rounds == 1                                 # the job did not end the pause
    assert t_stop < 0.5 and not th.is_alive()


def _model(seed):
    print(f"model seed={seed}")
    p = FHMMParams.random(2, 2, random_state=seed, noise=0.5, switch=(0.05, 0.3))
    return FHMM.from_params(W=p.W, covariance=p.covariance, transmat=p.transmat, window=3,
                            n_hidden=4, share_hidden="all")


def test_engine_learner_duty_argument_setter_metrics_and_checkpoints(tmp_path):
    model = _model(SEED)
    X, _ = model.sample(1500, random_state=SEED)
    for bad in BAD_DUTIES:
        with pytest.raises(ValueError, match="learner_duty must be a number in"):
            StreamEngine(model, mode="filter", posterior="exact", learner_duty=bad)
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, random_state=0) as eng:
        assert eng.learner_duty == DEFAULT_LEARNER_DUTY == eng._thread.duty
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, learner_duty=0.3,
                      random_state=0) as eng:
        eng.push_many(X)
        assert eng.learner_duty == 0.3 == eng._thread.duty
        eng.learner_duty = 0.6
        for bad in BAD_DUTIES:
            with pytest.raises(ValueError, match="learner_duty"):
                eng.learner_duty = bad
        m = eng.metrics()
        assert eng._thread.duty == 0.6 and m["learner_duty"] == 0.6 and m["learner_cpu_s"] >= 0
        path = eng.checkpoint(tmp_path / "a")
    with StreamEngine.resume(path) as eng:
        assert eng.learner_duty == 0.6 and eng._thread.duty == 0.6
    with StreamEngine.resume(path, learner_duty=0.9) as eng:
        assert eng.learner_duty == 0.9 and eng._thread.duty == 0.9
    with pytest.raises(ValueError, match="learner_duty"):
        StreamEngine.resume(path, learner_duty=0)
    # a checkpoint written before the setting existed loads with the default
    meta, arrays = load_checkpoint(path)
    del meta["config"]["learner_duty"]
    old = save_checkpoint(tmp_path / "old", arrays, meta)
    assert "learner_duty" not in load_checkpoint(old)[0]["config"]
    with StreamEngine.resume(old) as eng:
        assert eng.learner_duty == DEFAULT_LEARNER_DUTY == eng._thread.duty
        assert eng.n_samples == 1500
        eng.push_many(X[:100])
    # learn=False: the setting is kept (and checked) but there is no thread
    with StreamEngine(model, mode="filter", posterior="exact", learn=False, learner_duty=0.5) as eng:
        eng.learner_duty = 0.7
        assert eng.learner_duty == 0.7 and eng.metrics()["learner_cpu_s"] == 0.0


def test_engine_duty_limits_learner_steps():
    """The engine's learner at a low duty takes far fewer steps than at duty 1, on the same
    data (counted over the same wall time)."""
    model = _model(SEED + 1)
    X, _ = model.sample(3000, random_state=SEED + 1)
    rates = {}
    for duty in (1.0, 0.05):
        with StreamEngine(model, mode="filter", posterior="exact", learn=True, learner_duty=duty,
                          snapshot_interval=5, random_state=0) as eng:
            # a round per compiled call (see test_duty_bounds_the_learner_cpu_share)
            eng._thread.steps_per_call = 5
            eng.push_many(X)
            t0 = time.monotonic()
            while eng.metrics()["learner_steps"] == 0 and time.monotonic() - t0 < 30:
                time.sleep(0.005)
            s0, c0, t0 = eng.metrics()["learner_steps"], eng.metrics()["learner_cpu_s"], time.monotonic()
            time.sleep(1.0)
            m = eng.metrics()
            dt = time.monotonic() - t0
            rates[duty] = ((m["learner_steps"] - s0) / dt, (m["learner_cpu_s"] - c0) / dt)
    print({k: f"{v[0]:,.0f} steps/s, {v[1]:.3f} of a core" for k, v in rates.items()})
    assert rates[0.05][1] <= 0.05 + 0.05
    assert rates[0.05][0] < 0.3 * rates[1.0][0]
    assert rates[1.0][1] > 0.2


@pytest.mark.parametrize("steps_per_call", [1, 3, 20])
def test_run_steps_split_into_calls_takes_the_same_steps(steps_per_call):
    """Steps taken a few per compiled call (the thread yields between calls) are the
    steps of one call: same state, counters and ELBO, bit for bit, with a decaying step
    size and the model frozen for part of the run."""
    runs = []
    for per_call in (None, steps_per_call):
        learner = _learner()
        learner.lr_decay_steps = 30.0
        learner.freeze_remaining = 7
        kept = [learner.run_steps(n, per_call) for n in (20, 13, 20)]
        runs.append((kept, learner))
    (kept0, a), (kept1, b) = runs
    assert kept1 == kept0 and sum(kept0) == a.steps == b.steps > 0
    assert (a.discarded, a.freeze_remaining) == (b.discarded, b.freeze_remaining)
    np.testing.assert_array_equal(b.x, a.x)
    np.testing.assert_array_equal(b.sq, a.sq)
    assert b.elbo == a.elbo and math.isfinite(a.elbo)
    assert not np.array_equal(a.x, _learner().x)   # the steps did move the state


@pytest.mark.parametrize("steps_per_call", [None, 2, 20])
def test_freeze_holds_the_model_for_its_steps_only(steps_per_call):
    """freeze_steps=3 holds the model part fixed for the first three steps of a round of
    20 and no longer (the whole round was frozen before): the run equals three frozen
    steps then seventeen free ones of the compiled kernel on the same minibatches."""
    learner, ref = _learner(), _learner()
    learner.freeze_remaining = ref.freeze_remaining = 3
    model0 = learner.x[:learner.nm].copy()
    assert learner.run_steps(20, steps_per_call) == 20
    assert learner.freeze_remaining == 0
    assert not np.array_equal(learner.x[:learner.nm], model0)
    slots = ref.reservoir.sample_slots(20, ref.batch_size)
    lr, values = ref.learning_rates(20), np.empty(20)
    n_ok = ref._svi_run(slots, lr, values, 0, 3, 0, True)
    np.testing.assert_array_equal(ref.x[:ref.nm], model0)
    ref._svi_run(slots, lr, values, 3, 20, n_ok, False)
    np.testing.assert_array_equal(learner.x, ref.x)
    np.testing.assert_array_equal(learner.sq, ref.sq)


def test_a_rejected_state_returns_to_the_last_snapshot_with_its_rmsprop_statistics():
    """A state that makes no valid parameter set goes back to the last published one,
    RMSprop's mean squares included (zeroing them while the step count stays made the
    next steps ~3x RMSprop's first), and the round counts as one discarded step."""
    learner = _learner()
    learner.run_steps(20)
    assert learner.snapshot() is not None
    x_good, sq_good = learner.x.copy(), learner.sq.copy()
    learner.run_steps(5)
    assert not np.array_equal(learner.sq, sq_good)
    learner.x[0] = math.nan                      # W no longer finite
    steps, discarded, version = learner.steps, learner.discarded, learner.version
    assert learner.snapshot() is None
    np.testing.assert_array_equal(learner.x, x_good)
    np.testing.assert_array_equal(learner.sq, sq_good)
    assert (learner.steps, learner.discarded, learner.version) == (steps, discarded + 1, version)
    assert learner.run_steps(5) == 5 and learner.snapshot().version == version + 1


def test_thread_steps_per_call_argument():
    assert LearnerThread(_learner(), print).steps_per_call == 1
    assert LearnerThread(_learner(), print, steps_per_call=4).steps_per_call == 4
    for bad in (0, -1):
        with pytest.raises(ValueError, match="steps_per_call must be >= 1"):
            LearnerThread(_learner(), print, steps_per_call=bad)


def test_drain_stops_at_the_fence_and_before():
    """Pending segments reach the reservoir in order; those ending at or after the
    fence (a checkpoint's cut) wait, and to_arrays(before=t) takes the state at t."""
    learner = _learner()
    res = learner.reservoir
    S, D = res.segment_length, res.n_features
    n0 = res.n_seen
    for end in (5000, 5006, 5012, 5018):
        learner.feed(np.full((S, D), float(end)), end)
    learner.fence = 5012
    assert learner.drain() == 2 and res.n_seen == n0 + 2
    assert [e for _, e in learner.pending] == [5012, 5018]
    assert learner.drain() == 0              # still fenced
    learner.to_arrays(before=5018)
    assert res.n_seen == n0 + 3 and [e for _, e in learner.pending] == [5018]
    learner.fence = None
    assert learner.drain() == 1 and not learner.pending


def test_take_job():
    learner = _learner()
    th, _ = _thread(learner, 1.0)
    assert th.take_job() is None
    th.request(lambda: None)
    job = th.take_job()
    assert callable(job) and th.take_job() is None


def test_a_request_during_the_hand_over_is_not_lost():
    """The learner thread read its job and reset it in two steps: a request between them
    was erased (its checkpoint never written, its fence never lifted). The hand-over
    and request() now exclude each other: a request made while a job is being taken
    waits, then stays for the next round."""
    import threading
    learner = _learner()
    th, _ = _thread(learner, 1.0)
    th.request(lambda: "A")
    done, taken = threading.Event(), []
    with th._job_lock:                      # a hand-over in progress
        requester = threading.Thread(target=lambda: (th.request(lambda: "B"), done.set()))
        taker = threading.Thread(target=lambda: taken.append(th.take_job()))
        requester.start()
        taker.start()
        assert not done.wait(0.2) and not taken   # both wait for the lock
    requester.join(5.0)
    taker.join(5.0)
    assert done.is_set() and len(taken) == 1
    # whichever came first, A is taken once and B is not erased
    jobs = [taken[0]() if taken[0] else None, (th.take_job() or (lambda: None))()]
    assert sorted(j for j in jobs if j) in (["A", "B"], ["B"]), jobs


def test_the_thread_takes_its_jobs_through_the_hand_over():
    """The running thread takes each job through ``take_job`` (the locked hand-over the
    test above checks), once, holding the learner's lock."""
    learner = _learner()
    th, _ = _thread(learner, 1.0)
    taken, ran = [], []
    real = th.take_job
    th.take_job = lambda: taken.append(1) or real()
    th.start()
    try:
        th.request(lambda: ran.append(learner.lock.locked()))
        t0 = time.monotonic()
        while not ran and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        assert ran == [True] and len(taken) >= 1
        n = len(taken)
        t0 = time.monotonic()
        while len(taken) < n + 2 and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        assert ran == [True]                 # taken once: later rounds find no job
    finally:
        th.stop()


def test_stop_does_not_wait_for_a_whole_round(monkeypatch):
    """Stopping the thread waits for the compiled call under way, not for the rest of
    its round of ``snapshot_interval`` steps (closing an engine with
    snapshot_interval=5000 took 8 s); the steps cut off are neither taken nor counted,
    and those taken are the ones an uninterrupted round takes first."""
    from streamfhmm.kernels import online
    calls = []
    real = online.svi_run
    monkeypatch.setattr(online, "svi_run", lambda *a: calls.append(1) or real(*a))
    learner = _learner()
    th = LearnerThread(learner, lambda snap: None, snapshot_interval=10**7, min_fill=10, duty=1.0)
    th.start()
    t0 = time.monotonic()
    while len(calls) < 20 and time.monotonic() - t0 < 60:   # one step per call
        time.sleep(0.005)
    th.stop(timeout=30.0)
    assert not th.is_alive()
    n = learner.steps + learner.discarded
    assert 20 <= n == len(calls) < 10**6 and th.rounds == 1
    # the same first n steps, uninterrupted, from the same state and random stream
    again = _learner()
    assert again.run_steps(n, 1) == learner.steps
    np.testing.assert_array_equal(again.x, learner.x)
    np.testing.assert_array_equal(again.sq, learner.sq)


def test_a_tiny_duty_does_not_stop_the_thread():
    """A duty of 1e-300 asks for a pause beyond what ``Event.wait`` accepts: it used to
    raise OverflowError on the thread, which stopped learning for good (raising the duty
    again did nothing). The pause is waited in bounded pieces."""
    th, _ = _thread(_learner(), 1e-300)
    th.start()
    try:
        t0 = time.monotonic()
        while th.rounds < 1 and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        assert th.rounds == 1
        th.duty = 1.0            # the pause (and its wait) ends at once
        t1 = time.monotonic()
        while th.rounds < 3 and th.is_alive() and time.monotonic() - t1 < 60:
            time.sleep(0.005)
        assert th.error is None, th.error
        assert th.is_alive() and th.rounds >= 3
    finally:
        th.stop(timeout=60)
    assert not th.is_alive()


def test_learner_added_on_resume_continues_the_snapshot_versions(tmp_path):
    """A checkpoint written without a learner (resumed with learn=False), resumed with
    one: its snapshots used to start again at version 1, below the checkpoint's."""
    model = _model(SEED)
    X, _ = model.sample(200_000, random_state=SEED)   # (more than a slow machine pushes below)
    with StreamEngine(model, mode="filter", posterior="exact", learn=True, learner_duty=1.0,
                      snapshot_interval=5, random_state=0) as eng:
        i, t0 = 0, time.monotonic()
        while eng.version < 3 and time.monotonic() - t0 < 60:
            eng.push_many(X[i:i + 100])
            i += 100
            time.sleep(0.01)
        assert eng.version >= 3 and eng.learner_error is None
        a = eng.checkpoint(tmp_path / "a")
    with StreamEngine.resume(a, learn=False) as eng:
        eng.push_many(X[i:i + 100])
        i += 100
        b = eng.checkpoint(tmp_path / "b")
    with StreamEngine.resume(b, learn=True, learner_duty=1.0) as eng:
        v0 = eng.version
        assert v0 >= 3
        versions = []
        t0 = time.monotonic()
        while eng.version == v0 and eng.learner_error is None and time.monotonic() - t0 < 60:
            versions.extend(eng.push_many(X[i:i + 50]).version)
            i += 50
            time.sleep(0.01)
        versions.extend(eng.push_many(X[i:i + 50]).version)
        assert eng.learner_error is None
        assert eng.version > v0
        assert min(versions) >= v0 and (np.diff(versions) >= 0).all()


def test_load_arrays_refuses_negative_mean_squares_and_bad_counters():
    """A damaged learner state is refused (a negative RMSprop mean square made most of the
    resumed learner's steps non-finite, hence discarded, for as long as it stayed so)."""
    learner = _learner()
    with learner.lock:
        good = learner.to_arrays()
    fresh = _learner()
    for name, value, message in (
            ("sq", -np.abs(good["sq"]) - 1.0, r"mean squares \(sq\) must be >= 0"),
            ("counters", good["counters"][:4], "learner counters must be 5 integers >= 0"),
            ("counters", np.r_[good["counters"][:4], -5], "learner counters must be 5 integers"),
            ("counters", good["counters"] + 0.5, "learner counters must be 5 integers")):
        bad = dict(good)
        bad[name] = value
        with pytest.raises(ValueError, match=message):
            fresh.load_arrays(bad)
    fresh.load_arrays(good)
    np.testing.assert_array_equal(fresh.sq, good["sq"])


def test_an_idle_thread_backs_off_and_wakes_at_once():
    """A thread with nothing to do (a disabled learner) waited idle_sleep (2 ms) each
    round: 500 wake-ups a second, about 4 % of a core per idle engine. Its waits now
    double up to 0.1 s; wake() (as setting an engine's ``learning``) ends one at once
    and starts the doubling again. The waits asked for are recorded, not timed."""
    learner = _learner()
    learner.enabled = False
    th, _ = _thread(learner, 1.0)
    waits = []
    wait = th._wake.wait

    def recording_wait(timeout=None):
        waits.append(timeout)
        return wait(timeout)
    th._wake.wait = recording_wait
    th.start()
    try:
        deadline = time.monotonic() + 30
        while len(waits) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        first = list(waits[:12])
        assert first[:7] == [0.002 * 2 ** k for k in range(6)] + [0.1], first
        assert all(w == 0.1 for w in first[7:]), first
        n = len(waits)
        th.wake()
        while len(waits) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waits[n:n + 2] == [0.002, 0.004], waits[n - 2:]
        # segments fed to a learner that is off are still drained into the reservoir: a
        # round that drained some waits idle_sleep again (with 0.1 s waits a fast stream
        # overran max_pending, and segments were dropped)
        while waits[-1] != 0.1 and time.monotonic() < deadline:
            time.sleep(0.05)
        seg = learner.reservoir.data[0].copy()
        n = len(waits)
        for k in range(50):
            learner.feed(seg, 10**6 + k)
            time.sleep(0.003)
        while (learner.pending or len(waits) < n + 3) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 0.002 in waits[n + 1:], waits[n - 2:]
        assert learner.dropped == 0 and not learner.pending
        assert learner.steps == 0
    finally:
        th.stop(10)
    assert not th.is_alive()


def test_enabling_an_engine_s_learner_wakes_its_thread():
    params = FHMMParams.random(2, 3, random_state=SEED, noise=0.4)
    model = FHMM.from_params(params.W, params.covariance, params.transmat, params.startprob)
    X, _ = params.sample(300, random_state=SEED)
    print(f"seed={SEED}")
    # (duty 0.5: the thread waits after each round, so a wake() that lands between its
    # waits still ends the next one)
    with StreamEngine(model, learn=True, warmup=100, warmup_steps=2, learner_duty=0.5) as eng:
        eng.learning = False
        eng.push_many(X)
        th = eng._thread
        ended = []
        wait = th._wake.wait

        def recording_wait(timeout=None):
            ended.append(wait(timeout))    # True: the wait was cut short by wake()
            return ended[-1]
        th._wake.wait = recording_wait
        deadline = time.monotonic() + 30
        while len(ended) < 8 and time.monotonic() < deadline:   # (backed off to 0.1 s waits)
            time.sleep(0.05)
        eng.learning = False
        time.sleep(0.3)
        assert True not in ended      # switching learning off wakes nothing
        n = len(ended)
        eng.learning = True
        while len(ended) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert True in ended[n:n + 2], ended[n - 2:]   # the wait it was in ended at once


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------
def test_feed_keeps_at_most_max_pending_and_counts_the_rest():
    learner = _learner(max_pending=3)
    for t in range(4):
        learner.feed(np.zeros((learner.reservoir.segment_length, 3)), 10_000 + t)
    assert len(learner.pending) == 3 and learner.dropped == 1


def test_learning_rates_decay_from_the_steps_taken_and_floor_at_the_minimum():
    """η_k = η / √(1 + k / lr_decay_steps) from k = steps; min_learning_rate floors a
    constant rate too."""
    learner = _learner(learning_rate=1e-2, lr_decay_steps=10.0)
    np.testing.assert_allclose(learner.learning_rates(3), 1e-2 / np.sqrt(1.0 + np.arange(3) / 10.0))
    learner = _learner(learning_rate=1e-3, min_learning_rate=1e-2)
    np.testing.assert_array_equal(learner.learning_rates(4), np.full(4, 1e-2))


def test_freeze_counts_down_by_the_steps_taken_discarded_ones_included():
    learner = _learner(scale=1e200, freeze_steps=10)   # every step's ELBO is non-finite
    assert learner.run_steps(5) == 0 and learner.discarded == 5
    assert learner.freeze_remaining == 5


def test_elbo_running_mean_is_per_step_whatever_the_run_length():
    a, b = _learner(), _learner()
    a.run_steps(1)
    b.run_steps(1)
    a.run_steps(6)
    for _ in range(6):
        b.run_steps(1)
    np.testing.assert_array_equal(a.x, b.x)          # the same steps were taken
    assert a.steps == b.steps == 7
    assert a.elbo == pytest.approx(b.elbo, rel=1e-12)


def test_to_arrays_is_a_snapshot_and_load_arrays_checks_and_restores():
    """to_arrays copies x; load_arrays refuses a reservoir of other segments, and a state
    rejected after a load returns to the loaded one (not to the state before it)."""
    src = _learner()
    src.run_steps(20)
    with src.lock:
        arrays = src.to_arrays()
    before = arrays["x"].copy()
    assert src.run_steps(5) == 5
    np.testing.assert_array_equal(arrays["x"], before)
    dst = _learner()
    dst.load_arrays(arrays)
    dst.x[0] = math.nan                              # not a valid parameter set
    assert dst.snapshot() is None
    np.testing.assert_array_equal(dst.x, arrays["x"])
    other = Reservoir(5, src.reservoir.segment_length + 1, 3, random_state=0)
    for t in range(5):
        other.offer(np.zeros((other.segment_length, 3)), t)
    bad = dict(arrays, **{f"reservoir.{k}": v for k, v in other.to_arrays().items()})
    with pytest.raises(ValueError, match="does not match"):
        _learner().load_arrays(bad)


def test_the_thread_learns_once_the_reservoir_holds_min_fill_segments():
    M, D, L = 2, 3, 6
    print(f"seed={SEED}")
    params = FHMMParams.random(M, D, random_state=SEED, noise=0.4, switch=(0.05, 0.3))
    X, _ = params.sample(400, random_state=SEED + 1)
    net = RecognitionNet(M, D, window=3, n_hidden=8, share="chain").init(random_state=SEED)
    net.fit_scaler(X)
    S = L + net.window
    res = Reservoir(10, S, D, stride=L, random_state=SEED)
    for k in range(10):
        res.offer(X[k * L:k * L + S].copy(), k * L + S - 1)
    assert res.size == 10
    learner = Learner(params, net, res, batch_size=4, subchain_length=L, learning_rate=1e-3)
    th = LearnerThread(learner, lambda snap: None, snapshot_interval=5, min_fill=10)
    th.start()
    try:
        deadline = time.monotonic() + 30
        while learner.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        th.stop(10)
    assert th.error is None and learner.steps > 0


def test_load_arrays_refuses_an_infinite_elbo_a_long_freeze_and_another_reservoir():
    """An infinite ELBO (kept in every later running mean), more frozen steps than the
    caller allows (net_burnin) and a reservoir of another capacity were taken; a refused
    state leaves the learner as it was."""
    src = _learner()
    src.run_steps(5)
    with src.lock:
        good = src.to_arrays()
    dst = _learner(seed=SEED + 1)
    before = (dst.x.copy(), dst.steps, dst.elbo, dst.reservoir)
    counters = good["counters"].copy()
    counters[3] = 10 ** 15
    meta = json.loads(str(good["reservoir.meta"]))
    for changes, kw, message in (
            ({"elbo": np.array(np.inf)}, {}, "elbo must be finite"),
            ({"elbo": np.array(-np.inf)}, {}, "elbo must be finite"),
            ({"counters": counters}, {"max_freeze": 1000}, "steps left with the model frozen"),
            ({"reservoir.meta": np.array(json.dumps(dict(meta, capacity=500)))}, {},
             "contradict the configuration")):
        with pytest.raises(ValueError, match=message):
            dst.load_arrays(dict(good, **changes), **kw)
        np.testing.assert_array_equal(dst.x, before[0])
        assert (dst.steps, dst.reservoir) == before[1:2] + before[3:]
    dst.load_arrays(dict(good, counters=counters))      # no bound given: taken
    dst.load_arrays(dict(good, elbo=np.array(np.nan)), max_freeze=0)   # before a first step
    assert math.isnan(dst.elbo) and dst.steps == src.steps
