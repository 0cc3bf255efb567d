"""Applying a change set with the smallest window the kernel allows (sandbox/apply.py, docs/security-model.md):
each file swapped in at once (renameat2) and the file swapped out checked, so a person's save between the
check and a file's own swap is found and the whole set put back. Real files; the race made deterministic
by saving between the placing's own steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.apply import _Placing, apply_changes, exchange_by_link, rename_new_by_link
from sandbox.change_set import Action, ChangeSet
from sandbox.renames import exchange, rename_new
from tests.sandbox.confined_child import requires_root
from tests.sandbox.test_workspace_changes import changes_of, copied, workspace

pytestmark = requires_root

FILES = {"a.txt": b"a\n", "b.txt": b"b\n", "gone.txt": b"gone\n", "sub/c.txt": b"c\n"}


def _at(folder: Path) -> Path:
    folder.mkdir()
    return folder


def _set(tmp_path: Path) -> tuple[ChangeSet, dict[str, bytes]]:
    """A set that modifies a.txt, b.txt and sub/c.txt, deletes gone.txt and adds new.txt and sub/new.txt."""
    with workspace(_at(tmp_path / "run"), FILES) as ws, copied(ws) as (view, originals, copy):
        for name in ("a.txt", "b.txt", "sub/c.txt"):
            (copy / name).write_bytes(b"formatted " + FILES[name])
        (copy / "gone.txt").unlink()
        (copy / "new.txt").write_bytes(b"new\n")
        (copy / "sub" / "new.txt").write_bytes(b"sub new\n")
        changes = changes_of(view, originals, ws)
    return changes, FILES


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_save_between_the_check_and_its_swap_is_found_and_the_whole_set_put_back(tmp_path: Path) -> None:
    """The review's window: the checks first, then seconds of writes that overwrote a save made meanwhile."""
    changes, files = _set(tmp_path)
    for saved in ("b.txt", "gone.txt", "new.txt"):
        with workspace(_at(tmp_path / saved.replace(".", "_")), files) as ws:
            placing = _Placing(ws.fd, lambda: "t")
            try:
                assert placing.stage(changes.changes, frozenset({"gone.txt"})) == ()
                (ws.path / saved).write_bytes(b"the person's save\n")  # after the check, before its own swap
                assert placing.place() == saved
                placing.undo()
            finally:
                placing.close()
            expected = files | {saved: b"the person's save\n"}
            assert _tree(ws.path) == expected, "every file placed before it swapped back, no temporary left"


def test_an_editor_writing_into_the_file_it_holds_open_after_the_swap_is_found(tmp_path: Path) -> None:
    changes, files = _set(tmp_path)
    with workspace(_at(tmp_path / "applied"), files) as ws:
        held = os.open(ws.path / "a.txt", os.O_WRONLY)  # opened before the swap, written after its check
        placing = _Placing(ws.fd, lambda: "t")
        try:
            placing.stage(changes.changes, frozenset({"gone.txt"}))
            assert placing.place() is None
            os.write(held, b"typed")
            assert placing.still_unchanged() == "a.txt"
            placing.undo()
        finally:
            placing.close()
            os.close(held)
        assert _tree(ws.path) == files | {"a.txt": b"typed"}


def test_apply_changes_swaps_every_file_in_and_leaves_no_temporary(tmp_path: Path) -> None:
    changes, files = _set(tmp_path)
    with workspace(_at(tmp_path / "applied"), files) as ws:
        result = apply_changes(ws.fd, changes, new_token=lambda: "t")
        assert result.applied, result
        assert sorted(result.written) == sorted(c.path for c in changes.changes)
        assert _tree(ws.path) == {
            "a.txt": b"formatted a\n",
            "b.txt": b"formatted b\n",
            "new.txt": b"new\n",
            "sub/c.txt": b"formatted c\n",
            "sub/new.txt": b"sub new\n",
        }
    assert {c.action for c in changes.changes} == set(Action)


@pytest.mark.parametrize("kernel", [True, False], ids=["renameat2", "by hard link (no RENAME_EXCHANGE)"])
def test_the_renames_swap_and_never_replace(tmp_path: Path, kernel: bool) -> None:
    swap, move = (exchange, rename_new) if kernel else (exchange_by_link, rename_new_by_link)
    (tmp_path / "x").write_bytes(b"x")
    (tmp_path / "y").write_bytes(b"y")
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        swap(folder, "x", "y")
        assert ((tmp_path / "x").read_bytes(), (tmp_path / "y").read_bytes()) == (b"y", b"x")
        try:
            move(folder, "x", "y")
            raise AssertionError("replaced")
        except FileExistsError:
            pass
        move(folder, "x", "z")
        assert sorted(os.listdir(tmp_path)) == ["y", "z"]
    finally:
        os.close(folder)


def test_an_empty_set_applies_without_a_syncfs_and_a_real_one_is_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writing upstream server is synced after every call, and most calls change nothing: two syncfs of
    the workspace's filesystem for nothing cost 4-8 ms each on a busy disk (decision 87). The real syncfs
    still runs, counted, for a set with changes."""
    import sandbox.apply

    synced: list[int] = []
    real = sandbox.apply.sync_filesystem_of

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(sandbox.apply, "sync_filesystem_of", counted)
    changes, files = _set(tmp_path)
    with workspace(_at(tmp_path / "empty"), files) as ws:
        nothing = apply_changes(ws.fd, ChangeSet((), ()))
        assert (nothing.applied, nothing.reason, nothing.written) == (True, None, ())
        assert synced == [], "nothing placed: nothing to make durable"
        assert _tree(ws.path) == files
    with workspace(_at(tmp_path / "some"), files) as ws:
        applied = apply_changes(ws.fd, changes)
        assert applied.applied and len(synced) == 2, (applied, synced)
        assert _tree(ws.path)["new.txt"] == b"new\n"
