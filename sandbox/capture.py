"""A run's stdout and stderr through pipes, copied into files by the gateway with its own cap (decision 36).

The run never holds a descriptor of a host file. A file descriptor lets its holder grow the
file by means no size check sees: `fallocate(FALLOC_FL_KEEP_SIZE)` reserves blocks without
moving `st_size` (and `RLIMIT_FSIZE` does not apply to it), `ftruncate` and sparse writes at
large offsets move it in one call, a shared `mmap` writes without `write()`; and
`readlink("/proc/self/fd/1")` names the state folder. A pipe has none of these: `fallocate`,
`ftruncate` and `mmap` fail on it, it has no offset, and it is named `pipe:[inode]`.

The gateway reads both pipes as the run writes and keeps at most `cap` bytes of each stream
(what it reads past that is counted and dropped), so the host holds at most `cap` bytes per
stream whatever the run does. A run that stops reading is not the gateway's problem: the
writer blocks on a full pipe, and the time limit still ends the run.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import anyio

from sandbox.task_groups import task_group

_CHUNK = 64 * 1024
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class _Stream:
    path: Path
    read_fd: int = -1
    write_fd: int = -1
    file_fd: int = -1
    received: int = 0
    kept: int = 0
    ended: bool = False
    failed: bool = False
    """Writing the file failed once: nothing more of this stream is kept."""


class OutputCapture:
    """Two pipes for the run (`child_fds`), pumped into `stdout_path` and `stderr_path` by `pump`.

    Use as a context manager: entering creates the files (new, never through a link) and the
    pipes; leaving closes every descriptor. Call `close_child_ends` once the child holds its
    copies, so that end of file means every process of the run has let go.
    """

    def __init__(
        self, stdout_path: Path, stderr_path: Path, cap: int, on_stdout: Callable[[bytes], None] | None = None
    ) -> None:
        self._streams = (_Stream(stdout_path), _Stream(stderr_path))
        self._cap = cap
        self._on_stdout = on_stdout
        """Sees what is kept of stdout, as it comes (the run's progress): never more than `cap` bytes."""

    def __enter__(self) -> OutputCapture:
        try:
            for stream in self._streams:
                stream.file_fd = os.open(stream.path, _FILE_FLAGS, 0o600)
                stream.read_fd, stream.write_fd = os.pipe2(os.O_CLOEXEC)
                os.set_blocking(stream.read_fd, False)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def child_fds(self) -> tuple[int, int]:
        """The write ends, for the child's stdout and stderr."""
        return self._streams[0].write_fd, self._streams[1].write_fd

    @property
    def received(self) -> int:
        """Bytes the run wrote to both streams together, kept or not."""
        return sum(stream.received for stream in self._streams)

    @property
    def kept(self) -> tuple[int, int]:
        return self._streams[0].kept, self._streams[1].kept

    @property
    def truncated(self) -> bool:
        return any(stream.received > stream.kept for stream in self._streams)

    @property
    def ended(self) -> bool:
        """Both pipes reached end of file: no process holds a write end any more."""
        return all(stream.ended for stream in self._streams)

    def close_child_ends(self) -> None:
        for stream in self._streams:
            _close(stream, "write_fd")

    async def pump_all(self) -> None:
        """Copy both streams until end of file (run it in a task; cancel it to stop early)."""
        async with task_group() as group:
            for stream in self._streams:
                group.start_soon(self._pump, stream)

    async def _pump(self, stream: _Stream) -> None:
        while True:
            await anyio.wait_readable(stream.read_fd)
            if not self._drain(stream):
                stream.ended = True
                return

    def _drain(self, stream: _Stream) -> bool:
        """Read what the pipe holds now; False at end of file."""
        while True:
            try:
                data = os.read(stream.read_fd, _CHUNK)
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                return False
            stream.received += len(data)
            room = self._cap - stream.kept
            if room > 0 and not stream.failed:
                kept = data[:room]
                try:
                    _write_all(stream.file_fd, kept)
                except OSError:
                    # The host's disk is full or failing: keep reading (the run must not block on
                    # a full pipe), keep nothing more; the run's record says it was truncated.
                    stream.failed = True
                    continue
                stream.kept += len(kept)
                if self._on_stdout is not None and stream is self._streams[0]:
                    self._on_stdout(kept)

    def close(self) -> None:
        for stream in self._streams:
            for name in ("read_fd", "write_fd", "file_fd"):
                _close(stream, name)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(stream: _Stream, name: str) -> None:
    fd = getattr(stream, name)
    if fd >= 0:
        setattr(stream, name, -1)
        with contextlib.suppress(OSError):
            os.close(fd)
