"""A workspace file hashed only when the run changed it, vouched for by its identity meanwhile (decision 82).

On a real copy in a real tmpfs, in process, as test_workspace_changes.py: the copy is changed through
its fd as a run would change it, and the workspace by hand as a developer (or a hostile process) would
while the run goes on. What is checked: `sha256_before` is the hash of what was copied or None, never
another; a workspace file changed since the copy in any way that keeps its size and times (a rewrite
with the times set back, a reused inode, a rename swap, a link in its place) is a conflict and nothing
is written; a file identity cannot vouch for is hashed as it is copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.apply import apply_changes
from sandbox.backends.view import WorkspaceView
from sandbox.change_set import Action, Change, ChangeRules, ChangeSet
from sandbox.patch import render_patch
from sandbox.pinned import Pinned
from sandbox.workspace_copy import (
    LAZY_FILESYSTEMS,
    RACY_NS,
    Identity,
    Kind,
    Originals,
    Owner,
    copy_workspace,
    filesystem_type,
)
from sandbox.writable_copy import close_aside
from tests.sandbox.confined_child import requires_root
from tests.sandbox.test_workspace_changes import changes_of, workspace
from tests.sandbox.test_workspace_changes import copied as copied_by_hand

pytestmark = requires_root

ROOT = Owner(0, 0)
SHORT_RACY_NS = 20_000_000
"""The tests' own racy window: files made 200 ms before the copy are past it, so their hashes are left lazy."""
SAME_SIZE = {"a.txt": b"alpha 1\n", "b.txt": b"bravo 2\n", "c.txt": b"untouched\n"}


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@contextlib.contextmanager
def copied(ws: Pinned, *, lazy: bool) -> Iterator[tuple[WorkspaceView, Originals, Path]]:
    """The workspace copied into a view, its files' hashes left to their identity (`lazy`) or taken as copied."""
    assert filesystem_type(ws.fd) in LAZY_FILESYSTEMS, "the tests' folder must be on ext4, xfs, btrfs or tmpfs"
    if lazy:
        time.sleep(10 * SHORT_RACY_NS / 1e9)
    with copied_by_hand(ws, racy_ns=SHORT_RACY_NS if lazy else RACY_NS) as (view, originals, copy):
        files = [original for original in originals.values() if original.size]
        assert all((original.sha256 is None) is lazy for original in files)
        yield view, originals, copy


def by_path(changes: ChangeSet) -> dict[str, Change]:
    return {change.path: change for change in changes.changes}


def test_a_file_untouched_for_a_while_keeps_its_identity_and_a_recent_one_its_hash(tmp_path: Path) -> None:
    with workspace(tmp_path, {"old.txt": b"old\n"}) as ws:
        time.sleep(3 * SHORT_RACY_NS / 1e9)
        (ws.path / "new.txt").write_bytes(b"new\n")
        with WorkspaceView(64 << 20, 100) as view:
            originals = copy_workspace(
                ws.fd, view.mount_fd, ROOT, max_entries=100, max_bytes=1 << 20, racy_ns=SHORT_RACY_NS
            )
        assert originals["old.txt"].sha256 is None
        assert originals["old.txt"].identity == Identity.of(os.stat(ws.path / "old.txt"))
        assert originals["new.txt"].sha256 == sha(b"new\n"), "written within the racy window: hashed as copied"
        assert originals["new.txt"].identity is None
        with WorkspaceView(64 << 20, 100) as view:
            hashed = copy_workspace(
                ws.fd, view.mount_fd, ROOT, max_entries=100, max_bytes=1 << 20, racy_ns=0, trusted=frozenset()
            )
        assert hashed["old.txt"].sha256 == sha(b"old\n"), "a filesystem not trusted: every file hashed as copied"


def test_the_filesystem_type_is_the_kernels_and_unknown_is_none_trusted(tmp_path: Path) -> None:
    with WorkspaceView(1 << 20, 16) as view:
        assert filesystem_type(view.mount_fd) == 0x01021994  # tmpfs
    assert filesystem_type(-1) == 0
    assert 0 not in LAZY_FILESYSTEMS


def test_only_what_the_run_changed_is_hashed_and_sha256_before_is_what_was_copied(tmp_path: Path) -> None:
    files = {"mod.txt": b"one\n", "del.txt": b"gone\n", "same.txt": b"s\n", "d/inner.txt": b"in\n"}
    with workspace(tmp_path, files) as ws, copied(ws, lazy=True) as (view, originals, copy):
        (copy / "mod.txt").write_bytes(b"two\n")
        (copy / "del.txt").unlink()
        (copy / "d" / "inner.txt").unlink()
        (copy / "d").rmdir()
        (copy / "same.txt").write_bytes(b"s\n")  # rewritten as it was: hashed, and no change
        changes = by_path(changes_of(view, originals, ws))
        assert {path: c.action for path, c in changes.items()} == {
            "mod.txt": Action.MODIFIED,
            "del.txt": Action.DELETED,
            "d/inner.txt": Action.DELETED,
            "d": Action.DELETED,
        }
        for path in ("mod.txt", "del.txt", "d/inner.txt"):
            assert changes[path].sha256_before == sha(files[path])
            assert changes[path].content_before == files[path], "read once, for the hash and the diff"
        result = apply_changes(ws.fd, ChangeSet(tuple(changes.values()), ()))
        assert result.applied
        assert sorted(os.listdir(ws.path)) == ["mod.txt", "same.txt"]
        assert (ws.path / "mod.txt").read_bytes() == b"two\n"


def _rewrite_times_restored(ws: Path) -> None:
    """Same size, other bytes, atime and mtime set back as they were (only the ctime tells)."""
    before = os.stat(ws / "a.txt")
    with open(ws / "a.txt", "r+b") as handle:
        handle.write(b"ALPHA 1\n")
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))


def _inode_reused(ws: Path) -> None:
    """Deleted and made again at once (ext4 hands the freed inode out again), same size, times set back."""
    before = os.stat(ws / "a.txt")
    (ws / "a.txt").unlink()
    (ws / "a.txt").write_bytes(b"alpha 9\n")
    (ws / "a.txt").chmod(0o644)
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))


def _renames_swapped(ws: Path) -> None:
    """a.txt and b.txt (same size, same mode) swapped by renames, each given the other's times back."""
    a, b = os.stat(ws / "a.txt"), os.stat(ws / "b.txt")
    os.rename(ws / "a.txt", ws / "swap")
    os.rename(ws / "b.txt", ws / "a.txt")
    os.rename(ws / "swap", ws / "b.txt")
    os.utime(ws / "a.txt", ns=(a.st_atime_ns, a.st_mtime_ns))
    os.utime(ws / "b.txt", ns=(b.st_atime_ns, b.st_mtime_ns))


def _same_bytes_written(ws: Path) -> None:
    """The same bytes written again (an editor's save with no edit, a checkout of the same blob)."""
    before = os.stat(ws / "a.txt")
    (ws / "a.txt").write_bytes(SAME_SIZE["a.txt"])
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))


def _mode_changed_and_back(ws: Path) -> None:
    (ws / "a.txt").chmod(0o600)
    (ws / "a.txt").chmod(0o644)


def _link_to_the_same_bytes(ws: Path) -> None:
    """A symlink in its place, to a file holding exactly what was copied."""
    (ws / "elsewhere").write_bytes(SAME_SIZE["a.txt"])
    (ws / "a.txt").unlink()
    (ws / "a.txt").symlink_to("elsewhere")


Edit = Callable[[Path], None]


@pytest.mark.parametrize("lazy", [True, False], ids=["identity", "hashed-as-copied"])
@pytest.mark.parametrize(
    ("edit", "content_changed"),
    [
        (_rewrite_times_restored, True),
        (_inode_reused, True),
        (_renames_swapped, True),
        (_link_to_the_same_bytes, True),
        (_same_bytes_written, False),
        (_mode_changed_and_back, False),
    ],
)
def test_a_file_edited_in_the_workspace_during_the_run_is_a_conflict_whatever_its_size_and_times(
    tmp_path: Path, edit: Edit, content_changed: bool, lazy: bool
) -> None:
    with workspace(tmp_path, SAME_SIZE) as ws:
        with copied(ws, lazy=lazy) as (view, originals, copy):
            (copy / "a.txt").write_bytes(b"from the run a\n")
            (copy / "b.txt").write_bytes(b"from the run b\n")
            edit(ws.path)
            changes = changes_of(view, originals, ws)
        seen = by_path(changes)["a.txt"]
        assert seen.sha256_before in (None, sha(SAME_SIZE["a.txt"])), "what was copied, or not known: never another"
        if lazy:
            assert seen.sha256_before is None, "its identity moved: what was copied is not known"
            assert "applying it would conflict" in render_patch(changes)
        else:
            assert seen.sha256_before == sha(SAME_SIZE["a.txt"])
        before = {name: os.readlink(ws.path / name) if (ws.path / name).is_symlink() else (ws.path / name).read_bytes()
                  for name in os.listdir(ws.path)}  # fmt: skip
        result = apply_changes(ws.fd, changes)
        # Hashed as copied, the same bytes with the same mode still apply; by identity, any change of it conflicts.
        if content_changed or lazy:
            assert (result.applied, result.reason) == (False, "changes_conflict")
            assert "a.txt" in result.conflicts
            after = {name: os.readlink(ws.path / name) if (ws.path / name).is_symlink() else (ws.path / name).read_bytes()
                     for name in os.listdir(ws.path)}  # fmt: skip
            assert after == before, "nothing written"
        else:
            assert result.applied
            assert (ws.path / "a.txt").read_bytes() == b"from the run a\n"


def test_an_edit_after_the_set_was_read_is_caught_by_the_hash_applying_takes(tmp_path: Path) -> None:
    with workspace(tmp_path, SAME_SIZE) as ws:
        with copied(ws, lazy=True) as (view, originals, copy):
            (copy / "a.txt").write_bytes(b"from the run\n")
            changes = changes_of(view, originals, ws)
        assert by_path(changes)["a.txt"].sha256_before == sha(SAME_SIZE["a.txt"])
        _rewrite_times_restored(ws.path)  # while a person decides
        result = apply_changes(ws.fd, changes)
        assert (result.applied, result.reason, result.conflicts) == (False, "changes_conflict", ("a.txt",))
        assert (ws.path / "a.txt").read_bytes() == b"ALPHA 1\n"


@pytest.mark.parametrize("action", [Action.MODIFIED, Action.DELETED])
def test_a_change_whose_before_is_not_known_applies_nothing(tmp_path: Path, action: Action) -> None:
    with workspace(tmp_path, {"a.txt": b"as it is\n", "b.txt": b"b\n"}) as ws:
        deleted = action is Action.DELETED
        after, content = (None, None) if deleted else (sha(b"new\n"), b"new\n")
        unknown = Change(
            "a.txt",
            action,
            Kind.FILE,
            None,
            after,
            9,
            None if deleted else 4,
            0o644,
            None if deleted else 0o644,
            content,
        )
        added = Change("c.txt", Action.ADDED, Kind.FILE, None, sha(b"c\n"), None, 2, None, 0o644, b"c\n")
        result = apply_changes(ws.fd, ChangeSet((unknown, added), ()))
        assert (result.applied, result.reason, result.conflicts) == (False, "changes_conflict", ("a.txt",))
        assert sorted(os.listdir(ws.path)) == ["a.txt", "b.txt"]
        assert (ws.path / "a.txt").read_bytes() == b"as it is\n"


def test_a_large_file_is_hashed_in_chunks_and_kept_for_the_diff_only_within_the_cap(tmp_path: Path) -> None:
    big = os.urandom(3 << 20)
    with workspace(tmp_path, {"big.bin": big, "small.txt": b"small\n"}) as ws:
        with copied(ws, lazy=True) as (view, originals, copy):
            (copy / "big.bin").unlink()
            (copy / "small.txt").unlink()
            changes = by_path(changes_of(view, originals, ws, ChangeRules(max_bytes=1 << 20)))
        assert changes["big.bin"].sha256_before == sha(big)
        assert changes["big.bin"].content_before is None, "past max_change_bytes: hashed, not kept"
        assert changes["small.txt"].content_before == b"small\n"


def test_the_copys_tmpfs_is_closed_on_a_thread_of_its_own(tmp_path: Path) -> None:
    view = WorkspaceView(1 << 20, 16)
    assert view.mount_fd >= 0
    closer = close_aside(view.close)
    assert closer is not threading.current_thread()
    closer.join(timeout=60)
    assert not closer.is_alive()
    assert view.mount_fd == -1
