"""The ``streamfhmm`` command line (also ``python -m streamfhmm``).

Subcommands: ``fit``, ``score``, ``predict``, ``bench`` (over files: CSV with a header
row, or ``.npy``), ``serve`` (the ZeroMQ service), ``replay`` (publish a recording
over ZeroMQ), ``demo`` (live household-power disaggregation over ZeroMQ) and
``disaggregate`` (its offline version). ``streamfhmm COMMAND --help`` describes each.

Exit status: 0 on success (``serve`` and ``replay`` also after SIGTERM/SIGINT, once
drained and checkpointed), 2 for a bad command line, 1 for any other error (missing
file, malformed data, a port in use…), 130 after Ctrl-C and 143 after SIGTERM (for
``demo`` once it has stopped its subprocesses; a file being written is not left
half-written); every error is one line on stderr.
"""
from __future__ import annotations

import argparse
import codecs
import collections
import csv
import io
import logging
import math
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

from .io.checkpoint import write_atomically
from .io.wire import SEQ_LIMIT
from .stream import DEFAULT_LEARNER_DUTY

__all__ = ["main", "build_parser", "load_data", "CliError"]

_MISSING = {"", "nan", "NaN", "NAN", "na", "NA", "?", "null", "None"}
_INF = (math.inf, -math.inf)


#: ``streamfhmm demo`` sets it in its subprocesses' environment to its own pid: they then
#: ask Linux to kill them when the demo dies, however it dies (:func:`_die_with_parent`)
DIE_WITH_PARENT_ENV = "STREAMFHMM_DIE_WITH_PARENT"


class CliError(Exception):
    """An error reported as one line on stderr with exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# -- data files ---------------------------------------------------------------------------
def _plural(n: int, word: str) -> str:
    """``"1 sample"``, ``"1,500 samples"``."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _split_columns(spec):
    """``--columns``: one CSV row of names (a name holding a comma in double quotes, as in
    a CSV header; a space after a comma is not part of a name) or of .npy column
    indices, each given once; None when the option is not given."""
    if spec is None:
        return None
    expected = f"--columns must be a comma-separated list of column names, got {spec!r}"
    try:
        rows = list(csv.reader([spec], skipinitialspace=True, strict=True))
    except csv.Error as exc:
        raise CliError(f"{expected}: {exc}") from None
    cols = [c.strip() for c in rows[0]] if rows else []
    if not cols or not all(cols):
        raise CliError(expected)
    counts = collections.Counter(cols)
    for c in cols:
        if counts[c] > 1:
            raise CliError(f"--columns names {c!r} {counts[c]} times, got {spec!r}; expected each "
                           "column once")
    return cols


def _check_unique_names(path, header, problem, among=None) -> None:
    """Refuse a header that names a column more than once where the names pick columns
    (of ``among``, by default any name): ``problem`` says what the repeated name would
    make go wrong."""
    counts = collections.Counter(header)
    for name in header if among is None else among:
        if counts[name] > 1:
            at = [j + 1 for j, h in enumerate(header) if h == name]
            raise CliError(f"{path}'s header names {len(at)} columns {name!r} (columns "
                           f"{', '.join(map(str, at))}): {problem}; expected each column name once "
                           "(rename the columns)")


def _csv_line(fields) -> str:
    """``fields`` as one CSV line, without its end: a field holding a comma, a double quote
    or a line break is quoted (the csv module's minimal quoting)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()[:-1]


def _names_text(names) -> str:
    """Column names for a message, ``", "``-separated, each written as in a CSV header (a
    name holding a comma is quoted), so that the list reads one way only."""
    return ", ".join(_csv_line([n]) for n in names)


def _columns_option(names) -> str:
    """The ``--columns`` option choosing ``names``, ready for a POSIX shell (``--columns
    a,b,c``; quoted when a name holds a space, a comma or a quote)."""
    return "--columns " + shlex.quote(_csv_line(names))


def load_data(path: str, columns=None):
    """Read a data file for the command line.

    Parameters
    ----------
    path : str
        A ``.npy`` file (2-D numeric, or 1-D for one feature), a CSV file with a header
        row (any other extension), or ``"household"`` for
        :func:`streamfhmm.datasets.load_household_power`.
    columns : list of str, optional
        Columns to keep, by name (CSV, household) or index (``.npy``).

    Returns
    -------
    X : ndarray of float64, shape (T, D)
        Empty fields, ``nan``, ``NA`` and ``?`` become NaN (a missing value).
    names : list of str

    Raises
    ------
    CliError
        With the file, and for CSV the line and column, of the problem.
    """
    if path == "household":
        return _load_household(columns)
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory, not a data file")
    if path.endswith(".npy"):
        X, names = _load_npy(path, columns)
    else:
        X, names = _load_csv(path, columns)
    if X.shape[0] == 0:
        raise CliError(f"{path} has no data rows")
    if np.isinf(X).any():   # (CSV infinities are caught, with their line, while parsing)
        r, c = np.argwhere(np.isinf(X))[0]
        raise CliError(f"{path}, row {r}, column {c}: infinite value")
    return X, names


def _load_household(columns):
    try:
        from .datasets import load_household_power
    except ImportError:
        raise CliError("the built-in household power data is not available in this streamfhmm") from None
    try:
        data = load_household_power()
    except (ModuleNotFoundError, FileNotFoundError, OSError, ValueError) as exc:
        raise CliError(f"household: {exc}") from None
    names = list(columns) if columns else list(data.columns)
    try:
        X = data.select(names)
    except ValueError as exc:
        raise CliError(f"household: {exc}") from None
    return np.ascontiguousarray(X, dtype=np.float64), names


def _load_npy(path, columns):
    try:
        X = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CliError(f"{path} is not a readable .npy array: {exc}") from None
    if not isinstance(X, np.ndarray) or X.dtype.kind not in "biuf":
        raise CliError(f"{path} must hold a numeric array, got dtype {getattr(X, 'dtype', type(X))}")
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise CliError(f"{path} must hold a 2-D array (samples x features), got shape {X.shape}")
    names = [str(i) for i in range(X.shape[1])]
    if columns:
        try:
            idx = [int(c) for c in columns]
        except ValueError:
            raise CliError(f"--columns for a .npy file are column indices, got {','.join(columns)}") from None
        bad = [i for i in idx if not 0 <= i < X.shape[1]]
        if bad:
            raise CliError(f"{path} has {X.shape[1]} columns; no column {bad[0]}")
        X, names = X[:, idx], [names[i] for i in idx]
    return np.ascontiguousarray(X, dtype=np.float64), names


def _load_csv(path, columns):
    try:
        fh = open(path, newline="", encoding="utf-8-sig")   # -sig: a BOM is not part of the header
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    with fh:
        # (skipinitialspace: '"a", "b"' names a and b, as '"1", "2"' holds 1 and 2)
        reader = csv.reader(fh, skipinitialspace=True)
        try:
            header = next(reader, None)
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, exc) from None
        except csv.Error as exc:
            raise CliError(f"{path}, line 1: not a CSV header row: {exc}") from None
        if not header or not any(h.strip() for h in header):
            raise CliError(f"{path} is empty: a header row naming the columns is expected")
        header = [h.strip() for h in header]
        for j, h in enumerate(header):
            if _is_number(h):
                raise CliError(f"{path}, line 1, column {j + 1}: {h!r} looks like a number; the first "
                               "line must be a header row naming the columns")
        if columns:
            missing = [c for c in columns if c not in header]
            if missing:
                raise CliError(f"{path} has no column {missing[0]!r}; its columns are {_names_text(header)}")
            _check_unique_names(path, header, "--columns cannot tell them apart", among=columns)
            idx = [header.index(c) for c in columns]
        else:
            _check_named(path, header)
            idx = list(range(len(header)))
        names = [header[j] for j in idx]
        # (numpy's parser opens the file again: only a regular file can be read twice; a
        # FIFO would block that second open forever, a pipe would give it nothing)
        fast = _loadtxt(path, idx, len(header)) if os.path.isfile(path) else None
        if fast is not None:
            return fast, names
        # the careful parse: names the line and column of the first problem
        rows = []
        n = len(header)
        lineno = 1
        try:
            for row in reader:
                lineno = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != n:
                    raise CliError(f"{path}, line {lineno}: {len(row)} fields; the header has {n}")
                vals = []
                for j in idx:
                    field = row[j].strip()
                    if field in _MISSING:
                        vals.append(math.nan)
                        continue
                    try:
                        v = _number(field)
                    except ValueError:
                        raise CliError(f"{path}, line {lineno}, column {j + 1} ({header[j]!r}): "
                                       f"cannot read {field[:40]!r} as a number") from None
                    if v in _INF:
                        raise CliError(f"{path}, line {lineno}, column {j + 1} ({header[j]!r}): "
                                       "infinite value")
                    vals.append(v)
                rows.append(vals)
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, exc) from None
        except csv.Error as exc:
            raise CliError(f"{path}, line {lineno + 1}: malformed CSV: {exc}") from None
    X = np.array(rows, dtype=np.float64).reshape(len(rows), len(idx))
    return X, names


def _loadtxt(path, idx, n_columns):
    """numpy's fast parser, or None when the file needs the careful one (missing values,
    quoting, ragged lines, infinities, anything unusual)."""
    try:
        with open(path, encoding="utf-8-sig") as fh, warnings.catch_warnings():
            warnings.simplefilter("error")
            X = np.loadtxt(fh, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64, comments=None)
    except (ValueError, IndexError, UnicodeDecodeError, UserWarning):
        return None
    if X.shape[1] != n_columns:
        return None
    X = X[:, idx]
    if not np.isfinite(X).all():
        return None
    return np.ascontiguousarray(X)


def _check_named(path, header) -> None:
    """Every column is read (no --columns): each must have a name (an empty header field,
    often a trailing comma on every line, made a column of missing values)."""
    if all(header):
        return
    j = header.index("")
    named = [h for h in header if h]
    trailing = " (the header row ends with a comma)" if j == len(header) - 1 else ""
    raise CliError(f"{path}, line 1, column {j + 1}: the column has no name{trailing}; expected a name for "
                   "every column in the header row, or the columns to read chosen with "
                   + (_columns_option(named) if named else "--columns"))


def _number(s: str) -> float:
    """``float(s)``, refusing what it reads but a CSV number is not: ``1_5`` (Python's
    digit grouping, read as 15) is a ValueError."""
    if "_" in s:
        raise ValueError(f"not a number: {s!r}")
    return float(s)


def _is_number(s: str) -> bool:
    try:
        _number(s)
    except ValueError:
        return False
    return s.strip() not in _MISSING


def _not_utf8(path, exc: UnicodeDecodeError) -> CliError:
    """The error for a data file that is not UTF-8 text, at the line and byte offset of
    its first byte that is not (the decoder reads ahead in blocks: where it failed gives
    neither); a file that cannot be read again (a pipe) is named with the byte only."""
    expected = "expected a UTF-8 text file (save it as UTF-8)"
    where = _first_non_utf8(path) if os.path.isfile(path) else None
    if where is None:
        byte = exc.object[exc.start:exc.start + 1].hex() or "??"
        return CliError(f"{path} is not UTF-8 text (byte 0x{byte}: {exc.reason}); {expected}")
    line, offset, byte = where
    return CliError(f"{path}, line {line}: not UTF-8 text (byte 0x{byte:02x} at offset {offset:,} of the "
                    f"file); {expected}")


def _first_non_utf8(path, block_size: int = 1 << 20):
    """``(line, offset, byte)`` of the first byte of the file ``path`` that is not UTF-8
    text (line from 1, offset in bytes from 0), or None (all of it is, or it cannot be
    read)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1      # (of the block's first byte)
    after_cr = False         # (the last block ended with "\r", counted as a line break)

    def breaks(data):   # line breaks as the csv module reads them: \n, \r\n and a lone \r
        n = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
        return n - 1 if after_cr and data[:1] == b"\n" else n   # (\r\n across two blocks)

    try:
        with open(path, "rb") as fh:
            while True:
                block = fh.read(block_size)
                pending = decoder.getstate()[0]   # (a character cut by the last block's end)
                try:
                    decoder.decode(block, final=not block)
                except UnicodeDecodeError as exc:   # (its positions count from the pending bytes)
                    data = pending + block
                    return (line + breaks(data[:exc.start]), offset - len(pending) + exc.start,
                            data[exc.start])
                if not block:
                    return None
                line += breaks(block)
                after_cr = block[-1:] == b"\r"
                offset += len(block)
    except OSError:
        return None


def _load_model(path):
    from . import FHMM
    if not os.path.exists(path):
        # FHMM.load tries path + ".npz" too, as fit --out names the file it writes
        if path.endswith(".npz") or not os.path.exists(path + ".npz"):
            also = "" if path.endswith(".npz") else f" (nor {path}.npz)"
            raise CliError(f"{path}: no such model file{also}")
    try:
        return FHMM.load(path)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _named(data: str) -> bool:
    """Whether ``load_data(data)``'s names are the columns' own (a CSV header, the
    household data), not the positions of a .npy file's columns."""
    return data == "household" or not data.endswith(".npy")


def _check_features(model, X, data, names, command):
    """``X`` (read from ``data``, its columns called ``names``) as the model's features:
    as many, and, when both the file and the model name them, by the same names in the
    same order (a file that names none of the model's features is read by position,
    with a warning)."""
    D = model.n_features_in_
    from .estimator import _model_names
    known = _model_names(model)
    known = None if known is None else list(known)
    choose = "choose them with " + (_columns_option(known) if known else "--columns")
    if X.shape[1] != D:
        if not _named(data):   # (a .npy file's columns are chosen by index)
            choose = f"choose {D} of them by index with --columns, e.g. --columns {','.join(map(str, range(D)))}"
        raise CliError(f"{data} has {X.shape[1]} columns; the model expects {D} features ({choose})")
    if known is None or not _named(data) or names == known:
        return
    if set(names).isdisjoint(known):
        print(f"streamfhmm {command}: warning: {data}'s columns ({_names_text(names)}) are none of the model's "
              f"features ({_names_text(known)}): read in order, as {_names_text(known)}", file=sys.stderr)
        return
    _check_unique_names(data, names, f"its columns cannot be matched to the model's features "
                                     f"({_names_text(known)}) by name")
    raise CliError(f"{data}'s columns ({_names_text(names)}) are not the model's features "
                   f"({_names_text(known)}, in this order); {choose}")


def _progress(args) -> bool:
    """--progress / --no-progress, by default whether stderr is a terminal (as ``fit``)."""
    from .estimator import _stderr_is_terminal
    p = getattr(args, "progress", None)
    return _stderr_is_terminal() if p is None else p


def _positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


#: the longest recognition window (--window): an SVI step's windows take about
#: 80 x D x window² bytes (D features; 240 MB for 3 features at 1,001, while 99,999 asked
#: for 2.18 TiB), a stream's engine 32 KiB x D x window
_MAX_WINDOW = 1001


def _window(s):
    """An argparse type: a recognition window, 2h + 1 samples (odd), at most _MAX_WINDOW."""
    v = _positive_int(s)
    if v % 2 == 0 or v > _MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"expected an odd integer from 1 to {_MAX_WINDOW:,} "
                                         f"(2h + 1 samples), got {v}")
    return v


def _nonneg_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v}")
    return v


def _n_jobs(s):
    """An argparse type: a thread count, an integer >= 1 or -1 (every processor)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or -1, got {s!r}") from None
    if v < 1 and v != -1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or -1, got {v}")
    return v


def _int_at_least(low: int, high: int | None = None):
    """An argparse type: an integer >= ``low`` (and at most ``high``)."""
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {s!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {v}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low} and at most {high:,}, got {v}")
        return v
    return parse


#: ZeroMQ's socket options are C ints
_MAX_SOCKOPT = 2**31 - 1


def _nonneg_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {s}")
    return v


def _positive_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {s}")
    return v


def _bounded_float(low: float, high: float, low_open: bool = True):
    """An argparse type: a number in (low, high] (or [low, high] when not ``low_open``).

    The upper bound keeps values such as 1e308 from overflowing the arithmetic that turns
    them into sample counts or milliseconds."""
    rel = ">" if low_open else ">="

    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not ((v > low if low_open else v >= low) and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"expected a finite number {rel} {low:g}, got {s}")
        if v > high:
            raise argparse.ArgumentTypeError(f"expected a number {rel} {low:g} and at most {high:,.0f}, got {s}")
        return v
    return parse


#: upper bounds of the options that become counts of samples or milliseconds
_MAX_DAYS = 100_000.0
_MAX_SECONDS = 1e7          # about 116 days
_MAX_RATE = 1e7             # messages per second
_MAX_WAIT = 31_536_000.0    # a year


def _duty(s):
    try:
        v = float(s)
    except ValueError:
        v = math.nan
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {s!r}")
    return v


def _port(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port number, got {s!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port number in 1..65535, got {v}")
    return v


def _topic(s):
    """A topic (or topic prefix) as given: UTF-8 text of at most MAX_TOPIC_BYTES bytes
    (a non-UTF-8 argument failed after the data was loaded and the socket bound, with
    Python's encoding error naming no option)."""
    from .io.wire import MAX_TOPIC_BYTES
    try:
        n = len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"expected UTF-8 text (topics are UTF-8), got "
                                         f"{s.encode('utf-8', 'surrogateescape')!r}") from None
    if n > MAX_TOPIC_BYTES:
        raise argparse.ArgumentTypeError(f"a topic is at most {MAX_TOPIC_BYTES} bytes of UTF-8, "
                                         f"got {n}")
    return s


def _endpoint(s):
    """``tcp://host:port`` etc.; a bare port number means ``tcp://127.0.0.1:PORT``.

    The port of a ``tcp://`` endpoint must be ``*`` (any free port) or 1..65535: ZeroMQ
    would take 70000 as 70000 mod 65536 = 4464."""
    if s.isdigit():
        return f"tcp://127.0.0.1:{_port(s)}"
    scheme, sep, rest = s.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise argparse.ArgumentTypeError(
            f"expected an endpoint such as tcp://127.0.0.1:5555 (or a port number), got {s!r}")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host:
            raise argparse.ArgumentTypeError(f"expected tcp://HOST:PORT, got {s!r}")
        if port != "*" and not (port.isdigit() and port.isascii() and 1 <= int(port) <= 65535):
            raise argparse.ArgumentTypeError(
                f"the port of {s!r} must be a number in 1..65535 or * (any free port), got {port!r}")
    return s


def _warn_exposed(endpoint, bind, curve, prog):
    if not bind or not endpoint.startswith("tcp://"):
        return
    host = endpoint[6:].rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]", "::1") and curve is None:
        print(f"{prog}: warning: {endpoint} is reachable from other machines and not protected "
              "by CURVE (--curve-secret)", file=sys.stderr)


def _curve(args):
    if not (args.curve_secret or args.curve_public):
        return None
    from .io.zmq import CurveConfig
    for f in (args.curve_secret, args.curve_public):
        if f and not os.path.isfile(f):
            raise CliError(f"{f}: no such certificate file")
    return CurveConfig(secret_file=args.curve_secret, server_public_file=args.curve_public)


def _set_handlers(handler, signals=(signal.SIGINT, signal.SIGTERM)) -> dict:
    """``handler`` for ``signals`` (from the main thread only: elsewhere nothing is
    installed); the previous ones, for :func:`_restore_handlers`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in signals}


def _install_stop_handlers(callback):
    """``callback()`` on SIGINT and SIGTERM; the previous handlers."""
    return _set_handlers(lambda signum, frame: callback())


def _restore_handlers(old):
    """Put back the handlers ``old`` maps signals to (None: one not installed from Python,
    which cannot be put back)."""
    for s, h in old.items():
        if h is not None:
            signal.signal(s, h)


# -- fit / score / predict / bench ------------------------------------------------------
def _check_writable_dir(path, option) -> None:
    """Fail now, not after a long run, when ``path`` is not a directory we can write to."""
    path = os.fspath(path) or "."
    if not os.path.isdir(path):
        raise CliError(f"{option}: {path} is not a directory" if os.path.exists(path)
                       else f"{option}: no directory {path}")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise CliError(f"{option}: cannot write to {path}: {exc.strerror or exc}") from None


def _check_out_file(path, option, directory_hint="") -> None:
    """``path`` can be written: a name, not a directory, in a directory we can write to."""
    if not path:
        raise CliError(f"{option} must name a file, got ''{directory_hint}")
    if os.path.isdir(path):
        raise CliError(f"{option} {path} is a directory{directory_hint}")
    _check_writable_dir(os.path.dirname(path), f"{option} {path}")
    if os.path.islink(path):   # (written through the link: its target's directory too)
        target = os.path.realpath(path)
        _check_writable_dir(os.path.dirname(target), f"{option} {path} (a link to {target})")


def _check_restarts_option(n_restarts, steps_option, steps, time_budget=None) -> None:
    """``--n-restarts`` against the SVI steps (``steps_option``, None: FHMM.fit's 20,000)
    and ``--time-budget``, before any data is loaded."""
    if n_restarts == 1:
        return
    if time_budget is not None:
        raise CliError(f"--n-restarts needs {steps_option} steps, not --time-budget: the runs are "
                       "compared after the same steps")
    from .learn.svi import DEFAULT_MAX_ITER
    if (DEFAULT_MAX_ITER if steps is None else steps) < 6:
        raise CliError(f"{steps_option} {steps} is too few steps for --n-restarts: the runs are "
                       "compared after a sixth of them (at least 6)")


def _cmd_fit(args) -> int:
    from . import FHMM
    if not args.out:   # (else ".npz" below, and the fit's end would refuse it)
        raise CliError("--out must name a file, got ''; give a file name such as model.npz")
    out = args.out if args.out.endswith(".npz") else args.out + ".npz"   # what np.savez writes
    if os.path.isdir(args.out) or os.path.isdir(out):
        raise CliError(f"--out {args.out} is a directory; give a file name such as model.npz")
    _check_out_file(out, "--out", "; give a file name such as model.npz")
    if args.method != "svi":   # (the other methods train no networks, with one thread)
        for option, given in (("--n-restarts", args.n_restarts > 1), ("--net-warmup", args.net_warmup),
                              ("--n-jobs", args.n_jobs != 1), ("--batch-size", args.batch_size),
                              ("--learning-rate", args.learning_rate)):
            if given:
                raise CliError(f"{option} applies to --method svi, got --method {args.method}")
    if args.method == "em":
        from .learn.em import MAX_EM_CHAINS
        if args.chains > MAX_EM_CHAINS:
            raise CliError(f"--method em enumerates the 2^M joint states: at most {MAX_EM_CHAINS} --chains, "
                           f"got {args.chains} (use --method svi or smf)")
    _check_restarts_option(args.n_restarts, "--max-iter", args.max_iter, args.time_budget)
    if args.net_warmup and args.method == "svi":
        from .learn.svi import DEFAULT_MAX_ITER
        steps = DEFAULT_MAX_ITER if args.max_iter is None else args.max_iter
        if args.net_warmup >= steps:
            raise CliError(f"--net-warmup {args.net_warmup:,} must be less than the {steps:,} SVI steps "
                           f"(--max-iter{'' if args.max_iter else ', default 20,000'}): the model would "
                           "never be trained, only its networks")
    X, names = load_data(args.data, _split_columns(args.columns))
    if _named(args.data):   # (kept with the model, to find a file's columns by name)
        _check_unique_names(args.data, names, "fit keeps the names with the model, to match other "
                                              "files' columns by them")
    if args.window > X.shape[0]:
        raise CliError(f"--window {args.window} is longer than the data ({_plural(X.shape[0], 'sample')})")
    model = FHMM(n_chains=args.chains, window=args.window, n_hidden=args.hidden,
                 share_hidden=args.share, random_state=args.seed,
                 covariance_type=args.covariance_type)
    t0 = time.perf_counter()
    model.fit(X, method=args.method, max_iter=args.max_iter, time_budget=args.time_budget,
              progress=_progress(args),
              net_warmup=args.net_warmup or 0, n_jobs=args.n_jobs, n_init=args.n_init,
              n_restarts=args.n_restarts,
              # (the given ones only: FHMM.fit's defaults apply otherwise)
              **{k: v for k, v in (("batch_size", args.batch_size),
                                   ("learning_rate", args.learning_rate)) if v is not None})
    dt = time.perf_counter() - t0
    if _named(args.data):   # (score, predict and bench check a file's columns against them)
        model.feature_names_in_ = np.array(names, dtype=str)
    model.save(args.out)
    print(f"fitted {model!r} ({args.method}) on {_plural(X.shape[0], 'sample')} x {_plural(X.shape[1], 'feature')} "
          f"({_names_text(names)}) in {dt:.1f} s; saved to {out}")
    return 0


def _require_stdout(what: str) -> None:
    """Fail before the work when its results would go to a closed stdout (``>&-``: Python
    then has no ``sys.stdout``, and ``print`` drops what it is given without a word)."""
    if sys.stdout is None:
        raise CliError(f"stdout is closed: nowhere to write {what}")


def _score_text(x: float) -> str:
    """A log-likelihood or ELBO for ``score``: to 6 decimals, or beyond 1e9 in magnitude
    to 15 significant digits (about what a float holds; it printed every digit of a
    1e101 float's binary value)."""
    return f"{x:.6f}" if abs(x) < 1e9 else f"{x:.15g}"


def _check_finite_score(value: float, what: str, args) -> None:
    """A log-likelihood (or ELBO) of -inf or NaN is an error, not a result."""
    if not math.isfinite(value):
        raise CliError(f"the {what} of {args.data} under {args.model} is {value} (not finite): the data is "
                       "too far from the model, beyond what its densities can represent; expected data "
                       "in the units and columns the model was fitted on")


def _check_exact(model, path, what) -> None:
    """``what`` enumerates the 2^M joint states: at most MAX_EXACT_CHAINS chains."""
    from .exact import MAX_EXACT_CHAINS
    if model.n_chains > MAX_EXACT_CHAINS:
        raise CliError(f"{what} enumerates the 2^M joint states: at most {MAX_EXACT_CHAINS} chains, "
                       f"{path} has {model.n_chains}")


def _cmd_score(args) -> int:
    _require_stdout("the log-likelihood")
    model = _load_model(args.model)
    if args.elbo and getattr(model, "net_", None) is None:
        raise CliError(f"--elbo needs a model fitted with --method svi (the ELBO is its recognition "
                       f"networks'); {args.model} has none")
    _check_exact(model, args.model, "score (the exact log-likelihood)")
    X, names = load_data(args.data, _split_columns(args.columns))
    _check_features(model, X, args.data, names, args.command)
    if np.isnan(X).any():
        raise CliError(f"{args.data} has missing values; the exact log-likelihood needs complete rows")
    T = X.shape[0]
    ll = model.score(X)
    _check_finite_score(ll, "log-likelihood", args)
    e = model.elbo(X) if args.elbo else None
    if e is not None:
        _check_finite_score(e, "ELBO", args)
    print(f"log-likelihood: {_score_text(ll)} ({_score_text(ll / T)} per sample, {_plural(T, 'sample')})")
    if e is not None:
        print(f"ELBO: {_score_text(e)} ({_score_text(e / T)} per sample; gap {_score_text((ll - e) / T)} "
              "per sample)")
    return 0


#: names of a stream this process has open: /dev/stdout, /dev/stderr, /dev/fd/N,
#: /proc/self/fd/N (and /proc/<its pid>/fd/N)
_FD_PATH = re.compile(r"/dev/(?:(stdout)|(stderr)|fd/(\d+))|/proc/(?:self|thread-self|(\d+))/fd/(\d+)")


def _stream_fd(path) -> int | None:
    """The file descriptor ``path`` names when it is one of this process's open streams
    (:data:`_FD_PATH`), else None. Such a path is written where the stream stands: taken
    as a file, it was resolved to the file the shell redirected the stream to, and that
    file was replaced (``> all.txt``: the lines written before were lost; ``>>``: the
    file's earlier lines too)."""
    m = _FD_PATH.fullmatch(os.path.normpath(path))
    if m is None:
        return None
    stdout, stderr, dev_fd, pid, proc_fd = m.groups()
    if pid is not None and int(pid) != os.getpid():
        return None   # (another process's stream: a file like any other to us)
    return 1 if stdout else 2 if stderr else int(dev_fd or proc_fd)


def _write_table(path, A, names):
    def write(fh):   # (binary: the same bytes on every platform)
        if path.endswith(".npy"):
            np.save(fh, A)
            return
        fh.write((_csv_line(names) + "\n").encode())   # (a name holding a comma quoted)
        np.savetxt(fh, A, delimiter=",", fmt="%.10g")
    if path == "-" or _stream_fd(path) == 1:
        sys.stdout.flush()
        write(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    fd = _stream_fd(path)
    if fd is not None:   # /dev/stderr, /dev/fd/3...: written at the stream's position
        sys.stderr.flush()
        try:
            with open(fd, "wb", closefd=False) as fh:
                write(fh)
        except OSError as exc:
            raise CliError(f"--out {path}: cannot write: {exc.strerror or exc}") from None
        return
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "wb") as fh:   # /dev/null, a FIFO...: written in place, never replaced
            write(fh)
        return
    # a regular file, written atomically: a failed write (disk full, Ctrl-C) leaves
    # neither a truncated table nor a temporary file; a symbolic link's target is the
    # file replaced (the link stays a link)
    try:
        write_atomically(os.path.realpath(path), write)
    except OSError as exc:
        raise CliError(f"--out {path}: cannot write: {exc.strerror or exc}") from None


def _cmd_predict(args) -> int:
    if args.out == "-" or _stream_fd(args.out) == 1:
        _require_stdout("the table; give --out FILE")
    model = _load_model(args.model)
    has_net = getattr(model, "net_", None) is not None
    # in the options' terms (the library's errors name method='...')
    if args.method == "exact":
        _check_exact(model, args.model, "--method exact")
    if args.method == "recognition" and not has_net:
        raise CliError(f"--method recognition needs a model fitted with --method svi; {args.model} has "
                       "no recognition networks (use --method exact or smf)")
    X, names = load_data(args.data, _split_columns(args.columns))
    _check_features(model, X, args.data, names, args.command)
    if np.isnan(X).any() and (args.method in ("exact", "smf") or (args.method is None and not has_net)):
        raise CliError(f"{args.data} has missing values; --method {args.method or 'exact/smf'} needs "
                       "complete rows (--method recognition, a model fitted with --method svi, takes "
                       "missing values)")
    if args.out != "-" and _stream_fd(args.out) is None:
        _check_out_file(args.out, "--out")
    if args.reconstruct:
        A = model.reconstruct(X, method=args.method)
        cols = [f"mean_{n}" for n in names]
    else:
        A = model.predict_proba(X, method=args.method)
        cols = [f"theta_{m}" for m in range(A.shape[1])]
    _write_table(args.out, A, cols)
    if args.out != "-" and _stream_fd(args.out) not in (1, 2):   # (not into the table itself)
        print(f"wrote {A.shape[0]:,} rows x {A.shape[1]} columns to {args.out}", file=sys.stderr)
    return 0


def _engine_class():
    try:
        from .stream.engine import StreamEngine
    except ImportError as exc:
        raise CliError(f"the streaming engine is not available: {exc}") from None
    return StreamEngine


def _check_posterior(model, path, mode, posterior, learn) -> None:
    """What StreamEngine refuses about --mode, --posterior and --learn for the model
    ``path`` (fitted), in those options' names rather than the engine's arguments."""
    if posterior == "exact":
        _check_exact_chains(model.n_chains, path)
        return
    if learn or not _needs_new_net(model, mode, posterior):
        return
    net = getattr(model, "net_", None)
    if mode == "filter":   # (the engine never takes a model's network for filtering)
        need = "--mode filter needs a causal recognition network, which a model file does not provide"
    else:
        need = (f"--mode smooth needs a centred recognition network and {path} has "
                + (f"a {net.mode} one" if net is not None else "none (it was not fitted with --method svi)"))
    raise CliError(f"{need}: add --learn (each stream then trains one online) or use --posterior exact")


def _needs_new_net(model, mode, posterior) -> bool:
    """Whether a StreamEngine of a fitted ``model`` starts a recognition network of its
    own (trained on a warm-up of the stream, then online): the model has none for
    ``mode`` (:func:`~streamfhmm.stream.engine.model_network`)."""
    from .stream.engine import model_network
    return posterior == "recognition" and model_network(model, mode, posterior) is None


def _check_exact_chains(n_chains, source) -> None:
    from .exact import MAX_EXACT_CHAINS
    if n_chains > MAX_EXACT_CHAINS:
        raise CliError(f"--posterior exact is limited to {MAX_EXACT_CHAINS} chains (2^M joint states per "
                       f"sample), got {n_chains} ({source}): use --posterior recognition")


def _cmd_bench(args) -> int:
    _require_stdout("the measurements")
    StreamEngine = _engine_class()
    model = _load_model(args.model)
    _check_posterior(model, args.model, args.mode, args.posterior, args.learn)
    X, names = load_data(args.data, _split_columns(args.columns))
    _check_features(model, X, args.data, names, args.command)
    if args.samples is not None:
        X = X[:args.samples]
    n = X.shape[0]
    progress = _progress(args)
    # reference in the same run: the batch pass of the same posterior over the same rows
    # (exact smoothing for --posterior exact; it was the recognition pass whenever the
    # model had networks)
    method = ("exact" if args.posterior == "exact"
              else "recognition" if getattr(model, "net_", None) is not None else None)
    model.predict_proba(X[:min(n, 100)], method=method)
    t0 = time.perf_counter()
    model.predict_proba(X, method=method)
    batch_rate = n / (time.perf_counter() - t0)
    engine = StreamEngine(model, mode=args.mode, learn=args.learn, posterior=args.posterior)
    for x in X[:min(n, 50)]:
        engine.push(x)            # warm the kernels
    engine.close()
    engine = StreamEngine(model, mode=args.mode, learn=args.learn, posterior=args.posterior)
    lat = np.empty(n)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=n, unit="sample", desc="bench", mininterval=0.5)
    deadline = None if args.time_budget is None else time.perf_counter() + args.time_budget
    done = 0
    t0 = time.perf_counter()
    try:
        pc = time.perf_counter
        for i in range(n):
            a = pc()
            engine.push(X[i])
            lat[i] = pc() - a
            done += 1
            if bar is not None and done % 1000 == 0:
                bar.update(1000)
            if deadline is not None and done % 256 == 0 and pc() > deadline:
                break
        pushed = pc() - t0
        # (timed apart: the end of the stream flushes the smoothing lag, and a warm-up
        # not yet complete, which fits the model from the samples buffered: counted in
        # the push throughput, it made the pushes look slow)
        t1 = pc()
        tail = len(engine.flush())
        flushed = pc() - t1
    finally:
        if bar is not None:
            bar.close()
        engine.close()
    lat = lat[:done] * 1e6
    rate = done / pushed
    print(f"streamed {done:,} samples through StreamEngine(mode={args.mode!r}, learn={args.learn}, "
          f"posterior={args.posterior!r}) in {pushed + flushed:.2f} s: {pushed:.2f} s of pushes, "
          f"{flushed:.3f} s of the final flush ({tail:,} posterior(s))")
    print(f"  push throughput   {rate:12,.0f} samples/s ({done / (pushed + flushed):,.0f} with the flush)")
    print(f"  push latency      p50 {np.percentile(lat, 50):8.1f} us   p99 {np.percentile(lat, 99):8.1f} us   "
          f"max {lat.max():8.1f} us")
    print(f"  batch predict_proba ({method or 'default'}) {batch_rate:12,.0f} samples/s; streaming / batch "
          f"= {rate / batch_rate:.3f}")
    return 0


# -- serve / replay -----------------------------------------------------------------------
def _cmd_serve(args) -> int:
    # SIGTERM/SIGINT from the start: before the loop runs they end the start-up, after it
    # starts they make it drain, checkpoint and return
    state = {"stop": False, "service": None}

    def stop():
        if state["service"] is not None:
            state["service"].request_stop()
        elif not state["stop"]:   # (the start-up: it may be compiling kernels for minutes)
            print("streamfhmm serve: stopping the start-up (a kernel being compiled is finished "
                  "first, so that Numba's cache stays whole)", file=sys.stderr, flush=True)
        state["stop"] = True
    old = _install_stop_handlers(stop)
    old_switch = sys.getswitchinterval()
    try:
        return _serve(args, state)
    finally:
        _restore_handlers(old)
        sys.setswitchinterval(old_switch)


#: serve's options of the model --cold learns, and their defaults (None in the parser)
#: messages serve reads per wake-up (StreamService's batch_size)
_SERVE_BATCH = 256
_SERVE_COLD_OPTIONS = {"chains": 4, "window": 5, "hidden": 30, "share": "chain", "seed": None}


def _serve(args, state) -> int:
    from .io.zmq import ZmqSink, ZmqSource
    from .service import DEFAULT_LEARN_IDLE, CheckpointError, StreamService, start_metrics_server
    StreamEngine = _engine_class()
    from . import FHMM

    prog = "streamfhmm serve"
    if args.checkpoint_every is not None and args.checkpoint is None:
        raise CliError("--checkpoint-every needs --checkpoint DIR")
    if args.checkpoint_retain is not None and args.checkpoint is None:
        raise CliError("--checkpoint-retain needs --checkpoint DIR")
    if args.metrics_addr is not None and not args.metrics_port:
        raise CliError("--metrics-addr needs --metrics-port")
    args.metrics_addr = args.metrics_addr or "127.0.0.1"
    for option, value in (("--learner-duty", args.learner_duty), ("--learn-samples", args.learn_samples),
                          ("--learn-idle", args.learn_idle)):
        if value is not None and not (args.learn or args.cold):
            raise CliError(f"{option} needs --learn (or --cold)")
    for dest, default in _SERVE_COLD_OPTIONS.items():   # (None in the parser: given or not)
        if getattr(args, dest) is not None and not args.cold:
            raise CliError(f"--{dest} applies to --cold (the model it learns), not to --model")
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    warmup_given = args.warmup is not None
    args.warmup = 2000 if args.warmup is None else args.warmup
    if args.cold:
        if args.features is None:
            raise CliError("--cold needs --features D (values per sample)")
        if args.posterior == "exact":
            _check_exact_chains(args.chains, "--chains")
        n_features = args.features

        def new_model():
            return FHMM(n_chains=args.chains, window=args.window, n_hidden=args.hidden,
                        share_hidden=args.share, random_state=args.seed)
        learn = True
        if not args.learn:
            print(f"{prog}: note: --cold learns the model from the stream (--learn implied)", file=sys.stderr)
    else:
        base = _load_model(args.model)
        n_features = base.n_features_in_
        if args.features is not None and args.features != n_features:
            raise CliError(f"--features {args.features} differs from the model's {n_features} features")
        _check_posterior(base, args.model, args.mode, args.posterior, args.learn)
        new_net = args.learn and _needs_new_net(base, args.mode, args.posterior)
        if warmup_given and not new_net:
            raise CliError(f"--warmup applies to --cold, or to --model --learn when the streams start a "
                           f"recognition network of their own (--mode filter, or a model fitted without "
                           f"--method svi); the streams of {args.model} start at once")

        def new_model():
            from . import FHMM as _F
            return _F.load(args.model)
        learn = args.learn
    shared = new_model() if args.share_model else None
    extra = ({"n_features": n_features, "warmup": args.warmup} if args.cold
             else {"warmup": args.warmup} if new_net else {})
    # --learner-duty, --learn-samples: new engines get them, resumed ones too; without them
    # they keep the engine's defaults (new) or their checkpoint's settings (resumed)
    learner_kw = {} if args.learner_duty is None else {"learner_duty": args.learner_duty}
    if args.learn_samples is not None:
        learner_kw["learn_samples"] = args.learn_samples

    def factory(topic):
        return StreamEngine(shared if shared is not None else new_model(), mode=args.mode, learn=learn,
                            posterior=args.posterior, **extra, **learner_kw)

    def resume(path):
        return StreamEngine.resume(path, learn=learn, **learner_kw)

    # the checks that need no kernel, and the sockets (a port in use, a CURVE key file
    # that is no certificate), before the warm-up below: on a first run it compiles the
    # kernels for minutes
    curve = _curve(args)
    if args.checkpoint is not None:
        _check_checkpoint_dir(args.checkpoint)
    if args.metrics_port:
        _check_metrics_port(args.metrics_addr, args.metrics_port)
    sub_bind = args.bind
    pub_bind = not args.connect
    _warn_exposed(args.sub, sub_bind, curve, prog)
    _warn_exposed(args.pub, pub_bind, curve, prog)
    import zmq
    ctx = zmq.Context()   # terminated at the end, so that LINGER delivers the last posteriors
    try:
        sink = ZmqSink(args.pub, bind=pub_bind, format=args.format, hwm=args.hwm,
                       linger_ms=args.linger, curve=curve, context=ctx)
    except BaseException:
        ctx.term()
        raise
    try:
        # (not subscribed before the service runs: nothing is read while the kernels warm up)
        source = ZmqSource(args.sub, n_features, topics=args.topics, bind=sub_bind, hwm=args.hwm,
                           linger_ms=args.linger, subscribe=False, curve=curve, context=ctx,
                           # (room for one read's new topics: the service releases those
                           # it does not serve, and those it retires, for new ones)
                           max_streams=args.max_streams + _SERVE_BATCH, resync_after=args.resync_after)
    except BaseException:
        sink.close(0)
        ctx.term()
        raise
    server = None
    try:
        # fail now, not at the first sample, on a configuration the engine refuses; and
        # load the compiled kernels before subscribing
        _warm_engine(StreamEngine, factory, new_model, args, n_features, lambda: state["stop"])
        if state["stop"]:
            print(f"{prog}: stopped during the start-up", file=sys.stderr, flush=True)
            return 0
        try:
            service = StreamService(source, sink, factory, resume_engine=resume,
                                    checkpoint_dir=args.checkpoint,
                                    checkpoint_every=(args.checkpoint_every if args.checkpoint_every
                                                      else (10_000 if args.checkpoint else None)),
                                    heartbeat_interval=args.heartbeat, status_interval=args.status_interval,
                                    status=lambda line: print(line, file=sys.stderr, flush=True),
                                    max_streams=args.max_streams, wait_subscribers=args.wait_subscribers,
                                    batch_size=_SERVE_BATCH, retire_idle=args.retire_idle,
                                    checkpoint_retain=args.checkpoint_retain,
                                    learn_idle=(None if not (args.learn or args.cold)
                                                else DEFAULT_LEARN_IDLE if args.learn_idle is None
                                                else args.learn_idle or None),
                                    batch_wait=min(args.batch_wait * 1e-6, 1.0), lane=not args.no_lane)
        except CheckpointError as exc:
            raise CliError(str(exc)) from None
        if args.metrics_port:
            try:
                server = start_metrics_server(service, args.metrics_port, args.metrics_addr)
            except RuntimeError as exc:
                raise CliError(str(exc)) from None
            except OSError as exc:
                raise CliError(f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc}") from None
        learning = "off"
        if learn:
            learning = (f"on (learner duty {args.learner_duty:g} per stream)" if args.learner_duty
                        else f"on (learner duty {DEFAULT_LEARNER_DUTY:g} per new stream, the default; "
                             f"resumed streams keep their checkpoint's)")
            if args.learn_samples is not None:
                learning += f", for each stream's first {args.learn_samples:,} samples"
        print(f"{prog}: {'cold start' if args.cold else args.model}, {n_features} features, mode {args.mode}, "
              f"learning {learning}; input {'bound at' if sub_bind else 'from'} "
              f"{source.endpoint}, output {'bound at' if pub_bind else 'to'} {sink.endpoint} ({args.format})",
              file=sys.stderr, flush=True)
        # the learner thread hands the interpreter back to the inference path this often
        sys.setswitchinterval(args.switch_interval)
        state["service"] = service
        if state["stop"]:
            service.request_stop()
        service.run(time_budget=args.time_budget, max_samples=args.max_samples)
        print(service.status_line(prefix=f"{prog}: stopped after"), file=sys.stderr, flush=True)
        failed = service.final_checkpoint_failures
        if failed:   # (exit 0 told a supervisor all was kept, and a restart went back further)
            shown = ", ".join(repr(n) for n in failed[:5]) + (", ..." if len(failed) > 5 else "")
            raise CliError(f"the shutdown checkpoint of {_plural(len(failed), 'stream')} failed ({shown}): "
                           f"a restart resumes {'it' if len(failed) == 1 else 'them'} from the last "
                           f"checkpoint written in {args.checkpoint}")
    finally:
        if server is not None:
            server.close()
        source.close(0)
        sink.close()
        ctx.term()
    return 0


def _check_checkpoint_dir(path) -> None:
    """--checkpoint DIR is (or can be made) a directory we can write to: the service's
    own preparation, before the kernels are warmed up rather than after."""
    from .service import make_checkpoint_dir
    problem = make_checkpoint_dir(path)
    if problem:
        raise CliError(f"--checkpoint {path}: cannot use it as the checkpoint directory: {problem}")
    _check_writable_dir(path, f"--checkpoint {path}")


def _check_metrics_port(addr, port) -> None:
    """prometheus-client is installed and ``addr:port`` can be bound now (the server
    itself starts with the service, after the kernels are warmed up)."""
    from .service import require_prometheus
    try:
        require_prometheus()
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    import socket
    try:   # (as prometheus-client binds it: the first address, SO_REUSEADDR)
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {addr}:{port}: {exc}") from None


def _warm_engine(StreamEngine, factory, new_model, args, n_features, stopped=lambda: False):
    """Run the kernels a stream will need once: the engine's, then (a fitted model) the
    serving lane's (:func:`_warm_lane`); ``stopped()`` true skips the phases left."""
    try:
        probe = factory(b"")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    probe.close()
    if stopped():
        return
    if args.cold:
        _warm_cold_engine(StreamEngine, args, n_features, stopped)
        return
    model = new_model()

    def engine(topic=b""):
        return StreamEngine(model, mode=args.mode, learn=False, posterior=args.posterior)
    try:
        eng = engine()
    except ValueError:
        return  # e.g. a filter-mode network only the learner can make: nothing to warm
    X, _ = model.sample(4 * model.window + 16, random_state=0)
    _run_through(eng, X, X)
    if not stopped():
        _warm_lane(engine, X, args)


def _run_through(eng, singles, block) -> None:
    """Push ``singles`` one at a time, then ``block`` in one ``push_many``, flush and
    close ``eng``: each of its paths run once (a kernel warm-up)."""
    try:
        for x in singles:
            eng.push(x)
        eng.push_many(block)
        eng.flush()
    finally:
        eng.close()


def _warm_lane(factory, X, args):
    """The serving lane's kernel too (see :func:`streamfhmm.service.warm_lane`)."""
    if args.no_lane:
        return
    from .service import warm_lane
    warm_lane(factory, X, args.format)


def _warm_cold_engine(StreamEngine, args, n_features, stopped=lambda: False):
    """Run a cold-start engine through its warm-up on a small simulated stream, so that
    every kernel a cold stream needs (initialisation, networks, learner) is compiled or
    loaded from the cache before the service subscribes: a first run then does not let
    the publisher stream ahead of a service that is still compiling.

    On a first run (the learner's kernel not in Numba's cache) with two or more cores,
    a child process compiles the learner's kernels (most of the compilation: one fused
    kernel, about a minute) while this one compiles the inference kernels; the cold
    engine then loads both from the cache. Without a usable cache the child's work is
    lost and this process compiles all of it after the child's run."""
    child = _start_learner_compilation(args, n_features)
    if child is not None:
        import subprocess
        try:
            if not stopped():
                _warm_inference_engine(StreamEngine, args, n_features)
            # the child's whole run, not only until the kernel's index appears: Numba
            # writes a kernel's index before its code, and a child stopped in between
            # left an index that names the code file of an older build of the kernel
            child.wait(_COMPILE_CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:   # (this process compiles what is left)
            pass
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    if not stopped():
        _run_cold_engine(StreamEngine, args, n_features)


#: seconds serve waits for the child compiling the learner's kernels
_COMPILE_CHILD_TIMEOUT = 900.0


def _learner_kernel_cached() -> bool:
    """Whether Numba's cache holds a compiled learner kernel (of any signature) for the
    current source (an internal of Numba's cache, read defensively: False when it
    cannot tell, and serve then starts the child, which loads the kernel and exits)."""
    try:
        from .kernels import online
        return bool(online.svi_run._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001
        return False


def _start_learner_compilation(args, n_features):
    """A child ``python`` compiling the cold engine's kernels (:func:`_compile_child`),
    or None: the learner kernel is cached already, one core only, or no child starts."""
    from .learn.svi import check_n_jobs
    if check_n_jobs(-1) < 2 or _learner_kernel_cached():   # (-1: the processors we may use)
        return None
    import json
    import subprocess
    spec = {k: getattr(args, k) for k in ("chains", "window", "hidden", "share", "mode", "posterior")}
    spec = json.dumps(dict(spec, n_features=n_features))
    env = dict(os.environ, **{DIE_WITH_PARENT_ENV: str(os.getpid())})
    try:
        return subprocess.Popen([sys.executable, "-c", "import sys; from streamfhmm.cli import "
                                 "_compile_child; _compile_child(sys.argv[1])", spec],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None


def _compile_child(spec: str) -> None:
    """The child of :func:`_start_learner_compilation`: the cold engine's warm-up run,
    which compiles the learner's kernels first (into Numba's cache)."""
    import json
    # (a Ctrl-C in serve's terminal reaches this process too: it would stop a cache write
    # half done; it ends with serve, by _die_with_parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    from .stream.engine import StreamEngine
    spec = json.loads(spec)
    n_features = spec.pop("n_features")
    _run_cold_engine(StreamEngine, argparse.Namespace(**spec), n_features)


def _warm_inference_engine(StreamEngine, args, n_features):
    """The inference kernels of a cold stream (its posterior and mode), without the
    learner: an engine with fixed random parameters (and network) of the same shapes."""
    from . import FHMM
    from .model import FHMMParams
    from .network import RecognitionNet
    from .stream.engine import _net_mode
    params = FHMMParams.random(args.chains, n_features, random_state=0, noise=0.3)
    model = FHMM.from_params(params.W, params.covariance, params.transmat, params.startprob,
                             window=args.window, n_hidden=args.hidden, share_hidden=args.share)
    X, _ = params.sample(8 * args.window + 64, random_state=1)
    kw = {}
    if args.posterior == "recognition":
        net = RecognitionNet(args.chains, n_features, window=args.window, n_hidden=args.hidden,
                             share=args.share, mode=_net_mode(args.mode)).init(random_state=0)
        kw["net"] = net.fit_scaler(X)
    try:
        eng = StreamEngine(model, mode=args.mode, learn=False, posterior=args.posterior, **kw)
    except ValueError:
        return
    _run_through(eng, X[:2 * args.window], X[2 * args.window:])


def _run_cold_engine(StreamEngine, args, n_features):
    """A cold-start engine of ``args``' shapes through its warm-up and some samples."""
    from . import FHMM
    from .model import FHMMParams
    params = FHMMParams.random(args.chains, n_features, random_state=0, noise=0.3)
    # (its own warm-up, not the user's --warmup: long enough to initialise the chains,
    # which takes n_chains + 2 samples)
    n_warm = max(200, 8 * args.window, args.chains + 2)
    model = FHMM(n_chains=args.chains, window=args.window, n_hidden=args.hidden,
                 share_hidden=args.share, random_state=0)
    try:
        eng = StreamEngine(model, mode=args.mode, learn=True, posterior=args.posterior,
                           n_features=n_features, warmup=n_warm, warmup_steps=2, learner_duty=0.05)
    except ValueError:
        return
    X, _ = params.sample(n_warm + 8 * args.window + 64, random_state=1)
    _run_through(eng, X[:n_warm + 2 * args.window], X[n_warm + 2 * args.window:])
    # (not the serving lane: a cold stream reaches it only after its own warm-up, and
    # compiling it then overlaps the stream; before subscribing it would add its ~10 s
    # to the start of every first run: the demo's first run took 121-129 s instead of
    # 112-114)


def _cmd_replay(args) -> int:
    from .io.zmq import replay
    X, _ = load_data(args.data, _split_columns(args.columns))
    if args.start_row:
        X = X[args.start_row:]
    if args.limit is not None:
        X = X[:args.limit]
    if X.shape[0] == 0:
        raise CliError(f"{args.data}: no rows left to replay")
    if args.start_seq + X.shape[0] > SEQ_LIMIT:
        room = SEQ_LIMIT - args.start_seq
        raise CliError(f"--start-seq {args.start_seq} leaves room for {_plural(room, 'row')} (sequence "
                       f"numbers are below 2**63) and {args.data} has {_plural(X.shape[0], 'row')} to "
                       f"replay: lower --start-seq, or give --limit {room}")
    if args.wait_timeout is not None and args.wait_subscribers == 0:
        raise CliError("--wait-timeout applies to --wait-subscribers N with N >= 1 (0 does not wait)")
    curve = _curve(args)
    _warn_exposed(args.pub, not args.connect, curve, "streamfhmm replay")
    stop = {"flag": False}
    old = _install_stop_handlers(lambda: stop.__setitem__("flag", True))
    try:
        try:
            res = replay(X, args.pub, rate=args.rate or None, topic=args.topic, format=args.format,
                         bind=not args.connect, wait_subscribers=args.wait_subscribers,
                         wait_timeout=args.wait_timeout, start_seq=args.start_seq, hwm=args.hwm,
                         linger_ms=args.linger, end=not args.no_end, time_budget=args.time_budget,
                         progress=_progress(args), curve=curve, should_stop=lambda: stop["flag"],
                         announce=lambda ep: print(
                             f"streamfhmm replay: {X.shape[0]:,} rows of {X.shape[1]} values on {ep}"
                             + (f", waiting for {args.wait_subscribers} subscriber(s)"
                                if args.wait_subscribers else ""), file=sys.stderr, flush=True))
        except TimeoutError as exc:
            raise CliError(str(exc)) from None
    finally:
        _restore_handlers(old)
    seqs = f" (seq {args.start_seq}..{res['last_seq']})" if res["sent"] else ""
    # (a stop by signal is a normal end, as serve's: exit 0, with what was left unsent)
    stopped = (f"stopped by a signal after {res['sent']:,} of {X.shape[0]:,} rows: "
               if stop["flag"] and res["sent"] < X.shape[0] else "")
    print(f"streamfhmm replay: {stopped}sent {res['sent']:,} messages{seqs} "
          f"in {res['seconds']:.3f} s: {res['rate']:,.0f} messages/s", file=sys.stderr, flush=True)
    return 0


# -- demo / disaggregate -------------------------------------------------------------------
def _cmd_demo(args) -> int:
    from .demo import DemoError, DemoTerminated, run_demo
    if args.seconds is not None and args.samples is not None:
        raise CliError("give --seconds or --samples, not both")
    view = False if args.no_view else None
    try:
        res = run_demo(seconds=args.seconds, samples=args.samples, rate=args.rate, start=args.start,
                       out_dir=args.out_dir, view=view, seed=args.seed, n_chains=args.chains,
                       window=args.window, n_hidden=args.hidden, calibration_days=args.calibration_days,
                       warmup=args.warmup, keep_learning=args.keep_learning)
    except DemoError as exc:
        raise CliError(str(exc)) from None
    except DemoTerminated:
        print("streamfhmm demo: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    if res.missing or res.gaps:
        raise CliError(f"{res.missing} posteriors missing, {res.gaps} input gaps")
    return 0


def _fit_kwargs(args) -> dict:
    """SVI steps, learning rate, threads and (when given) the networks' warm-up and the
    runs of ``disaggregate``."""
    kw = dict(max_iter=args.iters, learning_rate=args.learning_rate, n_jobs=args.n_jobs)
    if args.net_warmup is not None:
        kw["net_warmup"] = args.net_warmup
    if args.n_restarts > 1:
        kw["n_restarts"] = args.n_restarts
    return kw


def _cmd_disaggregate(args) -> int:
    from .power import PAPER_MODEL, disaggregate_report, period_minutes
    # the checks that need no data and no fit come first: a bad value must not cost the fit
    _require_stdout("the report")
    if args.net_warmup is not None and args.net_warmup >= args.iters:
        raise CliError(f"--net-warmup {args.net_warmup:,} must be less than --iters {args.iters:,}: the "
                       "model would never be trained, only its networks")
    _check_restarts_option(args.n_restarts, "--iters", args.iters)
    for option, days in (("--calibration-days", args.calibration_days),
                         ("--evaluation-days", args.evaluation_days)):
        if period_minutes(days) < 1:
            raise CliError(f"{option} {days:g} is less than a minute of data (the periods are counted in "
                           "one-minute rows)")
    if args.train_rows is not None and args.train_rows > args.n_train:
        raise CliError(f"--train-rows {args.train_rows:,} is more than the {args.n_train:,} training minutes "
                       "(--n-train)")
    if not args.no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError('plotting needs matplotlib: pip install "streamfhmm[plot]" (or --no-plot)') from None
        try:
            os.makedirs(args.out_dir, exist_ok=True)
        except OSError as exc:
            raise CliError(f"--out-dir {args.out_dir}: cannot create it: {exc.strerror or exc}") from None
        _check_writable_dir(args.out_dir, f"--out-dir {args.out_dir}")
    try:
        from .datasets import load_household_power
        t0 = time.perf_counter()
        data = load_household_power()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise CliError(str(exc)) from None
    print(f"loaded {len(data):,} minutes ({str(data.timestamps[0])[:16]} .. {str(data.timestamps[-1])[:16]}) "
          f"in {time.perf_counter() - t0:.1f} s; seed={args.seed}", flush=True)
    # before the fit, in the options' names: the test period holds the calibration and
    # evaluation days (disaggregate_report's rule, which would refuse it after the fit)
    need = period_minutes(args.calibration_days) + period_minutes(args.evaluation_days)
    if len(data) - need < 2:   # (no --n-train fits: the periods are too long)
        room = len(data) - 2
        raise CliError(f"--calibration-days {args.calibration_days:g} + --evaluation-days "
                       f"{args.evaluation_days:g} need {need:,} minutes after the training minutes, and "
                       f"the data has {len(data):,} minutes: expected the two periods together to be at "
                       f"most {room:,} minutes ({math.floor(room / 14.4) / 100:,.2f} days), leaving "
                       "--n-train at least 2")
    if not 2 <= args.n_train <= len(data) - need:
        raise CliError(f"--n-train must be between 2 and {max(len(data) - need, 2):,}: the data has "
                       f"{len(data):,} minutes and the test period after them needs {need:,} "
                       f"(--calibration-days {args.calibration_days:g} + --evaluation-days "
                       f"{args.evaluation_days:g}), got {args.n_train:,}")
    model_kwargs = {k: v for k, v in (("n_chains", args.chains), ("window", args.window),
                                      ("n_hidden", args.hidden)) if v is not None}
    kw = dict(PAPER_MODEL, **model_kwargs)
    print(f"fitting FHMM({kw['n_chains']} chains, window {kw['window']}, {kw['n_hidden']} hidden units) "
          f"by SVI ({args.iters:,} steps) on the aggregate channels of the "
          f"{'last ' + format(args.train_rows, ',') if args.train_rows else 'first ' + format(args.n_train, ',')}"
          f" training minutes", flush=True)
    printed = []

    def before_plots(r):   # the table before the PNGs: a plot that fails must not take it along
        print(r.format(), flush=True)
        printed.append(True)

    try:
        report = disaggregate_report(
            data, n_train=args.n_train, train_rows=args.train_rows,
            calibration_days=args.calibration_days, evaluation_days=args.evaluation_days,
            on_threshold=args.on_threshold, model_kwargs=model_kwargs, fit_kwargs=_fit_kwargs(args),
            plot_dir=None if args.no_plot else args.out_dir, random_state=args.seed,
            progress=_progress(args), before_plots=before_plots)
    except OSError as exc:
        if not printed:
            raise
        raise CliError(f"--out-dir {args.out_dir}: cannot write the plots: {exc.strerror or exc}") from None
    for p in report.pngs:
        print(f"wrote {p}")
    return 0


# -- the parser -----------------------------------------------------------------------------
def _data_args(p, model=True):
    p.add_argument("data", metavar="DATA", help="CSV file with a header row, or .npy array")
    if model:
        p.add_argument("--model", required=True, metavar="MODEL.npz", help="a model written by 'streamfhmm fit'")
    p.add_argument("--columns", metavar="A,B,...",
                   help="columns to use, by name (CSV; a name holding a comma in double quotes, as in the "
                        "header) or index (.npy)")


def _progress_args(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _zmq_args(p, linger):
    p.add_argument("--hwm", type=_int_at_least(0, _MAX_SOCKOPT), default=100_000,
                   help="ZeroMQ high-water mark per socket and peer, messages (default 100000)")
    p.add_argument("--linger", type=_int_at_least(0, _MAX_SOCKOPT), default=linger, metavar="MS",
                   help=f"ZeroMQ LINGER at close, milliseconds (default {linger})")
    p.add_argument("--curve-secret", metavar="FILE",
                   help="CURVE certificate with this side's secret key (zmq.auth.create_certificates); "
                        "bound sockets become CURVE servers")
    p.add_argument("--curve-public", metavar="FILE",
                   help="the CURVE server's public certificate, for sockets that connect")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="streamfhmm", description="Streaming inference for factorial hidden Markov models.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    f = sub.add_parser("fit", help="learn a model from a data file",
                       description="Learn an FHMM (and its recognition networks) from a data file.")
    _data_args(f, model=False)
    f.add_argument("--out", required=True, metavar="MODEL.npz",
                   help="where to write the model (a symbolic link: its target)")
    f.add_argument("--chains", type=_positive_int, default=4, help="hidden binary chains M (default 4)")
    f.add_argument("--window", type=_window, default=5,
                   help=f"odd recognition window, at most {_MAX_WINDOW:,} (default 5)")
    f.add_argument("--hidden", type=_positive_int, default=30, help="hidden units per network (default 30)")
    f.add_argument("--share", choices=("chain", "all"), default="chain",
                   help="one hidden layer per chain, or one for all (default chain)")
    f.add_argument("--covariance-type", choices=("full", "diag", "spherical"), default="full",
                   help="noise covariance: full (default), diagonal, or spherical (σ² I: every "
                        "channel weighs the same)")
    f.add_argument("--method", choices=("svi", "smf", "em"), default="svi",
                   help="learning method: svi (default), smf (structured mean-field EM) or em (exact EM, "
                        "at most 14 chains)")
    f.add_argument("--max-iter", type=_positive_int,
                   help="SVI steps or EM iterations (default 20,000 SVI steps; 100 iterations with "
                        "--method smf or em)")
    f.add_argument("--time-budget", type=_positive_float, metavar="SECONDS", help="stop learning after this long")
    # (defaults None: given with another --method, they are refused, not ignored)
    f.add_argument("--batch-size", type=_positive_int,
                   help="subchains per SVI step (default 10, FHMM.fit's)")
    f.add_argument("--learning-rate", type=_positive_float,
                   help="RMSprop learning rate of --method svi (default 0.01, FHMM.fit's)")
    f.add_argument("--net-warmup", type=_nonneg_int, metavar="STEPS",
                   help="svi: first steps training the recognition networks only, the model held (default 0)")
    f.add_argument("--n-jobs", type=_n_jobs, default=1, metavar="N",
                   help="svi: threads computing each step's gradient (-1: one per processor; default 1)")
    f.add_argument("--n-init", type=_positive_int, default=1, metavar="K",
                   help="K starts (k-means, then a short SMF-EM run), the one most likely on the "
                        "data kept (default 1)")
    f.add_argument("--n-restarts", type=_positive_int, default=1, metavar="K",
                   help="svi: K runs from their own starts take the first sixth of the steps; the "
                        "one with the highest ELBO on the data goes on (default 1; needs --max-iter "
                        "or its default, not --time-budget)")
    f.add_argument("--seed", type=_nonneg_int, default=None, help="random seed, an integer >= 0")
    _progress_args(f)
    f.set_defaults(func=_cmd_fit)

    s = sub.add_parser("score", help="exact log-likelihood of a data file",
                       description="Exact log-likelihood (forward algorithm) of a data file under a model.")
    _data_args(s)
    s.add_argument("--elbo", action="store_true", help="also the recognition networks' ELBO")
    s.set_defaults(func=_cmd_score)

    pr = sub.add_parser("predict", help="posterior marginals of every chain",
                        description="Posterior marginals q(s_t^m = 1) (or the reconstructed data) for a data file.")
    _data_args(pr)
    pr.add_argument("--out", default="-", metavar="OUT.csv|OUT.npy",
                    help="output file (default: CSV on stdout; a symbolic link: its target)")
    pr.add_argument("--method", choices=("recognition", "exact", "smf"),
                    help="inference method (default: recognition if the model has networks, else exact up to 12 chains, else smf)")
    pr.add_argument("--reconstruct", action="store_true", help="write the reconstructed data W^T E[s_t] instead")
    pr.set_defaults(func=_cmd_predict)

    b = sub.add_parser("bench", help="streaming throughput and latency on a data file",
                       description="Push a data file through the StreamEngine one sample at a time; print "
                                   "samples/s, per-sample latency and the ratio to batch inference.")
    _data_args(b)
    b.add_argument("--samples", type=_positive_int, help="use only the first N rows")
    b.add_argument("--mode", choices=("smooth", "filter"), default="smooth")
    b.add_argument("--posterior", choices=("recognition", "exact"), default="recognition")
    b.add_argument("--learn", action="store_true", help="learn while streaming")
    b.add_argument("--time-budget", type=_nonneg_float, metavar="SECONDS")
    _progress_args(b)
    b.set_defaults(func=_cmd_bench)

    sv = sub.add_parser(
        "serve", help="serve posteriors over ZeroMQ",
        description="Subscribe to sensor samples, keep one engine state per topic, publish posteriors. "
                    "Wire format: streamfhmm.io.wire. SIGTERM/SIGINT drain, checkpoint and exit 0 (1 if a stream's checkpoint failed then). "
                    "By default the input SUB connects to --sub and the output PUB binds --pub.")
    g = sv.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", metavar="MODEL.npz", help="a fitted model")
    g.add_argument("--cold", action="store_true", help="start without a model (warm-up, then learn)")
    sv.add_argument("--sub", type=_endpoint, default="tcp://127.0.0.1:5555", metavar="ENDPOINT",
                    help="input endpoint (default tcp://127.0.0.1:5555; a bare port means 127.0.0.1)")
    sv.add_argument("--pub", type=_endpoint, default="tcp://127.0.0.1:5556", metavar="ENDPOINT",
                    help="output endpoint (default tcp://127.0.0.1:5556)")
    bc = sv.add_mutually_exclusive_group()
    bc.add_argument("--bind", action="store_true", help="bind both endpoints (sensors connect to the service)")
    bc.add_argument("--connect", action="store_true", help="connect both endpoints (to forwarders)")
    sv.add_argument("--topics", nargs="+", metavar="PREFIX", type=_topic,
                    help="subscribe to these topic prefixes only")
    sv.add_argument("--learn", action="store_true", help="keep learning from the stream")
    sv.add_argument("--learner-duty", type=_duty, metavar="FRACTION",
                    help="with --learn: the fraction of one core each stream's background learner "
                         f"may use, in (0, 1] (default {DEFAULT_LEARNER_DUTY:g}; a resumed stream "
                         "keeps its checkpoint's). It waits between rounds of SVI steps so that its "
                         "CPU time stays within this share; 1 runs them back to back and takes a "
                         "whole core from inference. Learner steps/s scale with it (status line)")
    sv.add_argument("--learn-samples", type=_positive_int, metavar="N",
                    help="with --learn: each stream learns from its first N samples (warm-up "
                         "included), then its model is held fixed, e.g. for a map calibrated on "
                         "the posteriors (default: learn as long as the stream runs)")
    sv.add_argument("--mode", choices=("smooth", "filter"), default="smooth",
                    help="smooth: centred windows (a lag of window//2 samples); filter: no lag")
    sv.add_argument("--posterior", choices=("recognition", "exact"), default="recognition")
    sv.add_argument("--share-model", action="store_true",
                    help="build every stream's engine from one model object loaded once (default: each "
                         "stream loads its own copy); each engine still learns from its own stream")
    sv.add_argument("--features", type=_positive_int, help="values per sample (required with --cold)")
    sv.add_argument("--chains", type=_positive_int, help="with --cold: hidden chains (default 4)")
    sv.add_argument("--window", type=_window,
                    help=f"with --cold: odd recognition window, at most {_MAX_WINDOW:,} (default 5)")
    sv.add_argument("--hidden", type=_positive_int, help="with --cold: hidden units (default 30)")
    sv.add_argument("--share", choices=("chain", "all"), help="with --cold: network sharing (default chain)")
    sv.add_argument("--seed", type=_nonneg_int, default=None, help="with --cold: random seed (>= 0)")
    sv.add_argument("--warmup", type=_int_at_least(2), metavar="N",
                    help="with --cold: samples with a value per stream before the model is initialised (default 2000); "
                         "also with --model and --learn when the streams start a recognition network of "
                         "their own (--mode filter, or a model fitted without --method svi)")
    sv.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory; the streams found there that had not ended are "
                         "resumed (others when their topics come back)")
    sv.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                    help="checkpoint each stream every N samples (default 10000 with --checkpoint)")
    sv.add_argument("--checkpoint-retain", type=_nonneg_float, metavar="SECONDS",
                    help="remove the checkpoint of a stream that ended or was retired (and is not "
                         "served) this long after it was written; its topic coming back then starts "
                         "anew (default: keep them all; each is an engine file of up to a few MB)")
    sv.add_argument("--format", choices=("binary", "json"), default="binary", help="output format")
    sv.add_argument("--metrics-port", type=_port, metavar="P",
                    help="serve Prometheus metrics on http://127.0.0.1:P/metrics (needs prometheus-client)")
    sv.add_argument("--metrics-addr", help="with --metrics-port: address of the metrics server (default 127.0.0.1)")
    sv.add_argument("--heartbeat", type=_nonneg_float, default=1.0, metavar="SECONDS",
                    help="heartbeat after this long idle (default 1; 0: none)")
    sv.add_argument("--status-interval", type=_nonneg_float, default=10.0, metavar="SECONDS",
                    help="status line on stderr every this many seconds (default 10; 0: none)")
    sv.add_argument("--wait-subscribers", type=_nonneg_int, default=0, metavar="N",
                    help="subscribe to the input only once N subscriptions to the output have come "
                         "(a consumer counts once per topic prefix it subscribes to)")
    sv.add_argument("--max-streams", type=_positive_int, default=1024,
                    help="most streams held at once (default 1024): a new topic takes the place of "
                         "a stream that ended (or, with --retire-idle, of one idle that long); "
                         "with --checkpoint that stream resumes where it was if its topic comes "
                         "back, without it starts anew; with no such stream the new topic is "
                         "skipped and counted. A restart resumes at most this many, the last checkpointed")
    sv.add_argument("--retire-idle", type=_nonneg_float, default=None, metavar="SECONDS",
                    help="let a new topic also take the place of a stream without a sample for "
                         "this long, when --max-streams are held (default: only ended streams)")
    sv.add_argument("--learn-idle", type=_nonneg_float, default=None, metavar="SECONDS",
                    help="with --learn (or --cold): hold the learner of a stream without a sample "
                         "for this long until its next sample, as an ended stream's is at once "
                         "(default 60; 0: never)")
    sv.add_argument("--resync-after", type=_nonneg_int, default=64, metavar="N",
                    help="a stream whose publisher restarted at a sequence number other than 0 "
                         "is followed again after N numbers in order behind the last one (the "
                         "N-1 before are skipped as stale; 0: only a restart at 0; default 64)")
    sv.add_argument("--time-budget", type=_nonneg_float, metavar="SECONDS", help="stop after this long")
    sv.add_argument("--max-samples", type=_positive_int, metavar="N",
                    help="stop after the read that brings the samples to N (the input still queued "
                         "is not read)")
    sv.add_argument("--switch-interval", type=_positive_float, default=1e-4, metavar="SECONDS",
                    help="Python's thread switch interval: the longest the learner thread keeps the "
                         "interpreter from the inference path (default 0.0001; Python's is 0.005)")
    sv.add_argument("--batch-wait", type=_nonneg_float, default=250.0, metavar="MICROSECONDS",
                    help="adaptive batching: when messages queue up, read the input at most once per "
                         "this many microseconds, so that they are handled in batches (each waiting at "
                         "most this long); a message that finds the service idle is handled at once; "
                         "0: read on every wake-up (default 250)")
    sv.add_argument("--no-lane", action="store_true",
                    help="never use the serving lane (one compiled call per read for a single stream, or "
                         "the one live stream among ended ones; binary or JSON output): the "
                         "general path, for comparison")
    sv.add_argument("--verbose", "-v", action="store_true", help="log stream events (new, ended, resumed)")
    _zmq_args(sv, linger=2000)
    sv.set_defaults(func=_cmd_serve)

    r = sub.add_parser(
        "replay", help="publish a data file over ZeroMQ",
        description="Publish the rows of a data file (or 'household') as samples with sequence numbers "
                    "and time stamps. Waits for subscribers first (an XPUB handshake; nothing is lost to "
                    "ZeroMQ's slow joiner) and ends with an end-of-stream heartbeat.")
    r.add_argument("data", metavar="DATA", help="CSV file with a header row, .npy array, or 'household'")
    r.add_argument("--columns", metavar="A,B,...",
                   help="columns to use, by name (CSV, household; a name holding a comma in double quotes, "
                        "as in the header) or index (.npy); default all (household: its 7 columns, while a "
                        "model fitted on some of them needs just those)")
    r.add_argument("--pub", type=_endpoint, default="tcp://127.0.0.1:5555", metavar="ENDPOINT",
                   help="endpoint to bind (default tcp://127.0.0.1:5555)")
    r.add_argument("--connect", action="store_true", help="connect to --pub instead of binding it")
    r.add_argument("--rate", type=_nonneg_float, default=1000.0,
                   help="messages per second (default 1000; 0: as fast as possible)")
    r.add_argument("--topic", default="", type=_topic,
                   help="topic (stream name) of the messages (default empty)")
    r.add_argument("--format", choices=("binary", "json"), default="binary", help="message format")
    r.add_argument("--wait-subscribers", type=_nonneg_int, default=1, metavar="N",
                   help="start once N subscriptions take the topic (default 1; 0: do not wait; a "
                        "consumer counts once per matching prefix it subscribes to)")
    r.add_argument("--wait-timeout", type=_bounded_float(0.0, _MAX_WAIT, low_open=False), metavar="SECONDS",
                   help="give up if they have not come after this long (at most a year, "
                        f"{_MAX_WAIT:,.0f})")
    r.add_argument("--start-seq", type=_int_at_least(0, SEQ_LIMIT - 1), default=0,
                   help="sequence number of the first row (sequence numbers are below 2**63)")
    r.add_argument("--start-row", type=_nonneg_int, default=0, help="skip the first rows")
    r.add_argument("--limit", type=_positive_int, help="publish at most N rows")
    r.add_argument("--no-end", action="store_true", help="do not send the end-of-stream heartbeat")
    r.add_argument("--time-budget", type=_nonneg_float, metavar="SECONDS", help="stop after this long")
    _zmq_args(r, linger=60_000)
    _progress_args(r)
    r.set_defaults(func=_cmd_replay)

    from .demo import DEFAULT_OUT_DIR, DEFAULT_RATE, DEFAULT_SECONDS, DEFAULT_START, DEFAULT_WARMUP
    d = sub.add_parser(
        "demo", help="live household-power disaggregation over ZeroMQ (needs the demo extra)",
        description="Start 'serve --cold --learn' and 'replay household' as subprocesses on 127.0.0.1, "
                    "subscribe to the posteriors, calibrate a map from the chains to the three sub-meters "
                    "after the warm-up, show the estimates live, then score them against an "
                    "aggregate-regression baseline and write PNGs. Needs pip install \"streamfhmm[demo]\".")
    ln = d.add_mutually_exclusive_group()
    ln.add_argument("--seconds", type=_bounded_float(0.0, _MAX_SECONDS),
                    help=f"seconds of streaming at --rate (default {DEFAULT_SECONDS:g})")
    ln.add_argument("--samples", type=_positive_int, help="minutes of data to stream (instead of --seconds)")
    d.add_argument("--rate", type=_bounded_float(0.0, _MAX_RATE), default=DEFAULT_RATE,
                   help=f"messages (minutes of data) per second (default {DEFAULT_RATE:g})")
    d.add_argument("--start", default=DEFAULT_START, metavar="ROW|DATE",
                   help=f"first row, or a date such as 2008-01-01 (default {DEFAULT_START})")
    d.add_argument("--out-dir", default=DEFAULT_OUT_DIR, metavar="DIR",
                   help=f"where the PNGs go (default ./{DEFAULT_OUT_DIR})")
    d.add_argument("--no-view", action="store_true",
                   help="plain progress lines instead of the live view (also when stdout is not a terminal)")
    d.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the service's cold start (default 0)")
    d.add_argument("--chains", type=_positive_int, default=6, help="hidden chains the service learns (default 6)")
    d.add_argument("--window", type=_window, default=9,
                   help=f"odd recognition window, at most {_MAX_WINDOW:,} (default 9)")
    d.add_argument("--hidden", type=_positive_int, default=32, help="hidden units per network (default 32)")
    d.add_argument("--calibration-days", type=_bounded_float(0.0, _MAX_DAYS), default=14.0,
                   help="days after the warm-up that calibrate the sub-meter map (default 14; a third of "
                        "a shorter stream)")
    d.add_argument("--warmup", type=_int_at_least(2), default=DEFAULT_WARMUP, metavar="N",
                   help="samples the service buffers before initialising its model (default "
                        f"{DEFAULT_WARMUP}, one week)")
    d.add_argument("--keep-learning", action="store_true",
                   help="let the service learn to the end (default: it stops at the calibration's "
                        "end, so that the calibrated chains keep their meaning)")
    d.set_defaults(func=_cmd_demo)

    dg = sub.add_parser(
        "disaggregate", help="offline disaggregation of the household power data",
        description="Learn an FHMM by SVI from the aggregate channels (active, reactive power, voltage) of "
                    "the first --n-train minutes, map its chains to Sub_metering_1..3 by non-negative least "
                    "squares over the first --calibration-days of the rest, score the estimated sub-meters "
                    "over the next --evaluation-days beside an aggregate-regression baseline, and plot one "
                    "day. Needs pip install \"streamfhmm[data,plot]\".")
    dg.add_argument("--iters", type=_positive_int, default=20_000, help="SVI steps (default 20000)")
    dg.add_argument("--learning-rate", type=_positive_float, default=3e-3, help="RMSprop learning rate (default 0.003)")
    dg.add_argument("--net-warmup", type=_nonneg_int, metavar="STEPS",
                    help="first SVI steps training the recognition networks only (default a tenth of --iters)")
    dg.add_argument("--n-jobs", type=_n_jobs, default=1, metavar="N",
                    help="threads computing each SVI step's gradient (-1: one per processor; default 1)")
    dg.add_argument("--n-restarts", type=_positive_int, default=1, metavar="K",
                    help="K SVI runs from their own starts take the first sixth of --iters; the one "
                         "with the highest training ELBO goes on (default 1)")
    dg.add_argument("--n-train", type=_positive_int, default=1_000_000,
                    help="minutes before the calibration period (default 1000000, the paper's split)")
    dg.add_argument("--train-rows", type=_int_at_least(2), help="fit on the last so many of them (default all)")
    dg.add_argument("--calibration-days", type=_bounded_float(0.0, _MAX_DAYS), default=14.0, help="default 14")
    dg.add_argument("--evaluation-days", type=_bounded_float(0.0, _MAX_DAYS), default=28.0, help="default 28")
    dg.add_argument("--on-threshold", type=_positive_float, default=5.0,
                    help="on/off threshold of the F1 score, Wh per minute (default 5)")
    dg.add_argument("--chains", type=_positive_int, help="hidden chains (default 10, the paper's)")
    dg.add_argument("--window", type=_window,
                    help=f"odd recognition window, at most {_MAX_WINDOW:,} (default 21)")
    dg.add_argument("--hidden", type=_positive_int, help="hidden units, shared by all chains (default 200)")
    dg.add_argument("--out-dir", default="power_plots", metavar="DIR", help="where the PNGs go (default power_plots)")
    dg.add_argument("--no-plot", action="store_true", help="write no PNG")
    dg.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the fit (default 0)")
    _progress_args(dg)
    dg.set_defaults(func=_cmd_disaggregate)
    p._commands = {"fit": f, "score": s, "predict": pr, "bench": b, "serve": sv, "replay": r, "demo": d,
                   "disaggregate": dg}
    return p


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time of the record."""

    def emit(self, record):
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


def _configure_logging(verbose: bool):
    """Log to stderr for the duration of a command; returns the undo function."""
    root = logging.getLogger("streamfhmm")
    old_level = root.level
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    h = _StderrHandler()
    h.setFormatter(logging.Formatter("streamfhmm: %(levelname)s: %(message)s"))
    root.addHandler(h)

    def undo():
        root.removeHandler(h)
        root.setLevel(old_level)
    return undo


def _die_with_parent():
    """In a subprocess of ``streamfhmm demo`` (its environment names the demo's pid), ask
    Linux for SIGKILL when the demo dies without stopping it (the demo itself killed by
    SIGKILL): nothing else would stop it, as it runs in a session of its own. (Not
    SIGTERM: a replay would then linger up to a minute over messages nobody takes; the
    demo's subprocesses keep nothing worth a clean exit.)"""
    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError, ValueError):
        return
    if os.getppid() != int(parent):   # it died before prctl: follow it now
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv=None) -> int:
    _die_with_parent()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:   # reported by the subcommand's parser, which names the subcommand
        parser._commands.get(getattr(args, "command", None), parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    prog = f"streamfhmm {args.command}"
    undo = None
    old_handlers = {}
    if args.command in ("serve", "replay"):
        undo = _configure_logging(getattr(args, "verbose", False))
    elif args.command != "demo":   # (those three handle SIGTERM themselves)
        # SIGTERM ends the command as Ctrl-C does, through the cleanup on the way out
        # (a file being written atomically leaves no temporary file): by default it
        # killed the process on the spot
        old_handlers = _set_handlers(_terminate, (signal.SIGTERM,))
    try:
        return _run(args, prog)
    finally:
        _restore_handlers(old_handlers)
        if undo is not None:
            undo()


class _Terminated(BaseException):
    """SIGTERM during a command that does not handle it itself."""


def _terminate(signum, frame):
    raise _Terminated()


def _run(args, prog) -> int:
    try:
        return args.func(args)
    except CliError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader of stdout went away (``streamfhmm predict ... | head``): stop quietly
        if sys.stdout is None:   # (not stdout's: it has none)
            print(f"{prog}: error: broken pipe: the reader of the output went away", file=sys.stderr)
            return 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (ValueError, OSError, RuntimeError, ArithmeticError) as exc:
        # ArithmeticError: OverflowError, FloatingPointError (a diverging fit), ZeroDivisionError
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 1
    except MemoryError as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else "not enough memory"
        print(f"{prog}: error: out of memory: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
