"""The state folder is hidden from a rootless native run: it has the gateway's uid, which Landlock cannot keep from stat or inotify.

Before the fix a run watched the state folder and stat'ed its files: it learned the names made
there (run ids) and when the database changed, never the contents. Root runs are stopped by
file permissions (a 0700 root folder), bubblewrap's by a tree without the folder. Now a rootless
native run finds an empty read-only tmpfs over it (sandbox/backends/scratch.py NamespacedTree).
"""

from __future__ import annotations

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
        watch_artifacts=attempt(lambda: watch(PARAMS["artifacts"])),
        stat_key=attempt(lambda: os.stat(PARAMS["key"]).st_size),
        stat_db=attempt(lambda: os.stat(PARAMS["db"]).st_mtime),
        make_in_home=attempt(lambda: open(PARAMS["home"] + "/planted", "w")),
        listing=attempt(lambda: os.listdir(PARAMS["home"])),
        same_device=os.stat(PARAMS["home"]).st_dev == os.stat(os.path.dirname(PARAMS["home"])).st_dev,
    )
"""


def test_the_state_folder_cannot_be_watched_nor_its_files_measured(rootless_arena: Arena) -> None:
    arena, home = rootless_arena, rootless_arena.gateway.home
    params = {"home": str(home), "artifacts": str(home / "artifacts"), "key": str(home / "signing.key")}
    params["db"] = str(home / "gateway.db")
    arena.write("adv/test_watch_state.py", WATCHER, **params)
    found = arena.run("adv/test_watch_state.py").report()
    same_device = found.pop("same_device")
    assert blocked(found) == {}, found  # listing too: Landlock grants no readdir there
    assert same_device is False, "a mount of its own (the empty tmpfs) covers the state folder"
    assert (home / "signing.key").is_file() and not (home / "planted").exists()
