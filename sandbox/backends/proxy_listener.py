"""The proxy's listener, made inside the run's network namespace and handed to the gateway (decision 89).

A proxied run (`Limits.proxy`) gets a network namespace of its own, as a run without network
does, but its loopback is brought UP (with 127.0.0.1 its only address: `::1` is taken off
again) and one TCP socket listens on it at 127.0.0.1:PROXY_PORT
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
import sys
from typing import NoReturn

from sandbox.errors import SandboxStartError
from sandbox.proxy_port import PROXY_BACKLOG, PROXY_HOST, PROXY_PORT

_SIOCSIFFLAGS = 0x8914
_SIOCDIFADDR = 0x8936
_LOOPBACK_INDEX = 1  # `lo` is the first interface of every new network namespace
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFNAMSIZ = 16
_FD_SIZE = 4

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


class _In6IfReq(ctypes.Structure):
    """struct in6_ifreq (linux/ipv6.h): the address, its prefix length, the interface's index."""

    _fields_ = [("addr", ctypes.c_ubyte * 16), ("prefixlen", ctypes.c_uint32), ("ifindex", ctypes.c_int)]


class ProxyListener:
    """Prepared in the gateway for one spawn; `apply` runs in the child, `receive` in the gateway after it."""

    __slots__ = ("_address", "_args", "_child_end", "_gateway_end", "_ifreq", "_ipv6_args", "_loopback6", "_rights")

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
        loopback6 = (ctypes.c_ubyte * 16)(*socket.inet_pton(socket.AF_INET6, "::1"))
        self._loopback6 = _In6IfReq(loopback6, 128, _LOOPBACK_INDEX)
        self._ipv6_args = (
            ctypes.c_int(socket.AF_INET6),
            ctypes.c_int(socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
            ctypes.c_ulong(_SIOCDIFADDR),
            ctypes.pointer(self._loopback6),
        )

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
            self._drop_ipv6_loopback()
            if _bind(fd, address, length) != 0:
                self._fail(b"bind")
            if _listen(fd, backlog) != 0:
                self._fail(b"listen")
            data, level, kind_of = self._rights
            self._child_end.sendmsg(data, [(level, kind_of, fd.to_bytes(_FD_SIZE, sys.byteorder, signed=True))])
        finally:
            _close(fd)

    def _drop_ipv6_loopback(self) -> None:
        """Take `::1` off the loopback `lo` just got: 127.0.0.1 is then the only address in the namespace, so
        no other listener can stand in for the proxy on a name that might mean it (`localhost`). Nothing to do
        where the kernel has no IPv6 (EAFNOSUPPORT) or gave `lo` no `::1` (EADDRNOTAVAIL)."""
        family, kind, remove, loopback6 = self._ipv6_args
        fd = _socket(family, kind, 0)
        if fd < 0:
            if ctypes.get_errno() == errno.EAFNOSUPPORT:
                return
            self._fail(b"ipv6_off")
        try:
            if _ioctl(fd, remove, loopback6) != 0 and ctypes.get_errno() != errno.EADDRNOTAVAIL:
                self._fail(b"ipv6_off")
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
            # Not socket.recv_fds: Python 3.11's drops its flags, and would wait forever for a child that sent nothing.
            flags = socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC  # never inheritable, not even for a moment
            data, ancillary, _, _ = self._gateway_end.recvmsg(64, socket.CMSG_SPACE(_FD_SIZE), flags)
        except OSError as exc:
            raise SandboxStartError("network_proxy:not_received") from exc
        fds = [
            int.from_bytes(payload[i : i + _FD_SIZE], sys.byteorder, signed=True)
            for level, kind, payload in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
            for i in range(0, len(payload) - len(payload) % _FD_SIZE, _FD_SIZE)
        ]
        if len(fds) != 1 or data != b"p":
            for fd in fds:
                os.close(fd)
            detail = data[1:].decode("ascii", "replace") if data.startswith(b"!") else "not_received"
            raise SandboxStartError(f"network_proxy:{detail}")
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
