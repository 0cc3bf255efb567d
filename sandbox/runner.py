"""Spawning a command and watching it to the end: time limit, output cap, kill on cancellation.

`run_unsafe_unconfined` is the placeholder the sandbox layers replace: it enforces the
time limit and the output cap and kills the whole process group, but it does NOT confine
the command (no namespaces, no Landlock, no seccomp, no rlimits, no uid drop). Its name
says so on purpose; nothing else in the gateway spawns a tool.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

import anyio

from sandbox.errors import SandboxStartError
from sandbox.limits import Limits


class KilledBy(StrEnum):
    TIMEOUT = "timeout"
    OUTPUT = "output"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_code: int | None
    signal: int | None
    duration_ms: int
    killed_by: KilledBy | None
    peak_memory_kb: int
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool


_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.05


async def run_unsafe_unconfined(
    argv: list[str], cwd: Path, limits: Limits, stdout_path: Path, stderr_path: Path
) -> RunResult:
    """Run `argv` in its own session with only `limits.env` as environment; output goes to files."""
    started = time.monotonic()
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        process = _spawn(argv, cwd, limits, out, err)
        killed_by: KilledBy | None = None
        status, peak_kb = 0, 0
        try:
            delay = _POLL_FIRST_S
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    peak_kb = usage.ru_maxrss
                    break
                if killed_by is None:
                    if time.monotonic() - started > limits.timeout_s:
                        killed_by = KilledBy.TIMEOUT
                    elif _output_size(stdout_path, stderr_path) > limits.max_output_bytes:
                        killed_by = KilledBy.OUTPUT
                    if killed_by is not None:
                        _kill_group(process.pid)
                await anyio.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
        except BaseException:
            # Cancelled (notifications/cancelled, client gone) or failing: nothing outlives the call.
            _kill_group(process.pid)
            with anyio.CancelScope(shield=True):
                _reap(process.pid)
            raise
        finally:
            process.returncode = os.waitstatus_to_exitcode(status) if status else 0
    duration_ms = int((time.monotonic() - started) * 1000)
    stdout_bytes, stderr_bytes = _truncate(stdout_path, limits), _truncate(stderr_path, limits)
    truncated = stdout_bytes[1] or stderr_bytes[1]
    return RunResult(
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        duration_ms=duration_ms,
        killed_by=killed_by,
        peak_memory_kb=peak_kb,
        stdout_bytes=stdout_bytes[0],
        stderr_bytes=stderr_bytes[0],
        truncated=truncated,
    )


def _spawn(argv: list[str], cwd: Path, limits: Limits, out: IO[bytes], err: IO[bytes]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(limits.env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxStartError("spawn_failed") from exc


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _output_size(*paths: Path) -> int:
    return sum(p.stat().st_size for p in paths)


def _truncate(path: Path, limits: Limits) -> tuple[int, bool]:
    """Cut a capture file to the cap; return (bytes kept, whether it was cut)."""
    size = path.stat().st_size
    if size <= limits.max_output_bytes:
        return size, False
    with path.open("r+b") as handle:
        handle.truncate(limits.max_output_bytes)
    return limits.max_output_bytes, True
