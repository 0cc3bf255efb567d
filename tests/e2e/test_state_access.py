"""A state folder, database or policy another user owns (or nobody may use) is named, in one line.

Before the fix an ordinary user pointed at root's state folder was told "no policy ... run
init", and `init` then ended in a PermissionError traceback. Now every command says which path
is out of reach, whose it is, and what to do: a state folder of one's own, or run as its owner.
The tests run as root and run the CLI as an ordinary uid (setpriv), since root bypasses file
permissions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO, as_uid_argv, enterable_by_everyone

OTHER_UID = 64125
"""An ordinary uid with no account, not the rootless suites' (64123) nor a pool uid."""
ROOT = "uid 0 (root)"


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder every uid may enter (not under pytest's temp folder, which is root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("runs the CLI as another uid with setpriv: needs root (CI has it)")
    folder = Path(tempfile.mkdtemp(prefix="mcp-state-access-"))
    enterable_by_everyone(folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_root(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "gateway", "--home", str(home), *args], None)


def as_other(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(as_uid_argv(OTHER_UID, [sys.executable, "-m", "gateway", "--home", str(home), *args]), OTHER_UID)


def _run(argv: list[str], uid: int | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")}
    if uid is not None:
        env["HOME"] = "/nonexistent"
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL, timeout=60, check=False
    )


def assert_one_line_naming(result: subprocess.CompletedProcess[str], path: Path, *words: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "", result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in (str(path), *words):
        assert needle in lines[0], (needle, lines[0])
    assert "no policy found" not in lines[0] and "database error" not in lines[0], lines[0]


COMMANDS = [
    ("init",),
    ("serve",),
    ("user", "list"),
    ("user", "add", "bob", "--role", "USER"),
    ("token", "issue", "alice"),
    ("token", "revoke", "x"),
    ("audit", "export"),
    ("audit", "verify"),
    ("consent", "list"),
    ("approvals",),
    ("policy", "check"),
    ("policy", "explain", "--user", "alice", "--tool", "run_pytest"),
    ("policy", "explain", "--role", "USER", "--tool", "run_pytest"),
]


def test_another_users_state_folder_is_named_with_its_owner_by_every_command(base: Path) -> None:
    home = base / "roots-state"
    assert as_root(home, "init").returncode == 0  # 0700, root's
    assert as_root(home, "user", "add", "alice", "--role", "USER").returncode == 0
    for args in COMMANDS:
        result = as_other(home, *args)
        assert_one_line_naming(result, home, f"belongs to {ROOT}", "--home", "MCP_GATEWAY_HOME", f"as {ROOT}")
    doctor = as_other(home, "doctor")
    assert "Traceback" not in doctor.stderr and "no policy at" not in doctor.stderr
    assert f"{home} belongs to {ROOT}" in doctor.stderr and "shipped default" in doctor.stderr


def test_init_in_a_folder_others_may_write_but_do_not_own_says_only_its_owner_can(base: Path) -> None:
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = as_other(shared, "init")
    assert_one_line_naming(result, shared, f"belongs to {ROOT}", "only its owner")
    assert list(shared.iterdir()) == [], "nothing half made"


def test_files_in_ones_own_folder_that_another_user_or_a_mode_keeps_out_are_named(base: Path) -> None:
    home = base / "mine"
    home.mkdir()
    os.chown(home, OTHER_UID, OTHER_UID)
    made = as_other(home, "init")
    assert made.returncode == 0, made.stderr
    database = home / "gateway.db"
    os.chown(database, 0, 0)  # as when root once ran a command on this folder
    for args in (("user", "list"), ("serve",), ("init",)):
        assert_one_line_naming(as_other(home, *args), database, f"belongs to {ROOT}")
    os.chown(database, OTHER_UID, OTHER_UID)
    database.chmod(0o400)
    assert_one_line_naming(as_other(home, "user", "list"), database, "is yours", "0400", "chmod")
    database.chmod(0o600)
    (home / "signing.key").chmod(0o000)
    assert_one_line_naming(as_other(home, "token", "issue", "alice"), home / "signing.key", "is yours", "chmod")
    (home / "signing.key").chmod(0o600)
    assert as_other(home, "user", "list").returncode == 0, "all its own again: served"


def test_a_folder_on_the_way_that_cannot_be_entered_is_named(base: Path) -> None:
    locked = base / "locked"
    locked.mkdir(mode=0o700)  # root's: the uid cannot go through it
    home = locked / "state"
    for args in (("init",), ("user", "list"), ("serve",)):
        assert_one_line_naming(as_other(home, *args), locked, f"belongs to {ROOT}", "entered")
