"""A long-lived confined server: one process talking over its stdin and stdout, confined like a run (decision 83).

An upstream MCP server (docs/upstreams.md) is started once and lives until the gateway stops it:
`start_server` spawns it with the very layer plan a run gets (sandbox/runner.py `spawn_confined`:
its own uid or user namespace, cgroup, network, IPC, mount and PID namespaces, scratch tmpfs,
rlimits, Landlock or bubblewrap's tree, seccomp), minus the time limit: its memory and process
limits hold for the whole server for as long as it lives, and the PID-namespace watchdog
(sandbox/backends/pidns.py) kills it when the gateway dies, whatever way the gateway dies.

stdin and stdout are pipes the gateway holds as anyio streams (sandbox/pipes.py); stderr is read
all along and only its last STDERR_TAIL_BYTES are kept, for error messages. The workspace is
readable through its pin, as a run's is. With `writable` the server works on a copy of the
workspace at the workspace's own path (sandbox/writable_copy.py, as a writing run does), and
`sync()` brings what it changed there since the last sync into the workspace, through the change
set's rules: protected paths, links, devices, setuid bits and anything outside are refused, never
applied; git's data in the workspace's own `.git` (a commit's objects, refs, index, logs; never its
config, hooks or commondir) may change (`ServerSpec.git_data`, sandbox/git_data.py), so a git
server commits (docs/security-model.md, "Upstream servers' confinement")."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import anyio
import anyio.abc

from sandbox.apply import ApplyResult, apply_changes
from sandbox.backends import pidns
from sandbox.change_set import Action, ChangeRules, ChangeSet, read_changes
from sandbox.confine import LayerReport
from sandbox.errors import SandboxStartError
from sandbox.layers import Layer
from sandbox.limits import Limits
from sandbox.pinned import Pinned
from sandbox.pipes import PipeReceiveStream, PipeSendStream
from sandbox.runner import Confinement, spawn_confined
from sandbox.task_groups import task_group
from sandbox.workspace_copy import Original, Originals

STDERR_TAIL_BYTES = 4096
"""How much of a server's stderr is kept: its last words, for the error that says why it died."""
SERVER_DEVICES = (Path("/dev/urandom"),)
"""Read-only for a native server, beyond a run's grants: git and Node read their random bytes there (a run's
pytest takes them from getrandom)."""
STOPPED = "stopped"
MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class ServerSpec:
    argv: tuple[str, ...]
    """argv[0]: the pinned program's absolute path."""
    workspace: Pinned
    """Readable always; writable (its copy) only with `writable`."""
    writable: bool
    """The upstream's `workspace: write`: the server works on a copy, `sync()` brings its changes back."""
    protected: tuple[str, ...]
    """Workspace-relative paths never written (the policy's `sandbox.protected_paths`; default DEFAULT_PROTECTED)."""
    limits: Limits
    """memory_limit_mb and max_processes hold for the whole server; timeout_s is not used (it lives until stopped)."""
    caps: ChangeRules = dataclasses.field(default_factory=ChangeRules)
    """With `writable`: what one sync may carry (max_files, max_bytes) and the copy's bounds; its protected list is
    replaced by `protected`, its git_data by `git_data`."""
    git_data: bool = True
    """With `writable`: a sync may carry git's data in the workspace's own `.git` (ChangeRules.git_data): an
    upstream such as a git server commits; its config, hooks and anything else of `.git` stay protected."""

    @property
    def rules(self) -> ChangeRules:
        return dataclasses.replace(self.caps, protected=self.protected, git_data=self.git_data)


@dataclass(frozen=True, slots=True)
class Synced:
    """One `sync()`: what the server changed in its copy since the last one, and what of it reached the workspace."""

    changes: ChangeSet
    """Empty when the copy could not be read (`applied.reason` is then `changes_unreadable`)."""
    applied: ApplyResult


class ConfinedServer:
    """A running confined server (`start_server` yields it); its end is watched all along."""

    def __init__(self, run: Confinement, stdin: int, stdout: int, stderr: int, spec: ServerSpec) -> None:
        self.stdin: anyio.abc.ByteSendStream = PipeSendStream(stdin)
        self.stdout: anyio.abc.ByteReceiveStream = PipeReceiveStream(stdout)
        self.pid = run.process.pid
        """The process the gateway spawned: the outer supervisor (the server itself is pid 2 of its PID namespace)."""
        self.layers: tuple[Layer, ...] = run.layers
        self.returncode: int | None = None
        self._run = run
        self._spec = spec
        self._stderr = PipeReceiveStream(stderr)
        self._tail = bytearray()
        self._ended = anyio.Event()
        self._ended_by: str | None = None
        self._stopping = False
        self._baseline: Originals = run.copy.originals
        self._sync_lock = anyio.Lock()
        self._exited = os.pidfd_open(self.pid)  # now: it may end (and be reaped by `stop`) before the watcher starts

    def stderr_tail(self) -> str:
        """The last STDERR_TAIL_BYTES of its stderr, decoded with replacement."""
        return bytes(self._tail).decode("utf-8", "replace")

    def ended_by(self) -> str | None:
        """None while alive; else `exit N`, `signal N`, `memory` (the kernel's OOM killer), `stopped` (`stop()`)."""
        return self._ended_by

    async def wait(self) -> int | None:
        """Wait for its end; its returncode (negative: the signal that ended it)."""
        await self._ended.wait()
        return self.returncode

    async def stop(self) -> None:
        """Kill it and everything it started (its cgroup, or its PID namespace and uid); idempotent."""
        if self._ended.is_set():
            return
        self._stopping = True
        _kill_group(self.pid)
        self._run.kill_leftovers()
        try:
            _, status = os.waitpid(self.pid, 0)  # SIGKILLed: at once; not left to the watcher, which may be cancelled
        except ChildProcessError:
            return  # the watcher reaped it, and said how it ended, in the same step
        self._ended_with(status)

    async def sync(self) -> Synced:
        """Bring what a `writable` server changed in its copy since the last sync into the workspace.

        The change set is read from the copy (sandbox/change_set.py) and applied beneath the pinned
        workspace (sandbox/apply.py): all of it or, on a conflict (a file the workspace changed
        meanwhile), none of it, which then stays pending in the copy. Protected paths, links, devices,
        FIFOs and setuid bits are refused, listed in `changes.refused`, never applied. Call it while no
        request is in flight (after each call), or after `stop()`: the copy lives until the context ends.
        A set over a cap (`changes_too_large`) or in conflict (`changes_conflict`) applies nothing and stays
        pending: every later sync meets it again, until the server is restarted on a fresh copy.
        Raises ValueError for a server that is not `writable` (it has no copy)."""
        mount_fd = self._run.copy.mount_fd if self._spec.writable else None
        if mount_fd is None:
            raise ValueError("only a writable server has a copy to sync")
        async with self._sync_lock:
            rules, workspace = self._spec.rules, self._spec.workspace
            try:
                changes = await anyio.to_thread.run_sync(read_changes, mount_fd, self._baseline, rules, workspace.fd)
            except OSError:
                return Synced(ChangeSet((), ()), ApplyResult(False, "changes_unreadable"))
            applied = await anyio.to_thread.run_sync(
                lambda: apply_changes(workspace.fd, changes, protected=rules.protected, git_data=rules.git_data)
            )
            self._baseline = _rebased(self._baseline, changes, frozenset(applied.written))
            return Synced(changes, applied)

    async def _pump_stderr(self) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            while True:
                self._tail += await self._stderr.receive()
                del self._tail[:-STDERR_TAIL_BYTES]

    async def _watch(self) -> None:
        """Wait for the spawned process's end, kill whatever is left of the server, and say why it ended."""
        while not self._ended.is_set():
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return  # `stop()` reaped it
            if pid:
                self._ended_with(status)
                return
            await anyio.wait_readable(self._exited)

    def _ended_with(self, status: int) -> None:
        self._run.process.returncode = os.waitstatus_to_exitcode(status)
        self._run.kill_leftovers()
        self.returncode, self._ended_by = self._verdict(status)
        self._ended.set()

    def _verdict(self, status: int) -> tuple[int, str]:
        code = os.waitstatus_to_exitcode(status)
        if self._spec.limits.backend == "native" and Layer.PID_NAMESPACE in self._run.active:
            reported = pidns.read_status(os.pread(self._run.status_fd, 64, 0))
            if reported is not None:
                exit_code, signal_number, _ = reported
                code = exit_code if exit_code is not None else -(signal_number or signal.SIGKILL)
        if self._stopping:
            return code, STOPPED
        killed = code == -signal.SIGKILL or code == 128 + signal.SIGKILL  # natively, or as bwrap reports it
        if killed and self._run.group is not None and self._run.group.usage().oom_kills:
            return code, MEMORY
        return code, f"exit {code}" if code >= 0 else f"signal {-code}"

    async def _close(self) -> None:
        for stream in (self.stdin, self.stdout, self._stderr):
            await stream.aclose()
        if self._exited >= 0:
            anyio.notify_closing(self._exited)
            os.close(self._exited)
            self._exited = -1


@contextlib.asynccontextmanager
async def start_server(
    spec: ServerSpec,
    *,
    scratch: Path,
    host: LayerReport | None = None,
    on_proxy: Callable[[socket.socket], None] | None = None,
) -> AsyncIterator[ConfinedServer]:
    """Start `spec`'s server confined; on leaving, it and everything it started are dead.

    `scratch` becomes its HOME and TMPDIR tmpfs, as a run's (`limits.scratch_bytes`). Raises
    SandboxStartError (as `run_sandboxed`: its reason names the step; nothing runs) when it cannot start.
    Spawn it from the event loop's thread: the supervisors' parent-death signal follows that thread.
    With `spec.limits.proxy`, `on_proxy` (required) gets the listener made in the server's network namespace,
    once, before this yields, as sandbox/runner.py `spawn_confined` says (decision 89): the server lives on, and
    so does the listener, until the callee closes it."""
    if not spec.argv or not os.path.isabs(spec.argv[0]):
        raise SandboxStartError("server_program_not_absolute")
    limits = spec.limits
    if limits.backend == "native":  # bubblewrap's own /dev has it
        limits = dataclasses.replace(limits, allowed_paths=(*limits.allowed_paths, *SERVER_DEVICES))
    ends = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]  # (read, write) for stdin, stdout, stderr
    child: tuple[int, ...] = (ends[0][0], ends[1][1], ends[2][1])
    mine: tuple[int, ...] = (ends[0][1], ends[1][0], ends[2][0])
    try:
        async with spawn_confined(
            list(spec.argv),
            spec.workspace,
            limits,
            scratch=scratch,
            host=host,
            writes=spec.rules if spec.writable else None,
            stdio=lambda _: (ends[0][0], ends[1][1], ends[2][1]),
            long_lived=True,
            on_proxy=on_proxy,
        ) as run:
            _close_all(child)
            child = ()
            server = ConfinedServer(run, ends[0][1], ends[1][0], ends[2][0], spec)
            mine = ()
            try:
                async with task_group() as watchers:
                    watchers.start_soon(server._watch)
                    watchers.start_soon(server._pump_stderr)
                    try:
                        yield server
                    finally:
                        await server.stop()
                        watchers.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await server._close()
    finally:
        _close_all((*child, *mine))


def _rebased(baseline: Originals, changes: ChangeSet, written: frozenset[str]) -> Originals:
    """The copy's baseline once `written` reached the workspace: the next sync shows only what changed after.

    A changed file's copy identity is unknown here (-1), so the next sync reads it again and finds it
    unchanged when its content and mode still match."""
    rebased: dict[str, Original] = dict(baseline)
    for change in changes.changes:
        if change.path not in written:
            continue
        if change.action is Action.DELETED:
            rebased.pop(change.path, None)
            continue
        rebased[change.path] = Original(
            change.kind,
            change.sha256_after,
            change.size_after or 0,
            change.mode_after or 0,
            copy_ino=-1,
            copy_ctime_ns=-1,
        )
    return MappingProxyType(rebased)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
