"""The bubblewrap backend: its command line read back, then real runs through run_sandboxed as root."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from sandbox import Limits, RunResult, probe_host, run_sandboxed
from sandbox.backends.bubblewrap import BWRAP, bubblewrap_argv, command_ran
from sandbox.errors import SandboxStartError
from sandbox.limits import BACKEND_LAYERS
from tests.sandbox.confined_child import DAEMONIZE, PYTHON, requires_root, shared_dir


def test_binds_parents_first_links_stay_links_and_the_filter_comes_by_fd(tmp_path: Path) -> None:
    deep, shallow = tmp_path / "a" / "b", tmp_path / "a"
    deep.mkdir(parents=True)
    (tmp_path / "link").symlink_to("a")
    argv = bubblewrap_argv(read_only=(deep, shallow, deep), scratch=tmp_path / "s", cwd=deep, seccomp_fd=7)
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"]
    assert binds == [str(shallow), str(deep)], "a parent bound after its child would hide it"
    assert argv[0] == str(BWRAP) and argv[-1] == "--"
    assert argv[argv.index("--seccomp") + 1] == "7"
    assert argv[argv.index("--bind") + 1 : argv.index("--bind") + 3] == [str(tmp_path / "s")] * 2
    assert argv.index("--remount-ro") > argv.index("--bind"), "/ goes read-only after every mount is made"
    for flag in ("--unshare-user", "--unshare-pid", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--unshare-net" not in argv, "the network namespace is made before, as root, like the native backend's"
    assert "--seccomp" not in bubblewrap_argv(read_only=(), scratch=tmp_path, cwd=tmp_path, seccomp_fd=None)


def test_a_top_level_symlink_is_recreated_not_bound(tmp_path: Path) -> None:
    lib = Path("/lib")
    if not lib.is_symlink():
        pytest.skip("/lib is not a symlink on this host")
    argv = bubblewrap_argv(read_only=(lib,), scratch=tmp_path, cwd=tmp_path, seccomp_fd=None)
    assert argv[argv.index("--symlink") + 1 : argv.index("--symlink") + 3] == [os.readlink(lib), "/lib"]


PROBE = """
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)

def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, exc.errno)

def write(path):
    with open(path, "w") as handle:
        handle.write("x")

def unshare():
    if libc.unshare(0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")

scratch = os.environ["TMPDIR"]
with open(os.path.join(scratch, "junit.xml"), "w") as handle:
    handle.write("<testsuites/>")
print(json.dumps({
    "uid": os.getuid(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "root": sorted(os.listdir("/")),
    "shadow": attempt(lambda: open("/etc/shadow").read()),
    "write_root": attempt(lambda: write("/x")),
    "write_dev": attempt(lambda: write("/dev/x")),
    "write_workspace": attempt(lambda: write("written.txt")),
    "dev_null": attempt(lambda: write("/dev/null")),
    "inet": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
    "unix": attempt(lambda: socket.socket(socket.AF_UNIX).close()),
    "unshare": attempt(unshare),
    "fill": attempt(lambda: write(os.path.join(scratch, "fill")) or open(os.path.join(scratch, "fill"), "wb").write(b"z" * (16 << 20))),
}))
"""


def run(folder: Path, code: str, **overrides: Any) -> tuple[RunResult, str]:
    scratch = folder / "scratch"
    scratch.mkdir()
    base = Limits(
        timeout_s=20,
        memory_limit_mb=256,
        max_processes=16,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(scratch)},
        scratch_bytes=8 << 20,
        backend="bubblewrap",
    )
    limits = dataclasses.replace(base, **overrides)
    collect = {"junit.xml": folder / "junit.xml"}
    result = anyio.run(
        lambda: run_sandboxed(
            [PYTHON, "-I", "-c", code], folder, limits, folder / "out", folder / "err", scratch=scratch, collect=collect
        )
    )
    return result, (folder / "out").read_text() + (folder / "err").read_text()


needs_bubblewrap = pytest.mark.skipif(not probe_host().mount_tree, reason="bubblewrap does not run here")


@requires_root
@needs_bubblewrap
def test_a_run_sees_only_its_tree_its_processes_and_its_scratch() -> None:
    with shared_dir() as folder:
        result, output = run(folder, PROBE)
        assert result.exit_code == 0, output
        found = json.loads(output)
        assert (folder / "junit.xml").read_text() == "<testsuites/>", "collected through the tmpfs's fd"
    assert result.layers == tuple(name for name in result.layers if name in BACKEND_LAYERS["bubblewrap"])
    assert set(result.layers) == set(BACKEND_LAYERS["bubblewrap"]) - {"user_namespace"}  # as root: a pool uid
    assert found["uid"] >= 1000
    assert found["pids"] == [1, 2], "its own PID namespace: bubblewrap's reaper and the command"
    assert "etc" not in found["root"] and "root" not in found["root"]
    assert found["shadow"] == "ENOENT", "not refused: not there at all"
    assert found["write_root"] == "EROFS" and found["write_dev"] == "EROFS"
    assert found["write_workspace"] == "EROFS"
    assert found["dev_null"] == "ok"
    assert found["inet"] == "EPERM" and found["unix"] == "EPERM", "the seccomp filter is in force"
    assert found["unshare"] == "EPERM"
    assert found["fill"] == "ENOSPC", "the scratch is the size-limited tmpfs"


@requires_root
@needs_bubblewrap
def test_a_daemon_inside_dies_with_the_run() -> None:
    # The pid it prints is its namespace's; from outside it is found by the marker in its command line.
    marker = f"# daemon-{secrets.token_hex(8)}"
    with shared_dir() as folder:
        result, output = run(folder, DAEMONIZE + marker)
    assert result.exit_code == 0, output
    assert int(output) > 2, "the daemon was made (its pid in the run's namespace)"
    # Who kills it depends on timing: the kernel, as the namespace's pid 1 exits, or the cgroup kill.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _with_marker(marker):
        time.sleep(0.05)
    assert _with_marker(marker) == []


def _with_marker(marker: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(
            marker in part for part in process.info["cmdline"] or []
        ):
            found.append(process.pid)
    return found


@requires_root
@needs_bubblewrap
def test_a_tree_bubblewrap_cannot_build_means_nothing_ran_not_a_failed_suite() -> None:
    # Native Landlock refuses a missing grant before the spawn; bubblewrap finds out itself and
    # exits 1, like a failing suite would. The runner must tell the two apart.
    marker = Path(f"/tmp/mcp-bwrap-ran-{secrets.token_hex(8)}")
    with shared_dir() as folder, pytest.raises(SandboxStartError) as caught:
        run(folder, f"open({str(marker)!r}, 'w')", allowed_paths=(folder / "gone",))
    assert caught.value.reason == "bubblewrap_failed"
    assert not marker.exists()


@pytest.mark.parametrize(
    ("status", "ran"),
    [
        (b'{ "child-pid": 7, "mnt-namespace": 1, "pid-namespace": 2 }\n{ "exit-code": 0 }\n', True),
        (b'{ "child-pid": 7, "mnt-namespace": 1, "pid-namespace": 2 }\n{ "exit-code": 137 }\n', True),
        (b'{ "child-pid": 7, "mnt-namespace": 1, "pid-namespace": 2 }\n', False),  # a bind that failed (measured)
        (b"", False),
    ],
    ids=["exit-0", "killed", "setup-failed", "nothing"],
)
def test_the_status_tells_a_run_from_a_tree_that_was_never_built(status: bytes, ran: bool) -> None:
    assert command_ran(status) is ran
