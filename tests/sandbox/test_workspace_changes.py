"""The change set, its patch and its application, on a real copy in a real tmpfs, in process (decision 78).

The copy is changed here through its fd as a run would change it; the runs themselves, through
the sandbox, are in test_workspace_runs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from sandbox import Limits, probe_host, run_sandboxed
from sandbox.apply import apply_changes
from sandbox.backends.view import MIB, NamespacedView, WorkspaceView
from sandbox.change_set import (
    Action,
    Change,
    ChangeRules,
    ChangeSet,
    Refusal,
    TooLarge,
    guarding_folders,
    is_listed,
    is_protected,
    read_changes,
)
from sandbox.confine import LayerReport
from sandbox.errors import SandboxStartError
from sandbox.patch import render_patch, shown, summarize, write_patch
from sandbox.pinned import Pinned, pin
from sandbox.workspace_copy import MAX_DEPTH, RACY_NS, Kind, Originals, Owner, WorkspaceTooLarge, copy_workspace
from sandbox.writable_copy import WritableCopy
from tests.sandbox.confined_child import requires_root

ROOT = Owner(0, 0)


@contextlib.contextmanager
def workspace(tmp_path: Path, files: dict[str, bytes]) -> Iterator[Pinned]:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, content in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_bytes(content)
        (ws / name).chmod(0o644)
    pinned = pin(ws)
    try:
        yield pinned
    finally:
        pinned.close()


@contextlib.contextmanager
def copied(ws: Pinned, **bounds: int) -> Iterator[tuple[WorkspaceView, Originals, Path]]:
    """The workspace copied into a view; the copy's folder as a path (through /proc/self/fd) to change it as a run would.

    `racy_ns`: the window within which a file's hash is taken as it is copied (test_copy_identity.py)."""
    with WorkspaceView(64 << 20, 10_000) as view:
        originals = copy_workspace(
            ws.fd,
            view.mount_fd,
            ROOT,
            max_entries=bounds.get("entries", 10_000),
            max_bytes=bounds.get("bytes", 32 << 20),
            racy_ns=bounds.get("racy_ns", RACY_NS),
        )
        root = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=view.mount_fd)
        try:
            yield view, originals, Path(f"/proc/self/fd/{root}")
        finally:
            os.close(root)


def changes_of(view: WorkspaceView, originals: Originals, ws: Pinned, rules: ChangeRules | None = None) -> ChangeSet:
    view.freeze()
    return read_changes(view.mount_fd, originals, rules or ChangeRules(), ws.fd)


def actions(changes: ChangeSet) -> dict[str, Action]:
    return {change.path: change.action for change in changes.changes}


pytestmark = requires_root


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        (".git/hooks", True),
        (".git/hooks/pre-commit", True),
        (".git/hooksx", True),  # everything beneath a .git: git reads more than hooks and config there
        (".git/HOOKS/pre-commit", True),
        (".git", True),  # the folder itself (its mode), or a `gitdir:` file in its place
        (".git/HEAD", True),
        (".git/commondir", True),  # where git reads config and hooks from instead
        (".git/worktrees/w/commondir", True),
        (".git/info/attributes", True),  # filter commands by path
        (".git/config", True),
        (".git/config.d", True),
        ("src/.git/hooks/x", True),  # a nested repository's
        ("src/.git", True),  # a submodule's `gitdir:` file, or a new one pointing anywhere
        ("a/b/c/.git/config", True),
        (".GIT/config", True),  # a casefold folder (ext4 +F), vfat, NTFS: the same name to git
        (".Git", True),
        (".git./config", True),  # NTFS drops trailing dots and spaces
        (".git ", True),
        ("git~1/config", True),  # NTFS's 8.3 short name
        (".g\u200cit/config", True),  # HFS+ ignores zero-width and bidi marks
        ("\ufeff.git", True),
        (".g\u0131t/config", False),  # a dotless i: no filesystem folds it to .git
        (".git/modules/lib/hooks/post-checkout", True),  # a submodule's git folder
        (".git/modules/lib/config", True),
        (".git/modules/lib/HEAD", True),
        (".gitignore", False),
        (".gitattributes", False),
        ("git/config", False),
        ("src/.github/workflows/ci.yml", False),
        ("sub/.envrc", True),  # direnv loads it in whatever folder a person enters
        ("sub/.vscode/tasks.json", True),
        (".vscode", True),
        ("./.vscode//tasks.json", True),
        ("vscode/x", False),
        ("a.py", False),
    ],
)
def test_protected_paths_are_compared_component_wise(path: str, protected: bool) -> None:
    assert is_protected(path, ChangeRules().protected) is protected


@pytest.mark.parametrize(
    "protected",
    [(), ("",), (".vscode",), ("a/b", "b"), ("x/y/z",), (".", "a"), ("a/./b/",), ("b", "a/b/c", ".envrc")],
)
def test_a_listed_path_is_found_as_a_slice_of_the_path_whatever_the_list(protected: tuple[str, ...]) -> None:
    """`is_listed` (its list parsed once, its first names looked up first) against the definition: a listed
    path's components appear, in order and together, somewhere in the path's."""
    paths = ["", "a", "a/b", "x/a/b/c", "b", "c/b", "x/y/z/w", "y/z", ".vscode/t", "s/.envrc", "a/./b", "ab/b"]
    for path in paths:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        expected = any(
            parts[start : start + len(g)] == g
            for g in ([p for p in entry.split("/") if p not in ("", ".")] for entry in protected)
            for start in range(len(parts) - len(g) + 1)
        )
        assert is_listed(path, protected) is expected, (path, protected)


def test_the_folders_guarding_a_protected_path_are_those_above_one() -> None:
    present = [".git", ".git/HEAD", ".git/hooks", ".git/hooks/x", "src", "src/a.py", "sub", "sub/.envrc"]
    assert guarding_folders(present, ChangeRules().protected) == {".git", ".git/hooks", "sub"}


@pytest.mark.parametrize("entry", ["/etc", "../x", "a/../../b", "", "."])
def test_a_protected_path_is_relative_and_inside(entry: str) -> None:
    with pytest.raises(ValueError, match="protected path"):
        ChangeRules(protected=(entry,))


def test_an_untouched_copy_has_no_changes_and_reads_no_file(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a.py": b"x", "d/b.bin": b"\0" * 10}) as ws:
        os.symlink("a.py", ws.path / "link")
        os.mkfifo(ws.path / "fifo")
        with copied(ws) as (view, originals, copy):
            assert sorted(originals) == ["a.py", "d", "d/b.bin", "link"], "a FIFO is not copied"
            assert originals["link"].kind is Kind.SYMLINK
            assert os.readlink(copy / "link") == "a.py"
            os.chmod(ws.path / "a.py", 0o600)  # the workspace itself may change: the copy is what is compared
            assert changes_of(view, originals, ws).is_empty


def test_rewriting_a_file_with_the_same_content_is_no_change(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws, copied(ws) as (view, originals, copy):
        (copy / "a.py").write_bytes(b"x = 1\n")
        assert changes_of(view, originals, ws).is_empty


def test_a_file_replaced_by_a_folder_is_a_deletion_and_an_addition(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": b"file", "d/x": b"1", "d/y": b"2"}) as ws, copied(ws) as (view, originals, copy):
        (copy / "a").unlink()
        (copy / "a").mkdir()
        (copy / "a" / "inner").write_bytes(b"i")
        for name in ("x", "y"):
            (copy / "d" / name).unlink()
        (copy / "d").rmdir()
        (copy / "d").write_bytes(b"now a file")
        changes = changes_of(view, originals, ws)
        assert [(c.path, c.action, c.kind) for c in changes.changes] == [
            ("a", Action.DELETED, Kind.FILE),
            ("a", Action.ADDED, Kind.FOLDER),
            ("a/inner", Action.ADDED, Kind.FILE),
            ("d/x", Action.DELETED, Kind.FILE),
            ("d/y", Action.DELETED, Kind.FILE),
            ("d", Action.DELETED, Kind.FOLDER),
            ("d", Action.ADDED, Kind.FILE),
        ]
        assert apply_changes(ws.fd, changes).applied
        assert (ws.path / "a" / "inner").read_bytes() == b"i"
        assert (ws.path / "d").read_bytes() == b"now a file"


def test_deleting_a_folder_that_holds_a_protected_path_is_refused(tmp_path: Path) -> None:
    files = {".git/HEAD": b"ref", ".git/hooks/pre-commit.sample": b"#!/bin/sh\n"}
    with workspace(tmp_path, files) as ws, copied(ws) as (view, originals, copy):
        for path in sorted(copy.joinpath(".git").rglob("*"), key=lambda p: -len(p.parts)):
            path.rmdir() if path.is_dir() else path.unlink()
        (copy / ".git").rmdir()
        changes = changes_of(view, originals, ws)
        assert actions(changes) == {}
        assert {r.path: r.why for r in changes.refused} == {
            ".git/hooks/pre-commit.sample": Refusal.PROTECTED,
            ".git/HEAD": Refusal.PROTECTED,
            ".git/hooks": Refusal.PROTECTED,
            ".git": Refusal.PROTECTED,
        }
        assert apply_changes(ws.fd, changes).applied
        assert sorted(p.name for p in (ws.path / ".git").iterdir()) == ["HEAD", "hooks"]


def test_a_folder_to_delete_that_got_a_new_file_meanwhile_is_a_conflict(tmp_path: Path) -> None:
    with workspace(tmp_path, {"d/a": b"a"}) as ws:
        with copied(ws) as (view, originals, copy):
            (copy / "d" / "a").unlink()
            (copy / "d").rmdir()
            changes = changes_of(view, originals, ws)
        (ws.path / "d" / "new").write_bytes(b"made while a person decided")
        assert apply_changes(ws.fd, changes).conflicts == ("d",)
        assert sorted(os.listdir(ws.path / "d")) == ["a", "new"]


def test_caps_stop_the_walk_at_the_cap_plus_one(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": b"a"}) as ws, copied(ws) as (view, originals, copy):
        for i in range(50):
            (copy / f"n{i:02}").write_bytes(b"x" * 100)
        by_files = changes_of(view, originals, ws, ChangeRules(max_files=10))
        assert by_files.too_large is TooLarge.FILES
        assert len(by_files.changes) == 11
        by_bytes = read_changes(view.mount_fd, originals, ChangeRules(max_bytes=1000), ws.fd)
        assert by_bytes.too_large is TooLarge.BYTES
        assert by_bytes.content_bytes <= 1000
        assert apply_changes(ws.fd, by_files).reason == "changes_too_large"
        assert sorted(os.listdir(ws.path)) == ["a"]
        assert "too large: over max_change_files" in render_patch(by_files)


def test_a_workspace_over_the_copy_bounds_does_not_start(tmp_path: Path) -> None:
    with workspace(tmp_path, {f"f{i}": b"x" * 100 for i in range(20)}) as ws:
        with pytest.raises(WorkspaceTooLarge), copied(ws, entries=10):
            pass
        with pytest.raises(WorkspaceTooLarge), copied(ws, bytes=1000):
            pass


def test_freezing_fails_while_a_writer_holds_the_copy(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": b"a"}) as ws, copied(ws) as (view, _, copy):
        with (copy / "late").open("wb") as writer:
            with pytest.raises(OSError, match="busy") as busy:
                view.freeze()
            assert busy.value.errno == errno.EBUSY
            writer.write(b"still open")
        view.freeze()
        with pytest.raises(OSError, match="Read-only") as read_only:
            (copy / "later").write_bytes(b"x")
        assert read_only.value.errno == errno.EROFS


def test_applying_checks_every_target_first_and_writes_nothing_on_a_conflict(tmp_path: Path) -> None:
    files = {"mod.txt": b"one\n", "del.txt": b"gone\n", "same.txt": b"s"}
    with workspace(tmp_path, files) as ws:
        with copied(ws) as (view, originals, copy):
            (copy / "mod.txt").write_bytes(b"two\n")
            (copy / "del.txt").unlink()
            (copy / "new.txt").write_bytes(b"new\n")
            changes = changes_of(view, originals, ws)
        for target, change in (("mod.txt", b"changed meanwhile\n"), ("del.txt", b"edited\n"), ("new.txt", b"made\n")):
            before = {p.name: p.read_bytes() for p in ws.path.iterdir()}
            (ws.path / target).write_bytes(change)
            result = apply_changes(ws.fd, changes)
            assert (result.applied, result.reason, result.conflicts) == (False, "changes_conflict", (target,))
            assert {p.name: p.read_bytes() for p in ws.path.iterdir()} == before | {target: change}, "nothing written"
            if target in files:
                (ws.path / target).write_bytes(files[target])
            else:
                (ws.path / target).unlink()
        os.chmod(ws.path / "mod.txt", 0o600)
        assert apply_changes(ws.fd, changes).conflicts == ("mod.txt",), "a mode changed meanwhile is a conflict too"
        os.chmod(ws.path / "mod.txt", 0o644)
        result = apply_changes(ws.fd, changes, new_token=lambda: "t")
        assert result.applied and sorted(result.written) == ["del.txt", "mod.txt", "new.txt"]
        assert sorted(os.listdir(ws.path)) == ["mod.txt", "new.txt", "same.txt"], "no temporary left"


def test_a_renamed_or_swapped_workspace_root_keeps_every_write_inside_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with workspace(tmp_path, {"a.txt": b"a"}) as ws:
        with copied(ws) as (view, originals, copy):
            (copy / "a.txt").write_bytes(b"A")
            (copy / "sub").mkdir()
            (copy / "sub" / "b.txt").write_bytes(b"b")
            changes = changes_of(view, originals, ws)
        moved = tmp_path / "moved"
        ws.path.rename(moved)
        (elsewhere / "sub").mkdir()
        ws.path.symlink_to(elsewhere)  # while a person decides, the path now leads elsewhere
        result = apply_changes(ws.fd, changes)
        assert result.applied, result
        assert (moved / "a.txt").read_bytes() == b"A"
        assert (moved / "sub" / "b.txt").read_bytes() == b"b"
        assert sorted(p.name for p in elsewhere.rglob("*")) == ["sub"], "nothing landed outside the pinned folder"


def test_a_link_put_on_the_way_before_applying_is_a_conflict(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with workspace(tmp_path, {"d/a.txt": b"a"}) as ws:
        with copied(ws) as (view, originals, copy):
            (copy / "d" / "a.txt").write_bytes(b"A")
            (copy / "d" / "new.txt").write_bytes(b"n")
            changes = changes_of(view, originals, ws)
        (outside / "a.txt").write_bytes(b"a")
        (ws.path / "d" / "a.txt").unlink()
        (ws.path / "d").rmdir()
        (ws.path / "d").symlink_to(outside)
        result = apply_changes(ws.fd, changes)
        assert (result.applied, result.reason, set(result.conflicts)) == (
            False,
            "changes_conflict",
            {"d/a.txt", "d/new.txt"},
        )
        assert (outside / "a.txt").read_bytes() == b"a" and not (outside / "new.txt").exists()


def test_modes_are_permission_bits_and_files_belong_to_the_gateway(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a.sh": b"echo\n"}) as ws, copied(ws) as (view, originals, copy):
        os.chown(copy / "a.sh", 61234, 61234)
        os.chmod(copy / "a.sh", 0o1755)  # noqa: S103  (sticky: not a permission bit, never applied)
        changes = changes_of(view, originals, ws)
        assert [(c.path, c.mode_before, c.mode_after) for c in changes.changes] == [("a.sh", 0o644, 0o755)]
        assert apply_changes(ws.fd, changes).applied
        info = (ws.path / "a.sh").stat()
        assert (info.st_mode & 0o7777, info.st_uid) == (0o755, os.getuid())


def test_a_root_gateway_keeps_owners_and_gives_new_entries_their_folders(tmp_path: Path) -> None:
    """Decision 80: a modified file keeps its owner and group, an added file or folder gets its folder's."""
    with workspace(tmp_path, {"mine.py": b"x = 1\n", "sub/keep.txt": b"k"}) as ws:
        os.chown(ws.path, 61230, 61231)
        os.chown(ws.path / "mine.py", 61232, 61233)
        os.chown(ws.path / "sub", 61234, 61235)
        with copied(ws) as (view, originals, copy):
            (copy / "mine.py").write_bytes(b"x = 2\n")
            (copy / "sub" / "new.txt").write_bytes(b"n")
            (copy / "made" / "deeper").mkdir(parents=True)
            (copy / "made" / "deeper" / "f.txt").write_bytes(b"f")
            changes = changes_of(view, originals, ws)
            assert apply_changes(ws.fd, changes).applied

        def owner(relative: str) -> tuple[int, int, int]:
            info = (ws.path / relative).stat()
            return info.st_uid, info.st_gid, info.st_mode & 0o7000

        assert owner("mine.py") == (61232, 61233, 0)
        assert owner("sub/new.txt") == (61234, 61235, 0)
        assert owner("made") == (61230, 61231, 0)
        assert owner("made/deeper") == (61230, 61231, 0)
        assert owner("made/deeper/f.txt") == (61230, 61231, 0)
        assert (ws.path / "mine.py").read_bytes() == b"x = 2\n"


@pytest.mark.parametrize(
    ("name", "seen"),
    [
        ("plain.py", "plain.py"),
        ("new\nline", "new\\nline"),
        ("tab\there", "tab\\there"),
        ("rea\u202edme", "rea\\u202edme"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("bell\x07", "bell\\x07"),
        (os.fsdecode(b"bad\xff"), "bad\\xff"),
        ("back\\slash", "back\\\\slash"),
        ("ünï", "ünï"),
    ],
)
def test_names_are_shown_escaped(name: str, seen: str) -> None:
    assert shown(name) == seen


def test_the_patch_names_binary_files_modes_folders_and_refusals(tmp_path: Path) -> None:
    files = {"bin.dat": b"\0\1" * 6000, "text.py": b"a = 1\nb = 2\n", "old.txt": b"bye\n"}
    with workspace(tmp_path, files) as ws, copied(ws) as (view, originals, copy):
        (copy / "bin.dat").write_bytes(b"\0\2" * 6200)
        (copy / "text.py").write_bytes(b"a = 1\nb = 3")
        os.chmod(copy / "text.py", 0o755)  # noqa: S103  (a mode change the patch names)
        (copy / "old.txt").unlink()
        (copy / "pkg").mkdir()
        os.symlink("/etc/passwd", copy / "pkg" / "link")
        changes = changes_of(view, originals, ws)
    patch = render_patch(changes)
    assert "# binary file, 12,000 bytes -> 12,400 bytes" in patch
    assert "# modified file text.py (mode 0644 -> 0755)" in patch
    assert "-b = 2\n+b = 3\n\\ No newline at end of file" in patch
    assert "--- a/old.txt\n+++ /dev/null" in patch and "-bye" in patch
    assert "# added folder pkg (mode 0755)" in patch
    assert "# refused: pkg/link (symlink): not applied" in patch
    short = summarize(changes, max_names=2)
    assert short.startswith("1 added, 2 modified, 1 deleted; 1 refused; 12,411 bytes to write")
    assert short.endswith("; and 3 more")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    assert write_patch(changes, artifacts).read_text() == patch


def test_a_writing_run_needs_a_pinned_workspace_and_root_with_cap_sys_admin_or_no_root(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": b"a"}) as ws:
        limits = Limits(timeout_s=10, memory_limit_mb=128, max_processes=8, max_output_bytes=1000)
        scratch = tmp_path / "scratch"
        scratch.mkdir()

        def attempt(cwd: Path | Pinned, host: LayerReport | None = None) -> None:
            async def start() -> None:
                await run_sandboxed(
                    ["/bin/true"],
                    cwd,
                    limits,
                    tmp_path / "o",
                    tmp_path / "e",
                    scratch=scratch,
                    writes=ChangeRules(),
                    host=host,
                )

            anyio.run(start)

        with pytest.raises(SandboxStartError, match="workspace_view_unavailable"):
            attempt(ws.path)
        # Root taking the rootless path (no CAP_SYS_ADMIN, as in some containers): its copy could not keep
        # the owners of what the run may not read, so it makes none.
        rootless = dataclasses.replace(probe_host(), uid_drop=False, user_namespace=True)
        with pytest.raises(SandboxStartError, match="workspace_view_unavailable"):
            attempt(ws, rootless)
        assert os.listdir(ws.path) == ["a"]


def test_folders_past_the_depth_bound_are_refused_not_walked(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": b"a"}) as ws, copied(ws) as (view, originals, copy):
        fd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for _ in range(MAX_DEPTH + 50):  # by fd: the path would pass PATH_MAX long before
                os.mkdir("d", dir_fd=fd)
                inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = inner
            os.close(os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        finally:
            os.close(fd)
        changes = changes_of(view, originals, ws)
        assert len(changes.changes) == MAX_DEPTH - 1
        assert [(r.path.count("/") + 1, r.why) for r in changes.refused] == [(MAX_DEPTH, Refusal.TOO_DEEP)]


def test_a_workspace_past_the_depth_bound_is_not_copied(tmp_path: Path) -> None:
    deep = {"/".join(["d"] * MAX_DEPTH) + "/f": b"f"}
    with workspace(tmp_path, deep) as ws, pytest.raises(WorkspaceTooLarge), copied(ws):
        pass
    shallower = tmp_path / "shallower"
    shallower.mkdir()
    with workspace(shallower, {"/".join(["d"] * (MAX_DEPTH - 1)) + "/f": b"f"}) as ws, copied(ws) as (_, originals, _):
        assert len(originals) == MAX_DEPTH


def test_a_filler_waiting_for_a_child_that_never_sends_wakes_when_the_spawn_fails(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": b"a"}) as ws:
        child_view = NamespacedView(MIB, 100, os.getuid(), os.getgid(), wait_s=60)
        copy = WritableCopy(ChangeRules(), child_view=child_view)
        started = time.monotonic()
        with pytest.raises(SandboxStartError, match="spawn_failed"), copy.spawning(ws):
            raise SandboxStartError("spawn_failed")  # the spawn failed before the child sent its tmpfs
        assert time.monotonic() - started < 10, "the filler thread woke at once, not at its 60 s timeout"


def test_control_and_bidi_characters_in_a_text_file_are_shown_escaped_and_said(tmp_path: Path) -> None:
    trojan = "access = 'user'\nif access != 'none\u202e \u2066// admin\u2069 \u2066':\n\tgrant()  \x1b[2J\n"
    with workspace(tmp_path, {"plain.py": b"a\n"}) as ws, copied(ws) as (view, originals, copy):
        (copy / "trojan.py").write_text(trojan)
        (copy / "plain.py").write_text("a\n\tb\n")
        changes = changes_of(view, originals, ws)
    patch = render_patch(changes)
    assert "\u202e" not in patch and "\u2066" not in patch and "\x1b" not in patch
    assert "+if access != 'none\\u202e \\u2066// admin\\u2069 \\u2066':" in patch
    assert "+\tgrant()  \\x1b[2J" in patch
    assert patch.count("# this file holds control or bidi characters") == 1, "said for trojan.py, not plain.py"
    assert "+\tb" in patch
    assert next(c for c in changes.changes if c.path == "trojan.py").content == trojan.encode(), "applied exact"


@pytest.mark.parametrize("control", ["\x1b[2J", "\x7f", "\r", "\x08"])
def test_a_control_character_in_an_ascii_file_shown_whole_is_escaped_and_said(control: str) -> None:
    """A file shown whole is passed a chunk at once when it holds only printable ASCII, tabs and newlines
    (sandbox/patch.py `_as_is`): one control character in otherwise plain ASCII is still seen."""
    text = f"a\n\tb {control}c\n"
    added = Change("y.py", Action.ADDED, Kind.FILE, None, "2", None, len(text), None, 0o644, text.encode())
    patch = render_patch(ChangeSet((added,), ()))
    assert control not in patch and f"+\tb {shown(control)}c\n" in patch
    assert "# this file holds control or bidi characters" in patch


def test_hunk_headers_stand_alone_and_a_missing_last_newline_is_said_once() -> None:
    change = Change("x.py", Action.MODIFIED, Kind.FILE, "1", "2", 5, 5, 0o644, 0o644, b"a\nb\nd", b"a\nb\nc")
    assert render_patch(ChangeSet((change,), ())).splitlines() == [
        "# modified file x.py",
        "--- a/x.py",
        "+++ b/x.py",
        "@@ -1,3 +1,3 @@",
        " a",
        " b",
        "-c",
        "\\ No newline at end of file",
        "+d",
        "\\ No newline at end of file",
    ]
    added = Change("y.py", Action.ADDED, Kind.FILE, None, "2", None, 4, None, 0o644, b"a\nb\n")
    assert render_patch(ChangeSet((added,), ())).splitlines()[3:] == ["@@ -0,0 +1,2 @@", "+a", "+b"]


def test_a_set_built_by_hand_with_a_protected_path_applies_nothing(tmp_path: Path) -> None:
    hook = Change(".git/hooks/pre-commit", Action.ADDED, Kind.FILE, None, "x", None, 3, None, 0o755, b"#!\n")
    fine = Change("a.txt", Action.ADDED, Kind.FILE, None, "y", None, 1, None, 0o644, b"a")
    with workspace(tmp_path, {"keep": b"k"}) as ws:
        result = apply_changes(ws.fd, ChangeSet((fine, hook), ()))
        assert (result.applied, result.reason, result.conflicts) == (
            False,
            "changes_protected",
            (".git/hooks/pre-commit",),
        )
        assert os.listdir(ws.path) == ["keep"]
        mine = apply_changes(ws.fd, ChangeSet((fine,), ()), protected=("a.txt",))
        assert (mine.reason, mine.conflicts) == ("changes_protected", ("a.txt",))
