"""The proxy's listener, made inside the run's network namespace and handed to the gateway (decision 89).

A proxied run (`Limits.proxy`) gets a network namespace of its own, as a run without network
does, but its loopback is brought UP and one TCP socket listens on it at 127.0.0.1:PROXY_PORT
(sandbox/proxy_port.py). The child makes it in `preexec_fn`, right after it entered the namespace
and while it still holds CAP_NET_ADMIN there (as root, before the drop; rootless, in its own user
namespace before `seal`), sends it to the gateway over a socket pair made here (SCM_RIGHTS) and
closes its own copy: by the time the command starts, the listener is bound and listening, and no
process of the run holds it. Connections the command makes wait in its backlog until the gateway
accepts them; the gateway's proxy talks to the world from the gateway's own namespace.

The run cannot take the address: the listener has no SO_REUSEPORT and no SO_REUSEADDR, so a
second bind to the port fails (EADDRINUSE) whatever address or option the run tries, and Landlock
(ABI >= 4) forbids every bind anyway. It cannot bring the loopback down, nor add an interface or a
route: it has no capability in the namespace (a pool uid, a sealed user namespace, or bubblewrap's
nested one). Each run has its own namespace, so nothing one run does reaches the next one's listener.

`apply` only makes system calls with arguments built in the parent (the same rule as every layer,
sandbox/confine.py). When a step fails it sends the step's name and errno instead of the socket,
so the gateway names it (`network_proxy:<step>:<errno>`) rather than a bare `layer_failed`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import struct
from typing import NoReturn

from sandbox.errors import SandboxStartError
from sandbox.proxy_port import PROXY_BACKLOG, PROXY_HOST, PROXY_PORT

_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFNAMSIZ = 16

_libc = ctypes.CDLL(None, use_errno=True)
_socket = _libc.socket
_socket.restype = ctypes.c_int
_ioctl = _libc.ioctl
_ioctl.restype = ctypes.c_int
_bind = _libc.bind
_bind.restype = ctypes.c_int
_listen = _libc.listen
_listen.restype = ctypes.c_int
_close = _libc.close
_close.restype = ctypes.c_int


class _IfReq(ctypes.Structure):
    """struct ifreq (linux/if.h): a name and, for SIOCSIFFLAGS, the flags; 40 bytes on x86_64."""

    _fields_ = [("name", ctypes.c_char * _IFNAMSIZ), ("flags", ctypes.c_short), ("_pad", ctypes.c_char * 22)]


class _SockaddrIn(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_ushort),
        ("port", ctypes.c_uint16),
        ("addr", ctypes.c_uint32),
        ("_zero", ctypes.c_char * 8),
    ]


class ProxyListener:
    """Prepared in the gateway for one spawn; `apply` runs in the child, `receive` in the gateway after it."""

    __slots__ = ("_address", "_args", "_child_end", "_gateway_end", "_ifreq", "_rights")

    def __init__(self) -> None:
        self._gateway_end, self._child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._ifreq = _IfReq(b"lo", _IFF_UP | _IFF_LOOPBACK)
        port = struct.unpack("=H", struct.pack("!H", PROXY_PORT))[0]
        addr = struct.unpack("=I", socket.inet_aton(PROXY_HOST))[0]
        self._address = _SockaddrIn(socket.AF_INET, port, addr)
        stream = socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        # Every argument of apply() is a ctypes object built now, so the child converts nothing.
        self._args = (
            ctypes.c_int(socket.AF_INET),
            ctypes.c_int(stream),
            ctypes.c_int(0),
            ctypes.c_ulong(_SIOCSIFFLAGS),
            ctypes.pointer(self._ifreq),
            ctypes.pointer(self._address),
            ctypes.c_uint(ctypes.sizeof(_SockaddrIn)),
            ctypes.c_int(PROXY_BACKLOG),
        )
        self._rights = ([b"p"], socket.SOL_SOCKET, socket.SCM_RIGHTS)

    def apply(self) -> None:
        """In the child, in its new network namespace with CAP_NET_ADMIN there: loopback up, the listener made,
        sent to the gateway and closed here. Raises OSError (after telling the gateway which step failed)."""
        family, kind, zero, set_flags, ifreq, address, length, backlog = self._args
        fd = _socket(family, kind, zero)
        if fd < 0:
            self._fail(b"socket")
        try:
            if _ioctl(fd, set_flags, ifreq) != 0:
                self._fail(b"loopback_up")
            if _bind(fd, address, length) != 0:
                self._fail(b"bind")
            if _listen(fd, backlog) != 0:
                self._fail(b"listen")
            data, level, kind_of = self._rights
            self._child_end.sendmsg(data, [(level, kind_of, fd.to_bytes(4, "little", signed=True))])
        finally:
            _close(fd)

    def _fail(self, step: bytes) -> NoReturn:
        number = ctypes.get_errno()
        with contextlib.suppress(OSError):
            self._child_end.send(b"!" + step + b":" + errno.errorcode.get(number, "E?").encode())
        raise OSError(number, os.strerror(number))

    def failure(self) -> str | None:
        """In the gateway, after a spawn that failed: the slug naming the listener's failed step, if it was this one."""
        try:
            data = self._gateway_end.recv(64, socket.MSG_DONTWAIT)
        except OSError:
            return None
        return f"network_proxy:{data[1:].decode('ascii', 'replace')}" if data.startswith(b"!") else None

    def receive(self) -> socket.socket:
        """In the gateway, after the spawn: the listener the child made (non-blocking). Raises SandboxStartError."""
        self._child_end.close()
        try:
            data, fds, _, _ = socket.recv_fds(self._gateway_end, 64, 1, socket.MSG_DONTWAIT)
        except OSError as exc:
            raise SandboxStartError("network_proxy:not_received") from exc
        if len(fds) != 1 or data != b"p":
            for fd in fds:
                os.close(fd)
            detail = data[1:].decode("ascii", "replace") if data.startswith(b"!") else "not_received"
            raise SandboxStartError(f"network_proxy:{detail}")
        os.set_inheritable(fds[0], False)
        listener = socket.socket(fileno=fds[0])
        if not is_proxy_listener(listener):
            listener.close()
            raise SandboxStartError("network_proxy:not_a_listener")
        listener.setblocking(False)
        return listener

    def close(self) -> None:
        self._gateway_end.close()
        self._child_end.close()


def is_proxy_listener(listener: socket.socket) -> bool:
    """Whether `listener` is a listening TCP socket bound to PROXY_HOST:PROXY_PORT."""
    try:
        listening = listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        bound = listener.getsockname() == (PROXY_HOST, PROXY_PORT)
    except OSError:
        return False
    return listening and bound and listener.family == socket.AF_INET and listener.type == socket.SOCK_STREAM
