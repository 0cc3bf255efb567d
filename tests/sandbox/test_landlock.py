"""Landlock layer: real children confined through preexec_fn, as root (as CI runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sandbox.backends.landlock import (
    HandledAccess,
    LandlockRules,
    PreparedLandlock,
    abi_version,
    handled_access,
    prepare_landlock,
    runtime_read_only_paths,
)
from sandbox.errors import SandboxStartError

PROBE = """
import os, signal, socket, sys
try:
{action}
except OSError as exc:
    print(type(exc).__name__, exc.errno)
else:
    print("ok")
"""


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A read-only dir with a file, a read-write dir, and an ungranted dir with a 0644 file."""
    ro, rw, outside = tmp_path / "ro", tmp_path / "rw", tmp_path / "outside"
    for folder in (ro, rw, outside):
        folder.mkdir()
    (ro / "data.txt").write_text("read-only data")
    (outside / "secret.txt").write_text("secret")
    (outside / "secret.txt").chmod(0o644)
    return ro, rw, outside


def rules(ro: Path, rw: Path, *, allow_tcp: bool = False, extra_ro: tuple[Path, ...] = ()) -> LandlockRules:
    return LandlockRules(read_only=(*runtime_read_only_paths(), ro, *extra_ro), read_write=(rw,), allow_tcp=allow_tcp)


def spawn(prepared: PreparedLandlock, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=prepared.apply,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def outcome(landlock_rules: LandlockRules, action: str, cwd: Path, abi: int | None = None) -> str:
    """Run `action` confined; 'ok', or the OSError class and errno it raised."""
    indented = "\n".join("    " + line for line in action.splitlines())
    with prepare_landlock(landlock_rules, abi) as prepared:
        result = spawn(prepared, PROBE.format(action=indented), cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_abi_version_is_seven_on_this_kernel() -> None:
    # Dev machines and CI run Linux 6.18; a different answer means the facts in the brief changed.
    assert abi_version() == 7


@pytest.mark.parametrize(
    ("abi", "allow_tcp", "expected"),
    [
        (0, False, HandledAccess(fs=0, net=0, scoped=0)),
        (1, False, HandledAccess(fs=0x1FFF, net=0, scoped=0)),
        (2, False, HandledAccess(fs=0x3FFF, net=0, scoped=0)),
        (3, False, HandledAccess(fs=0x7FFF, net=0, scoped=0)),
        (4, False, HandledAccess(fs=0x7FFF, net=0b11, scoped=0)),
        (5, False, HandledAccess(fs=0xFFFF, net=0b11, scoped=0)),
        (6, False, HandledAccess(fs=0xFFFF, net=0b11, scoped=0b11)),
        (7, False, HandledAccess(fs=0xFFFF, net=0b11, scoped=0b11)),
        (7, True, HandledAccess(fs=0xFFFF, net=0, scoped=0b11)),
        (4, True, HandledAccess(fs=0x7FFF, net=0, scoped=0)),
    ],
)
def test_every_right_of_the_abi_is_handled(abi: int, allow_tcp: bool, expected: HandledAccess) -> None:
    assert handled_access(abi, allow_tcp=allow_tcp) == expected


@pytest.mark.parametrize(("abi", "size"), [(1, 8), (3, 8), (4, 16), (5, 16), (6, 24), (7, 24)])
def test_ruleset_attr_size_follows_the_abi(abi: int, size: int) -> None:
    assert handled_access(abi, allow_tcp=abi == 6).attr_size == size


def test_runtime_paths_cover_the_interpreter() -> None:
    paths = runtime_read_only_paths()
    assert {Path(sys.prefix), Path(sys.base_prefix), Path("/usr")} <= set(paths)
    assert len(paths) == len(set(paths))


def test_runtime_paths_leave_etc_shadow_unreadable(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    assert Path("/etc") not in runtime_read_only_paths()
    assert outcome(rules(ro, rw), "open('/etc/shadow').read()", rw) == "PermissionError 13"
    assert outcome(rules(ro, rw), "open('/etc/passwd').read()", rw) == "PermissionError 13"


def test_reads_a_read_only_file_but_cannot_write_it(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    landlock_rules = rules(ro, rw)
    assert outcome(landlock_rules, f"assert open({str(ro / 'data.txt')!r}).read() == 'read-only data'", rw) == "ok"
    assert outcome(landlock_rules, f"open({str(ro / 'data.txt')!r}, 'a').write('x')", rw) == "PermissionError 13"
    assert outcome(landlock_rules, f"open({str(ro / 'new.txt')!r}, 'x')", rw) == "PermissionError 13"
    assert (ro / "data.txt").read_text() == "read-only data"
    assert not (ro / "new.txt").exists()


def test_cannot_read_a_world_readable_file_outside_the_rules(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, outside = dirs
    assert outcome(rules(ro, rw), f"open({str(outside / 'secret.txt')!r}).read()", rw) == "PermissionError 13"
    assert outcome(rules(ro, rw), f"os.listdir({str(outside)!r})", rw) == "PermissionError 13"


def test_writes_renames_and_removes_in_the_read_write_dir(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    action = (
        "os.mkdir('sub')\n"
        "open('sub/a.txt', 'w').write('hello')\n"
        "os.rename('sub/a.txt', 'b.txt')\n"
        "os.truncate('b.txt', 2)\n"
        "os.rmdir('sub')"
    )
    assert outcome(rules(ro, rw), action, rw) == "ok"
    assert (rw / "b.txt").read_text() == "he"


def test_cannot_create_a_file_in_tmp(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    target = Path("/tmp") / f"landlock-probe-{uuid.uuid4().hex}"
    assert outcome(rules(ro, rw), f"open({str(target)!r}, 'x')", rw) == "PermissionError 13"
    assert not target.exists()


@pytest.mark.parametrize(("abi", "expected"), [(7, "PermissionError 13"), (2, "ok")])
def test_truncate_of_a_read_only_file_needs_abi_3(dirs: tuple[Path, Path, Path], abi: int, expected: str) -> None:
    # ABI 2 does not know TRUNCATE: the contrast shows the denial comes from handling that right.
    ro, rw, _ = dirs
    assert outcome(rules(ro, rw), f"os.truncate({str(ro / 'data.txt')!r}, 0)", rw, abi=abi) == expected
    assert (ro / "data.txt").read_text() == ("read-only data" if expected != "ok" else "")


def test_a_single_file_grant_opens_that_file_only(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, outside = dirs
    (outside / "granted.txt").write_text("granted")
    landlock_rules = rules(ro, rw, extra_ro=(outside / "granted.txt",))
    assert outcome(landlock_rules, f"assert open({str(outside / 'granted.txt')!r}).read() == 'granted'", rw) == "ok"
    assert outcome(landlock_rules, f"open({str(outside / 'secret.txt')!r})", rw) == "PermissionError 13"


@pytest.mark.parametrize(("allow_tcp", "expected"), [(False, "PermissionError 13"), (True, "ok")])
def test_tcp_connect_follows_allow_tcp(dirs: tuple[Path, Path, Path], allow_tcp: bool, expected: str) -> None:
    ro, rw, _ = dirs
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        action = f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
        assert outcome(rules(ro, rw, allow_tcp=allow_tcp), action, rw) == expected


@pytest.mark.skipif(abi_version() < 6, reason="signal scoping needs Landlock ABI 6")
def test_cannot_signal_a_process_outside_the_domain(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        try:
            assert outcome(rules(ro, rw), f"os.kill({sleeper.pid}, signal.SIGKILL)", rw) == "PermissionError 1"
            assert sleeper.poll() is None
        finally:
            sleeper.kill()


@pytest.mark.skipif(abi_version() < 6, reason="abstract unix socket scoping needs Landlock ABI 6")
def test_cannot_reach_an_abstract_unix_socket_outside_the_domain(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    name = f"\0landlock-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(name)
        listener.listen()
        action = f"socket.socket(socket.AF_UNIX).connect({name!r})"
        assert outcome(rules(ro, rw), action, rw) == "PermissionError 1"


def test_the_child_runs_with_no_new_privs(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    action = "import ctypes\nassert ctypes.CDLL(None).prctl(39, 0, 0, 0, 0) == 1"  # PR_GET_NO_NEW_PRIVS
    assert outcome(rules(ro, rw), action, rw) == "ok"


def test_a_failing_syscall_in_the_child_aborts_the_spawn(dirs: tuple[Path, Path, Path]) -> None:
    ro, rw, _ = dirs
    marker = rw / "ran"
    fd = os.open(ro / "data.txt", os.O_PATH | os.O_CLOEXEC)
    read_dir = 1 << 3  # a directory-only right on a file: landlock_add_rule fails with EINVAL
    prepared = PreparedLandlock(handled_access(abi_version(), allow_tcp=False), [(fd, read_dir)])
    with prepared, pytest.raises(subprocess.SubprocessError):
        spawn(prepared, f"open({str(marker)!r}, 'w')", rw)
    assert not marker.exists()


def test_prepare_fails_closed_on_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(SandboxStartError) as caught:
        prepare_landlock(LandlockRules(read_only=(tmp_path / "missing",), read_write=(tmp_path,)))
    assert caught.value.reason == "landlock_path_unopenable"


def test_prepare_refuses_without_landlock(tmp_path: Path) -> None:
    with pytest.raises(SandboxStartError) as caught:
        prepare_landlock(LandlockRules(read_only=(), read_write=(tmp_path,)), abi=0)
    assert caught.value.reason == "landlock_unavailable"


def test_close_releases_the_path_fds(tmp_path: Path) -> None:
    before = set(os.listdir("/proc/self/fd"))
    with prepare_landlock(LandlockRules(read_only=runtime_read_only_paths(), read_write=(tmp_path,))):
        assert len(set(os.listdir("/proc/self/fd")) - before) >= 2
    assert set(os.listdir("/proc/self/fd")) <= before
