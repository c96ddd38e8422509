"""libzmq's C functions, callable from compiled code (the wire fast path).

pyzmq links libzmq; ``dlsym`` on pyzmq's own extension module resolves ``zmq_recv``,
``zmq_send``, ``zmq_getsockopt`` and ``zmq_errno`` in the very library (and so the
very context and sockets) pyzmq uses. Their addresses are passed to Numba kernels as
integers and called through the intrinsics below, so the kernels hold no process-specific
constant and stay cacheable (``cache=True``); ``socket.underlying`` is the ``void *``
of a pyzmq socket.

:func:`functions` returns None where this is not possible (another pyzmq backend, a
platform whose loader does not resolve the symbols, a big-endian machine): callers then
use the pure pyzmq path.
"""
from __future__ import annotations

import ctypes
import errno
import sys
from typing import NamedTuple

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["LibZmq", "functions", "call_io", "call_recv", "call_send", "call_getsockopt", "call_errno",
           "ZMQ_DONTWAIT", "ZMQ_SNDMORE", "ZMQ_RCVMORE", "EAGAIN", "EINTR"]

ZMQ_DONTWAIT = 1
ZMQ_SNDMORE = 2
ZMQ_RCVMORE = 13
EAGAIN = errno.EAGAIN
EINTR = errno.EINTR


class LibZmq(NamedTuple):
    """Addresses of libzmq's functions (integers)."""

    recv: int
    send: int
    getsockopt: int
    errno: int


_cache: list = []


def functions() -> LibZmq | None:
    """The addresses of the libzmq functions pyzmq uses, or None if not reachable."""
    if _cache:
        return _cache[0]
    found = None
    if sys.byteorder == "little" and ctypes.sizeof(ctypes.c_size_t) == 8:
        try:
            from zmq.backend.cython import _zmq
            lib = ctypes.CDLL(_zmq.__file__)
            found = LibZmq(*(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                             for name in ("zmq_recv", "zmq_send", "zmq_getsockopt", "zmq_errno")))
            if not all(found):
                found = None
        except (ImportError, OSError, AttributeError):
            found = None
    _cache.append(found)
    return found


_i8p = ir.IntType(8).as_pointer()
_i32 = ir.IntType(32)
_size = ir.IntType(64)


def _fn(builder, address, ret, args):
    return builder.inttoptr(address, ir.FunctionType(ret, args).as_pointer())


@intrinsic
def call_io(typingctx, fn, sock, buf, size, flags):
    """``int f(void *sock, void *buf, size_t size, int flags)`` at address ``fn``: the
    signature of both ``zmq_recv`` and ``zmq_send``."""
    sig = types.int32(types.intp, types.intp, types.intp, types.intp, types.int32)

    def codegen(context, builder, signature, args):
        fn, sock, buf, size, flags = args
        f = _fn(builder, fn, _i32, [_i8p, _i8p, _size, _i32])
        return builder.call(f, [builder.inttoptr(sock, _i8p), builder.inttoptr(buf, _i8p), size, flags])
    return sig, codegen


#: ``zmq_recv(sock, buf, size, flags)`` (at the address given first)
call_recv = call_io
#: ``zmq_send(sock, buf, size, flags)`` (at the address given first)
call_send = call_io


@intrinsic
def call_getsockopt(typingctx, fn, sock, option, value, size):
    """``int zmq_getsockopt(void *sock, int option, void *value, size_t *size)`` at ``fn``."""
    sig = types.int32(types.intp, types.intp, types.int32, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        fn, sock, option, value, size = args
        f = _fn(builder, fn, _i32, [_i8p, _i32, _i8p, _size.as_pointer()])
        return builder.call(f, [builder.inttoptr(sock, _i8p), option, builder.inttoptr(value, _i8p),
                                builder.inttoptr(size, _size.as_pointer())])
    return sig, codegen


@intrinsic
def call_errno(typingctx, fn):
    """``int zmq_errno(void)`` at ``fn``."""
    sig = types.int32(types.intp)

    def codegen(context, builder, signature, args):
        return builder.call(_fn(builder, args[0], _i32, []), [])
    return sig, codegen
