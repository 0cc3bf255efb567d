"""Spawning a command and watching it to the end: time limit, output cap, kill on cancellation.

`run_sandboxed` confines the command with every layer (sandbox/confine.py) and kills what
it leaves behind by uid. `run_unsafe_unconfined` keeps only the supervision (time limit,
output cap, group kill) and does NOT confine: it is the baseline for benchmarks and tests,
and its name says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import IO

import anyio

from sandbox.backends.containment import sweep
from sandbox.backends.identity import UidPool
from sandbox.backends.landlock import runtime_read_only_paths
from sandbox.confine import ChildPlan, LayerReport, probe_layers, require_layers
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
    survivors_killed: int = 0
    """Processes of the run's uid still alive after it ended (daemonized), killed by the sweep."""


_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.05


async def run_sandboxed(
    argv: list[str], cwd: Path, limits: Limits, stdout_path: Path, stderr_path: Path, *, scratch: Path
) -> RunResult:
    """Run `argv` confined: its own uid, session, rlimits, network namespace, Landlock, seccomp.

    `cwd` (and `limits.allowed_paths`) are readable, `scratch` (its HOME and TMPDIR) is the only
    writable place; output goes to files the gateway opened. Whatever the run leaves behind,
    daemonized grandchildren included, is killed by uid before this returns.
    Raises SandboxStartError when a layer is missing or cannot be applied: nothing ran.
    """
    require_layers(layers())
    identity = _POOL.acquire()
    try:
        os.chown(scratch, identity.uid, identity.gid)
        os.chmod(scratch, 0o700)
        read_only = tuple(dict.fromkeys((*runtime_read_only_paths(), cwd, *limits.allowed_paths)))
        read_write = (scratch, Path(os.devnull))
        with ChildPlan(limits, identity, read_only, read_write) as preexec:

            def kill() -> None:
                _kill_group(process.pid)
                sweep(identity.uid)

            started = time.monotonic()
            with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
                process = _spawn(argv, cwd, limits, out, err, preexec=preexec)
        result = await _supervise(process, limits, stdout_path, stderr_path, started=started, kill=kill)
    finally:
        survivors = sweep(identity.uid)
        _POOL.release(identity)
    return dataclasses.replace(result, survivors_killed=len(survivors))


async def run_unsafe_unconfined(
    argv: list[str], cwd: Path, limits: Limits, stdout_path: Path, stderr_path: Path
) -> RunResult:
    """Only the session, time limit, output cap and group kill: NO confinement (baselines, tests)."""
    started = time.monotonic()
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        process = _spawn(argv, cwd, limits, out, err, preexec=None)
    return await _supervise(
        process, limits, stdout_path, stderr_path, started=started, kill=lambda: _kill_group(process.pid)
    )


@cache
def layers() -> LayerReport:
    """The layers this kernel and process can enforce, probed once."""
    return probe_layers()


_POOL = UidPool()


async def _supervise(
    process: subprocess.Popen[bytes],
    limits: Limits,
    stdout_path: Path,
    stderr_path: Path,
    *,
    started: float,
    kill: Callable[[], None],
) -> RunResult:
    killed_by: KilledBy | None = None
    status, peak_kb = 0, 0
    # A pidfd turns readable the moment the child exits, so the run's end is seen at once;
    # the timer only paces the time-limit and output-cap checks.
    exited = os.pidfd_open(process.pid)
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
                    kill()
            with anyio.move_on_after(delay):
                await anyio.wait_readable(exited)
            delay = min(delay * 2, _POLL_MAX_S)
    except BaseException:
        # Cancelled (notifications/cancelled, client gone) or failing: nothing outlives the call.
        kill()
        with anyio.CancelScope(shield=True):
            _reap(process.pid)
        raise
    finally:
        os.close(exited)
        process.returncode = os.waitstatus_to_exitcode(status) if status else 0
    duration_ms = int((time.monotonic() - started) * 1000)
    stdout_bytes, stderr_bytes = _truncate(stdout_path, limits), _truncate(stderr_path, limits)
    return RunResult(
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        duration_ms=duration_ms,
        killed_by=killed_by,
        peak_memory_kb=peak_kb,
        stdout_bytes=stdout_bytes[0],
        stderr_bytes=stderr_bytes[0],
        truncated=stdout_bytes[1] or stderr_bytes[1],
    )


def _spawn(
    argv: list[str],
    cwd: Path,
    limits: Limits,
    out: IO[bytes],
    err: IO[bytes],
    *,
    preexec: Callable[[], None] | None,
) -> subprocess.Popen[bytes]:
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
            preexec_fn=preexec,  # noqa: PLW1509  (deliberate: sandbox/confine.py says why)
        )
    except subprocess.SubprocessError as exc:
        raise SandboxStartError("layer_failed") from exc
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
