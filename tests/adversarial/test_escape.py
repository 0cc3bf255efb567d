"""Hostile suites that try to reach outside: writes, the network, sockets, signals and privileges."""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.conftest import Arena, Listener, listening, open_to_everyone

WRITER = """
import os
from _kit import attempt, report

def write(path):
    with open(path, "ab") as handle:
        handle.write(b"hostile write")
    return "written"

def test_write_outside_scratch():
    report(**{path: attempt(lambda path=path: write(path)) for path in PARAMS["paths"]})
"""


def write_attempt(arena: Arena, name: str, paths: list[Path]) -> None:
    before = {path: path.read_bytes() if path.exists() else None for path in paths}
    arena.write(f"adv/test_write_{name}.py", WRITER, paths=[str(p) for p in paths])
    run = arena.run(f"adv/test_write_{name}.py")
    found = run.report()
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found
    after = {path: path.read_bytes() if path.exists() else None for path in paths}
    assert after == before, "a file outside the scratch folder was created or changed"


def test_cannot_write_into_the_workspace(arena: Arena) -> None:
    arena.write("adv/victim.py", "VALUE = 1\n")
    write_attempt(arena, "workspace", [arena.workspace / "adv/victim.py", arena.workspace / "adv/new_file.py"])


def test_cannot_write_into_tmp(arena: Arena) -> None:
    write_attempt(
        arena, "tmp", [Path(f"/tmp/mcp-adv-{secrets.token_hex(8)}"), Path(f"/dev/shm/mcp-adv-{secrets.token_hex(8)}")]
    )


def test_cannot_write_into_the_gateway_venv(arena: Arena) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    write_attempt(
        arena, "venv", [site / f"zz_mcp_adv_{secrets.token_hex(8)}.pth", Path(sys.executable).parent / "pytest"]
    )


def test_cannot_write_into_a_world_writable_folder(arena: Arena) -> None:
    # DAC allows this write (0777): the scratch folder is the only place Landlock lets through.
    write_attempt(arena, "world_writable", [arena.outside / "dropped", arena.gateway.home / "dropped"])


NETWORK = """
import socket
from _kit import attempt, report

def tcp():
    with socket.create_connection(("127.0.0.1", PARAMS["tcp"]), timeout=2) as conn:
        conn.sendall(b"tcp egress")
    return "sent"

def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return sock.sendto(b"udp egress", ("127.0.0.1", PARAMS["udp"]))

def udp6():
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        return sock.sendto(b"udp egress", ("::1", PARAMS["udp"]))

def raw():
    return socket.socket(socket.AF_PACKET, socket.SOCK_RAW)

def dns():
    return socket.getaddrinfo("example.com", 80)

def test_egress():
    report(tcp=attempt(tcp), udp=attempt(udp), udp6=attempt(udp6), raw=attempt(raw), dns=attempt(dns))
"""


def test_tcp_and_udp_egress_reach_nothing(arena: Arena, tcp_listener: Listener, udp_listener: Listener) -> None:
    arena.write("adv/test_network.py", NETWORK, tcp=tcp_listener.address[1], udp=udp_listener.address[1])
    run = arena.run("adv/test_network.py")
    found = run.report()
    time.sleep(0.2)
    assert tcp_listener.received == [] and udp_listener.received == []
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found


UNIX = """
import socket
from _kit import attempt, report

def connect(address, kind):
    with socket.socket(socket.AF_UNIX, kind) as sock:
        sock.settimeout(2)
        if kind == socket.SOCK_DGRAM:
            return sock.sendto(b"unix egress", address)
        sock.connect(address)
        sock.sendall(b"unix egress")
    return "sent"

def via_pair(address, kind):
    # A pair is born connected; a datagram one would still sendto() any address.
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    with a, b:
        if kind == socket.SOCK_DGRAM:
            return a.sendto(b"unix egress", address)
        a.connect(address)
        a.sendall(b"unix egress")
    return "sent"

def test_unix_sockets():
    report(
        stream=attempt(lambda: connect(PARAMS["stream"], socket.SOCK_STREAM)),
        datagram=attempt(lambda: connect(PARAMS["datagram"], socket.SOCK_DGRAM)),
        stream_pair=attempt(lambda: via_pair(PARAMS["stream"], socket.SOCK_STREAM)),
        datagram_pair=attempt(lambda: via_pair(PARAMS["datagram"], socket.SOCK_DGRAM)),
    )
"""


@pytest.fixture
def unix_listeners(tmp_path: Path) -> Iterator[tuple[Listener, Listener]]:
    folder = open_to_everyone(tmp_path / "sockets")
    with (
        listening(socket.AF_UNIX, socket.SOCK_STREAM, str(folder / "stream.sock")) as stream,
        listening(socket.AF_UNIX, socket.SOCK_DGRAM, str(folder / "dgram.sock")) as datagram,
    ):
        for name in ("stream.sock", "dgram.sock"):
            (folder / name).chmod(0o777)  # like a world-writable host socket (dbus, a dev server...)
        yield stream, datagram


def test_pathname_unix_sockets_outside_are_unreachable(arena: Arena, unix_listeners: tuple[Listener, Listener]) -> None:
    stream, datagram = unix_listeners
    arena.write("adv/test_unix_socket.py", UNIX, stream=stream.address, datagram=datagram.address)
    run = arena.run("adv/test_unix_socket.py")
    found = run.report()
    time.sleep(0.2)
    assert stream.received == [], (found, stream.received)
    assert datagram.received == [], (found, datagram.received)
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found


ABSTRACT = """
import socket
from _kit import attempt, report

def connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(PARAMS["name"].encode().replace(b"@", b"\\0", 1))
        sock.sendall(b"abstract egress")
    return "sent"

def test_abstract_socket():
    report(abstract=attempt(connect))
"""


def test_abstract_unix_socket_of_the_host_is_unreachable(arena: Arena) -> None:
    name = f"\0mcp-adv-{secrets.token_hex(8)}"
    with listening(socket.AF_UNIX, socket.SOCK_STREAM, name) as listener:
        arena.write("adv/test_abstract_socket.py", ABSTRACT, name="@" + name[1:])
        run = arena.run("adv/test_abstract_socket.py")
        found = run.report()
        time.sleep(0.2)
        assert listener.received == []
    assert found["abstract"].startswith("blocked:"), found


PRIVILEGE = """
import ctypes, os, resource
from _kit import attempt, report

libc = ctypes.CDLL(None, use_errno=True)

def checked(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result

def raise_limit(which):
    soft, hard = resource.getrlimit(which)
    resource.setrlimit(which, (hard + 1, hard + 1))
    return resource.getrlimit(which)

def test_privilege_tricks():
    report(
        rlimit_nproc=attempt(lambda: raise_limit(resource.RLIMIT_NPROC)),
        rlimit_as=attempt(lambda: raise_limit(resource.RLIMIT_AS)),
        rlimit_fsize=attempt(lambda: raise_limit(resource.RLIMIT_FSIZE)),
        rlimit_core=attempt(lambda: raise_limit(resource.RLIMIT_CORE)),
        setuid_root=attempt(lambda: os.setuid(0)),
        setgroups=attempt(lambda: os.setgroups([0])),
        mount_tmpfs=attempt(lambda: checked(libc.mount(b"none", os.environ["TMPDIR"].encode(), b"tmpfs", 0, None))),
        remount_root=attempt(lambda: checked(libc.mount(None, b"/", None, 32 | 1 << 5, None))),
        unshare_user=attempt(lambda: checked(libc.unshare(0x10000000))),
        unshare_mount=attempt(lambda: checked(libc.unshare(0x00020000))),
        unshare_net=attempt(lambda: checked(libc.unshare(0x40000000))),
        setns=attempt(lambda: checked(libc.setns(os.open("/proc/self/ns/uts", os.O_RDONLY), 0))),
        chroot=attempt(lambda: os.chroot(os.environ["TMPDIR"])),
        ptrace_parent=attempt(lambda: checked(libc.ptrace(16, os.getppid(), None, None))),
        bpf=attempt(lambda: checked(libc.syscall(321, 0, None, 0))),
        io_uring=attempt(lambda: checked(libc.syscall(425, 1, ctypes.create_string_buffer(120)) < 0)),
        keyctl=attempt(lambda: checked(libc.syscall(250, 0, -3, 0) < 0)),
        uid=os.getuid(),
        groups=os.getgroups(),
    )
"""


def test_privilege_tricks_are_refused(arena: Arena) -> None:
    arena.write("adv/test_privilege.py", PRIVILEGE)
    run = arena.run("adv/test_privilege.py")
    found = run.report()
    assert 61000 <= found.pop("uid") < 62000 and found.pop("groups") == []
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found


SIGNALS = """
import json, os, signal

def test_signal_everyone(capsys):
    found = {}
    for name, pid, sig in (("serve", PARAMS["serve"], signal.SIGKILL),
                           ("bystander", PARAMS["bystander"], signal.SIGKILL),
                           ("init", 1, signal.SIGTERM)):
        try:
            os.kill(pid, sig)
            found[name] = "ok:signalled"
        except OSError as exc:
            found[name] = "blocked:%s" % type(exc).__name__
    with capsys.disabled():  # the kill below ends pytest before it could print a failure
        print("REPORT " + json.dumps(found), flush=True)
    if os.fork() == 0:
        os.kill(-1, signal.SIGKILL)  # everything this uid may signal, this run's pytest included
        os._exit(0)
    os.wait()
"""


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of another unprivileged uid (nobody), started and stopped by this test."""
    process = subprocess.Popen(["sleep", "30"], user=65534, group=65534, extra_groups=[])
    yield process
    process.kill()
    process.wait(timeout=5)


def test_signals_reach_neither_the_gateway_nor_bystanders(arena: Arena, bystander: subprocess.Popen[bytes]) -> None:
    arena.write("adv/test_signals.py", SIGNALS, serve=arena.serve_pid, bystander=bystander.pid)
    run = arena.run("adv/test_signals.py")
    found = run.report()
    # pid 1 of the run's PID namespace is part of the run (bubblewrap's reaper, or natively the run's own
    # supervisor), and a namespace's init ignores what it has no handler for: it is signalled, and lives on.
    assert found.pop("init") == "ok:signalled"
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found
    assert arena.session.process.poll() is None, "the hostile suite killed the gateway"
    assert bystander.poll() is None, "the hostile suite killed another uid's process"
    event = run.sandbox_event()
    if arena.backend == "bubblewrap":
        assert event["exit_code"] == 128 + signal.SIGKILL, "kill(-1) reached only the run itself"
    else:
        assert event["signal"] == signal.SIGKILL, "kill(-1) reached only the run itself"
    follow_up = arena.run("tests")
    assert follow_up.structured["passed"] > 0, "the gateway stopped working after the hostile run"
