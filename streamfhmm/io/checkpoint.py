"""Atomic, pickle-free checkpoint files.

A checkpoint is an ``.npz`` file of plain arrays plus a JSON description, tagged with a
format name and version. It is written to a temporary file in the target's directory,
flushed and fsync'ed, then moved into place with ``os.replace``, so a reader (or a
process restarted after a crash, even a ``SIGKILL`` in the middle of a write) sees
either the previous complete checkpoint or the new one, never a torn file. Reading
never unpickles anything (``allow_pickle=False``).
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import stat

import numpy as np

__all__ = ["FORMAT_TAG", "FORMAT_VERSION", "save_checkpoint", "load_checkpoint", "write_atomically",
           "npz_read_error", "npz_target"]

FORMAT_TAG = "streamfhmm.StreamEngine.checkpoint"
#: 2: a warm-up's samples with a value and their positions (``warmup.rows``, ``warmup.at``);
#: 1: every warm-up sample (``warmup.buf``), still read
FORMAT_VERSION = 2


def path_str(path, what: str = "path") -> str:
    """``path`` (str, bytes or path-like) as str; ValueError for anything else (a
    number, None or a file object raised TypeError from os.fspath)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ValueError(f"{what} must be a file name (str or path-like), got {type(path).__name__}")
    return os.fsdecode(os.fspath(path))


def npz_target(path, what: str = "path") -> str:
    """The file a save to ``path`` writes: ``path`` with ``.npz`` appended unless it ends
    so (as ``np.savez`` names it).

    Raises
    ------
    ValueError
        ``path`` names a directory (or ends with a separator, or is empty): a save there
        wrote ``dir.npz`` beside it, or a hidden ``dir/.npz``.
    FileNotFoundError
        The directory it would go in does not exist (the error named the temporary file).
    """
    path = path_str(path, what)
    if not path or path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)) \
            or os.path.isdir(path):
        raise ValueError(f"{what} must name a file (such as model.npz), got the directory {path!r}")
    target = path if path.endswith(".npz") else path + ".npz"
    if os.path.isdir(target):
        raise ValueError(f"{what} {path!r} would be written as {target!r}, which is a directory")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot write {target!r}: its directory {parent!r} does not exist")
    return target


#: the first bytes of a zip archive (an .npz file is one; an empty archive starts with PK\x05\x06)
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def read_npz(fh) -> dict:
    """The arrays of the ``.npz`` archive open as ``fh`` (binary, seekable), read only if
    every member is stored uncompressed, as ``np.savez`` writes them: a compressed
    member's data is not bounded by the file's size (a 534 kB checkpoint inflated to
    512 MB before any check could refuse it). ValueError otherwise."""
    import zipfile
    with zipfile.ZipFile(fh) as z:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"its member {info.filename!r} is compressed; streamfhmm writes "
                                 f"its files uncompressed (np.savez)")
    fh.seek(0)
    with np.load(fh, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def npz_read_error(path, exc: Exception) -> str:
    """What went wrong reading ``path`` with ``np.load``, for an error message.

    A file that is not a zip archive at all (a CSV given as a model, say) is named as
    such: numpy tries to read it as a pickle and its message suggests loading it with
    ``allow_pickle`` or ``pickle.load``, which streamfhmm never does. Otherwise
    ``exc``'s message (a truncated or damaged archive).
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return str(exc)
    if not head:
        return "the file is empty"
    if head not in _ZIP_MAGIC:
        return f"not a zip archive, as .npz files are (it begins with {head!r})"
    return str(exc)


#: the longest file name (bytes) assumed where the file system does not say
_NAME_MAX = 255
#: numbers the temporary files of this process's atomic writes
_TMP_COUNTER = itertools.count()


def _name_max(directory: str) -> int:
    """The longest file name, in bytes, ``directory``'s file system takes."""
    try:
        n = os.pathconf(directory, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):   # (no pathconf on Windows)
        return _NAME_MAX
    return n if isinstance(n, int) and n > 0 else _NAME_MAX


def _temporary_name(name: str, suffix: str, name_max: int) -> str:
    """``.NAME<suffix>``, with ``name`` cut so that the whole fits in ``name_max`` bytes."""
    budget = name_max - len(os.fsencode("." + suffix))
    while name and len(os.fsencode(name)) > budget:
        name = name[:max(0, min(len(name) - 1, budget))]   # (a character may take 4 bytes)
    return f".{name}{suffix}"


def _create_temporary(directory: str, name: str, mode: int, name_max: int) -> tuple[int, str]:
    """Create a new file for :func:`write_atomically` in ``directory`` (``O_EXCL``: no
    other writer's, even one of another process with the same process id); its name is
    ``.NAME.tmp-<pid>-<n>``, ``name`` cut if the whole would be longer than ``name_max``
    bytes.

    Returns
    -------
    fd : int
        Opened for writing.
    tmp : str
        Its path.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(1000):
        tmp = os.path.join(directory, _temporary_name(
            name, f".tmp-{os.getpid()}-{next(_TMP_COUNTER)}", name_max))
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", tmp)


#: the extended attribute holding a file's POSIX access ACL (Linux)
_ACL_XATTR = "system.posix_acl_access"


def _keep_owner_and_mode(fd: int, tmp: str, st: os.stat_result, path: str) -> None:
    """Give the temporary file ``fd`` (``tmp``) the group, permission bits, POSIX access
    ACL and, when running as root, the owner of the file ``path`` it replaces (``st``).

    Where the group cannot be kept (a group the writer is not a member of), its
    permission bits are dropped: the file's new group must not read what the old one
    could. So are they where the old file has an ACL that cannot be copied: its group
    bits are then the ACL's mask, not the owning group's rights. If the mode cannot be
    set the file keeps the owner-only mode it was created with, never a wider one.
    """
    mode = stat.S_IMODE(st.st_mode)
    acl = None
    if hasattr(os, "getxattr"):
        try:
            acl = os.getxattr(path, _ACL_XATTR)
        except OSError:   # (none, or no ACLs on this file system)
            acl = None
    if hasattr(os, "fchown"):
        mine = os.fstat(fd)
        if st.st_gid != mine.st_gid:
            try:
                os.fchown(fd, -1, st.st_gid)
            except OSError:
                mode &= ~0o070
        if st.st_uid != mine.st_uid and os.geteuid() == 0:
            try:
                os.fchown(fd, st.st_uid, -1)
            except OSError:
                pass
    if acl is not None:
        try:
            os.setxattr(fd, _ACL_XATTR, acl)   # (sets the group bits to its mask too)
        except OSError:
            mode &= ~0o070
    try:   # (after fchown, which clears the set-id bits)
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        else:
            os.chmod(tmp, mode)
    except OSError:
        pass


def write_atomically(path, write, mode: str = "wb") -> None:
    """Write a file so that readers see the old one or the new one, never a torn file.

    ``write(fh)`` fills a temporary file in ``path``'s directory (opened with ``mode``;
    text modes as UTF-8), which is flushed, fsync'ed and moved into place with
    ``os.replace``; the directory is then fsync'ed, so the rename is durable too. If
    anything fails (a full disk, Ctrl-C) the temporary file is removed, ``path`` is left
    as it was and the error propagates.

    A file replaced keeps its permission bits and group (and, for a writer running as
    root, its owner); the temporary file has them before anything is written to it. A
    new file is created as ``open`` would (``0o666`` less the umask).

    Parameters
    ----------
    path : str or path-like
        The file written.
    write : callable
        ``write(fh)`` writes the content to the open file ``fh``.
    mode : str
        The mode the temporary file is opened with (``"wb"`` or ``"w"``).

    Raises
    ------
    OSError
        The file cannot be written (``ENAMETOOLONG`` before anything is written when its
        name is longer than the file system takes).
    """
    path = os.fsdecode(os.fspath(path))
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    name_max = _name_max(directory)
    if len(os.fsencode(name)) > name_max:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), path)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        st = None     # (a device or pipe's bits are not a file's)
    # a file replaced: owner-only until it has the old file's group and bits
    fd, tmp = _create_temporary(directory, name, 0o666 if st is None else stat.S_IMODE(st.st_mode) & 0o700,
                                name_max)
    try:
        try:
            if st is not None:
                _keep_owner_and_mode(fd, tmp, st, path)
            fh = os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
        except BaseException:
            os.close(fd)
            raise
        with fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def save_checkpoint(path, arrays: dict, meta: dict) -> str:
    """Write ``arrays`` (name → array) and ``meta`` (JSON-serialisable) atomically.

    Parameters
    ----------
    path : str or path-like
        Target file; ``.npz`` is appended when missing (:func:`npz_target`: a
        directory is a ValueError).
    arrays : dict of str to array_like
        Plain numeric or string arrays (no objects).
    meta : dict
        Stored as JSON.

    Returns
    -------
    str
        The path written.
    """
    path = npz_target(path)
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    for k, v in payload.items():
        if v.dtype == object:
            raise ValueError(f"checkpoint array {k!r} has dtype object; only plain arrays are stored")
    payload["format"] = np.array(FORMAT_TAG)
    payload["version"] = np.array(FORMAT_VERSION)
    payload["meta"] = np.array(json.dumps(meta))
    write_atomically(path, lambda fh: np.savez(fh, **payload))
    return path


def load_checkpoint(path) -> tuple[dict, dict]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Returns
    -------
    meta : dict
    arrays : dict of str to ndarray

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        ``path`` is not a file name (str, bytes or path-like), or the file is not a
        streamfhmm checkpoint (foreign, truncated or damaged), or was written by a newer
        format version.
    """
    path = path_str(path)   # (bytes as str, as save_checkpoint; a number is a ValueError)
    if not os.path.exists(path) and os.path.exists(path + ".npz"):
        path += ".npz"
    try:
        with open(path, "rb") as fh:   # (closed even when reading fails)
            data = read_npz(fh)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a streamfhmm checkpoint") from None
    except Exception as exc:  # a truncated or foreign file fails in many ways
        raise ValueError(f"{path} is not a valid streamfhmm checkpoint (unreadable or truncated "
                         f".npz: {npz_read_error(path, exc)})") from None
    if not isinstance(data, dict) or str(data.get("format", "")) != FORMAT_TAG:
        raise ValueError(f"{path} is not a streamfhmm checkpoint (no '{FORMAT_TAG}' tag)")
    try:
        version = int(data.pop("version"))
        meta = json.loads(str(data.pop("meta")))
        if not isinstance(meta, dict):
            raise TypeError(f"its description is a JSON {type(meta).__name__}, not an object")
    except (KeyError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # (int(inf): OverflowError; JSON nested 100,000 deep: RecursionError)
        raise ValueError(f"{path} is a damaged streamfhmm checkpoint: {exc}") from None
    if version > FORMAT_VERSION:
        raise ValueError(f"{path} has checkpoint format version {version}; this streamfhmm reads "
                         f"versions up to {FORMAT_VERSION}: upgrade streamfhmm")
    data.pop("format")
    return meta, data
