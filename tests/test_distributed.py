"""The Dask learner: it learns what the local learner learns, is reproducible, keeps
.npy chunks off the driver, and survives (or clearly reports) a lost worker.

Every test runs under a hard watchdog (``faulthandler``): a hang kills the run with a
traceback instead of blocking it.
"""
import faulthandler
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from streamfhmm import FHMM, exact  # noqa: E402
from streamfhmm.learn import distributed as dl  # noqa: E402
from streamfhmm.learn.distributed import (  # noqa: E402
    chunk_lengths, chunk_scaler, fit_svi_distributed, head_rows, write_npy_chunks)
from streamfhmm.learn.smf import init_params  # noqa: E402
from streamfhmm.learn.svi import SVIState, fit_svi  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.network import RecognitionNet  # noqa: E402

W2 = np.array([[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]])
A2 = np.array([[[0.95, 0.05], [0.10, 0.90]], [[0.90, 0.10], [0.05, 0.95]]])
SEED = 5
N_CHUNKS = 4
# the scheduler always serves HTTP (metrics, health); None would mean port 8787, which
# another cluster on the machine may hold: a free port instead
DASHBOARD = ":0"


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def problem():
    """2,000 samples of the two-chain model in 4 chunks, a starting model and networks."""
    print(f"seed={SEED}")
    true = FHMM.from_params(W=W2, covariance=0.1 * np.eye(2), transmat=A2)
    X, _ = true.sample(2000, random_state=SEED)
    chunks = np.array_split(X, N_CHUNKS)
    params = init_params(X, 2, random_state=np.random.default_rng(SEED))
    net = RecognitionNet(2, 2, window=5, n_hidden=16, share="chain").init(random_state=SEED)
    net.fit_scaler(X)
    return X, chunks, params, net


@pytest.fixture(scope="module")
def client():
    """Two in-process workers (threads of this process)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=DASHBOARD) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def _loglik(params, chunks):
    return sum(exact.log_likelihood(params, c) for c in chunks) / sum(len(c) for c in chunks)


def _scaled(problem, scale):
    """The problem in units ``scale`` times larger: data, chunks, starting model and
    networks (their scaler fitted to the new data)."""
    X, chunks, params, net = problem
    p = FHMMParams(W=params.W * scale, L=params.L * scale, alpha=params.alpha,
                   beta=params.beta, startprob=params.startprob)
    nt = net.copy()
    nt.fit_scaler(X * scale)
    return X * scale, [c * scale for c in chunks], p, nt


def _only_shard_seed(random_state):
    """The sampler seed of a fit's only shard: the fit draws a root seed from
    ``random_state``, the batch split takes its first child and shard k child k + 1."""
    rng = np.random.default_rng(random_state)
    return np.random.SeedSequence(int(rng.integers(2**63))).spawn(2)[1]


def test_matches_the_local_learner(problem, client):
    X, chunks, params, net = problem
    lengths = [len(c) for c in chunks]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # one worker (one shard holding every chunk in order) and the local learner's sampler
    # seeded as that shard's: the same subchains, sums and RMSprop steps, to rounding
    one = [sorted(client.nthreads())[0]]
    for cov in ("full", "diag", "spherical"):
        kw = dict(max_iter=20, batch_size=6, progress=False, covariance_type=cov)
        local = fit_svi(X, bounds, params, net, rng=np.random.default_rng(_only_shard_seed(SEED)),
                        **kw)
        dist = fit_svi_distributed(chunks, params, net, client, workers=one, random_state=SEED,
                                   **kw)
        a, b = local.state_vector(), dist.state_vector()
        print(f"{cov}: one shard, max |local - dask| {np.abs(a - b).max():.1e}")
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
        assert dist.history[-1]["elbo"] == pytest.approx(local.history[-1]["elbo"], rel=1e-10)
    # two shards of unequal positions (48 and 50) whose every step is the whole data: each
    # chunk no longer than a subchain, one subchain per chunk per step. In units 1000
    # times larger the model's steps must be taken in the data's units, and the step is
    # the mean over every counted position (not the mean of the shards' means)
    Xs, _, ps, nets = _scaled(problem, 1000.0)
    sizes = [30, 25, 20, 10, 8, 5]
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    data = Xs[:edges[-1]]
    kw = dict(max_iter=20, batch_size=len(sizes), subchain_length=max(sizes), progress=False)
    local = fit_svi(data, edges, ps, nets, rng=np.random.default_rng(SEED), **kw)
    dist = fit_svi_distributed(np.split(data, edges[1:-1]), ps, nets, client,
                               random_state=SEED, **kw)
    a, b = local.state_vector(), dist.state_vector()
    x0 = np.concatenate([local.packer.pack(ps), nets.weights])
    print(f"x1000, two shards, full batches: max |local - dask| {np.abs(a - b).max():.1e}, "
          f"max |step| {np.abs(a - x0).max():.1e}")
    np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10)
    # the stochastic batches of two shards learn what the local learner learns (x1000:
    # the steps' units matter here too)
    Xs, chunks_s, ps, nets = _scaled(problem, 1000.0)
    weights = nets.weights.copy()
    steps = 1500
    local = fit_svi(Xs, bounds, ps, nets, max_iter=steps, rng=np.random.default_rng(SEED),
                    progress=False)
    t0 = time.perf_counter()
    dist = fit_svi_distributed(chunks_s, ps, nets, client, max_iter=steps,
                               random_state=SEED, progress=False, step_timeout=30.0)
    wall = time.perf_counter() - t0
    assert isinstance(dist, SVIState)
    ll0, ll_local, ll_dist = (_loglik(p, chunks_s) for p in (ps, local.params, dist.params))
    print(f"x1000 loglik/step: start {ll0:.4f} local {ll_local:.4f} dask {ll_dist:.4f}; "
          f"dask {steps} steps in {wall:.1f} s")
    assert ll_dist > ll0 + 0.1
    assert abs(ll_dist - ll_local) < 0.01
    h = dist.history
    assert h[-1]["iteration"] == steps and len(h) == 100
    assert {"elbo", "lr", "time", "compute", "overhead", "recoveries"} <= set(h[0])
    assert h[-1]["elbo"] > h[0]["elbo"]
    assert h[-1]["recoveries"] == 0
    assert np.array_equal(nets.weights, weights)  # the caller's networks are untouched


def test_warmup_holds_the_model(problem, client):
    X, chunks, params, net = problem
    held = fit_svi_distributed(chunks, params, net, client, max_iter=20, net_warmup=20,
                               random_state=SEED, progress=False, step_timeout=30.0)
    np.testing.assert_allclose(held.params.W, params.W, rtol=0, atol=1e-12)
    assert not np.array_equal(held.net.weights, net.weights)
    joint = fit_svi_distributed(chunks, params, net, client, max_iter=20, net_warmup=10,
                                random_state=SEED, progress=False, step_timeout=30.0)
    assert np.abs(joint.params.W - params.W).max() > 1e-4
    with pytest.raises(ValueError, match="net_warmup must be an integer >= 0"):
        fit_svi_distributed(chunks, params, net, client, max_iter=2, net_warmup=-1, progress=False)


def test_reproducible_for_a_fixed_seed(problem, client):
    _, chunks, params, net = problem
    kw = dict(max_iter=40, progress=False, batch_size=7, subchain_length=3)
    a = fit_svi_distributed(chunks, params, net, client, random_state=1, **kw)
    b = fit_svi_distributed(chunks, params, net, client, random_state=1, **kw)
    c = fit_svi_distributed(chunks, params, net, client, random_state=2, **kw)
    assert np.array_equal(a.state_vector(), b.state_vector())
    assert not np.array_equal(a.state_vector(), c.state_vector())
    # continuing a state takes the steps from where it stopped
    d = fit_svi_distributed(chunks, None, None, client, random_state=3, state=a, **kw)
    assert d is a and d.iteration == 80 and d.opt.steps == 80


def test_npy_chunks_are_opened_by_the_workers_only(problem, client, tmp_path, monkeypatch):
    X, chunks, params, net = problem
    paths = write_npy_chunks(X, tmp_path, N_CHUNKS)
    assert chunk_lengths(paths).tolist() == [len(c) for c in chunks]
    calls = []
    real_load = np.load

    def spy(file, *args, **kwargs):
        calls.append((os.fspath(file), kwargs.get("mmap_mode"), threading.current_thread().name))
        return real_load(file, *args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    kw = dict(max_iter=60, progress=False, random_state=4)
    from_files = fit_svi_distributed(paths, params, net, client, **kw)
    main = threading.main_thread().name
    opened = [c for c in calls if c[0] in paths]
    print(opened)
    assert sorted({c[0] for c in opened}) == sorted(paths)  # every file was opened ...
    assert all(c[1] == "r" for c in opened)                  # ... memory-mapped ...
    assert all(c[2] != main for c in opened)                 # ... by a worker, never the driver
    # same shards, same seeds, same data: the same fit as from the arrays in memory
    monkeypatch.setattr(np, "load", real_load)
    in_memory = fit_svi_distributed(chunks, params, net, client, **kw)
    np.testing.assert_array_equal(from_files.state_vector(), in_memory.state_vector())


def test_helpers(problem, client, tmp_path):
    X, chunks, _, net = problem
    Xn = X.copy()
    Xn[::13, 1] = np.nan
    paths = write_npy_chunks(Xn, tmp_path, 3, prefix="part")
    assert [os.path.basename(p) for p in paths] == ["part_00000.npy", "part_00001.npy",
                                                   "part_00002.npy"]
    ref = RecognitionNet(2, 2).fit_scaler(Xn)
    for source, c in ((paths, client), (paths, None), (np.array_split(Xn, 3), None)):
        mean, scale = chunk_scaler(source, client=c)
        np.testing.assert_allclose(mean, ref.mean, rtol=1e-12)
        np.testing.assert_allclose(scale, ref.scale, rtol=1e-12)
    np.testing.assert_array_equal(head_rows(paths, 900), Xn[:900])
    np.testing.assert_array_equal(head_rows(paths, 10**6), Xn)


@pytest.mark.parametrize("mode", ["centred", "causal"])
def test_shard_batches_equal_the_local_layout(mode):
    """A shard's compact row copies give the gradient of the same subchains laid out
    over the whole concatenated data, as the local learner lays them out."""
    from streamfhmm.kernels import svi as ks
    from streamfhmm.learn.objective import ModelPacker
    from streamfhmm.learn.sampler import SubchainSampler
    from streamfhmm.model import FHMMParams
    seed = 17
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    M, D, L, B = 3, 2, 4, 6
    lengths = [9, 30, 2, 1, 25]
    X = rng.standard_normal((sum(lengths), D))
    X[rng.random(X.shape) < 0.1] = np.nan
    X[np.isnan(X).all(axis=1), 0] = 0.0
    chunks = np.split(X, np.cumsum(lengths)[:-1])
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    net = RecognitionNet(M, D, window=7, n_hidden=5, mode=mode).init(random_state=seed)
    net.fit_scaler(X)
    packer = ModelPacker(M, D)
    x = np.concatenate([packer.pack(FHMMParams.random(M, D, random_state=seed)), net.weights])
    spec = {"M": M, "D": D, "n_model": packer.size, "n_weights": net.n_weights,
            "window": net.window, "offset": net.offset, "layout": net.layout, "mean": net.mean,
            "scale": net.scale, "n_inputs": net.n_inputs, "n_hidden_total": net.n_hidden,
            "subchain_length": L, "max_blocks": B}
    shard = dl._ShardLearner(chunks, spec, np.random.SeedSequence(seed))
    ref = SubchainSampler(bounds, L, B, np.random.default_rng(np.random.SeedSequence(seed)))
    n_max = B * (L + 1)
    rows, rs, re = (np.empty(n_max, dtype=np.int64) for _ in range(3))
    scratch = [np.empty((n_max, k)) for k in (net.n_inputs, net.n_hidden, M, M, M, M, D)]
    for n_blocks in (B, 1, 5, B, 3, B, B, 2):  # several epochs
        ref.ensure(n_blocks)
        offsets, first = np.empty(n_blocks + 1, dtype=np.int64), np.empty(n_blocks, dtype=bool)
        ks.fill_batch(ref.q_start, ref.q_stop, ref.q_lo, ref.q_hi, ref.cursor, n_blocks,
                      rows, rs, re, offsets, first)
        ref.advance(n_blocks)
        g_ref = np.empty_like(x)
        v_ref, c_ref = ks.batch_gradient(X, rows, rs, re, offsets, first, net.window,
                                         net.offset, net.mean, net.scale, x, packer.size,
                                         net.layout, M, D, *scratch, g_ref)
        value, counted, grad, _ = shard.gradient(x, n_blocks)
        assert counted == c_ref
        np.testing.assert_allclose(value, v_ref, rtol=1e-12)
        np.testing.assert_allclose(grad, g_ref, rtol=1e-10, atol=1e-12)


def test_allocation_is_unbiased():
    rng = np.random.default_rng(0)
    print("seed=0")
    fractions = np.array([0.5, 0.3, 0.15, 0.05])
    draws = np.array([dl._allocate(7, fractions, rng) for _ in range(20000)])
    assert (draws.sum(axis=1) == 7).all()
    assert (draws >= np.floor(7 * fractions)).all() and (draws <= np.ceil(7 * fractions)).all()
    np.testing.assert_allclose(draws.mean(axis=0), 7 * fractions, atol=0.02)
    assert dl._allocate(10, np.array([0.5, 0.5]), rng).tolist() == [5, 5]


def test_shards_are_balanced():
    # longest first onto the lighter shard: 100 | 60, 50 | 40 | 10 -> loads 140 and 120
    assert dl._shard_chunks([100, 10, 60, 50, 40], 2) == [[0, 4], [1, 2, 3]]
    assert sorted(i for m in dl._shard_chunks([5] * 7, 3) for i in m) == list(range(7))


def test_bad_input(problem, client, tmp_path):
    X, chunks, params, net = problem
    with pytest.raises(ValueError, match="only .npy files"):
        fit_svi_distributed([str(tmp_path / "a.csv")], params, net, client, max_iter=1)
    with pytest.raises(ValueError, match="does not exist"):
        fit_svi_distributed([str(tmp_path / "a.npy")], params, net, client, max_iter=1)
    with pytest.raises(ValueError, match="same number of features"):
        fit_svi_distributed([X, X[:, :1]], params, net, client, max_iter=1)
    with pytest.raises(ValueError, match="the chunks have 3 features"):
        fit_svi_distributed([np.zeros((50, 3))], params, net, client, max_iter=1)
    with pytest.raises(ValueError, match="list of"):
        fit_svi_distributed(X, params, net, client, max_iter=1)
    np.save(tmp_path / "bad.npy", np.zeros(10))
    with pytest.raises(ValueError, match="2-D array"):
        fit_svi_distributed([str(tmp_path / "bad.npy")], params, net, client, max_iter=1)
    with pytest.raises(ValueError, match="workers must be addresses"):
        fit_svi_distributed(chunks, params, net, client, max_iter=1, workers=["tcp://nowhere:1"])
    inf = X[:100].copy()
    inf[7, 0] = np.inf
    np.save(tmp_path / "inf.npy", inf)
    # a fault in the data is raised as itself, not retried as a lost worker
    with pytest.raises(ValueError, match="infinity at row 7"):
        fit_svi_distributed([str(tmp_path / "inf.npy")], params, net, client, max_iter=1,
                            progress=False)


def test_values_too_large_to_fit_are_refused(problem, client, tmp_path):
    """Values beyond ±1e150 are refused as by a local fit, in arrays and in every block
    of a .npy chunk a worker scans (they failed as 'W must be finite' or as a
    FloatingPointError at the first step)."""
    X, chunks, params, net = problem
    big = chunks[1].copy()
    big[300, 1] = 1e160
    message = r"must hold values within ±1e\+150 to fit a model .* found {} at row {}, column {}"
    with pytest.raises(ValueError, match=r"chunks\[1\] " + message.format("1e\\+160", 300, 1)):
        fit_svi_distributed([chunks[0], big], params, net, client, max_iter=2, progress=False)
    # (FHMM.fit names X and its row, as a local fit does)
    with pytest.raises(ValueError, match="^X " + message.format("1e\\+160", 800, 1)):
        FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(
            np.concatenate([chunks[0], big]), lengths=[500, 500], max_iter=2, progress=False,
            init_samples=300, client=client)
    # in the second block the workers scan: its row counted from the file's start
    Y = np.zeros((dl._SCAN_ROWS + 10, 2))
    Y[dl._SCAN_ROWS + 3, 0] = -1e200
    np.save(tmp_path / "big.npy", Y)
    path = str(tmp_path / "big.npy")
    with pytest.raises(ValueError, match="chunk .*big.npy " + message.format(
            "-1e\\+200", dl._SCAN_ROWS + 3, 0)):
        fit_svi_distributed([path, chunks[0]], params, net, client, max_iter=2, progress=False)
    np.testing.assert_array_equal(head_rows([path], 5), Y[:5])
    with pytest.raises(ValueError, match=message.format("-1e\\+200", dl._SCAN_ROWS + 3, 0)):
        head_rows([path], dl._SCAN_ROWS + 5)


def test_bad_npy_files_are_named(tmp_path):
    """A truncated file is refused from its size before any worker opens it (it failed
    with numpy's 'mmap length is greater than file size', naming no file), and a file a
    worker cannot open fails with a ValueError naming it (it was the bare OSError)."""
    X = np.arange(40.0).reshape(20, 2)
    path = str(tmp_path / "cut.npy")
    np.save(path, X)
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(size - 8)
    with pytest.raises(ValueError, match=r"chunks\[0\] \(.*cut.npy\) is truncated: .* shape "
                                         rf"\(20, 2\) of float64, {size} bytes .* has {size - 8}"):
        chunk_lengths([path])
    # what a worker meets when its view of the files differs from the driver's
    with pytest.raises(ValueError, match="chunk .*cut.npy cannot be opened on .*mmap length"):
        dl._open_chunk(path, 2)
    with pytest.raises(ValueError, match="chunk .*gone.npy cannot be opened on .*No such file"):
        dl._open_chunk(str(tmp_path / "gone.npy"), 2)


def test_lost_worker_without_recoveries_raises_clearly(problem):
    X, chunks, params, net = problem
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=DASHBOARD) as cluster, \
            distributed.Client(cluster) as c:
        closed = []

        def close_one(state):
            if not closed:
                name = sorted(cluster.workers)[0]
                closed.append(cluster.workers[name].address)
                cluster.sync(cluster.workers[name].close)

        t0 = time.perf_counter()
        with pytest.raises(RuntimeError,
                           match=r"shard \d .* was lost .* 0 allowed recoveries") as err:
            fit_svi_distributed(chunks, params, net, c, max_iter=300, log_every=20,
                                random_state=SEED, progress=False, callback=close_one,
                                max_recoveries=0, step_timeout=20.0)
        wall = time.perf_counter() - t0
    print(f"closed {closed}; raised after {wall:.1f} s: {err.value}")
    assert closed and closed[0] in str(err.value)
    assert wall < 30


@pytest.mark.parametrize("n_stalls", [1, 2])
def test_a_slow_step_costs_a_recovery_not_the_worker(problem, client, monkeypatch, n_stalls):
    """A shard that misses ``step_timeout`` (its worker busy for a moment, not gone) is
    re-created elsewhere; its worker stays in use. One stall on each of the two workers
    ended the fit ('no worker is left') while both were alive. The old actor is
    cancelled at once: with the cyclic garbage collector off, nothing of it stays on the
    worker or in the client (a reference cycle through the kept error held it)."""
    print(f"seed={SEED}")
    _, chunks, params, net = problem
    gradient = dl._ShardLearner.gradient
    replace = dl._ShardPool._replace
    lock = threading.Lock()
    replaced = threading.Event()
    calls, stalled, done = [], [], []

    def stalling(shard, x, n_blocks):  # in-process workers: the actors run in this process
        worker = distributed.get_worker().address
        with lock:
            calls.append(worker)
            # the 11th call; then, once that stall is over, a call on the other worker
            stall = (len(stalled) < n_stalls and len(calls) > 10 and worker not in stalled
                     and len(done) == len(stalled))
            if stall:
                stalled.append(worker)
                replaced.clear()
        if stall:  # busy until the driver has given up on this call and moved the shard
            replaced.wait(timeout=10.0)
            done.append(worker)
        return gradient(shard, x, n_blocks)

    def replacing(pool, shard, loss):
        replace(pool, shard, loss)
        replaced.set()

    monkeypatch.setattr(dl._ShardLearner, "gradient", stalling)
    monkeypatch.setattr(dl._ShardPool, "_replace", replacing)
    before = set(client.futures)
    gc.collect()
    gc.disable()
    try:
        state = fit_svi_distributed(chunks, params, net, client, max_iter=100, log_every=20,
                                    random_state=SEED, progress=False, step_timeout=1.0,
                                    setup_timeout=5.0, max_recoveries=6)
        left = _wait_for_no_actors(client)
        kept = sorted(set(client.futures) - before)
    finally:
        gc.enable()
    print(f"stalled {stalled}; history {state.history[-1]}; actors left {left}, "
          f"futures kept {kept}")
    assert len(stalled) == n_stalls and len(set(stalled)) == n_stalls
    assert state.iteration == 100 and state.history[-1]["recoveries"] >= n_stalls
    assert left == 0
    assert kept == []


def test_a_lost_scheduler_is_reported_at_once(problem):
    """Losing the scheduler ends the fit at once with a RuntimeError that says so (it was
    an OSError after the client's reconnection timeout, 30 s by default; 2 s here, also
    for closing the cluster without its scheduler)."""
    import dask
    X, chunks, params, net = problem
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                     dashboard_address=DASHBOARD) as cluster, \
            distributed.Client(cluster) as c:
        closed = []

        def close_scheduler(state):
            if not closed:
                closed.append(time.perf_counter())
                cluster.sync(cluster.scheduler.close)

        with pytest.raises(RuntimeError, match="the scheduler was lost") as err:
            fit_svi_distributed(chunks, params, net, c, max_iter=300, log_every=20,
                                random_state=SEED, progress=False, callback=close_scheduler,
                                step_timeout=20.0, setup_timeout=20.0)
        wall = time.perf_counter() - closed[0]
    print(f"raised {wall:.1f} s after the scheduler closed: {err.value}")
    assert wall < 1.5


def test_the_fit_calls_through_its_own_client(problem, client):
    """The shards are called through the fit's client, not Dask's default one (the
    newest): with a second client, closing it mid-fit lost every shard."""
    print(f"seed={SEED}")
    _, chunks, params, net = problem
    with distributed.Client(client.scheduler.address) as other:  # now the current client
        assert distributed.default_client() is other

        def close_other(state):
            other.close()

        state = fit_svi_distributed(chunks, params, net, client, max_iter=40, log_every=10,
                                    random_state=SEED, progress=False, callback=close_other,
                                    step_timeout=20.0, setup_timeout=5.0)
    print(f"history {state.history[-1]}")
    assert state.iteration == 40 and state.history[-1]["recoveries"] == 0


# ---------------------------------------------------------------- process workers
@pytest.fixture(scope="module")
def process_client():
    """Two worker processes, each under a nanny that restarts it when it dies."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=DASHBOARD) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def _signal_worker(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # already gone (its nanny may have replaced it)
        pass


def test_silent_worker_is_timed_out(problem, process_client):
    """A worker that stops answering (SIGSTOP: alive, connected, silent) costs one
    ``step_timeout``, then its shard moves to the other worker. (5 s: on a loaded machine
    a healthy worker can miss 3 s, and counted as a second recovery.)"""
    X, chunks, params, net = problem
    process_client.wait_for_workers(2, timeout=60)
    pids = process_client.run(os.getpid)
    address = sorted(pids)[0]
    stopped = []

    def stop_once(state):
        if not stopped:
            os.kill(pids[address], signal.SIGSTOP)
            stopped.append(time.perf_counter())

    try:
        state = fit_svi_distributed(chunks, params, net, process_client, max_iter=200,
                                    log_every=40, random_state=SEED, progress=False,
                                    callback=stop_once, step_timeout=5.0)
    finally:
        _signal_worker(pids[address], signal.SIGCONT)
    after = time.perf_counter() - stopped[0]
    print(f"stopped {address}; the fit ended {after:.1f} s later; history {state.history[-1]}")
    assert state.iteration == 200
    assert state.history[-1]["recoveries"] == 1
    assert 5.0 <= after < 40


def test_killed_worker_is_survived(problem, process_client, tmp_path, monkeypatch):
    """A killed worker's shard is re-created and the step repeated: every step the fit
    takes is a whole batch, every shard's part of it answered."""
    X, chunks, params, net = problem
    process_client.wait_for_workers(2, timeout=60)
    paths = write_npy_chunks(X, tmp_path, N_CHUNKS)
    # every shard holds a file (re-opened on recovery) and an array (sent again)
    mixed = paths[:2] + chunks[2:]
    pids = process_client.run(os.getpid)
    address = sorted(pids)[0]
    killed = []

    def kill_once(state):
        if not killed:
            _signal_worker(pids[address], signal.SIGKILL)
            killed.append(time.perf_counter())

    gradients = dl._ShardPool.gradients
    rounds, partial = [], []

    def checked(pool, x, counts):
        results = gradients(pool, x, counts)
        rounds.append(pool.recoveries)
        # a shard asked for n subchains counts at least one position of each
        if len(results) != len(counts) or any(n > 0 and r[1] < n for r, n in zip(results, counts)):
            partial.append((len(rounds), counts.tolist(), [r[1] for r in results]))
        return results

    monkeypatch.setattr(dl._ShardPool, "gradients", checked)
    state = fit_svi_distributed(mixed, params, net, process_client, max_iter=300, log_every=50,
                                random_state=SEED, progress=False, callback=kill_once,
                                step_timeout=20.0, setup_timeout=30.0)
    after = time.perf_counter() - killed[0]
    print(f"killed {address}; the fit ended {after:.1f} s later; history {state.history[-1]}; "
          f"steps with part of the batch: {partial}")
    assert len(rounds) == 300 and rounds[-1] >= 1   # (the steps after the loss too)
    assert partial == []
    assert state.iteration == 300
    assert state.history[-1]["recoveries"] >= 1
    assert after < 30
    assert np.isfinite(state.state_vector()).all()
    assert _loglik(state.params, chunks) > _loglik(params, chunks)


def test_relative_paths_name_the_same_files_on_the_workers(problem, process_client, tmp_path,
                                                           monkeypatch):
    """A relative path is made absolute where it was checked, on the driver: workers
    started elsewhere (as a service's are) opened it against their own directory
    (FileNotFoundError)."""
    X, _, params, net = problem
    process_client.wait_for_workers(2, timeout=60)
    monkeypatch.chdir(tmp_path)
    paths = write_npy_chunks(X[:600], "data", 2)
    assert paths == [str(tmp_path / "data" / f"chunk_{i:05d}.npy") for i in range(2)]
    relative = [os.path.relpath(p) for p in paths]
    assert not any(os.path.isabs(p) for p in relative)
    home = process_client.run(os.getcwd)
    process_client.run(os.chdir, "/")
    try:
        mean, _ = chunk_scaler(relative, process_client)
        state = fit_svi_distributed(relative, params, net, process_client, max_iter=5,
                                    random_state=SEED, progress=False)
    finally:
        for address, directory in home.items():
            process_client.run(os.chdir, directory, workers=[address])
    np.testing.assert_allclose(mean, X[:600].mean(axis=0), rtol=1e-12)
    assert state.iteration == 5


def test_estimator_fit_with_client():
    """FHMM.fit(client=...) trains on the cluster and matches a local fit's quality."""
    from distributed import Client, LocalCluster

    from streamfhmm import FHMM
    seed = 5
    print(f"seed={seed}")
    true = FHMM.from_params(W=[[1.0, -1.0], [1.5, 1.0], [0.0, 0.0]], covariance=0.1 * np.eye(2),
                            transmat=[[[0.95, 0.05], [0.1, 0.9]], [[0.9, 0.1], [0.05, 0.95]]])
    X, _ = true.sample(2000, random_state=seed)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        m = FHMM(n_chains=2, window=5, n_hidden=8, random_state=seed)
        m.fit(X, lengths=[1000, 1000], max_iter=1500, progress=False, client=client)
        chunks = [X[:1000], X[1000:]]
        m2 = FHMM(n_chains=2, window=5, n_hidden=8, random_state=seed)
        m2.fit(chunks, max_iter=1500, progress=False, client=client)
        with pytest.raises(ValueError, match="method='svi' only"):
            FHMM(n_chains=2).fit(X, method="smf", client=client)
    ll_true = true.score(X) / len(X)
    for model in (m, m2):
        ll = model.score(X, [1000, 1000]) / len(X)
        print(f"distributed fit {ll:.4f} true {ll_true:.4f}")
        assert ll > ll_true - 0.02
    assert np.array_equal(m.W_, m2.W_)


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_covariance_family_is_kept(problem, client, covariance_type):
    """The driver maps the workers' summed gradient to the family: Σ stays on it."""
    _, chunks, params, net = problem
    print(f"covariance_type={covariance_type}")
    kw = dict(max_iter=60, progress=False, batch_size=6, random_state=4)
    st = fit_svi_distributed(chunks, params, net, client, covariance_type=covariance_type, **kw)
    assert st.covariance_type == covariance_type
    L = st.params.L
    assert L[1, 0] == 0.0
    if covariance_type == "spherical":
        assert L[0, 0] == L[1, 1]
    start = params.L @ params.L.T
    # the learnt variances moved away from the projected start
    assert abs(L[0, 0] ** 2 - (start[0, 0] if covariance_type == "diag"
                               else np.trace(start) / 2)) > 1e-4
    st = fit_svi_distributed(chunks, None, None, client, state=st, **kw)
    assert st.params.L[1, 0] == 0.0


# ---------------------------------------------------------------- failures while starting
@pytest.mark.parametrize("where", ["scatter", "submit"])
def test_worker_lost_while_the_shards_start(problem, client, monkeypatch, where):
    """A worker lost while its shard's data is sent (the scatter fails: CommClosedError
    is an OSError) or while its actor starts (the scheduler drops the future:
    FutureCancelledError) costs one recovery, not the fit (both escaped before)."""
    X, chunks, params, net = problem
    original = getattr(client, where)
    failed = []

    def failing(*args, **kwargs):
        if failed:
            return original(*args, **kwargs)
        failed.append(kwargs.get("workers"))
        if where == "scatter":
            raise OSError("connection closed (simulated)")
        fut = original(*args, **kwargs)
        fut.cancel()
        return fut

    monkeypatch.setattr(client, where, failing)
    state = fit_svi_distributed(chunks, params, net, client, max_iter=30, log_every=10,
                                random_state=SEED, progress=False, setup_timeout=30.0)
    print(f"{where} failed on {failed}; history {state.history[-1]}")
    assert len(failed) == 1
    assert state.iteration == 30 and state.history[-1]["recoveries"] == 1


def test_a_failed_fit_keeps_its_steps_in_the_state(problem, client, monkeypatch):
    """A fit that raises part-way (here the 25th round of gradients) leaves the caller's
    state at its last step: before, the parameters stayed where the call started while
    the iteration count and the RMSprop statistics had moved on."""
    X, chunks, params, net = problem
    state = fit_svi_distributed(chunks, params, net, client, max_iter=10, random_state=SEED,
                                progress=False)
    start = state.state_vector().copy()
    gradients = dl._ShardPool.gradients
    calls = []

    def failing(pool, x, counts):
        calls.append(1)
        if len(calls) == 25:
            raise RuntimeError("shard lost (simulated)")
        return gradients(pool, x, counts)

    monkeypatch.setattr(dl._ShardPool, "gradients", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        fit_svi_distributed(chunks, None, None, client, state=state, max_iter=300,
                            log_every=1000, random_state=SEED, progress=False)
    print(f"iteration {state.iteration}, optimiser steps {state.opt.steps}")
    assert state.iteration == 10 + 24 and state.opt.steps == state.iteration
    assert not np.array_equal(state.state_vector(), start)   # the 24 steps are in it
    assert np.isfinite(state.state_vector()).all()


def test_recovery_stays_on_the_given_workers(problem, monkeypatch):
    """``workers=``: a lost shard is re-created on one of them, not elsewhere."""
    X, chunks, params, net = problem
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False,
                                  dashboard_address=DASHBOARD) as cluster, \
            distributed.Client(cluster) as c:
        names = sorted(cluster.workers)
        given = [cluster.workers[n].address for n in names[:2]]
        placed = []
        submit = dl._ShardPool._submit

        def recording(pool, shard, address):
            placed.append(address)
            return submit(pool, shard, address)

        monkeypatch.setattr(dl._ShardPool, "_submit", recording)

        def close_first(st):
            if len(cluster.workers) == 3:
                cluster.sync(cluster.workers[names[0]].close)

        state = fit_svi_distributed(chunks, params, net, c, workers=given, max_iter=60,
                                    log_every=10, random_state=SEED, progress=False,
                                    callback=close_first, step_timeout=20.0)
    print(f"given {given}; placed {placed}; history {state.history[-1]}")
    assert state.history[-1]["recoveries"] >= 1 and len(placed) > 2
    assert set(placed) <= set(given)


def test_a_restarted_worker_takes_its_shard_back(problem):
    """Without workers=, recovery may use any worker of the cluster: a one-worker cluster
    whose worker is killed and restarted by its nanny (on a new address) goes on there
    (for a moment the recovery considered only the workers of the fit's start)."""
    X, chunks, params, net = problem
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=DASHBOARD) as cluster, \
            distributed.Client(cluster) as c:
        c.wait_for_workers(1, timeout=60)
        pids = c.run(os.getpid)
        before = sorted(pids)
        killed = []

        def kill_once(state):
            if not killed:
                _signal_worker(pids[before[0]], signal.SIGKILL)
                killed.append(1)

        state = fit_svi_distributed(chunks, params, net, c, max_iter=100, log_every=25,
                                    random_state=SEED, progress=False, callback=kill_once,
                                    step_timeout=20.0, setup_timeout=60.0)
        after = sorted(c.nthreads())
    print(f"workers before {before}, after {after}; history {state.history[-1]}")
    assert state.iteration == 100 and state.history[-1]["recoveries"] >= 1
    assert after != before


def test_expected_blocks_match_the_sampler():
    """The batch split's weights: the mean number of subchains an epoch of the sampler
    cuts from each sequence."""
    from streamfhmm.learn.sampler import SubchainSampler, expected_subchains
    seed = 11
    print(f"seed={seed}")
    lengths = np.array([1, 2, 5, 6, 9, 10, 11, 23, 40])
    for L in (1, 5, 10):
        bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        sampler = SubchainSampler(bounds, L, 1, np.random.default_rng(seed))
        n_epochs = 4000
        counts = np.zeros(len(lengths))
        for _ in range(n_epochs):
            _, _, lo, _ = sampler._epoch_blocks()
            counts += np.bincount(np.searchsorted(bounds, lo), minlength=len(lengths))
        np.testing.assert_allclose(counts / n_epochs, expected_subchains(lengths, L),
                                   rtol=0.02)


def test_every_position_is_used_equally_often(problem, client, monkeypatch):
    """A shard of short sequences and a shard of one long one: their positions are used
    equally often, as by the local learner (the batch was split by positions, so the
    long sequence's were used 4.8 times as often as the short ones')."""
    seed = 3
    print(f"seed={seed}")
    _, _, params, net = problem
    rng = np.random.default_rng(seed)
    lengths = [1000] + [2] * 200
    X = rng.standard_normal((sum(lengths), 2))
    chunks = np.split(X, np.cumsum(lengths)[:-1])
    used = {}   # shard's number of positions -> counted positions its subchains used
    fill = dl._ShardLearner._fill

    def recording(shard, n_blocks):   # in-process workers: the actors are in this process
        c0 = shard.sampler.cursor
        fill(shard, n_blocks)
        q = shard.sampler
        n = int((q.q_stop[c0:c0 + n_blocks] - q.q_start[c0:c0 + n_blocks]).sum())
        used[shard.n_positions] = used.get(shard.n_positions, 0) + n

    monkeypatch.setattr(dl._ShardLearner, "_fill", recording)
    steps = 1500
    fit_svi_distributed(chunks, params, net, client, max_iter=steps, batch_size=10,
                        subchain_length=10, random_state=seed, progress=False)
    rate_long, rate_short = used[1000] / 1000 / steps, used[400] / 400 / steps
    print(f"uses per position and step: long sequence {rate_long:.4f}, short ones "
          f"{rate_short:.4f}")
    assert set(used) == {1000, 400}
    assert abs(rate_long / rate_short - 1) < 0.1


def test_head_rows_reads_only_its_rows(tmp_path):
    """head_rows reads (and checks) the rows it returns, not the rest of the file: an
    infinity past them does not stop it (the whole file was scanned before)."""
    seed = 2
    print(f"seed={seed}")
    X = np.random.default_rng(seed).standard_normal((3 * dl._SCAN_ROWS, 3))
    X[-1, 2] = np.inf
    path = str(tmp_path / "c.npy")
    np.save(path, X)
    np.testing.assert_array_equal(head_rows([path], 5), X[:5])
    X[3, 1] = np.inf
    np.save(path, X)
    with pytest.raises(ValueError, match="infinity at row 3, column 1"):
        head_rows([path], 5)
    X[3] = np.nan
    np.save(path, X)
    with pytest.raises(ValueError, match=r"every value missing \(row 3\)"):
        head_rows([path, path], 5)


def test_chunk_scaler_sends_only_paths(problem, client, tmp_path, monkeypatch):
    """In-memory chunks are scanned on the driver: they were put into the tasks (through
    the scheduler, a 'large graph' warning for big arrays) before the fit sent them
    again."""
    X, chunks, _, _ = problem
    paths = write_npy_chunks(X[:1000], tmp_path, 2)
    mixed = paths + list(np.array_split(X[1000:], 2))
    sent = []
    submit = client.submit

    def spy(fn, *args, **kwargs):
        sent.append(args)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(client, "submit", spy)
    mean, scale = chunk_scaler(mixed, client)
    ref = RecognitionNet(2, 2).fit_scaler(X)
    np.testing.assert_allclose(mean, ref.mean, rtol=1e-12)
    np.testing.assert_allclose(scale, ref.scale, rtol=1e-12)
    assert not any(isinstance(v, np.ndarray) for a in sent for v in a)
    assert sorted(a[0] for a in sent) == sorted(paths)


@pytest.mark.parametrize("units", [1.0, 1e-13, 1e13])
def test_chunk_scaler_is_fit_scaler_in_any_units(client, tmp_path, units):
    """chunk_scaler on chunks (in memory, .npy files scanned here or by the workers) is
    fit_scaler on their concatenation, in any units: a feature counts as constant by its
    spread against its largest magnitude. Before, a floor of 1e-12·max(1, |mean|) took
    data in units of 1e-13 for constant (scale 1, where fit_scaler gives ~1e-13)."""
    seed = 31
    print(f"seed={seed}, units={units}")
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((600, 5)) * [1.0, 2.0, 0.5, 1.0, 1.0] + [0.0, 3.0, -1.0, 0.0, 0.0]
    base[:, 3] = 7.0   # a constant feature
    base[:, 4] = 0.0   # a feature of zeros
    base[rng.random(base.shape) < 0.05] = np.nan
    X = base * units + 3.0 * units   # X·c + shift
    chunks = [X[:50], X[50:320], X[320:]]
    paths = write_npy_chunks(X, tmp_path, 3)
    ref = RecognitionNet(2, 5).fit_scaler(X)
    assert np.all(ref.scale[:3] < 10 * units) and np.all(ref.scale[3:] == 1.0)
    for source, c in ((chunks, None), (paths, None), (paths, client)):
        mean, scale = chunk_scaler(source, client=c)
        print(f"scale {scale}, fit_scaler's {ref.scale}")
        np.testing.assert_allclose(mean, ref.mean, rtol=1e-12, atol=1e-12 * units)
        np.testing.assert_allclose(scale, ref.scale, rtol=1e-12)
        assert np.all(scale[3:] == 1.0)   # constant: scale 1, as fit_scaler's


def test_tiny_chunks_are_refused_as_one_tiny_array(problem, client, tmp_path):
    """Chunks whose feature varies below 1e-150 in magnitude over every chunk get the
    message a single array gets ("rescale the data"), before any fitting; before, a list
    of chunks failed in the initialisation with an error about an internal argument
    ("floor must be 2 positive finite variances")."""
    print(f"seed={SEED}")
    X, chunks, params, net = problem
    tiny = [c * 1e-160 for c in chunks]
    message = r"column 0 holds no value larger than .* in magnitude.*rescale the data"
    with pytest.raises(ValueError, match=message):
        FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(X * 1e-160, max_iter=5,
                                                                       progress=False,
                                                                       client=client)
    with pytest.raises(ValueError, match=message):
        FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(tiny, max_iter=5,
                                                                       progress=False,
                                                                       client=client)
    with pytest.raises(ValueError, match=message):
        fit_svi_distributed(tiny, params, net, client, max_iter=2, progress=False)
    paths = write_npy_chunks(X * 1e-160, tmp_path / "tiny", 2)
    for source, c in ((tiny, None), (paths, None), (paths, client)):
        with pytest.raises(ValueError, match=message):
            chunk_scaler(source, client=c)
    with pytest.raises(ValueError, match=message):   # (.npy files: scanned before the start)
        FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(paths, max_iter=5,
                                                                       progress=False,
                                                                       client=client)
    # constant in each chunk, varying across them: refused all the same
    steps = [np.full((10, 2), 1e-160), np.full((10, 2), 2e-160)]
    for c in steps:
        c[:, 0] = 1.0
    with pytest.raises(ValueError, match=r"column 1 holds no value larger than 2e-160"):
        chunk_lengths(steps)
    # accepted: a tiny chunk beside a chunk of ordinary magnitude, a feature of zeros with
    # a lone tiny value, a feature that is tiny but constant over every chunk
    lone = np.zeros((10, 2))
    lone[:, 0] = np.arange(10.0)
    lone[3, 1] = 1e-200
    same = [np.full((10, 2), 1e-160), np.full((10, 2), 1e-160)]
    same[0][:, 0] = np.arange(10.0)
    for ok in ([tiny[0], chunks[1]], [lone, np.zeros((5, 2))], same):
        chunk_scaler(ok)
    chunk_scaler(paths[:1] + [chunks[1]], client)


def test_bad_settings(problem, client):
    """Bad settings raise ValueError saying what was expected, before any worker starts."""
    X, chunks, params, net = problem
    address = sorted(client.nthreads())[0]
    kw = dict(max_iter=2, progress=False)
    cases = [
        (dict(workers=address), "workers must be a list of worker addresses, got str"),
        (dict(step_timeout=True), "step_timeout must be a positive number of seconds"),
        (dict(setup_timeout=-1.0), "setup_timeout must be a positive number of seconds"),
        (dict(state={}), "state must be an SVIState"),
        (dict(direct_to_workers="no"), "direct_to_workers must be True, False or None"),
        (dict(callback=3), "callback must be callable"),
    ]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            fit_svi_distributed(chunks, params, net, client, **kw, **extra)
    # numpy numbers are numbers of seconds
    st = fit_svi_distributed(chunks, params, net, client, step_timeout=np.int64(30),
                             setup_timeout=np.float32(60), random_state=SEED, **kw)
    assert st.iteration == 2
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        chunk_scaler(chunks, client, timeout=-1)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=DASHBOARD) as cluster:
        closed = distributed.Client(cluster)
        closed.close()
        with pytest.raises(ValueError, match="client is closed"):
            fit_svi_distributed(chunks, params, net, closed, **kw)


# ---------------------------------------------------------------- cleanup and checks
def _actors_on_workers(client):
    return sum(client.run(lambda dask_worker: len(dask_worker.state.actors)).values())


def _wait_for_no_actors(client, seconds=10.0):
    """The number of actors left on the workers once they are gone or ``seconds``
    passed (a cancel reaches the workers through the scheduler: not at once)."""
    deadline = time.monotonic() + seconds
    n = _actors_on_workers(client)
    while n and time.monotonic() < deadline:
        time.sleep(0.1)
        n = _actors_on_workers(client)
    return n


def test_a_shard_that_fails_to_start_leaves_nothing_behind(problem, client, tmp_path):
    """A bad .npy chunk fails its shard's start with the data error; the other shard's
    actor, the failed one's future and the scattered arrays went with it (before, they
    stayed on the workers and in the client for good: the error kept by the client
    referred to them through its traceback)."""
    print(f"seed={SEED}")
    X, chunks, params, net = problem
    bad = X[:100].copy()
    bad[7, 0] = np.inf
    np.save(tmp_path / "inf.npy", bad)
    before = set(client.futures)
    # two shards: chunks[0] (scattered) with the bad file, chunks[1] alone (it starts)
    mixed = [chunks[0], chunks[1], str(tmp_path / "inf.npy")]
    with pytest.raises(ValueError, match="infinity at row 7"):
        fit_svi_distributed(mixed, params, net, client, max_iter=5, random_state=SEED,
                            progress=False)
    gc.collect()
    left = _wait_for_no_actors(client)
    kept = sorted(set(client.futures) - before)
    print(f"actors left {left}, futures kept {kept}")
    assert left == 0
    assert kept == []


def test_the_actors_leave_the_workers_with_the_fit(problem, client):
    """When a fit returns, its actors are cancelled: the workers drop them without the
    driver's cyclic garbage collector (disabled here), which they waited for before."""
    print(f"seed={SEED}")
    _, chunks, params, net = problem
    gc.collect()
    gc.disable()
    try:
        state = fit_svi_distributed(chunks, params, net, client, max_iter=5,
                                    random_state=SEED, progress=False)
        left = _wait_for_no_actors(client)
    finally:
        gc.enable()
    print(f"iterations {state.iteration}, actors left {left}")
    assert state.iteration == 5
    assert left == 0


def test_a_wrong_client_is_refused_before_any_work(problem, tmp_path, monkeypatch):
    """A client that is not a distributed.Client raises ValueError at once: with .npy
    chunks it was an AttributeError from chunk_scaler, with arrays a ValueError only
    after the model's initialisation."""
    X, _, params, net = problem
    paths = write_npy_chunks(X, tmp_path, 2)
    message = "client must be a distributed.Client, got str"

    def initialise(self, *args, **kwargs):
        raise AssertionError("the model was initialised before the client was checked")

    monkeypatch.setattr(FHMM, "_initial_params", initialise)
    for data in (paths, X):
        with pytest.raises(ValueError, match=message):
            FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(
                data, max_iter=5, progress=False, client="tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match=message):
        chunk_scaler(paths, "tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match="client must be a distributed.Client, got object"):
        fit_svi_distributed(paths, params, net, object(), max_iter=1, progress=False)


def test_log_every_is_checked_before_the_workers_start(problem, client, monkeypatch):
    """log_every="10" failed with TypeError after the workers started; -5 and 2.5 were
    taken silently."""
    _, chunks, params, net = problem
    started = []
    monkeypatch.setattr(dl._ShardPool, "start", lambda pool: started.append(1))
    for bad in ("10", -5, 2.5, 0, True):
        with pytest.raises(ValueError, match="log_every must be an integer >= 1"):
            fit_svi_distributed(chunks, params, net, client, max_iter=5, log_every=bad,
                                progress=False)
    assert started == []


def test_a_step_sums_every_shards_gradient(problem, client, monkeypatch):
    """One driver step's summed ELBO terms, gradient and counted positions equal one
    batch_gradient over the same subchains. Every chunk is no longer than a subchain and
    the batch holds as many subchains as there are chunks, split 3 + 3 over the two
    shards: the first step uses every chunk once, whole, whatever the shards' shuffles."""
    print(f"seed={SEED}")
    from streamfhmm.kernels import svi as ks
    X, _, params, net = problem
    lengths = [5, 8, 3, 8, 7, 2]
    L = max(lengths)
    data = X[:sum(lengths)]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    chunks = np.split(data, bounds[1:-1])
    steps = []
    apply = dl.apply_gradient_sum

    def recording(x, grad, value, counted, *args):
        steps.append((x.copy(), grad.copy(), value, counted))
        return apply(x, grad, value, counted, *args)

    monkeypatch.setattr(dl, "apply_gradient_sum", recording)
    fit_svi_distributed(chunks, params, net, client, max_iter=1, batch_size=len(lengths),
                        subchain_length=L, random_state=SEED, progress=False)
    x, grad, value, counted = steps[0]
    # the reference: every chunk one whole subchain, over the concatenated data
    n = len(data)
    rows = np.arange(n, dtype=np.int64)
    seq = np.repeat(np.arange(len(lengths)), lengths)
    row_start, row_end = bounds[seq], bounds[seq + 1]
    first = np.ones(len(lengths), dtype=bool)
    M, D = net.n_chains, net.n_features
    scratch = [np.empty((n, k)) for k in (net.n_inputs, net.n_groups * net.n_hidden,
                                          M, M, M, M, D)]
    g_ref = np.empty_like(x)
    v_ref, c_ref = ks.batch_gradient(data, rows, row_start, row_end, bounds, first,
                                     net.window, net.offset, net.mean, net.scale, x,
                                     x.size - net.n_weights, net.layout, M, D, *scratch, g_ref)
    print(f"counted {counted} (reference {c_ref}), value {value:.6f} (reference {v_ref:.6f})")
    assert counted == c_ref == n
    np.testing.assert_allclose(value, v_ref, rtol=1e-12)
    np.testing.assert_allclose(grad, g_ref, rtol=1e-10, atol=1e-12)


def test_a_nested_list_is_one_array_not_chunks(problem, client):
    """fit(X.tolist(), client=...) is fit(X, client=...), as without a client: a list of
    rows of numbers was taken for a list of chunks (and refused: 'chunks[0] must be a
    2-D array')."""
    print(f"seed={SEED}")
    X = problem[0][:400]
    kw = dict(max_iter=20, progress=False, client=client)
    a = FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(X.tolist(), **kw)
    b = FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED).fit(X, **kw)
    assert a.n_features_in_ == 2 and a.history_[-1]["iteration"] == 20
    np.testing.assert_array_equal(a.W_, b.W_)


def test_a_refused_dask_fit_keeps_the_earlier_fits_scores(problem, client):
    """As the local fit: a fit with a client refused inside its start (no complete row to
    initialise from) keeps init_scores_ (they were cleared, beside the earlier fit's
    parameters)."""
    X = problem[0][:400]
    bad = X.copy()
    bad[::2, 0] = np.nan
    bad[1::2, 1] = np.nan                    # no complete row
    m = FHMM(n_chains=2, window=3, n_hidden=4, random_state=SEED)
    m.fit(X, init="smf", n_init=2, max_iter=20, progress=False)
    scores = m.init_scores_.copy()
    assert scores.size == 2
    with pytest.raises(ValueError, match="too few complete rows"):
        m.fit(bad, init="smf", n_init=2, max_iter=20, progress=False, client=client)
    np.testing.assert_array_equal(m.init_scores_, scores)


def test_a_refused_or_unstarted_fit_leaves_the_state_as_it_was(problem, client, tmp_path,
                                                               monkeypatch):
    """fit_svi_distributed(state=...) set the state's covariance_type before checking its
    input: a refused call left it changed (the next fit continued on the refused call's
    family), and a fit failing before its first step (a chunk a worker refuses, a first
    round of gradients that fails) stored the model projected onto the new family. A
    call refused, or failing before its first step, leaves the state as it was, as the
    local fit_svi does."""
    print(f"seed={SEED}")
    X, chunks, params, net = problem
    state = fit_svi_distributed(chunks, params, net, client, max_iter=5, random_state=SEED,
                                progress=False)
    assert state.covariance_type == "full" and state.params.L[1, 0] != 0.0

    def snapshot():
        return (state.covariance_type, state.state_vector().copy(), state.opt.sq.copy(),
                state.opt.steps, state.iteration, state.seconds, len(state.history))

    def check_unchanged(what):
        now = snapshot()
        assert now[0] == start[0], what
        for a, b in zip(now[1:], start[1:]):
            np.testing.assert_array_equal(a, b, err_msg=what)

    start = snapshot()
    bad = X[:100].copy()
    bad[7, 0] = np.inf
    np.save(tmp_path / "inf.npy", bad)
    refused = [("the chunks have 3 features", [np.zeros((50, 3))], {}),
               ("workers must be addresses", chunks, {"workers": ["tcp://nowhere:1"]}),
               # (refused by a worker while the shards start)
               ("infinity at row 7", [str(tmp_path / "inf.npy")], {})]
    for cov in ("diag", "spherical"):
        for message, data, kw in refused:
            with pytest.raises(ValueError, match=message):
                fit_svi_distributed(data, None, None, client, state=state, covariance_type=cov,
                                    max_iter=5, random_state=SEED, progress=False, **kw)
            check_unchanged(f"{cov}: {message}")

    def failing(pool, x, counts):
        raise RuntimeError("shard lost (simulated)")

    with monkeypatch.context() as mp:
        mp.setattr(dl._ShardPool, "gradients", failing)
        with pytest.raises(RuntimeError, match="simulated"):
            fit_svi_distributed(chunks, None, None, client, state=state, covariance_type="diag",
                                max_iter=5, random_state=SEED, progress=False)
    check_unchanged("a first step that fails")
    # continued without a family: the state's own, full
    state = fit_svi_distributed(chunks, None, None, client, state=state, max_iter=5,
                                random_state=SEED, progress=False)
    assert state.covariance_type == "full" and state.params.L[1, 0] != 0.0
    assert state.iteration == state.opt.steps == 10


def test_npy_chunks_of_every_format_version(problem, client, tmp_path):
    """A valid format-3.0 .npy chunk (numpy writes one for a header latin-1 cannot encode,
    or when asked) raised AttributeError: its header was read with numpy's private
    reader, which numpy 2 no longer has. Versions 1.0 to 3.0 are read with the public
    readers (3.0 is 2.0 with a UTF-8 header); another version, or a file that is not a
    .npy one, is a ValueError naming the chunk."""
    print(f"seed={SEED}")
    X, _, params, net = problem
    paths = []
    for version in ((1, 0), (2, 0), (3, 0)):
        path = str(tmp_path / f"v{version[0]}.npy")
        with open(path, "wb") as fh:
            np.lib.format.write_array(fh, X[:300], version=version)
        assert chunk_lengths([path]).tolist() == [300]
        shape, _, dtype, offset = dl._npy_header(path)
        mapped = np.load(path, mmap_mode="r")
        assert (shape, dtype, offset) == (mapped.shape, mapped.dtype, mapped.offset)
        np.testing.assert_array_equal(head_rows([path], 5), X[:5])
        paths.append(path)
    state = fit_svi_distributed(paths, params, net, client, max_iter=3, random_state=SEED,
                                progress=False)
    assert state.iteration == 3
    with open(paths[2], "rb") as fh:
        raw = fh.read()
    with open(tmp_path / "v9.npy", "wb") as fh:
        fh.write(raw[:6] + b"\x09\x00" + raw[8:])
    with pytest.raises(ValueError, match=r"^chunk '.*v9.npy' is a .npy file of an unsupported "
                                         r"format version 9.0 \(expected 1.0, 2.0 or 3.0\)$"):
        chunk_lengths([str(tmp_path / "v9.npy")])
    with open(tmp_path / "text.npy", "wb") as fh:
        fh.write(b"1.0,2.0\n3.0,4.0\n")
    with pytest.raises(ValueError, match=r"^chunk '.*text.npy' is not a .npy file"):
        chunk_lengths([str(tmp_path / "text.npy")])
