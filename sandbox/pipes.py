"""anyio byte streams over the gateway's ends of a confined server's stdin and stdout pipes (decision 83).

A server spawned with `preexec_fn` (sandbox/confine.py) is not an `anyio.open_process` child, so its
pipes are wrapped here: non-blocking fds, awaited with `anyio.wait_readable`/`wait_writable`, closed
with `anyio.notify_closing` so a task still waiting on one wakes instead of hanging.
"""

from __future__ import annotations

import contextlib
import errno
import os

import anyio
import anyio.abc

_CHUNK = 64 * 1024


class PipeReceiveStream(anyio.abc.ByteReceiveStream):
    """The read end of a pipe: `receive` returns what is there (at most `max_bytes`), EndOfStream at its end."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def receive(self, max_bytes: int = _CHUNK) -> bytes:
        while True:
            if self._fd < 0:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise anyio.BrokenResourceError from exc
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        _close(self)


class PipeSendStream(anyio.abc.ByteSendStream):
    """The write end of a pipe: `send` writes all of `item`, waiting while the pipe is full."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            if self._fd < 0:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
            except OSError as exc:  # EPIPE: the server is gone
                if exc.errno == errno.EINTR:
                    continue
                raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        _close(self)


def _close(stream: PipeReceiveStream | PipeSendStream) -> None:
    fd, stream._fd = stream._fd, -1
    if fd >= 0:
        anyio.notify_closing(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
