"""open_beneath: a file beneath a pinned folder, no link followed, no check-then-open gap (decision 28).

Both ways of opening are held to the same table: openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
(the kernel's), and the O_NOFOLLOW walk used where openat2 is missing. Then both under a real race.
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.beneath import open_beneath, walk_beneath
from sandbox.pinned import open_without_links
from tests.races import FolderSwapper

Opener = Callable[[int, str, int], int]
FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
SECRET = b"SECRET-CONTENT-91c2"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[int]:
    """An fd on a workspace: `src/a.py`, `src/inner -> a.py`, `src/up -> ..`, `out -> ../outside`, `abs -> /etc`."""
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "a.py").write_text("inside\n")
    (workspace / "src" / "inner").symlink_to("a.py")
    (workspace / "src" / "up").symlink_to("..")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "s").write_bytes(SECRET)
    (workspace / "out").symlink_to("../outside")
    (workspace / "abs").symlink_to("/etc")
    fd = open_without_links(workspace)
    yield fd
    os.close(fd)


@pytest.fixture(params=[open_beneath, walk_beneath], ids=["openat2", "walk"])
def opener(request: pytest.FixtureRequest) -> Opener:
    chosen: Opener = request.param
    return chosen


@pytest.mark.parametrize(
    ("relative", "content"),
    [("src/a.py", "inside\n"), ("./src//a.py", "inside\n"), ("src/../src/a.py", "inside\n"), ("src/..", None)],
)
def test_what_lies_beneath_without_links_opens(root: int, opener: Opener, relative: str, content: str | None) -> None:
    fd = opener(root, relative, FLAGS)
    try:
        if content is None:
            assert os.path.isdir(f"/proc/self/fd/{fd}")  # the folder itself
        else:
            assert os.read(fd, 100).decode() == content
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("relative", "code"),
    [
        ("src/inner", errno.ELOOP),  # a link, even one that stays inside
        ("src/up/src/a.py", errno.ELOOP),
        ("out/s", errno.ELOOP),
        ("abs/passwd", errno.ELOOP),
        ("../outside/s", errno.EXDEV),
        ("src/../../outside/s", errno.EXDEV),
        ("/etc/passwd", errno.EXDEV),
        ("src/missing.py", errno.ENOENT),
        ("src/a.py/x", errno.ENOTDIR),
    ],
)
def test_nothing_else_opens(root: int, opener: Opener, relative: str, code: int) -> None:
    with pytest.raises(OSError, match=r".") as raised:
        os.close(opener(root, relative, FLAGS))
    assert raised.value.errno == code, errno.errorcode[raised.value.errno or 0]


def test_a_final_link_is_refused_even_without_o_nofollow(root: int, opener: Opener) -> None:
    with pytest.raises(OSError, match=r"symlink|symbolic link|Too many levels") as raised:
        opener(root, "src/inner", os.O_RDONLY | os.O_CLOEXEC)
    assert raised.value.errno == errno.ELOOP


def test_neither_way_reads_outside_under_a_real_race(tmp_path: Path, opener: Opener) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "out"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "data").write_bytes(b"harmless")
    outside.mkdir()
    (outside / "data").write_bytes(SECRET)
    root_fd = open_without_links(workspace)
    seen: Counter[str] = Counter()
    try:
        with FolderSwapper(workspace / "sub", outside):
            deadline = time.monotonic() + 30
            # At least 300 opens, and on until both states were met (a loaded host may starve the swapper).
            while sum(seen.values()) < 300 or (min(seen["read"], seen["ELOOP"]) == 0 and time.monotonic() < deadline):
                try:
                    fd = opener(root_fd, "sub/data", FLAGS)
                except OSError as exc:
                    seen[errno.errorcode[exc.errno or 0]] += 1
                    continue
                seen["secret" if os.read(fd, 100) == SECRET else "read"] += 1
                os.close(fd)
    finally:
        os.close(root_fd)
    assert seen["secret"] == 0, seen
    assert seen["read"] > 0 and seen["ELOOP"] > 0, f"the race was not on: {seen}"
