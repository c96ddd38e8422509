"""The ``streamfhmm`` command line (also ``python -m streamfhmm``)."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _cmd_demo(args) -> int:
    from . import FHMM
    from .model import FHMMParams

    params = FHMMParams.random(args.chains, args.features, random_state=args.seed, noise=0.3)
    model = FHMM.from_params(W=params.W, covariance=params.covariance, transmat=params.transmat,
                             startprob=params.startprob)
    X, S = model.sample(args.samples, random_state=args.seed + 1)
    print(f"simulated a sensor stream: {args.samples:,} samples of {args.features} channels "
          f"from {args.chains} hidden on/off processes (seed {args.seed})")
    t0 = time.perf_counter()
    ll = model.score(X)
    t1 = time.perf_counter()
    theta = model.predict_proba(X)
    t2 = time.perf_counter()
    acc = np.mean((theta > 0.5) == S, axis=0)
    print(f"exact log-likelihood: {ll / len(X):.4f} nats per sample "
          f"({len(X) / (t1 - t0):,.0f} samples/s)")
    print(f"exact smoothing over {2 ** args.chains} joint states: {len(X) / (t2 - t1):,.0f} samples/s")
    for m, a in enumerate(acc):
        print(f"  chain {m}: on {S[:, m].mean():5.1%} of the time, state recovered at {a:6.1%} of samples")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamfhmm", description="Streaming inference for factorial HMMs.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="simulate a sensor stream and infer its hidden processes")
    d.add_argument("--chains", type=int, default=4, help="hidden chains (default 4)")
    d.add_argument("--features", type=int, default=3, help="sensor channels (default 3)")
    d.add_argument("--samples", type=int, default=20000, help="samples to simulate (default 20000)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"streamfhmm {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
