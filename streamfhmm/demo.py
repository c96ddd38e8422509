"""``streamfhmm demo``: live disaggregation of household power over ZeroMQ.

The demo starts two real processes on the loopback interface and is itself the third:

* ``streamfhmm serve --cold --learn --learn-samples N`` — a streaming engine with no
  model: it buffers a warm-up (a week by default), initialises an FHMM and recognition
  networks from it, then learns online while it publishes one posterior per sample, up
  to the calibration's last minute (N), and holds its model fixed after it;
* ``streamfhmm replay household`` — the whole-house channels of the household power
  data (active power, reactive power, voltage), one minute per message, at ``rate``
  messages per second;
* this process subscribes to the posteriors (:func:`streamfhmm.io.wire.decode_output`),
  checks that every sequence number arrives, and, knowing the true sub-meter readings,
  fits a non-negative map from the chain posteriors to ``Sub_metering_1..3`` over a
  calibration period right after the warm-up (:func:`streamfhmm.power.fit_submeter_map`),
  beside the baseline of the same period (:func:`streamfhmm.power.fit_aggregate_baseline`).
  From then on it shows the estimated sub-meters live; at the end it scores both on
  the rest of the stream (:func:`streamfhmm.power.disaggregation_metrics`) and plots one
  day.

The engine never sees a sub-meter: the chains are learnt from the aggregate alone; the
calibration only names them. The map is fitted once, so the service stops learning when
the calibration ends: a chain that changes its meaning afterwards would be read with the
wrong weights. With ``keep_learning`` (``--keep-learning``) it learns to the end; with
the earlier 2,000-sample warm-up, one of five such default runs (seeds 0-3, seed 0
twice) scored the second sub-meter at an evaluation NDE of 4.4 (its chain came to mean
something else), while four runs that stopped at the calibration scored 0.844-0.853.
"""
from __future__ import annotations

import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .cli import DIE_WITH_PARENT_ENV, _plural, _restore_handlers, _set_handlers
from .power import (AGGREGATE_COLUMNS, SUBMETER_COLUMNS, calibration_weights, disaggregation_metrics,
                    fit_aggregate_baseline, fit_submeter_map, metric_table, predict_aggregate_baseline,
                    predict_submeters)

__all__ = ["DemoError", "DemoResult", "run_demo", "resolve_start", "DEFAULT_RATE", "DEFAULT_SECONDS",
           "DEFAULT_START", "DEFAULT_OUT_DIR", "DEFAULT_WARMUP"]

#: messages (minutes of data) per second
DEFAULT_RATE = 1250.0
#: seconds of streaming (the whole run adds start-up, the warm-up fit and the summary):
#: 60,000 minutes, six weeks of data
DEFAULT_SECONDS = 48.0
#: share of one core the service's background learner may use (the demo has the machine)
LEARNER_DUTY = 0.5
#: seconds the demo waits for serve to start, and for its first posterior (a first run
#: compiles the kernels: 1-2 minutes on an idle 2-core machine, several on a busy one)
SERVE_START_TIMEOUT = 600.0
#: the first minute streamed
DEFAULT_START = "2007-01-01"
#: samples the service buffers before initialising its model: one week, so that the
#: initialisation sees a whole weekly cycle of the household's appliance use (the
#: default start's first 2,000 minutes hold no kitchen or laundry use at all). Measured
#: against 2,000 over three start dates (2007-01-01, 2008-01-01, 2009-06-01), the mean
#: NDE of each sub-meter was lower or equal in 8 of 9 cases (README, "The demo")
DEFAULT_WARMUP = 7 * 1440
#: where the PNGs go
DEFAULT_OUT_DIR = "streamfhmm_demo"
_MINUTES_PER_DAY = 1440
_FLAG_WARMUP = 2
_SHORT = {"Sub_metering_1": "kitchen", "Sub_metering_2": "laundry", "Sub_metering_3": "heater/AC"}


class DemoError(Exception):
    """A failure reported as one line (a subprocess died, the data is missing, ...)."""


class DemoTerminated(KeyboardInterrupt):
    """SIGTERM reached :func:`run_demo`: it stopped its subprocesses, as for Ctrl-C."""


@dataclass
class DemoResult:
    """What a demo run measured.

    Attributes
    ----------
    n_samples : int
        Samples streamed (= posteriors expected).
    n_received : int
        Posteriors received.
    missing : int
        Stream positions whose posterior never arrived.
    gaps : int or None
        Input gaps reported by the service (None if it did not report).
    seconds : float
        From the first posterior to the last.
    wall_seconds : float
        The whole run, start-up included.
    first_posterior : float
        Seconds from the start to the first posterior (start-up, warm-up, the model's
        initialisation and, on a first run, compiling the kernels).
    rate : float
        Posteriors per second over ``seconds``.
    warmup : int
        Warm-up samples (flagged by the service).
    calibration, evaluation : slice
        Stream positions of both periods.
    fhmm, baseline : dict
        :func:`disaggregation_metrics` on the evaluation period (empty if too short).
    aggregate_nmse : ndarray, shape (3,)
        Reconstruction error of each aggregate channel over the evaluation period,
        divided by the channel's variance there.
    version : int
        The last parameter snapshot seen.
    learner_steps : int or None
    learn_samples : int or None
        The samples the service learnt from (None: it learnt to the end).
    pngs : list of str
    """

    n_samples: int = 0
    n_received: int = 0
    missing: int = 0
    gaps: int | None = None
    seconds: float = 0.0
    wall_seconds: float = 0.0
    first_posterior: float = 0.0
    rate: float = 0.0
    warmup: int = 0
    calibration: slice = field(default_factory=lambda: slice(0, 0))
    evaluation: slice = field(default_factory=lambda: slice(0, 0))
    fhmm: dict = field(default_factory=dict)
    baseline: dict = field(default_factory=dict)
    aggregate_nmse: np.ndarray = field(default_factory=lambda: np.full(3, np.nan))
    version: int = 0
    learner_steps: int | None = None
    learn_samples: int | None = None
    pngs: list = field(default_factory=list)


def resolve_start(timestamps: np.ndarray, start) -> int:
    """The row of ``start``: a row number (int or digits) or a date/time (``2007-01-01``).

    A date/time is taken at its own precision: ``2006-12-16`` (the first day of the
    household data, which starts at 17:24) is that day's first row, ``2007-01`` the
    month's; ``2006-12-16 17:00`` is before the data.

    Raises
    ------
    DemoError
        When the row is out of range or the date is not in the data.
    """
    T = len(timestamps)
    s = str(start).strip()
    if re.fullmatch(r"\d+", s):
        row = int(s)
    else:
        try:
            when = np.datetime64(s)
        except ValueError:
            raise DemoError(f"--start must be a row number or a date such as 2007-01-01, got {s!r}") from None
        if np.isnat(when):
            raise DemoError(f"--start must be a row number or a date such as 2007-01-01, got {s!r}")
        if np.datetime_data(when.dtype)[0] in ("ms", "us", "ns", "ps", "fs", "as"):
            when = when.astype("datetime64[s]")
        # compared at the date's own precision: a day (month, year) is in the data when
        # any of its minutes is
        if not timestamps[0].astype(when.dtype) <= when <= timestamps[-1].astype(when.dtype):
            raise DemoError(f"--start {s} is outside the data ({_day(timestamps[0])} .. "
                            f"{_day(timestamps[-1])})")
        row = int(np.searchsorted(timestamps, when.astype("datetime64[s]")))
    if not 0 <= row < T:
        raise DemoError(f"--start row {row} is outside the data (0 .. {T - 1})")
    return row


# ----------------------------------------------------------------------------------------
# subprocesses
# ----------------------------------------------------------------------------------------
class _Child:
    """A ``python -m streamfhmm`` subprocess whose stderr lines are collected by a thread."""

    def __init__(self, name: str, args: list[str], registry: list | None = None):
        self.name = name
        # with it, the child is killed when the demo dies, however it dies (Linux)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{DIE_WITH_PARENT_ENV: str(os.getpid())})
        # a session of its own: Ctrl-C reaches the demo only, which then stops the children
        self.proc = subprocess.Popen([sys.executable, "-m", "streamfhmm", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=env, start_new_session=True)
        if registry is not None:
            registry.append(self)   # at once: an interrupt from here on still stops it
        self.lines: list[str] = []
        self.queue: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"{name}-stderr", daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            self.queue.put(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def last_error(self) -> str:
        self._reader.join(timeout=2.0)
        for line in reversed(self.lines):
            if line.strip() and "Traceback" not in line:
                return line.strip()
        return "(no message)"

    def wait_line(self, pattern, timeout: float, on_slow=None, slow_after: float = 5.0):
        """The first stderr line matching ``pattern`` (a compiled regex); its match.
        ``on_slow()`` is called once if none has come after ``slow_after`` seconds."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise DemoError(f"{self.name} did not start within {timeout:g} s")
            if on_slow is not None and now - start >= slow_after:
                on_slow()
                on_slow = None
            try:
                line = self.queue.get(timeout=min(left, 0.2))
            except queue.Empty:
                if not self.alive():
                    raise DemoError(f"{self.name} exited with status {self.proc.returncode}: "
                                    f"{self.last_error()}") from None
                continue
            m = pattern.search(line)
            if m:
                return m

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal, wait up to ``timeout`` s, then kill; the exit status."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
            except ProcessLookupError:
                pass
        self._reader.join(timeout=5.0)
        return self.proc.returncode

    def kill(self):
        """SIGKILL, if it still runs; never raises."""
        try:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10.0)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _stop_children(children: list) -> None:
    """Stop every child, last started first, even when Ctrl-C is pressed again (or SIGTERM
    comes) meanwhile: both are ignored until all are stopped."""
    old = _set_handlers(signal.SIG_IGN)
    pending = None
    try:
        for child in reversed(children):
            try:
                child.stop(signal.SIGTERM, timeout=10.0)
            except BaseException as exc:   # noqa: BLE001 - an interrupt that came before SIG_IGN
                child.kill()
                pending = pending or exc
    finally:
        _restore_handlers(old)
    if pending is not None:
        raise pending


_ENDPOINTS = re.compile(r"input bound at (\S+), output bound at (\S+) \(")
_STEPS = re.compile(r"learner steps (\d+)")
_SAMPLES = re.compile(r"serve: ([\d,]+) samples \(")
_GAPS = re.compile(r"stopped after .* gaps (\d+) \((\d+) samples\)")


# ----------------------------------------------------------------------------------------
# the live view
# ----------------------------------------------------------------------------------------
def _bar(x: float, width: int = 20) -> str:
    if not math.isfinite(x):
        return " " * width
    n = int(round(min(max(x, 0.0), 1.0) * width))
    return "█" * n + "·" * (width - n)


class _View:
    """A block of lines redrawn in place (a terminal), or a plain line now and then."""

    def __init__(self, stream, live: bool, plain_every: float = 5.0):
        self.stream = stream
        self.live = live
        self.plain_every = plain_every
        self._drawn = 0
        self._last_plain = -math.inf

    def draw(self, lines: list[str], plain: str, now: float):
        if self.live:
            import shutil
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)  # a wrapped line breaks the redraw
            out = []
            if self._drawn:
                out.append(f"\x1b[{self._drawn}F")
            for line in lines:
                out.append("\x1b[2K" + line[:width] + "\n")
            for _ in range(self._drawn - len(lines)):
                out.append("\x1b[2K\n")
            self.stream.write("".join(out))
            self.stream.flush()
            self._drawn = max(len(lines), self._drawn)
        elif now - self._last_plain >= self.plain_every:
            self._last_plain = now
            print(plain, file=self.stream, flush=True)

    def message(self, text: str):
        """A line above the live block (or a plain line)."""
        if self.live and self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0
        print(text, file=self.stream, flush=True)


# ----------------------------------------------------------------------------------------
# the demo
# ----------------------------------------------------------------------------------------
def run_demo(*, seconds: float | None = None, samples: int | None = None, rate: float = DEFAULT_RATE,
             start=DEFAULT_START, out_dir=DEFAULT_OUT_DIR, view: bool | None = None, seed: int = 0,
             n_chains: int = 6, window: int = 9, n_hidden: int = 32, calibration_days: float = 14.0,
             warmup: int = DEFAULT_WARMUP, on_threshold: float = 5.0, keep_learning: bool = False,
             stream=None, data=None) -> DemoResult:
    """Stream household power through ``serve --cold --learn`` over ZeroMQ; disaggregate live.

    Parameters
    ----------
    seconds : float, optional
        Seconds of streaming at ``rate`` (default :data:`DEFAULT_SECONDS`); ignored when
        ``samples`` is given.
    samples : int, optional
        Samples (minutes) to stream.
    rate : float
        Messages per second (> 0).
    start : int or str
        First row, or a date/time (:func:`resolve_start`).
    out_dir : str or path-like
        Where ``demo_submeters.png`` and ``demo_aggregate.png`` go.
    view : bool, optional
        Redraw a live block in place; default when ``stream`` is a terminal. Otherwise
        a plain progress line every few seconds.
    seed : int
        Seed of the service's cold start.
    n_chains, window, n_hidden : int
        The model the service learns.
    calibration_days : float
        Days after the warm-up that calibrate the chain-to-sub-meter map (shortened to
        a third of the stream after the warm-up when the stream is short).
    warmup : int
        Samples the service buffers before initialising the model (default
        :data:`DEFAULT_WARMUP`, one week).
    on_threshold : float
        On/off threshold of the F1 score, Wh per minute.
    keep_learning : bool
        Let the service learn to the end. Default: it learns until the calibration's
        last posterior (``serve --learn-samples``), so that the chains the map was fitted
        to keep their meaning over the evaluation.
    stream : file, optional
        Where the view and the summary go (default ``sys.stdout``).
    data : HouseholdPower, optional
        Default :func:`streamfhmm.datasets.load_household_power`.

    Returns
    -------
    DemoResult

    Raises
    ------
    DemoError
        A subprocess died or timed out, the data is missing, or the arguments do not fit.
    KeyboardInterrupt
        Ctrl-C; :class:`DemoTerminated` (a KeyboardInterrupt) for SIGTERM. Either way the
        subprocesses are stopped first (a second Ctrl-C does not cut that short).

    Notes
    -----
    In the main thread, SIGTERM is handled like Ctrl-C while the demo runs (the previous
    handler is restored at the end). On Linux the subprocesses are also killed by the
    kernel if this process dies without stopping them (SIGKILL): PR_SET_PDEATHSIG, which
    they set when their environment names this process
    (:data:`streamfhmm.cli.DIE_WITH_PARENT_ENV`).
    """
    def terminate(signum, frame):
        raise DemoTerminated()

    old = _set_handlers(terminate, (signal.SIGTERM,))
    try:
        return _run_demo(seconds=seconds, samples=samples, rate=rate, start=start, out_dir=out_dir, view=view,
                         seed=seed, n_chains=n_chains, window=window, n_hidden=n_hidden,
                         calibration_days=calibration_days, warmup=warmup, on_threshold=on_threshold,
                         keep_learning=keep_learning, stream=stream, data=data)
    finally:
        _restore_handlers(old)


def _check_out_dir(out_dir) -> None:
    """Create ``out_dir`` and check that it takes files, before the run (not after it)."""
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        return   # no PNG will be written (the run says so at its end)
    if not os.fspath(out_dir):
        raise DemoError("--out-dir must name a directory, got an empty string")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise DemoError(f"--out-dir {os.fspath(out_dir)}: cannot write there: {exc.strerror or exc}") from None


def _run_demo(*, seconds, samples, rate, start, out_dir, view, seed, n_chains, window, n_hidden,
              calibration_days, warmup, on_threshold, keep_learning, stream, data) -> DemoResult:
    stream = sys.stdout if stream is None else stream
    wall0 = time.perf_counter()
    if not (rate > 0 and math.isfinite(rate)):
        raise DemoError(f"--rate must be a positive number of messages per second, got {rate}")
    if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
        raise DemoError(f"--seconds must be a positive number, got {seconds}")
    if not (calibration_days > 0 and math.isfinite(calibration_days)):
        raise DemoError(f"--calibration-days must be a positive number, got {calibration_days}")
    if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or warmup < 2:
        raise DemoError(f"--warmup must be an integer >= 2 (samples before the model is initialised), "
                        f"got {warmup!r}")
    least = max(int(n_chains) + 2, 4)   # (what serve's engine starts from: else it waits longer)
    if warmup < least:
        raise DemoError(f"--warmup must be at least {least} for {int(n_chains)} chains (the "
                        f"service starts the model from max(chains + 2, 4) samples), got {warmup}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DemoError(f"--seed must be an integer >= 0, got {seed!r}")
    _check_out_dir(out_dir)
    if data is None:
        from .datasets import load_household_power
        try:
            data = load_household_power()
        except (ModuleNotFoundError, FileNotFoundError) as exc:
            raise DemoError(str(exc)) from None
    row0 = resolve_start(data.timestamps, start)
    if samples is None:
        want = (DEFAULT_SECONDS if seconds is None else seconds) * rate   # (as a float: no overflow)
        samples = len(data) - row0 if want >= len(data) - row0 else int(round(want))
    n = min(int(samples), len(data) - row0)
    min_n = warmup + 2 * _MINUTES_PER_DAY
    if n < min_n:
        at_end = row0 + n == len(data)   # (more samples or seconds cannot help then)
        hints = ["start earlier" if at_end else "raise --seconds or --samples"]
        if warmup > DEFAULT_WARMUP:
            hints.append(f"lower --warmup (default {DEFAULT_WARMUP:,})")
        raise DemoError(f"the stream must hold at least {min_n:,} samples (the warm-up and two days), "
                        f"got {n:,}" + (" (the data ends there)" if at_end else "") + ": "
                        + " or ".join(hints))
    A = data.select(AGGREGATE_COLUMNS)[row0:row0 + n]
    Y = data.select(SUBMETER_COLUMNS)[row0:row0 + n]
    ts = data.timestamps[row0:row0 + n]
    imputed = data.imputed[row0:row0 + n]
    # the periods: the calibration begins with the first minute after the warm-up (the
    # posteriors of the warm-up's minutes, flagged so, are the start's); with serve's
    # smoothing lag (window // 2) the calibration's last posterior arrives with sample
    # cal.stop + lag, the last the service learns from
    lag = window // 2
    first = warmup
    n_cal = (n - first) // 3
    capped = calibration_days * _MINUTES_PER_DAY >= n_cal   # (compared as floats: no overflow)
    if not capped:
        n_cal = int(round(calibration_days * _MINUTES_PER_DAY))
    cal, ev = slice(first, first + n_cal), slice(first + n_cal, n)
    # the two calibration fits need as many complete rows as weights: known before anything
    # starts (else found after the whole warm-up)
    need = max(calibration_weights(int(n_chains)))
    have = int((~imputed[cal]).sum())
    if have < need:
        # capped at a third of the stream after the warm-up, more days would not help
        remedy = ("stream more minutes (--seconds, --samples) or use fewer --chains: the "
                  "calibration takes at most a third of the stream after the warm-up"
                  if capped else f"raise --calibration-days (got {calibration_days:g})")
        raise DemoError(f"the calibration period holds {have:,} complete minutes, fewer than the "
                        f"{need:,} weights its fits need (the sub-meter map's and the baseline's): "
                        f"{remedy}")
    learn_samples = None if keep_learning else cal.stop + lag
    if view is None:
        view = bool(getattr(stream, "isatty", lambda: False)())
    out = _View(stream, live=view)
    M = int(n_chains)
    K = len(SUBMETER_COLUMNS)
    theta = np.full((n, M), np.nan)
    mean = np.full((n, A.shape[1]), np.nan)
    got = np.zeros(n, dtype=bool)
    res = DemoResult(n_samples=n)
    out.message(f"streamfhmm demo: {n:,} minutes of household power from {str(ts[0])[:16].replace('T', ' ')} "
                f"(row {row0:,}), {', '.join(AGGREGATE_COLUMNS)} only, at {rate:,.0f} messages/s over "
                f"ZeroMQ on 127.0.0.1")

    import zmq
    from .io.wire import Heartbeat, WireError, decode_output

    children: list[_Child] = []
    ctx = zmq.Context()
    sub = None
    try:
        serve = _Child("serve", [
            "serve", "--cold", "--learn", "--learner-duty", str(LEARNER_DUTY), "--features", str(A.shape[1]), "--chains", str(M),
            "--window", str(window), "--hidden", str(n_hidden), "--seed", str(seed),
            "--warmup", str(warmup), "--bind", "--sub", "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*",
            "--wait-subscribers", "1", "--status-interval", "1", "--heartbeat", "1"]
            + ([] if learn_samples is None else ["--learn-samples", str(learn_samples)]), children)
        # serve prints its endpoints once its kernels are compiled: a minute or two on a
        # first run, several on a busy machine. It exits with a message on any error, which
        # wait_line reports at once, so the deadline only guards against a hung start.
        m = serve.wait_line(_ENDPOINTS, timeout=SERVE_START_TIMEOUT, on_slow=lambda: out.message(
            "serve is starting (a first run compiles its kernels first: a minute or two, "
            "longer on a busy machine)"))
        ep_in, ep_out = m.group(1), m.group(2)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(ep_out)
        sub.subscribe(b"")
        replay = _Child("replay", [
            "replay", "household", "--columns", ",".join(AGGREGATE_COLUMNS), "--pub", ep_in, "--connect",
            "--rate", repr(float(rate)), "--start-row", str(row0), "--limit", str(n), "--topic", "house",
            "--wait-timeout", "120", "--no-progress"], children)
        out.message(f"started serve --cold --learn (pid {serve.proc.pid}; input {ep_in}, posteriors {ep_out}) "
                    f"and replay (pid {replay.proc.pid}); {_plural(M, 'chain')}, window {window}, warm-up {warmup:,} "
                    f"samples")

        coef = base = None
        warm_end = None
        est = np.full((n, K), np.nan)
        received = 0
        last_t = -1
        version = 0
        steps = buffered = None
        t_first = t_last = None
        replay_done = False
        last_draw = 0.0
        last_rate = (time.perf_counter(), 0)
        shown_rate = 0.0
        # the first posterior waits for the warm-up fit (and, on a first run, compilation)
        first_limit, stall_limit = SERVE_START_TIMEOUT, 300.0
        last_received = 0
        last_progress = time.perf_counter()
        while received < n:
            now = time.perf_counter()
            if sub.poll(100):
                for _ in range(20_000):
                    try:
                        frames = sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        msg = decode_output(frames)
                    except WireError:
                        continue
                    if isinstance(msg, Heartbeat):
                        continue
                    t = msg.t
                    if not 0 <= t < n or got[t]:
                        continue
                    got[t] = True
                    received += 1
                    if t_first is None:   # when it arrived, not after the read it came in
                        t_first = time.perf_counter()
                    last_t = max(last_t, t)
                    theta[t] = msg.theta
                    mean[t] = msg.mean
                    version = msg.version
                    if warm_end is None and not msg.flags & _FLAG_WARMUP:
                        warm_end = t
                    if coef is not None:
                        est[t] = np.maximum(predict_submeters(msg.theta[None], coef)[0], 0.0)
                now = time.perf_counter()
                if received > last_received:
                    last_received = received
                    last_progress = t_last = now
            if coef is None and warm_end is not None and got[cal].all():
                keep = ~imputed[cal]
                coef = fit_submeter_map(theta[cal][keep], Y[cal][keep])
                base = fit_aggregate_baseline(A[cal][keep], Y[cal][keep])
                done = np.flatnonzero(got)
                est[done] = np.maximum(predict_submeters(theta[done], coef), 0.0)
                out.message(f"calibrated at minute {cal.stop:,} on {int(keep.sum()):,} minutes "
                            f"({_day(ts[cal.start])} .. {_day(ts[cal.stop - 1])}{_left_out(keep)}): "
                            f"non-negative least squares "
                            f"from the {_plural(M, 'chain posterior')} to the sub-meters; "
                            + ("the service keeps learning" if keep_learning else
                               f"the service learnt from the first {learn_samples:,} minutes and "
                               "now holds its model fixed"))
            for child in children:
                while True:
                    try:
                        line = child.queue.get_nowait()
                    except queue.Empty:
                        break
                    s = _STEPS.search(line)
                    if s:
                        steps = int(s.group(1))
                    b = _SAMPLES.search(line)
                    if b:
                        now_buffered = int(b.group(1).replace(",", ""))
                        # a slow stream's warm-up is progress too (after it, only posteriors
                        # are: the status line counts every sample the service takes)
                        if warm_end is None and (buffered is None or now_buffered > buffered):
                            last_progress = now
                        buffered = now_buffered
            if not serve.alive():
                raise DemoError(f"serve exited with status {serve.proc.returncode}: {serve.last_error()}")
            if not replay_done and not replay.alive():
                if replay.proc.returncode != 0:
                    raise DemoError(f"replay exited with status {replay.proc.returncode}: {replay.last_error()}")
                replay_done = True
            if replay_done and received and now - last_progress > 15.0:
                break   # the replay has ended and nothing came for a while: count what is missing
            limit = stall_limit if received else first_limit
            if now - last_progress > limit:
                raise DemoError(f"no posterior for {limit:g} s ({received:,} of {n:,} received)")
            if now - last_rate[0] >= 1.0:
                shown_rate = (received - last_rate[1]) / (now - last_rate[0])
                last_rate = (now, received)
            if now - last_draw >= 0.25:
                last_draw = now
                lines, plain = _frame(now - wall0, received, n, last_t, ts, theta, est, Y, shown_rate,
                                      version, steps, warm_end, cal, coef is not None, replay_done,
                                      learn_samples, buffered, warmup)
                out.draw(lines, plain, now)
        # every posterior arrived (or the replay ended long ago): stop the service (it drains and exits 0)
        out.draw(*_frame(time.perf_counter() - wall0, received, n, last_t, ts, theta, est, Y, shown_rate,
                         version, steps, warm_end, cal, coef is not None, True, learn_samples),
                 math.inf)
        code = serve.stop(signal.SIGTERM, timeout=30.0)
        if code != 0:
            raise DemoError(f"serve exited with status {code}: {serve.last_error()}")
        code = replay.stop(signal.SIGTERM, timeout=30.0)
        if code != 0:
            raise DemoError(f"replay exited with status {code}: {replay.last_error()}")
        for line in serve.lines:
            g = _GAPS.search(line)
            if g:
                res.gaps = int(g.group(1))
            s = _STEPS.search(line)
            if s:
                steps = int(s.group(1))
    finally:
        try:
            _stop_children(children)
        finally:
            if sub is not None:
                sub.close(0)
            ctx.term()

    res.n_received = received
    res.missing = int((~got).sum())
    res.seconds = (t_last - t_first) if t_first is not None else 0.0
    res.rate = received / res.seconds if res.seconds > 0 else 0.0
    res.first_posterior = (t_first - wall0) if t_first is not None else 0.0
    res.warmup = int(warm_end or 0)
    res.calibration, res.evaluation = cal, ev
    res.version, res.learner_steps = version, steps
    res.learn_samples = learn_samples
    if coef is None:
        raise DemoError("the stream ended before the calibration period was complete")
    keep_ev = ~imputed[ev] & got[ev]
    est_base = np.maximum(predict_aggregate_baseline(A, base), 0.0)
    res.fhmm = disaggregation_metrics(Y[ev], est[ev], on_threshold, mask=~keep_ev)
    res.baseline = disaggregation_metrics(Y[ev], est_base[ev], on_threshold, mask=~keep_ev)
    Ae, Re = A[ev][keep_ev], mean[ev][keep_ev]
    res.aggregate_nmse = ((Re - Ae) ** 2).mean(axis=0) / Ae.var(axis=0)
    res.wall_seconds = time.perf_counter() - wall0
    # the summary first: a plot that fails must not take the run's results with it
    print(_summary(res, ts, imputed, M, window, rate, on_threshold), file=stream, flush=True)
    try:
        res.pngs = _plots(out_dir, ts, ev, A, mean, Y, est, est_base, out)
    except OSError as exc:
        raise DemoError(f"--out-dir {os.fspath(out_dir)}: cannot write the plots: {exc.strerror or exc}") from None
    for p in res.pngs:
        print(f"  wrote {p}", file=stream, flush=True)
    res.wall_seconds = time.perf_counter() - wall0
    return res


def _day(ts) -> str:
    return str(np.datetime64(ts, "m")).replace("T", " ")


def _frame(elapsed, received, n, last_t, ts, theta, est, Y, rate, version, steps, warm_end, cal,
           calibrated, replay_done, learn_samples=None, buffered=None, warmup=None):
    """The live block: its lines, and the one plain line that stands for it."""
    M = theta.shape[1]
    when = _day(ts[last_t]) if last_t >= 0 else "-"
    if warm_end is None:
        phase = "warm-up: the service buffers samples, then initialises the model"
        if warmup and received:
            # each buffered sample's posterior (flagged warm-up) has come: the count the
            # service's status line gives lags (it is printed every few seconds, and not
            # while the service compiles its kernels)
            buffered = max(buffered or 0, min(received, warmup))
        if buffered is not None and warmup:
            phase = (f"warm-up: the service buffered {buffered:,} of {warmup:,} samples, then "
                     "initialises the model" if buffered < warmup else
                     f"warm-up: {warmup:,} samples buffered; the service initialises the model")
        if elapsed > 20 and (buffered is None or not warmup or buffered >= warmup):
            phase += " (a first run also compiles its kernels: a minute or two)"
    elif not calibrated:
        phase = f"calibrating: {max(0, last_t + 1 - cal.start):,} of {cal.stop - cal.start:,} minutes"
    else:
        phase = ("estimating the sub-meters (the service keeps learning)" if learn_samples is None
                 else "estimating the sub-meters (the model is held fixed)")
    status = (f"{received:>9,}/{n:,} posteriors  {rate:>7,.0f} msg/s  snapshot v{version}"
              + (f"  learner steps {steps:,}" if steps is not None else "") + f"  {elapsed:5.1f} s")
    lines = [f"streamfhmm demo  {when}  {phase}", status]
    if last_t >= 0:
        th = theta[last_t]
        lines += [f"  chain {m}  θ {th[m]:5.2f} {_bar(th[m])}" for m in range(M)]
    else:
        lines += [f"  chain {m}" for m in range(M)]
    lo = max(0, last_t - 59)
    if calibrated and last_t >= 0:
        lines.append(f"  {'sub-meter, last hour':<28}{'estimate':>9}{'true':>9}  Wh/min")
        for k, name in enumerate(SUBMETER_COLUMNS):
            e = np.nanmean(est[lo:last_t + 1, k]) if np.isfinite(est[lo:last_t + 1, k]).any() else math.nan
            y = Y[lo:last_t + 1, k].mean()
            lines.append(f"  {name + ' (' + _SHORT[name] + ')':<28}{e:>9.2f}{y:>9.2f}  {_bar(e / 20)} "
                         f"{_bar(y / 20)}")
    else:
        lines.append("  sub-meter estimates appear after the calibration period")
        lines += [""] * len(SUBMETER_COLUMNS)
    plain = f"[{elapsed:6.1f} s] {when}  {received:,}/{n:,} posteriors, {rate:,.0f} msg/s, v{version}"
    if steps is not None:
        plain += f", learner steps {steps:,}"
    plain += "; " + phase
    return lines, plain


def _plots(out_dir, ts, ev, A, mean, Y, est, est_base, out) -> list:
    try:
        from .power import _plot_window, plot_reconstruction, plot_submeters
        import matplotlib  # noqa: F401
    except ImportError:
        out.message('no PNG: plotting needs matplotlib (pip install "streamfhmm[plot]")')
        return []
    # the first whole day of the evaluation period (one beginning at midnight included:
    # the next was taken), else its first 24 hours, as the offline report plots
    w = _plot_window(ts[:ev.stop], ev.start, None)
    sl = slice(w.start, w.stop)
    os.makedirs(out_dir, exist_ok=True)
    return [plot_submeters(ts[sl], Y[sl], est[sl], est_base[sl], SUBMETER_COLUMNS,
                           os.path.join(os.fspath(out_dir), "demo_submeters.png")),
            plot_reconstruction(ts[sl], A[sl], mean[sl], AGGREGATE_COLUMNS,
                                os.path.join(os.fspath(out_dir), "demo_aggregate.png"))]


def _left_out(keep) -> str:
    """The note on a period's minutes the file filled from the day before (left out of
    the fits and the scores, as in the offline report)."""
    n = int(keep.size - np.count_nonzero(keep))
    return f"; {n:,} filled from the day before left out" if n else ""


def _summary(res: DemoResult, ts, imputed, M, window, rate, on_threshold) -> str:
    cal, ev = res.calibration, res.evaluation
    n_ev = int((~imputed[ev]).sum())
    gaps = "not reported" if res.gaps is None else f"{res.gaps}"
    lines = [
        "",
        "summary",
        f"  streamed {res.n_samples:,} samples ({_day(ts[0])} .. {_day(ts[-1])}); received {res.n_received:,} "
        f"posteriors, missing {res.missing}, input gaps {gaps}",
        (f"  throughput {res.rate:,.0f} posteriors/s over {res.seconds:.1f} s" if res.seconds > 0 else
         "  throughput not measured: the posteriors arrived in one read")
        + f" (replay paced at {rate:,.0f}/s); wall time {res.wall_seconds:.1f} s",
        f"  model: {_plural(M, 'chain')}, window {window}, learnt online from a cold start (warm-up {res.warmup:,} "
        f"samples, first posterior after {res.first_posterior:.1f} s); last snapshot v{res.version}"
        + (f", {res.learner_steps:,} learner steps" if res.learner_steps is not None else ""),
        f"  calibration {_day(ts[cal.start])} .. {_day(ts[cal.stop - 1])} ({int((~imputed[cal]).sum()):,} "
        f"minutes{_left_out(~imputed[cal])}); "
        f"evaluation {_day(ts[ev.start])} .. {_day(ts[ev.stop - 1])} ({n_ev:,} minutes); "
        + ("learning stayed on after calibration" if res.learn_samples is None else
           f"the service learnt from the first {res.learn_samples:,} minutes, to the calibration's end"),
        "  aggregate reconstruction error / variance: "
        + ", ".join(f"{c} {v:.3f}" for c, v in zip(AGGREGATE_COLUMNS, res.aggregate_nmse)),
        f"  on/off threshold {on_threshold:g} Wh per minute; baseline: each sub-meter regressed on the "
        "aggregate channels over the same calibration period",
    ]
    lines += metric_table(SUBMETER_COLUMNS, res.fhmm, res.baseline, indent="  ")
    lines += [f"  wrote {p}" for p in res.pngs]
    return "\n".join(lines)
