"""Hostile suites against a user's own gateway (decision 57): the run has the user's kernel uid.

What an ordinary user's gateway must keep from its runs, though DAC lets the user's uid at all
of it: the state folder (signing.key, the SQLite database, the policy, the logs), the gateway's
`/proc/<pid>`, signals to it and to the user's other processes, another run of the same user,
the network (TCP, UDP, the user's own unix sockets, abstract ones), the disk (the scratch is
bounded, the workspace the user owns is read-only), the process count (counted per run, not per
user), daemons, and each process's memory. The memory total is not kept rootless on this host
(test_serve_as_user.py): no test here asks for it.

Every test judges from outside: the files' bytes, modes and times, the listeners, the pids.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.adversarial.conftest import Arena, Listener, listening
from tests.adversarial.test_escape import ABSTRACT, NETWORK, PRIVILEGE, SIGNALS, UNIX, WRITER
from tests.adversarial.test_exhaustion import DAEMON, DISK_FILL_MANY_FILES, FORK_BOMB, INODE_FILL, MEMORY_HOG
from tests.adversarial.test_secrets import ENVIRON, HARDLINK
from tests.harness import as_uid_argv, hand_over
from tests.rootless.conftest import USER_UID

READER = """
import os
from _kit import attempt, report

def read(path):
    if os.path.isdir(path):
        return sorted(os.listdir(path))
    with open(path, "rb") as handle:
        return handle.read(1 << 16)

def test_read():
    report(**{path: attempt(lambda path=path: read(path)) for path in PARAMS["paths"]})
"""


def gone(arena: Arena, marker: str, within_s: float = 2) -> list[int]:
    """The run's processes (by a hostile file's path in their command line) still alive after `within_s`:
    the kernel takes a moment to end a PID namespace's last processes once its pid 1 is gone."""
    deadline = time.monotonic() + within_s
    while arena.leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return arena.leftovers(marker)


def blocked(found: dict[str, Any]) -> dict[str, Any]:
    """The findings that are not `blocked:...`: what the hostile code managed."""
    return {what: outcome for what, outcome in found.items() if not str(outcome).startswith("blocked:")}


def state_files(arena: Arena) -> list[Path]:
    home = arena.gateway.home
    return [home / "signing.key", home / "gateway.db", home / "gateway.db-wal", arena.gateway.policy_path]


def test_the_state_folder_the_user_owns_is_unreadable(rootless_arena: Arena) -> None:
    arena, home = rootless_arena, rootless_arena.gateway.home
    assert (home / "signing.key").stat().st_uid == USER_UID, "the key must be the run's uid's: DAC would let it"
    logs = [str(p) for p in arena.gateway.root.glob("serve-stderr-*.log")]
    paths = [*map(str, state_files(arena)), str(home), str(home / "artifacts"), *logs]
    serve = arena.serve_pid
    paths += [f"/proc/{serve}/root{home}/signing.key", f"/proc/{serve}/cwd", f"/proc/self/root{home}/signing.key"]
    arena.write("adv/test_read_state.py", READER, paths=paths)
    run = arena.run("adv/test_read_state.py")
    found = run.report()
    assert set(found) == set(paths)
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    assert blocked(found) == {}


def test_links_to_the_state_folder_read_nothing(rootless_arena: Arena) -> None:
    arena, home = rootless_arena, rootless_arena.gateway.home
    folder = arena.workspace / "adv" / "links"
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (("key", home / "signing.key"), ("state", home), ("policy", arena.gateway.policy_path)):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(target)
    hand_over(USER_UID, folder)
    paths = [str(folder / "key"), str(folder / "state" / "gateway.db"), str(folder / "policy")]
    arena.write("adv/test_read_links.py", READER, paths=paths)
    try:
        run = arena.run("adv/test_read_links.py")
    finally:
        for link in folder.iterdir():  # a link into the state folder would break later runs' collection
            link.unlink()
    found = run.report()
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    assert blocked(found) == {}
    arena.write("adv/test_hardlink.py", HARDLINK, sources=[str(p) for p in state_files(arena)])
    found = arena.run("adv/test_hardlink.py").report()
    assert blocked(found) == {}, "a file of the state folder was linked into the scratch"


TAMPER = """
import os
from _kit import attempt, report

def test_tamper():
    found = {}
    for path in PARAMS["files"]:
        found["append " + path] = attempt(lambda: open(path, "ab").write(b"tampered"))
        found["truncate " + path] = attempt(lambda: os.truncate(path, 0))
        found["chmod " + path] = attempt(lambda: os.chmod(path, 0o666))
        found["utime " + path] = attempt(lambda: os.utime(path, (0, 0)))
        found["xattr " + path] = attempt(lambda: os.setxattr(path, "user.mcp", b"tampered"))
        found["rename " + path] = attempt(lambda: os.rename(path, path + ".moved"))
        found["unlink " + path] = attempt(lambda: os.unlink(path))
    for folder in PARAMS["folders"]:
        found["chmod " + folder] = attempt(lambda: os.chmod(folder, 0o777))
        found["create in " + folder] = attempt(lambda: open(os.path.join(folder, "dropped"), "xb").write(b"x"))
        found["mkdir in " + folder] = attempt(lambda: os.mkdir(os.path.join(folder, "made")))
        found["symlink in " + folder] = attempt(lambda: os.symlink("/", os.path.join(folder, "link")))
    for path in PARAMS["readable"]:  # granted for reading: the descriptor is the run's, the file the user's
        with open(path, "rb") as handle:
            found["fchmod " + path] = attempt(lambda: os.chmod(handle.fileno(), 0o666))
            found["futime " + path] = attempt(lambda: os.utime(handle.fileno(), (0, 0)))
            found["fsetxattr " + path] = attempt(lambda: os.setxattr(handle.fileno(), "user.mcp", b"tampered"))
    for pid in PARAMS["pids"]:  # another mount namespace of the same uid, the host's, by its /proc entry
        for path in PARAMS["files"][:2]:
            found["chmod via /proc/%d/root%s" % (pid, path)] = attempt(lambda: os.chmod("/proc/%d/root%s" % (pid, path), 0o666))
    report(**found)
"""


def snapshot(paths: list[Path], live: set[Path]) -> dict[Path, tuple[Any, ...]]:
    """What a tampering run could change: mode, owner, extended attributes, and (but for the `live` files
    the gateway itself writes during a call: the database's WAL, the artifacts folder) times and bytes or names."""
    out: dict[Path, tuple[Any, ...]] = {}
    for path in paths:
        info = path.stat()
        out[path] = (info.st_mode, info.st_uid, sorted(os.listxattr(path)))
        if path not in live:
            content = sorted(os.listdir(path)) if path.is_dir() else path.read_bytes()
            out[path] += (info.st_mtime_ns, content)
    return out


def test_the_user_files_a_run_can_name_stay_as_they_are(
    rootless_arena: Arena, users_bystander: subprocess.Popen[bytes]
) -> None:
    # The run's uid owns each of these. Landlock refuses writes, but not chmod, utime or setxattr: before the
    # run's mount tree was read-only (scratch.NamespacedScratch), a run made signing.key and its folder 0666/0777.
    arena = rootless_arena
    arena.write("adv/victim.py", "VALUE = 1\n")
    home, workspace = arena.gateway.home, arena.workspace
    files = [*state_files(arena), workspace / "adv/victim.py", workspace / "pyproject.toml"]
    folders = [home, home / "artifacts", workspace, arena.outside]
    readable = [workspace / "adv/victim.py", workspace / "pyproject.toml"]
    params = {
        "files": [str(p) for p in files],
        "folders": [str(p) for p in folders],
        "readable": [str(p) for p in readable],
        "pids": [arena.serve_pid, users_bystander.pid],
    }
    arena.write("adv/test_tamper.py", TAMPER, **params)
    hand_over(USER_UID, workspace)
    assert all(p.stat().st_uid == USER_UID for p in files + folders)
    live = {home / "gateway.db", home / "gateway.db-wal", home / "artifacts"}
    before = snapshot(files + folders, live)
    run = arena.run("adv/test_tamper.py")
    found = run.report()
    after = snapshot(files + folders, live)
    changed = {str(path): (before[path][:3], after[path][:3]) for path in before if before[path] != after[path]}
    assert changed == {}, changed
    assert blocked(found) == {}, blocked(found)
    assert len(found) == 7 * len(files) + 4 * len(folders) + 3 * len(readable) + 2 * 2


def test_the_gateways_proc_entries_are_closed(rootless_arena: Arena, users_bystander: subprocess.Popen[bytes]) -> None:
    arena = rootless_arena
    serve = arena.serve_pid
    paths = [f"/proc/{serve}/{name}" for name in ("environ", "mem", "cmdline", "maps", "fd", "fd/0", "status")]
    paths += [f"/proc/{users_bystander.pid}/environ", f"/proc/{users_bystander.pid}/cmdline"]  # the user's others
    arena.write("adv/test_read_proc.py", READER, paths=paths)
    run = arena.run("adv/test_read_proc.py")
    found = run.report()
    assert blocked(found) == {}
    arena.write("adv/test_environ.py", ENVIRON, serve_pid=serve, canary_var="MCP_ADVERSARIAL_CANARY")
    run = arena.run("adv/test_environ.py")
    found = run.report()
    run.assert_no_secret(arena.secrets["canary"])
    assert found["canary_in_own"] is False
    for name in ("environ", "mem", "fd/0"):
        assert found[f"/proc/{serve}/{name}"].startswith("blocked:"), found


PTRACE = """
import ctypes, os
from _kit import attempt, report

libc = ctypes.CDLL(None, use_errno=True)

def checked(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result

def vm_read(pid):
    local = ctypes.create_string_buffer(64)
    iov_local = (ctypes.c_void_p * 2)(ctypes.addressof(local), 64)
    iov_remote = (ctypes.c_void_p * 2)(0x400000, 64)
    return checked(libc.process_vm_readv(pid, iov_local, 1, iov_remote, 1, 0))

def test_reach_the_gateway():
    pid = PARAMS["serve"]
    report(
        ptrace_attach=attempt(lambda: checked(libc.ptrace(16, pid, None, None))),
        ptrace_seize=attempt(lambda: checked(libc.ptrace(0x4206, pid, None, None))),
        process_vm_readv=attempt(lambda: vm_read(pid)),
        pidfd_open=attempt(lambda: checked(libc.syscall(434, pid, 0))),
        kill_0=attempt(lambda: os.kill(pid, 0)),
    )
"""


def test_the_gateway_cannot_be_traced_nor_found_by_pid(rootless_arena: Arena) -> None:
    arena = rootless_arena
    arena.write("adv/test_ptrace.py", PTRACE, serve=arena.serve_pid)
    found = arena.run("adv/test_ptrace.py").report()
    assert blocked(found) == {}, found


@pytest.fixture
def users_bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the user's own uid outside any run (their editor, their shell), started and stopped here."""
    process = subprocess.Popen(as_uid_argv(USER_UID, ["sleep", "60"]))
    yield process
    process.kill()
    process.wait(timeout=5)


def test_signals_reach_neither_the_gateway_nor_the_users_other_processes(
    rootless_arena: Arena, users_bystander: subprocess.Popen[bytes]
) -> None:
    arena = rootless_arena
    arena.write("adv/test_signals.py", SIGNALS, serve=arena.serve_pid, bystander=users_bystander.pid)
    run = arena.run("adv/test_signals.py")
    found = run.report()
    assert found.pop("init") == "ok:signalled"  # the run's own pid 1, which ignores it
    assert blocked(found) == {}, found
    assert arena.session.process.poll() is None, "the hostile suite killed the gateway"
    assert users_bystander.poll() is None, "the hostile suite killed a process of the user's outside the run"
    assert run.sandbox_event()["signal"] == signal.SIGKILL, "kill(-1) reached only the run itself"
    assert arena.run("tests").structured["passed"] == 8, "the gateway stopped working after the hostile run"


HOLDER = """
import os, signal, time
from _kit import report

def test_hold_a_secret():
    signalled = []
    for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(number, lambda n, _: signalled.append(n))
    secret = os.path.join(os.environ["TMPDIR"], "secret")
    with open(secret, "wb") as handle:
        handle.write(PARAMS["secret"].encode())
    deadline = time.monotonic() + 20
    while not os.path.exists(PARAMS["done"]) and time.monotonic() < deadline:  # the test says when, in the workspace
        time.sleep(0.05)
    report(secret=open(secret, "rb").read().decode(), names=sorted(os.listdir(os.environ["TMPDIR"])), signalled=signalled)
"""

PROBER = """
import os, signal
from _kit import attempt, report

def test_reach_the_other_run():
    found = {}
    scratch = PARAMS["scratch"]
    for label, folder in (("host path", scratch), *(("via /proc/%d" % pid, "/proc/%d/root%s" % (pid, scratch)) for pid in PARAMS["pids"])):
        found["list " + label] = attempt(lambda: os.listdir(folder))
        found["read " + label] = attempt(lambda: open(os.path.join(folder, "secret"), "rb").read())
        found["write " + label] = attempt(lambda: open(os.path.join(folder, "secret"), "ab").write(b"overwritten"))
        found["create " + label] = attempt(lambda: open(os.path.join(folder, "done"), "xb").write(b"1"))
    for pid in PARAMS["pids"]:
        for number in (signal.SIGTERM, signal.SIGKILL):
            found["signal %d %d" % (pid, number)] = attempt(lambda: os.kill(pid, number))
    report(**found)
"""


def run_processes(arena: Arena, marker: str) -> list[psutil.Process]:
    return [psutil.Process(pid) for pid in arena.leftovers(marker)]


def test_two_runs_of_the_same_user_cannot_reach_each_other(rootless_arena: Arena) -> None:
    arena, secret = rootless_arena, f"run-a-{secrets.token_hex(16)}"
    done = arena.workspace / "adv" / "holder-done"
    done.unlink(missing_ok=True)
    arena.write("adv/test_holder.py", HOLDER, secret=secret, done=str(done))
    holder = arena.session.send_call("run_pytest", {"test_path": "adv/test_holder.py", "timeout_s": 30}, arena.token)
    deadline, scratch = time.monotonic() + 30, None
    while scratch is None and time.monotonic() < deadline:
        arena.session.pump()
        for process in run_processes(arena, "adv/test_holder.py"):
            with contextlib.suppress(psutil.Error, KeyError):
                folder = process.environ()["TMPDIR"]
                if Path(f"/proc/{process.pid}/root{folder}/secret").exists():
                    scratch = folder
    assert scratch is not None, "run A never wrote its secret"
    pids = [p.pid for p in run_processes(arena, "adv/test_holder.py")]
    arena.write("adv/test_prober.py", PROBER, scratch=scratch, pids=pids)
    prober = arena.run("adv/test_prober.py")
    found = prober.report()
    prober.assert_no_secret(secret.encode())
    assert blocked(found) == {}, blocked(found)
    assert all(pid in arena.leftovers("adv/test_holder.py") for pid in pids), "run B ended a process of run A"
    done.write_bytes(b"")  # run A may go on, and report what its scratch holds
    holding = arena.session.wait_response(holder, timeout=60)
    seen = holding["result"]["structuredContent"] if "result" in holding else holding
    stdout = (arena.gateway.home / "artifacts" / seen["run_id"] / "stdout.txt").read_text()
    report = re.search(r"REPORT (\{.*\})", stdout)
    assert report, stdout
    assert report.group(1).count(secret) == 1 and '"signalled": []' in report.group(1), report.group(1)
    assert '"names": ["secret"]' in report.group(1), "run B created a file in run A's scratch"


def test_tcp_and_udp_to_a_local_listener_reach_nothing(
    rootless_arena: Arena, tcp_listener: Listener, udp_listener: Listener
) -> None:
    arena = rootless_arena
    arena.write("adv/test_network.py", NETWORK, tcp=tcp_listener.address[1], udp=udp_listener.address[1])
    found = arena.run("adv/test_network.py").report()
    time.sleep(0.2)
    assert tcp_listener.received == [] and udp_listener.received == []
    assert blocked(found) == {}, found


@pytest.fixture
def users_sockets(tmp_path: Path) -> Iterator[tuple[Listener, Listener]]:
    """Pathname sockets of the user's own (like ssh-agent's), in a 0700 folder of theirs: DAC lets the run in."""
    folder = Path(f"/tmp/mcp-rootless-sockets-{secrets.token_hex(6)}")
    folder.mkdir(mode=0o700)
    try:
        with (
            listening(socket.AF_UNIX, socket.SOCK_STREAM, str(folder / "agent.sock")) as stream,
            listening(socket.AF_UNIX, socket.SOCK_DGRAM, str(folder / "dgram.sock")) as datagram,
        ):
            hand_over(USER_UID, folder)
            yield stream, datagram
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


def test_the_users_own_unix_sockets_and_abstract_ones_are_unreachable(
    rootless_arena: Arena, users_sockets: tuple[Listener, Listener]
) -> None:
    arena, (stream, datagram) = rootless_arena, users_sockets
    arena.write("adv/test_unix_socket.py", UNIX, stream=stream.address, datagram=datagram.address)
    found = arena.run("adv/test_unix_socket.py").report()
    name = f"\0mcp-rootless-{secrets.token_hex(8)}"
    with listening(socket.AF_UNIX, socket.SOCK_STREAM, name) as abstract:
        arena.write("adv/test_abstract_socket.py", ABSTRACT, name="@" + name[1:])
        found |= arena.run("adv/test_abstract_socket.py").report()
        time.sleep(0.2)
    assert stream.received == [] and datagram.received == [] and abstract.received == []
    assert blocked(found) == {}, found


def test_privileges_are_the_users_and_no_more(rootless_arena: Arena) -> None:
    arena = rootless_arena
    arena.write("adv/test_privilege.py", PRIVILEGE)
    found = arena.run("adv/test_privilege.py").report()
    assert found.pop("uid") == USER_UID and found.pop("groups") == []
    assert blocked(found) == {}, found


def test_the_workspace_the_user_owns_is_read_only(rootless_arena: Arena) -> None:
    arena = rootless_arena
    arena.write("adv/victim.py", "VALUE = 1\n")
    hand_over(USER_UID, arena.workspace)
    victim, new = arena.workspace / "adv/victim.py", arena.workspace / "adv/new_file.py"
    arena.write("adv/test_write_workspace.py", WRITER, paths=[str(victim), str(new), str(arena.outside / "dropped")])
    hand_over(USER_UID, arena.workspace)
    found = arena.run("adv/test_write_workspace.py").report()
    assert blocked(found) == {}, found
    assert victim.read_text() == "VALUE = 1\n" and not new.exists() and not (arena.outside / "dropped").exists()


def test_the_scratch_fills_up_at_its_limit_in_bytes_and_files(rootless_arena: Arena) -> None:
    arena = rootless_arena
    arena.write("adv/test_disk_many_files.py", DISK_FILL_MANY_FILES)
    found = arena.run("adv/test_disk_many_files.py").report()
    assert found["error"] == errno.ENOSPC and found["written_mib"] <= 256, found  # scratch_limit_mb: 256
    arena.write("adv/test_inode_fill.py", INODE_FILL)
    found = arena.run("adv/test_inode_fill.py").report()
    assert found["error"] == errno.ENOSPC and found["files"] < 8192, found


@pytest.fixture
def users_other_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """40 processes of the user's uid outside the run, stopped at the end (only these)."""
    started = [subprocess.Popen(as_uid_argv(USER_UID, ["sleep", "60"])) for _ in range(40)]
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait(timeout=5)


def test_a_fork_bomb_stops_at_max_processes_counted_for_the_run_alone(
    rootless_arena: Arena, users_other_processes: list[subprocess.Popen[bytes]]
) -> None:
    arena = rootless_arena
    arena.write("adv/test_fork_bomb.py", FORK_BOMB)
    run = arena.run("adv/test_fork_bomb.py")
    found = run.report()
    # max_processes 64, the two supervisors included; were the user's 40 others counted, it would stop near 20.
    assert 40 <= found["forked"] <= 64, found["forked"]
    assert found["refused"] >= 400
    assert run.sandbox_event()["duration_ms"] < 5000, "the run waited for the sleeping children"
    assert gone(arena, "adv/test_fork_bomb.py") == [], "forked children outlived the run"
    assert all(p.poll() is None for p in users_other_processes)


def test_a_setsid_daemon_is_gone_when_the_call_returns(rootless_arena: Arena) -> None:
    arena = rootless_arena
    marker = arena.outside / "daemon-alive"
    arena.write("adv/test_daemon.py", DAEMON, marker=str(marker))
    run = arena.run("adv/test_daemon.py")
    found = run.report()
    assert found["capture_fd"] is not None
    assert gone(arena, "adv/test_daemon.py") == [], "the daemon outlived the call"
    ticks = [float(t) for t in re.findall(r"DAEMON_TICK (\d+\.\d+)", run.stdout)]
    assert ticks, "the daemon never ran"
    assert max(ticks) <= run.ended_at, "the daemon was still writing after the call returned"
    assert not marker.exists()


def test_each_process_stays_under_the_memory_limit(rootless_arena: Arena) -> None:
    arena = rootless_arena
    arena.write("adv/test_memory_hog.py", MEMORY_HOG)
    run = arena.run("adv/test_memory_hog.py")
    assert run.report()["allocated_mib"] < 512, "RLIMIT_AS (memory_limit_mb 512) did not hold"
    assert "memory_total" not in run.evidence()["sandbox"]["confinement"]["guarantees"]


INOTIFY_HOG = """
import ctypes, os, time
from _kit import attempt, report

libc = ctypes.CDLL(None, use_errno=True)

def raise_quota():
    with open("/proc/sys/user/max_inotify_instances", "w") as handle:
        handle.write("100000")

def test_take_every_inotify_instance():
    raised = attempt(raise_quota)
    fds, error = [], None
    for _ in range(400):
        fd = libc.inotify_init1(os.O_CLOEXEC)
        if fd < 0:
            error = ctypes.get_errno()
            break
        fds.append(fd)
    deadline = time.monotonic() + 20
    while not os.path.exists(PARAMS["release"]) and time.monotonic() < deadline:  # held while the test looks
        time.sleep(0.05)
    report(instances=len(fds), errno=error, raised=raised)
"""

USERS_OWN_INOTIFY = (
    "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); fd = libc.inotify_init1(0);"
    " print(fd, ctypes.get_errno())"
)


def inotify_fds(pid: int) -> int:
    return sum(1 for fd in os.listdir(f"/proc/{pid}/fd") if "inotify" in os.readlink(f"/proc/{pid}/fd/{fd}"))


def test_a_run_takes_only_its_share_of_the_users_inotify_instances(rootless_arena: Arena) -> None:
    arena, marker = rootless_arena, "adv/test_inotify_hog.py"
    release = arena.workspace / "adv" / "inotify-release"
    release.unlink(missing_ok=True)
    arena.write(marker, INOTIFY_HOG, release=str(release))
    call = arena.session.send_call("run_pytest", {"test_path": marker, "timeout_s": 30}, arena.token)
    deadline, held = time.monotonic() + 30, [-1]
    while time.monotonic() < deadline:
        arena.session.pump()
        with contextlib.suppress(OSError, psutil.Error):
            held.append(max((inotify_fds(pid) for pid in arena.leftovers(marker)), default=0))
        if held[-1] > 0 and held[-1] == held[-2]:
            break
    assert held[-1] > 0, "the run never took an inotify instance"
    users_own = subprocess.run(
        as_uid_argv(USER_UID, [sys.executable, "-c", USERS_OWN_INOTIFY]), capture_output=True, text=True, check=False
    )
    release.write_bytes(b"")
    response = arena.session.wait_response(call, timeout=60)
    fd, error = users_own.stdout.split()
    assert int(fd) >= 0, f"while the run held its instances, the user's own program got errno {error}"
    host_quota = int(Path("/proc/sys/user/max_inotify_instances").read_text())
    stdout = arena.gateway.home / "artifacts" / response["result"]["structuredContent"]["run_id"] / "stdout.txt"
    found = json.loads(re.findall(r"REPORT (\{.*\})", stdout.read_text())[0])
    assert found.pop("raised").startswith("blocked:"), "the run raised its own share"
    assert found == {"instances": host_quota // 8, "errno": errno.EMFILE}, found
