"""The scratch folders of runs whose gateway died, and the start-up sweep that removes them (decision 38)."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox.backends.identity import holding
from sandbox.errors import SandboxStartError
from sandbox.leftovers import (
    ROOT_MODE,
    ROOT_PREFIX,
    SCRATCH_PREFIX,
    UNSAFE_ROOT,
    kill_unheld_uids,
    remove_if_abandoned,
    scratch_folder,
    scratch_root,
    sweep_scratch,
)

HOLD = """
import sys, time
from pathlib import Path
from sandbox.leftovers import scratch_folder
with scratch_folder("held", Path(sys.argv[1])) as folder:
    print(folder, flush=True)
    time.sleep(60)
"""


def test_a_live_runs_folder_is_kept_and_a_dead_gateways_is_removed(tmp_path: Path) -> None:
    # A gateway in another process holds one folder; a second process (the dead gateway) held one and was killed.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    live = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    dead = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    assert live.stdout is not None and dead.stdout is not None
    with live.stdout, dead.stdout:
        live_folder = Path(live.stdout.readline().decode().strip())
        dead_folder = Path(dead.stdout.readline().decode().strip())
        (dead_folder / "junk").write_bytes(b"x" * 1000)
        dead.kill()
        dead.wait(timeout=10)
        try:
            removed = sweep_scratch(tmp_path)
            assert removed == [dead_folder]
            assert live_folder.is_dir() and not dead_folder.exists()
        finally:
            live.kill()
            live.wait(timeout=10)


def test_the_sweep_leaves_what_is_not_a_gateways(tmp_path: Path) -> None:
    (tmp_path / "unrelated").mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("keep")
    (tmp_path / f"{SCRATCH_PREFIX}link").symlink_to(target)
    (tmp_path / f"{SCRATCH_PREFIX}file").write_text("a file, not a folder")
    if os.geteuid() == 0:
        someone = tmp_path / f"{SCRATCH_PREFIX}someone"
        someone.mkdir()
        os.chown(someone, 1000, 1000)  # another user's folder, outside the run uid pool
    assert sweep_scratch(tmp_path) == []
    assert (target / "keep").read_text() == "keep" and (tmp_path / "unrelated").is_dir()
    assert os.geteuid() != 0 or (tmp_path / f"{SCRATCH_PREFIX}someone").is_dir()


def test_a_scratch_folder_is_held_from_the_moment_it_has_its_name(tmp_path: Path) -> None:
    with scratch_folder("t", tmp_path) as folder:
        assert folder.name.startswith(f"{SCRATCH_PREFIX}t-") and folder.is_dir()
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
        assert sweep_scratch(tmp_path) == []
        (folder / "f").write_text("x")
    assert list(tmp_path.iterdir()) == [], "the folder and its placeholder are gone after the run"


@pytest.mark.skipif(os.geteuid() != 0, reason="the folders of run uids are root's to remove")
def test_a_folder_owned_by_a_run_uid_is_swept(tmp_path: Path) -> None:
    folder = tmp_path / f"{SCRATCH_PREFIX}abandoned"
    folder.mkdir()
    os.chown(folder, 61000, 61000)
    assert sweep_scratch(tmp_path) == [folder]


# Entries that vanish, change or belong to someone else never stop the sweep.


def test_the_sweep_survives_folders_vanishing_while_it_looks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    churner = subprocess.Popen(
        [sys.executable, "-m", "tests.scratch_churn", str(tmp_path), "60"], stdout=subprocess.PIPE, env=env
    )
    seen = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            # Old code: FileNotFoundError, from the stat of an entry gone since the listing.
            seen += len(sweep_scratch(tmp_path))
    finally:
        churner.kill()
        churner.wait(timeout=30)
        if churner.stdout is not None:
            churner.stdout.close()
    assert seen > 0, "the churn never overlapped a sweep"


def test_an_entry_gone_replaced_or_not_a_gateways_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("keep")
    (tmp_path / f"{SCRATCH_PREFIX}link").symlink_to(target)
    (tmp_path / f"{SCRATCH_PREFIX}file").write_text("a file")
    os.mkfifo(tmp_path / f"{SCRATCH_PREFIX}fifo")
    parent_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ("gone", "link", "file", "fifo", "elsewhere/keep"):
            assert remove_if_abandoned(parent_fd, f"{SCRATCH_PREFIX}{name}") is False
        if os.geteuid() == 0:
            theirs = tmp_path / f"{SCRATCH_PREFIX}theirs"
            theirs.mkdir()
            os.chown(theirs, 1000, 1000)  # another user's, outside the run uid pool
            assert remove_if_abandoned(parent_fd, theirs.name) is False
            assert theirs.is_dir()
    finally:
        os.close(parent_fd)
    assert (target / "keep").read_text() == "keep", "a link was followed"


def test_a_held_folder_is_kept_and_removed_once_nobody_holds_it(tmp_path: Path) -> None:
    # The sweep removes only a folder it could lock: a live gateway holds its run's.
    parent_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        abandoned = tmp_path / f"{SCRATCH_PREFIX}abandoned"
        abandoned.mkdir()
        held = os.open(abandoned, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)  # a live gateway's
            assert remove_if_abandoned(parent_fd, abandoned.name) is False
        finally:
            os.close(held)
        assert remove_if_abandoned(parent_fd, abandoned.name) is True
        assert not abandoned.exists()
    finally:
        os.close(parent_fd)


def test_a_new_scratch_folder_is_never_swept_while_it_is_made(tmp_path: Path) -> None:
    # Old code: mkdtemp reserved the name with an empty, unheld folder before the held one replaced it.
    stop = threading.Event()
    lost: list[Path] = []

    def make() -> None:
        for _ in range(300):
            with scratch_folder("race", tmp_path) as folder:
                if not folder.is_dir():
                    lost.append(folder)
        stop.set()

    maker = threading.Thread(target=make, daemon=True)
    maker.start()
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        sweep_scratch(tmp_path)
    maker.join(timeout=30)
    assert stop.is_set() and lost == []


def test_the_scratch_root_is_the_users_own_and_0711(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        root = scratch_root(tmp_path)
    finally:
        os.umask(old)
    assert root == tmp_path / f"{ROOT_PREFIX}{os.geteuid()}"
    assert root.stat().st_uid == os.geteuid() and stat.S_IMODE(root.stat().st_mode) == ROOT_MODE
    assert scratch_root(tmp_path) == root  # made once, checked each time
    with scratch_folder("t") as folder:  # by default, in the temp folder's root
        assert folder.parent == scratch_root()


@pytest.mark.parametrize("planted", ["symlink", "file", "others_may_write", "another_users"])
def test_a_scratch_root_someone_else_made_is_refused_with_the_reason(tmp_path: Path, planted: str) -> None:
    root = tmp_path / f"{ROOT_PREFIX}{os.geteuid()}"
    decoy = tmp_path / "decoy"
    decoy.mkdir(mode=0o711)
    if planted == "symlink":
        root.symlink_to(decoy)
    elif planted == "file":
        root.write_text("x")
    elif planted == "others_may_write":
        root.mkdir()
        root.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("making another user's folder needs root")
        root.mkdir()
        os.chown(root, 1000, 1000)
    with pytest.raises(SandboxStartError) as refused:
        scratch_root(tmp_path)
    assert refused.value.reason.startswith(f"{UNSAFE_ROOT}:") and str(root) in refused.value.reason
    with pytest.raises(SandboxStartError), scratch_folder("t", scratch_root(tmp_path)):
        pass
    assert list(decoy.iterdir()) == [], "nothing was made through the planted root"


# The processes a dead gateway's run left, found by their run uid nobody holds.

SWEPT_POOL = range(62300, 62302)  # apart from the default pool: no live gateway's sweep reaches it


def _sleeping_as(uid: int) -> subprocess.Popen[bytes]:
    def drop() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return subprocess.Popen(["sleep", "60"], preexec_fn=drop)  # noqa: PLW1509  (a test's child, no threads to mind)


@pytest.mark.skipif(os.geteuid() != 0, reason="run uids, and their sweep, are root's")
def test_the_processes_of_a_run_uid_nobody_holds_are_killed_and_a_held_ones_are_kept(tmp_path: Path) -> None:
    left, running = SWEPT_POOL
    orphan, live = _sleeping_as(left), _sleeping_as(running)
    try:
        with holding(running, tmp_path):  # a live gateway's run
            killed = kill_unheld_uids(SWEPT_POOL, tmp_path)
            assert killed == {left: [orphan.pid]}, killed
            assert orphan.wait(timeout=10) == -9
            assert live.poll() is None, "a held uid's process was killed"
        assert kill_unheld_uids(SWEPT_POOL, tmp_path) == {running: [live.pid]}, "once nobody holds it"
    finally:
        for child in (orphan, live):
            child.kill()
            child.wait(timeout=10)


def test_without_a_lock_folder_nothing_is_killed(tmp_path: Path) -> None:
    assert kill_unheld_uids(SWEPT_POOL, tmp_path / "missing") == {}
    (tmp_path / "link").symlink_to(tmp_path)
    assert kill_unheld_uids(SWEPT_POOL, tmp_path / "link") == {}
