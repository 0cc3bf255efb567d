"""The Edit/Write preview reads only inside the workspace, with no check-then-open gap (decision 28).

A child process keeps swapping a folder inside the workspace for a symlink to a folder outside
that holds a secret, while previews are computed: the secret never appears. The same race run
against the read as it was before (realpath, check, then open the resolved path), kept here as the
control, leaks it.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.previews import current_file, preview
from sandbox.pinned import pin
from tests.races import FolderSwapper, exchange

SECRET = "SECRET-CONTENT-7f3a"
ATTEMPTS = 300


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with `sub/data.txt`, and beside it `out/data.txt` holding the secret."""
    workspace, outside = tmp_path / "ws", tmp_path / "out"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "data.txt").write_text("harmless\n")
    outside.mkdir()
    (outside / "data.txt").write_text(SECRET + "\n")
    return workspace, outside


def old_current_file(value: str, root: Path, between: Callable[[], None] = lambda: None) -> str | None:
    """The control: the preview's read as it was before the fix (realpath, check inside, open the resolved path)."""
    real_root = Path(os.path.realpath(root))
    try:
        real = Path(os.path.realpath(value))
    except OSError:  # a link read as it was being swapped away
        return None
    if not real.is_relative_to(real_root):
        return None
    between()
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 20).decode()
    finally:
        os.close(fd)


def test_the_old_read_leaks_when_the_swap_falls_between_check_and_open(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    spare = workspace / "sub.swap"
    spare.symlink_to(outside, target_is_directory=True)
    target = str(workspace / "sub" / "data.txt")
    leaked = old_current_file(target, workspace, between=lambda: exchange(workspace / "sub", spare))
    assert leaked is not None and SECRET in leaked
    # The new read has no "between": with the link in place when it opens, it refuses.
    current = current_file(target, pin(workspace))
    assert current.text is None and current.note is not None and "symbolic link" in current.note


def test_the_preview_never_reads_outside_under_a_real_race(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    pinned = pin(workspace)
    target = str(workspace / "sub" / "data.txt")
    edit = {"file_path": target, "old_string": "harmless", "new_string": "changed"}
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + 30
    with FolderSwapper(workspace / "sub", outside):
        # At least ATTEMPTS previews, and on until both states were met (a loaded host may starve the swapper).
        while seen["tries"] < ATTEMPTS or (min(seen["read"], seen["refused"]) == 0 and time.monotonic() < deadline):
            seen["tries"] += 1
            current = current_file(target, pinned)
            seen["secret"] += SECRET in (current.text or "")
            seen["read"] += current.text == "harmless\n"
            seen["refused"] += current.note is not None and "symbolic link" in current.note
            shown = preview("Edit", edit, pinned)
            seen["secret shown"] += SECRET in (shown or "")
    assert seen["secret"] == 0 and seen["secret shown"] == 0, seen
    assert seen["read"] > 0 and seen["refused"] > 0, f"the race was not on: {seen}"


def test_the_old_read_leaks_under_the_same_race(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    target = str(workspace / "sub" / "data.txt")
    leaks = attempts = 0
    deadline = time.monotonic() + 30
    with FolderSwapper(workspace / "sub", outside):
        while attempts < ATTEMPTS or (leaks == 0 and time.monotonic() < deadline):
            attempts += 1
            leaks += SECRET in (old_current_file(target, workspace) or "")
    assert leaks > 0, f"the control never leaked in {attempts} attempts"


@pytest.mark.parametrize(
    ("value", "note"),
    [
        ("{ws}/sub/data.txt", None),
        ("sub/data.txt", None),
        ("sub/../sub/data.txt", None),
        ("{out}/data.txt", "outside the workspace"),
        ("../out/data.txt", "outside the workspace"),
        ("{ws}/sub/../../out/data.txt", "outside the workspace"),
        ("{ws}/link/data.txt", "symbolic link"),
        ("{ws}/sub/inner.txt", "symbolic link"),  # a link that stays inside is not followed either
        ("~/data.txt", "home"),
        ("{ws}/sub/new.txt", "new file"),
    ],
)
def test_what_the_preview_reads(layout: tuple[Path, Path], value: str, note: str | None) -> None:
    workspace, outside = layout
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    (workspace / "sub" / "inner.txt").symlink_to("data.txt")
    for root in (pin(workspace), workspace):
        current = current_file(value.format(ws=workspace, out=outside), root)
        assert SECRET not in (current.text or "")
        if note is None:
            assert (current.text, current.label) == ("harmless\n", "sub/data.txt")
        else:
            assert current.note is not None and note in current.note, current
