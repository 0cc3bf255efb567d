"""What a rootless run still reaches, each a strict xfail naming its fix: the test turns red once the gap is closed.

Kept apart from test_contained.py so that closing a gap (or dropping this file) touches nothing else.
"""

from __future__ import annotations

import pytest

from tests.adversarial.conftest import Arena
from tests.rootless.test_contained import blocked

WATCHER = """
import ctypes, os
from _kit import attempt, report

libc = ctypes.CDLL(None, use_errno=True)

def watch(path):
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, path.encode(), 0xFFF) < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "watching"

def test_watch_the_state_folder():
    report(
        watch_home=attempt(lambda: watch(PARAMS["home"])),
        watch_artifacts=attempt(lambda: watch(PARAMS["artifacts"])),
        stat_key=attempt(lambda: os.stat(PARAMS["key"]).st_size),
    )
"""


@pytest.mark.xfail(
    strict=True,
    reason="known gap, rootless native only: Landlock does not see inotify nor stat, and the state folder is the"
    " run's uid's, so a run learns the names (run ids) made in it and when the database changes (never contents)."
    " Root runs are stopped by DAC (a 0700 root folder), bubblewrap's by a tree without it. Fix: mount an empty"
    " read-only tmpfs over the state folder in the run's own mount namespace (needs the folder in Limits)",
)
def test_the_state_folder_cannot_be_watched_nor_its_files_measured(rootless_arena: Arena) -> None:
    arena, home = rootless_arena, rootless_arena.gateway.home
    params = {"home": str(home), "artifacts": str(home / "artifacts"), "key": str(home / "signing.key")}
    arena.write("adv/test_watch_state.py", WATCHER, **params)
    found = arena.run("adv/test_watch_state.py").report()
    assert blocked(found) == {}, found
