"""Spawning a command and watching it to the end: time limit, output cap, kill on cancellation.

`run_sandboxed` confines the command with every layer the host has and the policy requires
(sandbox/confine.py) and, when it ends, kills whatever it left behind: the whole cgroup when
that layer is on, every process of the run's uid otherwise. `run_unsafe_unconfined` keeps
only the supervision (time limit, output cap, group kill) and does NOT confine: it is the
baseline for benchmarks and tests, and its name says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import IO

import anyio

from sandbox.backends import seccomp
from sandbox.backends.bubblewrap import bubblewrap_argv, command_ran
from sandbox.backends.cgroup import RunCgroup, discover
from sandbox.backends.containment import sweep
from sandbox.backends.identity import RunIdentity, UidPool
from sandbox.backends.landlock import runtime_read_only_paths
from sandbox.backends.scratch import ScratchSpace, files_for
from sandbox.confine import ChildPlan, LayerReport, plan_layers, probe_layers
from sandbox.errors import SandboxStartError
from sandbox.limits import Limits

MAX_COLLECTED_BYTES = 16 * 1024 * 1024


class KilledBy(StrEnum):
    TIMEOUT = "timeout"
    OUTPUT = "output"
    MEMORY = "memory"
    """The kernel's OOM killer killed a process of the run: the run as a whole hit its memory limit."""
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
    """Processes of the run still alive after its first process ended (daemonized), killed at the end."""
    oom_kills: int = 0
    forks_refused: int = 0
    """fork/clone calls the run's process limit refused (cgroup layer only)."""
    layers: tuple[str, ...] = ()
    """The isolation layers this run got, in the order they were applied."""
    collected: Mapping[str, Path] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Scratch files copied out (name -> where), those that were regular files under the size cap."""


_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.05


async def run_sandboxed(
    argv: list[str],
    cwd: Path,
    limits: Limits,
    stdout_path: Path,
    stderr_path: Path,
    *,
    scratch: Path,
    collect: Mapping[str, Path] = MappingProxyType({}),
    host: LayerReport | None = None,
) -> RunResult:
    """Run `argv` confined: its own uid, cgroup, session, rlimits, network and mount namespaces, Landlock, seccomp
    (with `limits.backend == "bubblewrap"`: bubblewrap's PID namespace and mount tree in place of Landlock).

    `cwd` (and `limits.allowed_paths`) are readable; `scratch` (its HOME and TMPDIR, a tmpfs of
    `limits.scratch_bytes`) is the only writable place; output goes to files the gateway
    opened. When the run ends, each `collect` name found in the scratch as a regular file of
    at most MAX_COLLECTED_BYTES is copied to its path, never through a link; then whatever the
    run left behind, daemonized grandchildren included, is killed before this returns.
    `host` is what this host can enforce (default: probed once); a layer it lacks is left out
    unless `limits.required_layers` names it. Raises SandboxStartError when a required layer is
    missing or cannot be applied: nothing ran.
    """
    active = plan_layers(host or layers(), limits)
    identity = _POOL.acquire()
    group: RunCgroup | None = None
    try:
        with contextlib.ExitStack() as stack:
            if "cgroup" in active:
                group = stack.enter_context(_run_cgroup(identity, limits))
            space = None
            if "scratch_tmpfs" in active:
                space = stack.enter_context(
                    ScratchSpace(
                        scratch, limits.scratch_bytes, files_for(limits.scratch_bytes), identity.uid, identity.gid
                    )
                )
            else:
                os.chown(scratch, identity.uid, identity.gid)
            os.chmod(scratch, 0o700)
            read_only = tuple(dict.fromkeys((*runtime_read_only_paths(), cwd, *limits.allowed_paths)))
            read_write = (scratch, Path(os.devnull))

            def kill() -> None:
                _kill_group(process.pid)
                _kill_leftovers(group, identity)

            command, pass_fds, status_fd = _command(
                argv, limits, active=active, read_only=read_only, scratch=scratch, cwd=cwd, stack=stack
            )
            with ChildPlan(
                limits, identity, read_only, read_write, active=active, group=group, scratch=space
            ) as preexec:
                started = time.monotonic()
                with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
                    process = _spawn(command, cwd, limits, out, err, preexec=preexec, pass_fds=pass_fds)
            result = await _supervise(process, limits, stdout_path, stderr_path, started=started, kill=kill)
            survivors = _kill_leftovers(group, identity)
            ended_on_its_own = result.killed_by is None
            if status_fd is not None and ended_on_its_own and not command_ran(os.pread(status_fd, 4096, 0)):
                raise SandboxStartError("bubblewrap_failed")  # bwrap could not build the tree (stderr.txt says why)
            collected = _collect(space, scratch, collect)
            if group is not None:
                usage = group.usage()
                result = dataclasses.replace(
                    result,
                    peak_memory_kb=usage.peak_memory_bytes // 1024,
                    oom_kills=usage.oom_kills,
                    forks_refused=usage.forks_refused,
                    killed_by=result.killed_by or (KilledBy.MEMORY if usage.oom_kills else None),
                )
    finally:
        if group is None:
            sweep(identity.uid)  # without a cgroup, the uid is the run: nothing of it outlives the call
        _POOL.release(identity)
    applied = tuple(name for name in _APPLY_ORDER if name in active)
    return dataclasses.replace(result, survivors_killed=len(survivors), layers=applied, collected=collected)


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
_APPLY_ORDER = (
    "cgroup", "network_namespace", "scratch_tmpfs", "rlimits", "uid_drop", "landlock", "mount_tree", "pid_namespace",
    "seccomp",
)  # fmt: skip


def _command(
    argv: list[str],
    limits: Limits,
    *,
    active: frozenset[str],
    read_only: tuple[Path, ...],
    scratch: Path,
    cwd: Path,
    stack: contextlib.ExitStack,
) -> tuple[list[str], tuple[int, ...], int | None]:
    """What to spawn, the fds it must inherit, and where bwrap reports whether it started the command.

    Without bubblewrap: `argv` itself. With it: `argv` behind bwrap, which inherits the seccomp
    program's fd and a status fd.
    """
    if limits.backend != "bubblewrap":
        return argv, (), None
    program = stack.enter_context(_seccomp_memfd(limits)) if "seccomp" in active else None
    status = os.memfd_create("mcp-bwrap-status", os.MFD_CLOEXEC)
    stack.callback(os.close, status)
    prefix = bubblewrap_argv(read_only=read_only, scratch=scratch, cwd=cwd, seccomp_fd=program, status_fd=status)
    return [*prefix, *argv], (status,) if program is None else (program, status), status


@contextlib.contextmanager
def _seccomp_memfd(limits: Limits) -> Iterator[int]:
    """The seccomp program on a sealed memfd, for bubblewrap's `--seccomp FD`.

    The child holds the fd between fork and bubblewrap's read: sealed, nothing can change the
    program in that window.
    """
    fd = os.memfd_create("mcp-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, seccomp.build_filter(allow_network=limits.network))
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _run_cgroup(identity: RunIdentity, limits: Limits) -> Iterator[RunCgroup]:
    roots = discover()
    if roots is None:
        raise SandboxStartError("cgroup_unavailable")
    try:
        group = RunCgroup(roots, f"run-{identity.uid}", limits.memory_limit_mb * 1024 * 1024, limits.max_processes)
    except OSError as exc:
        raise SandboxStartError("cgroup_failed") from exc
    try:
        yield group
    finally:
        group.kill_all()  # every exit path, an exception before or during the run included
        group.close()


def _kill_leftovers(group: RunCgroup | None, identity: RunIdentity) -> list[int]:
    """Kill every process the run left: its whole cgroup when it has one, every process of its uid otherwise."""
    if group is not None:
        return group.kill_all()
    return sweep(identity.uid)


def _collect(space: ScratchSpace | None, scratch: Path, wanted: Mapping[str, Path]) -> Mapping[str, Path]:
    """Copy the wanted files out of the run's scratch; the run owned it, so each may be a link, a FIFO or huge."""
    copied: dict[str, Path] = {}
    for name, target in wanted.items():
        try:
            if space is not None:
                fd = space.open_file(name)
            else:
                fd = os.open(scratch / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_COLLECTED_BYTES:
                continue
            data = handle.read(MAX_COLLECTED_BYTES + 1)
        if len(data) <= MAX_COLLECTED_BYTES:
            target.write_bytes(data)
            copied[name] = target
    return MappingProxyType(copied)


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
    pass_fds: tuple[int, ...] = (),
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
            pass_fds=pass_fds,
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
