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
import itertools
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from types import MappingProxyType

import anyio

from sandbox.backends import pidns, seccomp
from sandbox.backends.bubblewrap import bubblewrap_argv, command_ran
from sandbox.backends.cgroup import RunCgroup, discover
from sandbox.backends.cgroup2 import RunCgroup2
from sandbox.backends.containment import sweep
from sandbox.backends.identity import RunIdentity, UidPool
from sandbox.backends.landlock import runtime_read_only_paths
from sandbox.backends.proxy_listener import ProxyListener
from sandbox.backends.scratch import NamespacedScratch, ScratchSpace, files_for
from sandbox.capture import OutputCapture
from sandbox.change_set import ChangeRules, ChangeSet
from sandbox.confine import ChildPlan, LayerReport, plan_layers, probe_layers, run_groups
from sandbox.errors import SandboxStartError
from sandbox.layers import Layer
from sandbox.limits import Limits
from sandbox.pinned import Pinned
from sandbox.proxy_port import proxy_environment
from sandbox.task_groups import task_group
from sandbox.workspace_copy import Owner
from sandbox.writable_copy import VIEW_IN_SCRATCH, CopyPlace, WritableCopy

MAX_COLLECTED_BYTES = 16 * 1024 * 1024
RUN_GRACE_S = pidns.WATCHDOG_GRACE_S + 3.0
"""Past its time limit plus this, no process of a run is alive, whatever happened to the gateway:
the watchdog's grace, and a margin for the kernel to tear the namespace down."""


class KilledBy(StrEnum):
    TIMEOUT = "timeout"
    OUTPUT = "output"
    MEMORY = "memory"
    """The kernel's OOM killer killed a process of the run: the run as a whole hit its memory limit."""


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
    layers: tuple[Layer, ...] = ()
    """The isolation layers this run got, in the order they were applied."""
    collected: Mapping[str, Path] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Scratch files copied out (name -> where), those that were regular files under the size cap."""
    changes: ChangeSet | None = None
    """A writing run's change set (`run_sandboxed(writes=...)`), read once every process of the run was dead
    and its copy frozen; None for a read-only run, or when the copy could not be frozen (`changes_error`)."""
    changes_error: str | None = None
    """Why a writing run has no change set: `workspace_view_busy` (something still held the copy open for
    writing after the run), `changes_unreadable` (the copy could not be read); nothing of it applies."""


_POLL_FIRST_S = 0.002
_POLL_MAX_S = 0.05
_DRAIN_S = 2.0
_LATE_SLACK_MS = 4 * _POLL_MAX_S * 1000  # a healthy gateway kills within a poll or two


async def run_sandboxed(
    argv: list[str],
    cwd: Path | Pinned,
    limits: Limits,
    stdout_path: Path,
    stderr_path: Path,
    *,
    scratch: Path,
    collect: Mapping[str, Path] = MappingProxyType({}),
    host: LayerReport | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
    writes: ChangeRules | None = None,
    on_proxy: Callable[[socket.socket], None] | None = None,
) -> RunResult:
    """Run `argv` confined: its own uid, cgroup, session, rlimits, network, IPC, mount and PID namespaces,
    Landlock, seccomp (with `limits.backend == "bubblewrap"`: bubblewrap's mount tree in place of Landlock).

    `cwd` (and `limits.allowed_paths`) are readable. A Pinned one is reached only through its fd
    (the Landlock rule, the cwd by `fchdir`, bubblewrap's bind), whatever its path leads to by now
    (sandbox/pinned.py); a plain Path is opened by path when the run starts. `scratch` (its HOME
    and TMPDIR, a tmpfs of `limits.scratch_bytes`) is the only writable place; stdout and stderr are pipes the gateway
    copies into `stdout_path` and `stderr_path`, at most `limits.max_output_bytes` each
    (sandbox/capture.py). When the run ends, each `collect` name found in the scratch as a
    regular file of at most MAX_COLLECTED_BYTES is copied to its path, never through a link;
    then whatever the run left behind, daemonized grandchildren included, is killed before this
    returns. `on_stdout` sees the kept stdout as it arrives (a run's progress; it must not raise).
    With `writes`, the run works on a copy of the pinned `cwd` at the same path (sandbox/backends/view.py,
    decision 78), never on the workspace itself; `RunResult.changes` is what it changed there
    (sandbox/change_set.py), for the gateway to show and apply (sandbox/patch.py, sandbox/apply.py).
    Where no copy can be made, SandboxStartError `workspace_view_unavailable` (sandbox/writable_copy.py).
    With `limits.proxy` the run's network is the gateway's proxy only (decision 89): `on_proxy` (required) gets
    the listener made in the run's namespace, as `spawn_confined` says.
    `host` is what this host can enforce (default: probed once); a layer it lacks is
    left out unless a guarantee the run requires (`limits.required`) needs it. Raises SandboxStartError
    when a required guarantee has no layer here, or a layer cannot be applied: nothing ran.
    """
    captures: list[OutputCapture] = []

    def stdio(stack: contextlib.ExitStack) -> tuple[int, int, int]:
        captures.append(
            stack.enter_context(OutputCapture(stdout_path, stderr_path, limits.max_output_bytes, on_stdout))
        )
        return subprocess.DEVNULL, *captures[0].child_fds

    async with spawn_confined(
        argv, cwd, limits, scratch=scratch, host=host, writes=writes, stdio=stdio, on_proxy=on_proxy
    ) as run:
        capture = captures[0]
        result, survivors = await _supervise(
            run.process, limits, capture, started=run.started, leftovers=run.kill_leftovers
        )
        result = _with_watchdog_verdict(result, limits)
        ended_on_its_own = result.killed_by is None
        if limits.backend == "bubblewrap":
            if ended_on_its_own and not command_ran(os.pread(run.status_fd, 4096, 0)):
                raise SandboxStartError("bubblewrap_failed")  # bwrap could not build the tree (stderr.txt says why)
        elif Layer.PID_NAMESPACE in run.active:
            result = _with_command_status(result, os.pread(run.status_fd, 64, 0))
        collected = _collect(run.space, scratch, collect)
        # After _supervise: every process of the run is dead (its cgroup or uid swept).
        result = await run.copy.read(result, cwd)
        if run.group is not None:
            usage = run.group.usage()
            result = dataclasses.replace(
                result,
                peak_memory_kb=usage.peak_memory_bytes // 1024,
                oom_kills=usage.oom_kills,
                forks_refused=usage.forks_refused,
                killed_by=result.killed_by or (KilledBy.MEMORY if usage.oom_kills else None),
            )
    return dataclasses.replace(result, survivors_killed=len(survivors), layers=run.layers, collected=collected)


@dataclass(frozen=True, slots=True)
class Confinement:
    """A command just spawned confined (`spawn_confined`), and what it holds until the context ends."""

    process: subprocess.Popen[bytes]
    """The child the gateway spawned: the PID namespace's outer supervisor, or bwrap's watchdog (backends/pidns.py)."""
    active: frozenset[Layer]
    group: RunCgroup | RunCgroup2 | None
    identity: RunIdentity | None
    space: ScratchSpace | None
    status_fd: int
    """The memfd where the command's own end is reported (pidns.read_status; bubblewrap's JSON status)."""
    copy: WritableCopy
    started: float

    @property
    def layers(self) -> tuple[Layer, ...]:
        """The layers applied, in the order they were applied."""
        return tuple(name for name in _APPLY_ORDER if name in self.active)

    def kill_leftovers(self) -> list[int]:
        """Kill every process of it still alive: its cgroup, or every process of its pool uid (see _kill_leftovers)."""
        return _kill_leftovers(self.group, self.identity)


@contextlib.asynccontextmanager
async def spawn_confined(
    argv: list[str],
    cwd: Path | Pinned,
    limits: Limits,
    *,
    scratch: Path,
    host: LayerReport | None,
    writes: ChangeRules | None,
    stdio: Callable[[contextlib.ExitStack], tuple[int, int, int]],
    long_lived: bool = False,
    on_proxy: Callable[[socket.socket], None] | None = None,
) -> AsyncIterator[Confinement]:
    """Spawn `argv` with the layers `run_sandboxed` documents, its stdin, stdout and stderr on the fds `stdio` opens
    (in the stack of what the spawn holds, once every layer is prepared: nothing is opened for a run refused before); on leaving,
    whatever is left of it is killed (its cgroup, its uid) and its scratch, copy and uid are given back.

    The one place the layers are planned and set up, for a run (`run_sandboxed`) and a long-lived server
    (sandbox/server.py, `long_lived`: no time limit for the watchdog). Raises SandboxStartError: nothing ran.

    With `limits.proxy` (decision 89): the child brings its namespace's loopback up and makes a TCP listener at
    sandbox/proxy_port.py PROXY_URL before the command starts (backends/proxy_listener.py); `on_proxy` is called
    once with it, non-blocking, in this process, on the calling (event loop's) thread, as soon as the spawn
    returns and before this yields. The command may have started by then: its connects wait in the listener's
    backlog until the callee accepts them. The callee owns the socket and closes it; no process of the run holds
    it. The run's environment names the proxy (`proxy_environment`). A listener that cannot be made or handed
    over: SandboxStartError `network_proxy:<step>:<errno>`, nothing left running. `limits.proxy` without
    `on_proxy` is a ValueError (a listener nobody serves would leave the run's connects hanging)."""
    if limits.proxy and on_proxy is None:
        raise ValueError("limits.proxy needs on_proxy: the gateway's proxy must be handed the run's listener")
    report = host or probe_host()
    active = plan_layers(report, limits)
    identity = _POOL.acquire() if Layer.UID_DROP in active else None
    owner = (identity.uid, identity.gid) if identity is not None else (os.getuid(), os.getgid())
    group: RunCgroup | RunCgroup2 | None = None
    try:
        with contextlib.ExitStack() as stack:
            if Layer.CGROUP in active:
                group = stack.enter_context(_run_cgroup(identity, limits, report.cgroup_version))
            space, child_scratch = None, None
            if Layer.SCRATCH_TMPFS in active and Layer.USER_NAMESPACE in active:
                child_scratch = NamespacedScratch(
                    scratch,
                    limits.scratch_bytes,
                    files_for(limits.scratch_bytes),
                    *owner,
                )
                stack.callback(child_scratch.close)
            elif Layer.SCRATCH_TMPFS in active:
                space = stack.enter_context(
                    ScratchSpace(scratch, limits.scratch_bytes, files_for(limits.scratch_bytes), *owner)
                )
            elif identity is not None:
                os.chown(scratch, identity.uid, identity.gid)
            os.chmod(scratch, 0o700)
            copy = await WritableCopy.prepare(
                stack,
                cwd,
                writes,
                CopyPlace(active, space, scratch, limits.backend, Owner(*owner), root=os.geteuid() == 0),
            )
            read_only = tuple(dict.fromkeys((*runtime_read_only_paths(), cwd, *limits.allowed_paths)))
            read_write = (scratch, Path(os.devnull))
            cwd_fd = _cwd_fd(cwd, stack)
            command, pass_fds, status_fd = _command(
                argv, limits, active=active, read_only=read_only, scratch=scratch, cwd=_path_of(cwd), stack=stack,
                writable=copy.view is not None or copy.child_view is not None,
            )  # fmt: skip
            listener = _proxy_listener(limits, stack)
            stdin, stdout, stderr = stdio(stack)
            with (
                ChildPlan(
                    limits,
                    identity,
                    read_only,
                    read_write,
                    active=active,
                    group=group,
                    scratch=space,
                    child_scratch=child_scratch,
                    status_fd=status_fd,
                    cwd_fd=cwd_fd,
                    view=copy.view,
                    child_view=copy.child_view,
                    long_lived=long_lived,
                    proxy=listener,
                ) as preexec,
                copy.spawning(cwd),
            ):
                started = time.monotonic()
                try:
                    process = _spawn(
                        command, None, limits, (stdout, stderr), preexec=preexec, pass_fds=pass_fds, stdin=stdin
                    )
                except SandboxStartError as exc:
                    failed = listener.failure() if listener is not None else None
                    if failed is None:
                        raise
                    raise SandboxStartError(failed) from exc
            if child_scratch is not None:
                space = _received(child_scratch, process, stack)
            if listener is not None and on_proxy is not None:
                _hand_over(listener, process, on_proxy)
            if identity is not None:
                _POOL.refill()  # the next run's uid, found while this one starts (decision 95)
            yield Confinement(process, active, group, identity, space, status_fd, copy, started)
    finally:
        if identity is not None:
            if group is None:
                sweep(identity.uid)  # without a cgroup, the uid is the run: nothing of it outlives the call
            _POOL.release(identity)


async def run_unsafe_unconfined(
    argv: list[str], cwd: Path, limits: Limits, stdout_path: Path, stderr_path: Path
) -> RunResult:
    """Only the session, time limit, output cap and group kill: NO confinement (baselines, tests)."""
    with OutputCapture(stdout_path, stderr_path, limits.max_output_bytes) as capture:
        started = time.monotonic()
        process = _spawn(argv, cwd, limits, capture.child_fds, preexec=None)
        result, _ = await _supervise(process, limits, capture, started=started, leftovers=list)
    return result


@cache
def probe_host() -> LayerReport:
    """The layers this kernel and process can enforce, probed once per process.

    The probes start children with `preexec_fn`: call it while the process has one thread (the
    gateway does, in `open_services`, before serving; decision 48)."""
    return probe_layers()


_POOL = UidPool()
_APPLY_ORDER = (
    Layer.CGROUP, Layer.USER_NAMESPACE, Layer.NETWORK_NAMESPACE, Layer.IPC_NAMESPACE, Layer.SCRATCH_TMPFS, Layer.RLIMITS,
    Layer.UID_DROP, Layer.LANDLOCK, Layer.MOUNT_TREE, Layer.PID_NAMESPACE, Layer.SECCOMP,
)  # fmt: skip


def _command(
    argv: list[str],
    limits: Limits,
    *,
    active: frozenset[Layer],
    read_only: tuple[Path | Pinned, ...],
    scratch: Path,
    cwd: Path,
    stack: contextlib.ExitStack,
    writable: bool = False,
) -> tuple[list[str], tuple[int, ...], int]:
    """What to spawn, the fds it must inherit, and the status memfd where the run's end is reported.

    Without bubblewrap: `argv` itself; the PID namespace's pid 1 writes the command's wait status
    to the memfd (sandbox/backends/pidns.py). With bubblewrap: `argv` behind bwrap, which
    inherits the seccomp program's fd and writes its JSON status to the memfd.
    """
    status = os.memfd_create("mcp-run-status", os.MFD_CLOEXEC)
    stack.callback(os.close, status)
    if limits.backend != "bubblewrap":
        return argv, (), status
    program = stack.enter_context(_seccomp_memfd(limits)) if Layer.SECCOMP in active else None
    prefix = bubblewrap_argv(
        read_only=read_only,
        scratch=scratch,
        cwd=cwd,
        seccomp_fd=program,
        status_fd=status,
        writable_cwd=scratch / VIEW_IN_SCRATCH if writable else None,
    )
    pinned = tuple(grant.fd for grant in read_only if isinstance(grant, Pinned))  # for --ro-bind-fd
    return [*prefix, *argv], (*pinned, status) if program is None else (*pinned, program, status), status


def _path_of(cwd: Path | Pinned) -> Path:
    return cwd.path if isinstance(cwd, Pinned) else cwd


def _cwd_fd(cwd: Path | Pinned, stack: contextlib.ExitStack) -> int:
    """The fd the child `fchdir`s to: a Pinned one's own, or a Path opened now (closed after the run)."""
    if isinstance(cwd, Pinned):
        return cwd.fd
    try:
        fd = os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxStartError("spawn_failed") from exc
    stack.callback(os.close, fd)
    return fd


def _with_watchdog_verdict(result: RunResult, limits: Limits) -> RunResult:
    """A run that outlived its time limit is a timeout, whoever ended it.

    A SIGKILL at or past the limit that the gateway did not send is the watchdog's; a run that
    ended by itself later than the limit plus the gateway's polling slack means the gateway was
    late to look (its event loop held up): the limit was still passed, and the call says so.
    """
    limit_ms = limits.timeout_s * 1000
    killed_late = result.signal == signal.SIGKILL and result.duration_ms >= limit_ms
    if result.killed_by is None and (killed_late or result.duration_ms > limit_ms + _LATE_SLACK_MS):
        return dataclasses.replace(result, killed_by=KilledBy.TIMEOUT)
    return result


def _with_command_status(result: RunResult, status: bytes) -> RunResult:
    """The command's own end, as the PID namespace's pid 1 reported it (the spawned process is its supervisor)."""
    reported = pidns.read_status(status)
    if reported is None:
        return result  # pid 1 was killed first (time limit, cancellation): the supervisor's status stands
    exit_code, signal_number, watchdog = reported
    killed_by = result.killed_by or (KilledBy.TIMEOUT if watchdog else None)
    return dataclasses.replace(result, exit_code=exit_code, signal=signal_number, killed_by=killed_by)


@contextlib.contextmanager
def _seccomp_memfd(limits: Limits) -> Iterator[int]:
    """The seccomp program on a sealed memfd, for bubblewrap's `--seccomp FD`.

    The child holds the fd between fork and bubblewrap's read: sealed, nothing can change the
    program in that window.
    """
    fd = os.memfd_create("mcp-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, seccomp.build_filter(allow_network=limits.network, proxy=limits.proxy))
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _received(
    child_scratch: NamespacedScratch, process: subprocess.Popen[bytes], stack: contextlib.ExitStack
) -> ScratchSpace:
    """The tmpfs a rootless run's child made; none sent means the child failed before: kill it, nothing ran."""
    try:
        return stack.enter_context(child_scratch.receive())
    except SandboxStartError:
        _abandon(process)
        raise


def _proxy_listener(limits: Limits, stack: contextlib.ExitStack) -> ProxyListener | None:
    """A proxied run's listener, prepared (its socket pair) for the spawn; None without `limits.proxy`."""
    if not limits.proxy:
        return None
    listener = ProxyListener()
    stack.callback(listener.close)
    return listener


def _hand_over(
    listener: ProxyListener, process: subprocess.Popen[bytes], on_proxy: Callable[[socket.socket], None]
) -> None:
    """The listener the child made, to `on_proxy`; none received, or the callee failing: kill the run, re-raise."""
    try:
        received = listener.receive()
    except SandboxStartError:
        _abandon(process)
        raise
    try:
        on_proxy(received)
    except BaseException:
        received.close()  # the callee never took it: nothing serves the run's connects
        _abandon(process)
        raise


def _abandon(process: subprocess.Popen[bytes]) -> None:
    """Kill a run that must not go on, before it was handed to its supervision, and reap it."""
    _kill_group(process.pid)
    _reap(process.pid)
    process.returncode = -signal.SIGKILL


_group_serial = itertools.count()


@contextlib.contextmanager
def _run_cgroup(identity: RunIdentity | None, limits: Limits, version: int) -> Iterator[RunCgroup | RunCgroup2]:
    """The run's group in the hierarchy the probe chose (`LayerReport.cgroup_version`)."""
    # A pool uid is the run's alone (held host-wide); without one, this process's pid and a serial are.
    name = f"run-{identity.uid}" if identity is not None else f"run-p{os.getpid()}-{next(_group_serial)}"
    memory, processes = limits.memory_limit_mb * 1024 * 1024, limits.process_limit
    group: RunCgroup | RunCgroup2
    try:
        if version == 2:
            v2 = run_groups().v2
            if v2 is None:
                raise SandboxStartError("cgroup_unavailable")
            group = RunCgroup2(v2, name, memory, processes)
        else:
            roots = discover()
            if roots is None:
                raise SandboxStartError("cgroup_unavailable")
            group = RunCgroup(roots, name, memory, processes)
    except OSError as exc:
        raise SandboxStartError("cgroup_failed") from exc
    try:
        yield group
    finally:
        group.kill_all()  # every exit path, an exception before or during the run included
        group.close()


def _kill_leftovers(group: RunCgroup | RunCgroup2 | None, identity: RunIdentity | None) -> list[int]:
    """Kill every process the run left: its whole cgroup when it has one, every process of its pool uid otherwise.

    A rootless run without a cgroup shares the gateway's uid, which is never swept: its PID
    namespace ended with its pid 1 (the `whole_run_kill` guarantee), daemons included."""
    if group is not None:
        return group.kill_all()
    if identity is not None:
        return sweep(identity.uid)
    return []


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
    capture: OutputCapture,
    *,
    started: float,
    leftovers: Callable[[], list[int]],
) -> tuple[RunResult, list[int]]:
    """Copy the output while waiting for the end; kill at the time limit or the output cap.

    Returns how the run ended and what `leftovers` killed after its first process ended.
    """
    capture.close_child_ends()
    killed_by: KilledBy | None = None
    status, peak_kb = 0, 0

    def kill() -> None:
        _kill_group(process.pid)
        leftovers()

    # A pidfd turns readable the moment the child exits, so the run's end is seen at once;
    # the timer only paces the time-limit and output-cap checks.
    exited = os.pidfd_open(process.pid)
    try:
        async with task_group() as pumps:
            pumps.start_soon(capture.pump_all)
            delay = _POLL_FIRST_S
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    peak_kb = usage.ru_maxrss
                    break
                if killed_by is None:
                    if time.monotonic() - started > limits.timeout_s:
                        killed_by = KilledBy.TIMEOUT
                    elif capture.received > limits.max_output_bytes:
                        killed_by = KilledBy.OUTPUT
                    if killed_by is not None:
                        kill()
                with anyio.move_on_after(delay):
                    await anyio.wait_readable(exited)
                delay = min(delay * 2, _POLL_MAX_S)
            duration_ms = int((time.monotonic() - started) * 1000)
            survivors = leftovers()
            # Every writer is gone now; what the pipes still hold is read, within a bound.
            with anyio.move_on_after(_DRAIN_S):
                while not capture.ended:
                    await anyio.sleep(_POLL_FIRST_S)
            pumps.cancel_scope.cancel()
    except BaseException:
        # Cancelled (notifications/cancelled, client gone) or failing: nothing outlives the call.
        kill()
        with anyio.CancelScope(shield=True):
            _reap(process.pid)
        raise
    finally:
        os.close(exited)
        process.returncode = os.waitstatus_to_exitcode(status) if status else 0
    stdout_bytes, stderr_bytes = capture.kept
    result = RunResult(
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        duration_ms=duration_ms,
        killed_by=killed_by,
        peak_memory_kb=peak_kb,
        stdout_bytes=stdout_bytes,
        stderr_bytes=stderr_bytes,
        truncated=capture.truncated,
    )
    return result, survivors


def _spawn(
    argv: list[str],
    cwd: Path | None,
    limits: Limits,
    output: tuple[int, int],
    *,
    preexec: Callable[[], None] | None,
    pass_fds: tuple[int, ...] = (),
    stdin: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    # The child's parent-death signal (backends/pidns.py) fires when the *thread* that spawned
    # it ends: spawn from the event loop's thread, never from a short-lived worker thread.
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=proxy_environment(limits.env) if limits.proxy else dict(limits.env),
            stdin=stdin,
            stdout=output[0],
            stderr=output[1],
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
