"""A writing run's copy of its workspace from start to change set, as root or rootless (decisions 78, 82).

`WritableCopy.prepare` makes the copy a run of `run_sandboxed(writes=...)` works on, or refuses the
run (`workspace_view_unavailable`) where none can be made: a cwd that is not pinned, a host without
the scratch step's mount namespace, a root gateway without CAP_SYS_ADMIN, a rootless one without
the PID namespace. As root the gateway makes it before the spawn (backends/view.py WorkspaceView)
and a thread fills it while the child makes its namespaces; the child waits for the word last thing
before its exec (`spawning`). Rootless the child makes it and waits, before it mounts it, while a
thread of the gateway fills it (NamespacedView). With bubblewrap the copy is moved into a folder of the scratch tmpfs
(VIEW_IN_SCRATCH) and bwrap binds it over the workspace. `read` gives the run's result its change set once the run is over.

A copy is capped after it is made at what it holds plus twice `max_bytes` (a tool writes a file's
new content before the old goes) and `max_files` + 64 inodes: a run filling it gets ENOSPC, and
its change set is too large.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio

from sandbox.backends.scratch import ScratchSpace
from sandbox.backends.view import NamespacedView, WorkspaceView
from sandbox.change_set import ChangeRules, read_changes
from sandbox.errors import SandboxStartError
from sandbox.layers import Layer
from sandbox.limits import Backend
from sandbox.pinned import Pinned
from sandbox.workspace_copy import Originals, Owner, copy_workspace

if TYPE_CHECKING:
    from sandbox.runner import RunResult

VIEW_IN_SCRATCH = ".workspace"
"""With bubblewrap, the copy is moved here in the scratch tmpfs (made by the gateway, root's) and bound over the workspace."""
SLACK_FILES = 64
"""Inodes a run may use beyond max_change_files (temporaries a tool makes and removes)."""
MIB = 1024 * 1024
FILL_WAIT_S = 120.0
"""How long a rootless run's child waits for its copy, and the gateway for the child's tmpfs."""


@dataclasses.dataclass(frozen=True, slots=True)
class CopyPlace:
    """Where a run's copy is made: the layers it gets, its scratch, its backend, its owner, whether root makes it."""

    active: frozenset[Layer]
    space: ScratchSpace | None
    scratch: Path
    backend: Backend
    owner: Owner
    root: bool


class WritableCopy:
    """Nothing (a read-only run), the copy root made and filled (`view`), or the one the child will make (`child_view`)."""

    def __init__(
        self,
        writes: ChangeRules | None = None,
        view: WorkspaceView | None = None,
        child_view: NamespacedView | None = None,
        originals: Originals = MappingProxyType({}),
        run_owner: Owner | None = None,
    ) -> None:
        self.writes, self.view, self.child_view, self.originals = writes, view, child_view, originals
        self.run_owner = run_owner
        """Whom the copy was given to (root: the run's pool uid); None, the run has the gateway's uid."""
        self._filled: Originals | None = None
        self._failure: BaseException | None = None
        self._fill_later: Callable[[], tuple[Originals, tuple[int, int]]] | None = None
        """Root: the copy to fill while the child makes its namespaces (`spawning`), before it may exec."""
        self._child_mount_fd = -1
        """The rootless copy's tmpfs, as the child sent it: read after the run, closed with the run."""

    @classmethod
    async def prepare(
        cls, stack: contextlib.ExitStack, cwd: Path | Pinned, writes: ChangeRules | None, place: CopyPlace
    ) -> WritableCopy:
        """The copy for a run of `writes` (None: a read-only run, no copy); raises SandboxStartError (nothing ran)."""
        if writes is None:
            return cls()
        rootless = Layer.USER_NAMESPACE in place.active
        if not isinstance(cwd, Pinned) or Layer.SCRATCH_TMPFS not in place.active:
            raise SandboxStartError("workspace_view_unavailable")
        if rootless:
            if place.root or Layer.PID_NAMESPACE not in place.active:
                raise SandboxStartError("workspace_view_unavailable")
            size, files = _bounds(writes)
            at = place.scratch / VIEW_IN_SCRATCH if place.backend == "bubblewrap" else None
            child_view = NamespacedView(size, files, place.owner.uid, place.owner.gid, FILL_WAIT_S, mount_at=at)
            stack.callback(child_view.close)
            copy = cls(writes, child_view=child_view)
            stack.callback(close_aside, copy.close)
            return copy
        if place.space is None:
            raise SandboxStartError("workspace_view_unavailable")
        mount_at = None
        if place.backend == "bubblewrap":  # a folder of the scratch tmpfs, root's, bound over the workspace by bwrap
            os.mkdir(VIEW_IN_SCRATCH, 0o755, dir_fd=place.space.mount_fd)
            mount_at = place.space.target / VIEW_IN_SCRATCH
        view = WorkspaceView(*_bounds(writes), mount_at=mount_at)
        stack.callback(close_aside, view.close)
        copy = cls(writes, view=view, run_owner=place.owner)
        copy._fill_later = functools.partial(_fill, cwd, view.mount_fd, place.owner, writes)
        return copy

    @contextlib.contextmanager
    def spawning(self, cwd: Path | Pinned) -> Iterator[None]:
        """Around the spawn: the run's child waits in it while a thread fills its copy (rootless: before it
        mounts the copy; root: before its exec, decision 82, so the copy is made while it makes its namespaces).

        The copy's own failure (a workspace too large) is raised rather than the spawn's."""
        if self.view is not None and self._fill_later is not None:
            filler = threading.Thread(target=self._fill_view, args=(self.view, self._fill_later), daemon=True)
        elif self.child_view is not None and isinstance(cwd, Pinned) and self.writes is not None:
            filler = threading.Thread(
                target=self._fill_child_view, args=(self.child_view, cwd, self.writes), daemon=True
            )
        else:
            yield
            return
        filler.start()
        try:
            yield
        except BaseException:
            # Set already, the copy's failure is why the child failed (it refused the child); set only
            # once the filler is woken below, it is a consequence of the spawn's own failure.
            cause = self._failure
            if self.child_view is not None:
                self.child_view.close()  # a filler still waiting wakes (root's never waits)
            filler.join()
            if self.view is not None:
                self.view.end_go()
            if cause is not None:
                raise cause from None
            raise
        filler.join()
        if self.view is not None:
            self.view.end_go()
        if self._filled is None:
            raise SandboxStartError("workspace_view_unavailable")
        self.originals = self._filled

    def _fill_view(self, view: WorkspaceView, fill: Callable[[], tuple[Originals, tuple[int, int]]]) -> None:
        try:
            originals, (size, files) = fill()
            view.resize(size, files)
            self._filled = originals
            view.go()
        except Exception as exc:
            self._filled = None
            self._fail(exc, view.refuse)

    def _fill_child_view(self, child_view: NamespacedView, workspace: Pinned, writes: ChangeRules) -> None:
        try:
            self._child_mount_fd = child_view.receive(FILL_WAIT_S)
            originals, (size, files) = _fill(workspace, self._child_mount_fd, None, writes)
            child_view.go(size, files)
        except Exception as exc:
            self._fail(exc, child_view.refuse)
            return
        self._filled = originals

    def _fail(self, exc: Exception, refuse: Callable[[], None]) -> None:
        """The copy's failure, noted before the waiting child is refused (so the spawn's failure is known as its)."""
        self._failure = exc if isinstance(exc, SandboxStartError) else SandboxStartError("workspace_copy_failed")
        refuse()

    async def read(self, result: RunResult, cwd: Path | Pinned) -> RunResult:
        """`result` with the run's change set; call once every process of the run is dead.

        As root the copy is made read-only first: a writer still holding it open makes that fail
        (`workspace_view_busy`). A copy that cannot be read: `changes_unreadable`."""
        if self.writes is None or not isinstance(cwd, Pinned):
            return result
        if self.view is not None:
            try:
                self.view.freeze()
            except OSError:
                return dataclasses.replace(result, changes_error="workspace_view_busy")
            mount_fd = self.view.mount_fd
        elif self._child_mount_fd >= 0:
            mount_fd = self._child_mount_fd  # rootless: its writers died with the run's PID namespace
        else:
            return result
        return await _read_into(result, mount_fd, self.originals, self.writes, cwd, run_owner=self.run_owner)

    @property
    def mount_fd(self) -> int | None:
        """The copy's tmpfs root, to read a change set through while it is in use (sandbox/server.py); None without one."""
        if self.view is not None:
            return self.view.mount_fd
        return self._child_mount_fd if self._child_mount_fd >= 0 else None

    def close(self) -> None:
        if self._child_mount_fd >= 0:
            os.close(self._child_mount_fd)
            self._child_mount_fd = -1


def close_aside(close: Callable[[], None]) -> threading.Thread:
    """Close a copy's tmpfs on a thread of its own: the last close of a detached mount tears the tmpfs down
    (about 5 ms of CPU for 2,000 files, and an RCU grace period: 4-48 ms measured on a busy machine), which
    the run's result need not wait for. Nothing reads the copy after the change set (decision 82). The thread
    is returned for a test to join."""
    closer = threading.Thread(target=close, name="workspace-copy-close", daemon=True)
    closer.start()
    return closer


def _bounds(writes: ChangeRules) -> tuple[int, int]:
    """The copy's tmpfs before it is filled: room for the largest workspace it may hold (the copy counts)."""
    return max(writes.max_copy_bytes, 1) + MIB, writes.max_copy_files + SLACK_FILES


def _fill(
    workspace: Pinned, mount_fd: int, owner: Owner | None, writes: ChangeRules
) -> tuple[Originals, tuple[int, int]]:
    """Copy the workspace into the tmpfs at `mount_fd`; what it holds then, plus the headroom (size, inodes)."""
    originals = copy_workspace(
        workspace.fd,
        mount_fd,
        owner,
        max_entries=writes.max_copy_files,
        max_bytes=writes.max_copy_bytes,
        racy_ns=writes.racy_ns,
    )
    root = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=mount_fd)
    try:
        usage = os.fstatvfs(root)
    finally:
        os.close(root)
    used_bytes = (usage.f_blocks - usage.f_bfree) * usage.f_frsize
    used_files = usage.f_files - usage.f_ffree
    return originals, (used_bytes + 2 * writes.max_bytes + 1024 * 1024, used_files + writes.max_files + SLACK_FILES)


async def _read_into(
    result: RunResult,
    mount_fd: int,
    originals: Originals,
    writes: ChangeRules,
    workspace: Pinned,
    *,
    run_owner: Owner | None,
) -> RunResult:
    read = functools.partial(read_changes, mount_fd, originals, writes, workspace.fd, run_owner=run_owner)
    try:
        changes = await anyio.to_thread.run_sync(read)
    except OSError:
        return dataclasses.replace(result, changes_error="changes_unreadable")
    return dataclasses.replace(result, changes=changes)
