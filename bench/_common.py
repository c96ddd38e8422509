"""Shared helpers for the benchmark scripts: timing, tables, the machine's peak."""
from __future__ import annotations

import os
import platform
import time

import numpy as np


def int_in(low: int, high: int | None = None):
    """An argparse ``type``: an integer in ``[low, high]`` (a usage error otherwise, not
    a traceback after the set-up)."""
    import argparse

    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < low or (high is not None and v > high):
            want = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return v
    return parse


def best_time(fn, repeat: int = 3, min_time: float = 0.2) -> float:
    """Best wall time of ``fn()`` over ``repeat`` rounds (each round ≥ ``min_time`` s)."""
    best = np.inf
    for _ in range(repeat):
        n = 0
        t0 = time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best = min(best, dt / n)
    return best


def matmul_peak_flops(n: int = 1024, repeat: int = 5) -> float:
    """The machine's measured double-precision peak: FLOP/s of a large BLAS matrix product."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))
    a @ b
    t = best_time(lambda: a @ b, repeat=repeat, min_time=0.3)
    return 2.0 * n**3 / t


def header(title: str):
    print(f"# {title}")
    print(f"# python {platform.python_version()}, {os.cpu_count()} cpus, numpy {np.__version__}")


def table(rows, columns):
    """Print a plain-text table; rows are dicts."""
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e7:
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:.3e}"
    return str(v)


def wait_for_line(lines, pattern, proc, reader, timeout: float, tail=None) -> str:
    """Group 1 of the first of ``lines()`` (a process's stderr lines so far, read by the
    thread ``reader``) that matches ``pattern``, polled every 10 ms for ``timeout`` s while
    ``proc`` runs or ``reader`` still reads; else RuntimeError with the last 20 lines
    (``tail()``, default ``lines()``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in lines():
            m = pattern.search(line)
            if m:
                return m.group(1)
        if proc.poll() is not None and not reader.is_alive():
            break
        time.sleep(0.01)
    text = "\n".join((tail or lines)()[-20:])
    raise RuntimeError(f"no line matching {pattern.pattern!r} from pid {proc.pid} "
                       f"(exit status {proc.poll()}): {text}")
