"""The scratch folders of runs whose gateway died, and the start-up sweep that removes them (issue 10, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.leftovers import SCRATCH_PREFIX, scratch_folder, sweep_scratch

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
