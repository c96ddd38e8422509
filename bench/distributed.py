"""Learning speed of the Dask learner against the local one, measured in the same run.

    python bench/distributed.py [--steps 400] [--batches 10 200] [--threads]

M = 10 chains, D = 6, window 21, one shared hidden layer of 200 tanh units, subchains
of 5 positions. For each batch size (subchains per step) it times the local learner
(:func:`streamfhmm.learn.svi.fit_svi`) and :func:`streamfhmm.learn.distributed.fit_svi_distributed`
on a ``LocalCluster`` of 1 and 2 single-threaded workers (worker processes; ``--threads``
for in-process workers), and prints positions per second, milliseconds per step, the
slowest worker's compute time per step and the per-step overhead (step time minus that
compute: sending the parameters, returning the gradient sums, the driver's update),
with ratios against the local learner.

What to expect: a step of 10 subchains takes about a millisecond to compute, less than
one round trip to a worker process, so the local learner wins at the paper's batch
size. Distribution pays only when a step's compute dwarfs the round trip — large
batches, and workers on separate cores or machines; on one 2-core machine shared with
the driver it mostly cannot. The script prints a projected break-even batch size from
the measured overhead and compute, for 2 workers each on a core of its own (a model,
not a measurement: on this 2-core machine the workers share the cores with the driver
and with each other), and beside it what the same run measured at each batch size.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

# this script's name shadows the Dask package: take its directory off the front of the
# path before importing Dask, and put it back at the end for ``_common``
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
from distributed import Client, LocalCluster  # noqa: E402
sys.path.append(_HERE)
from _common import header, table  # noqa: E402

from streamfhmm.learn.distributed import fit_svi_distributed  # noqa: E402
from streamfhmm.learn.svi import fit_svi  # noqa: E402
from streamfhmm.model import FHMMParams  # noqa: E402
from streamfhmm.network import RecognitionNet  # noqa: E402

M, D, WINDOW, HIDDEN, L = 10, 6, 21, 200, 5
T, N_CHUNKS = 100_000, 8


def _steps_for(batch, steps):
    return max(40, steps * 10 // batch)


def time_local(X, bounds, params, net, batch, steps):
    kw = dict(batch_size=batch, subchain_length=L, rng=np.random.default_rng(0), progress=False)
    fit_svi(X, bounds, params, net, max_iter=10, **kw)  # compile / load the cache
    n = _steps_for(batch, steps)
    t = time.perf_counter()
    fit_svi(X, bounds, params, net, max_iter=n, **kw)
    dt = (time.perf_counter() - t) / n
    return {"ms/step": 1e3 * dt, "compute ms": 1e3 * dt, "overhead ms": 0.0,
            "positions/s": batch * L / dt}


def time_dask(chunks, params, net, client, batch, steps):
    kw = dict(batch_size=batch, subchain_length=L, random_state=0, progress=False)
    n = _steps_for(batch, steps)
    fit_svi_distributed(chunks, params, net, client, max_iter=10, **kw)  # warm the workers
    state = fit_svi_distributed(chunks, params, net, client, max_iter=n, log_every=n, **kw)
    h = state.history[-1]
    dt = h["compute"] + h["overhead"]
    return {"ms/step": 1e3 * dt, "compute ms": 1e3 * h["compute"],
            "overhead ms": 1e3 * h["overhead"], "positions/s": batch * L / dt}


class _Echo:
    """Returns a vector of the parameters' size: Dask's bare round trip, no compute."""

    def call(self, x):
        return x.copy()


def time_round_trip(client, size, n=200):
    """Milliseconds for one call to every worker with a ``size`` vector each way."""
    actors = [client.submit(_Echo, actor=True, workers=[w], pure=False).result()
              for w in sorted(client.nthreads())]
    x = np.zeros(size)
    for _ in range(20):
        [f.result() for f in [a.call(x) for a in actors]]
    t = time.perf_counter()
    for _ in range(n):
        [f.result() for f in [a.call(x) for a in actors]]
    return 1e3 * (time.perf_counter() - t) / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400,
                    help="steps timed at batch 10 (fewer for larger batches)")
    ap.add_argument("--batches", type=int, nargs="+", default=[10, 200])
    ap.add_argument("--threads", action="store_true",
                    help="in-process workers (threads) instead of worker processes")
    args = ap.parse_args(argv)

    header(f"Dask SVI learner vs local: M={M}, D={D}, window {WINDOW}, {HIDDEN} shared "
           f"hidden units, subchains of {L}; {'thread' if args.threads else 'process'} workers")
    try:
        load = os.getloadavg()[0]
        print(f"# load average at start: {load:.2f}")
    except OSError:
        pass
    params = FHMMParams.random(M, D, random_state=0)
    X, _ = params.sample(T, random_state=1)
    net = RecognitionNet(M, D, window=WINDOW, n_hidden=HIDDEN, share="all").init(random_state=0)
    net.fit_scaler(X)
    chunks = np.array_split(X, N_CHUNKS)
    bounds = np.concatenate([[0], np.cumsum([len(c) for c in chunks])]).astype(np.int64)
    results = {b: {"local": time_local(X, bounds, params, net, b, args.steps)}
               for b in args.batches}
    size = net.n_weights + 2 * M + (M + 1) * D + D * (D + 1) // 2
    trips = {}
    for n_workers in (1, 2):
        with LocalCluster(n_workers=n_workers, threads_per_worker=1,
                          processes=not args.threads, dashboard_address=":0") as cluster, \
                Client(cluster, direct_to_workers=True) as client:
            trips[n_workers] = time_round_trip(client, size)
            for b in args.batches:
                results[b][f"dask x{n_workers}"] = time_dask(chunks, params, net, client, b,
                                                             args.steps)
    rows = []
    for b in args.batches:
        ref = results[b]["local"]["positions/s"]
        for name, r in results[b].items():
            rows.append({"batch": b, "learner": name, **r, "vs local": r["positions/s"] / ref})
    table(rows, ["batch", "learner", "positions/s", "ms/step", "compute ms", "overhead ms",
                 "vs local"])
    print(f"bare Dask round trip (a {size:,}-float vector out and back, no compute): "
          + ", ".join(f"{k} worker{'s' * (k > 1)} {v:.2f} ms" for k, v in trips.items()))
    # break-even: local step = c·B; n workers: c·B/n + overhead
    b0 = args.batches[0]
    c = results[b0]["local"]["ms/step"] / b0
    ovh = results[b0]["dask x2"]["overhead ms"]
    print(f"local compute {c:.3f} ms per subchain; Dask overhead {ovh:.2f} ms per step "
          f"(2 workers, batch {b0}).")
    print(f"PROJECTED break-even with 2 workers each on a separate core (a model: local step = c·B, "
          f"Dask step = c·B/2 + overhead; not measured): batch >= overhead / (c/2) = "
          f"{ovh / (c / 2):.0f} subchains per step.")
    measured = [(b, results[b]["dask x2"]["positions/s"] / results[b]["local"]["positions/s"])
                for b in args.batches]
    faster = [b for b, r in measured if r >= 1]
    print("MEASURED in this run (2 workers sharing this machine's cores with the driver): dask x2 / local = "
          + ", ".join(f"{r:.2f} at batch {b}" for b, r in measured) + "; "
          + (f"Dask faster from batch {faster[0]}" if faster else
             f"the local learner is faster at every batch measured (up to {max(args.batches)})") + ".")


if __name__ == "__main__":
    main()
