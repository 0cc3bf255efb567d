"""The seccomp layer: the filter read back by a tiny BPF interpreter, then installed in real children."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.backends import seccomp
from sandbox.backends.seccomp import (
    AUDIT_ARCH_X86_64,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    SYSCALLS,
    build_filter,
)
from sandbox.errors import SandboxStartError

ALLOW = SECCOMP_RET_ALLOW
EPERM = SECCOMP_RET_ERRNO | errno.EPERM
ENOSYS = SECCOMP_RET_ERRNO | errno.ENOSYS
KILL = SECCOMP_RET_KILL_PROCESS

AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
CLONE_NEW = {"NS": 0x20000, "CGROUP": 0x2000000, "UTS": 0x4000000, "IPC": 0x8000000}
CLONE_NEW |= {"USER": 0x10000000, "PID": 0x20000000, "NET": 0x40000000, "TIME": 0x80}
# Written out here, not read from the module, so a name dropped from the filter fails a test.
MUST_DENY = (
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd"),
    *("keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "chroot"),
    *("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree_attr"),
    *("unshare", "setns", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"),
    "open_by_handle_at",
)
UNISTD_64 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def run_filter(code: bytes, nr: int, args: tuple[int, ...] = (), arch: int = AUDIT_ARCH_X86_64) -> int:
    """Walk a classic BPF program over one struct seccomp_data; only the opcodes the builder may use."""
    insns = list(struct.iter_unpack("=HBBI", code))
    assert 0 < len(insns) <= 4096
    padded = (*args, *(0,) * (6 - len(args)))
    data = struct.pack("=iIQ6Q", nr if nr < 2**31 else nr - 2**32, arch, 0, *padded)
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = insns[pc]
        if op == seccomp.BPF_RET_K:
            return int(k)
        if op == seccomp.BPF_LD_W_ABS:
            assert k % 4 == 0 and k + 4 <= len(data)
            (acc,) = struct.unpack_from("=I", data, k)
            pc += 1
            continue
        if op == seccomp.BPF_ALU_AND_K:
            acc &= k
            pc += 1
            continue
        taken = {
            seccomp.BPF_JEQ_K: acc == k,
            seccomp.BPF_JGE_K: acc >= k,
            seccomp.BPF_JSET_K: bool(acc & k),
        }[op]
        pc += 1 + (jt if taken else jf)
        assert pc < len(insns), "jump past the end"


@pytest.fixture(params=[(False, False), (True, False), (False, True)], ids=["no_network", "network", "proxy"])
def program(request: pytest.FixtureRequest) -> bytes:
    allow_network, proxy = request.param
    return build_filter(allow_network=allow_network, proxy=proxy)


@pytest.mark.parametrize("name", MUST_DENY)
def test_denied_syscalls_get_eperm_whatever_the_arguments(program: bytes, name: str) -> None:
    assert run_filter(program, SYSCALLS[name]) == EPERM
    assert run_filter(program, SYSCALLS[name], (2**64 - 1,) * 6) == EPERM


@pytest.mark.parametrize(
    ("nr", "args"),
    [
        (0, (0, 0, 0)),  # read
        (1, (1, 0, 0)),  # write
        (257, (0, 0, 0)),  # openat
        (59, (0, 0, 0)),  # execve
        (57, ()),  # fork
        (58, ()),  # vfork
        (61, ()),  # wait4
        (105, (65534,)),  # setuid: the uid drop may come before the filter or after
        (317, (1, 0, 0)),  # seccomp: a stacked filter can only narrow this one
        (444, ()),  # landlock_create_ruleset
        (446, ()),  # landlock_restrict_self
        (231, ()),  # exit_group
    ],
)
def test_ordinary_syscalls_are_allowed(program: bytes, nr: int, args: tuple[int, ...]) -> None:
    assert run_filter(program, nr, args) == ALLOW


@pytest.mark.parametrize("arch", [AUDIT_ARCH_I386, AUDIT_ARCH_AARCH64, 0])
@pytest.mark.parametrize("nr", [0, 101])
def test_another_architecture_kills_the_process(program: bytes, arch: int, nr: int) -> None:
    assert run_filter(program, nr, arch=arch) == KILL


@pytest.mark.parametrize("nr", [0x40000000, 0x40000000 | 101, 0x40000000 | 272, 0x7FFFFFFF, 2**32 - 1])
def test_x32_and_out_of_range_numbers_kill_the_process(program: bytes, nr: int) -> None:
    assert run_filter(program, nr) == KILL


@pytest.mark.parametrize(
    "flags",
    [17, 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x80000 | 0x100000 | 0x200000 | 0x1000000, 0x4000 | 0x100 | 17],
    ids=["fork", "thread", "vfork"],
)
def test_clone_without_new_namespaces_is_allowed(program: bytes, flags: int) -> None:
    assert run_filter(program, SYSCALLS["clone"], (flags,)) == ALLOW
    assert run_filter(program, SYSCALLS["clone"], (flags | 0xFFFFFFFF_00000000,)) == ALLOW  # kernel keeps 32 bits


@pytest.mark.parametrize("flag", CLONE_NEW.values(), ids=CLONE_NEW.keys())
def test_clone_with_any_new_namespace_flag_gets_eperm(program: bytes, flag: int) -> None:
    assert run_filter(program, SYSCALLS["clone"], (flag | 17,)) == EPERM


def test_clone3_gets_enosys_so_libc_falls_back_to_clone(program: bytes) -> None:
    assert run_filter(program, SYSCALLS["clone3"], (0, 88)) == ENOSYS


@pytest.mark.parametrize(("persona", "action"), [(0xFFFFFFFF, ALLOW), (0, EPERM), (0x0040000, EPERM), (8, EPERM)])
def test_personality_allows_only_the_query(program: bytes, persona: int, action: int) -> None:
    assert run_filter(program, SYSCALLS["personality"], (persona,)) == action


@pytest.mark.parametrize(
    ("request_code", "action"), [(0x5412, EPERM), (0x541C, EPERM), (0x5401, ALLOW), (0x541B, ALLOW)]
)
def test_ioctl_denies_only_terminal_injection(program: bytes, request_code: int, action: int) -> None:
    assert run_filter(program, SYSCALLS["ioctl"], (0, request_code)) == action


@pytest.mark.parametrize("domain", [1, 2, 10, 16, 17, 0], ids=["unix", "inet", "inet6", "netlink", "packet", "unspec"])
@pytest.mark.parametrize("kind", [1, 2, 5, 1 | 0x80000 | 0x800], ids=["stream", "dgram", "seqpacket", "stream-flags"])
def test_without_network_no_socket_opens_at_all(domain: int, kind: int) -> None:
    nr = SYSCALLS["socket"]
    assert run_filter(build_filter(allow_network=False), nr, (domain, kind, 0)) == EPERM
    assert run_filter(build_filter(allow_network=True), nr, (domain, kind, 0)) == ALLOW


@pytest.mark.parametrize(
    ("domain", "kind", "offline"),
    [
        (1, 1, ALLOW),
        (1, 1 | 0x80000 | 0x800, ALLOW),  # SOCK_CLOEXEC | SOCK_NONBLOCK do not change the type
        (1, 5, ALLOW),
        (1, 5 | 0x80000, ALLOW),
        (1, 2, EPERM),  # a datagram pair may sendto() any pathname socket
        (1, 2 | 0x80000, EPERM),
        (1, 3, EPERM),
        (2, 1, EPERM),
        (10, 1, EPERM),
        (16, 1, EPERM),
    ],
    ids=["unix-stream", "unix-stream-flags", "unix-seqpacket", "unix-seqpacket-flags", "unix-dgram", "unix-dgram-flags",
         "unix-raw", "inet", "inet6", "netlink"],
)  # fmt: skip
def test_without_network_only_connected_unix_pairs(domain: int, kind: int, offline: int) -> None:
    nr = SYSCALLS["socketpair"]
    assert run_filter(build_filter(allow_network=False), nr, (domain, kind, 0)) == offline
    assert run_filter(build_filter(allow_network=True), nr, (domain, kind, 0)) == ALLOW


@pytest.mark.parametrize(
    ("domain", "kind", "protocol", "proxied"),
    [
        (2, 1, 0, ALLOW),  # a TCP client: how a run reaches the proxy's listener
        (2, 1, 6, ALLOW),  # IPPROTO_TCP named
        (2, 1 | 0x80000 | 0x800, 0, ALLOW),  # SOCK_CLOEXEC | SOCK_NONBLOCK do not change the type
        (10, 1, 0, ALLOW),
        (10, 1, 6, ALLOW),
        (2, 1, 132, EPERM),  # SCTP's stream: not TCP, which Landlock's port rule would not see
        (2, 1, 262, EPERM),  # MPTCP
        (2, 2, 0, EPERM),  # UDP: no DNS query, nothing past the proxy
        (10, 2, 17, EPERM),
        (2, 3, 1, EPERM),  # raw ICMP
        (10, 3, 58, EPERM),
        (2, 5, 0, EPERM),
        (17, 3, 0x300, EPERM),  # a packet socket
        (16, 3, 0, EPERM),  # netlink, as without network
        (1, 1, 0, EPERM),  # a pathname unix socket, as without network
        (1, 2, 0, EPERM),
        (0, 1, 0, EPERM),
        (2 | 0xFFFFFFFF_00000000, 1, 0, ALLOW),  # the kernel reads an int: the high half changes nothing
    ],
    ids=["tcp", "tcp-named", "tcp-flags", "tcp6", "tcp6-named", "sctp", "mptcp", "udp", "udp6", "raw", "raw6",
         "seqpacket", "packet", "netlink", "unix-stream", "unix-dgram", "unspec", "tcp-high-bits"],
)  # fmt: skip
def test_through_the_proxy_only_tcp_client_sockets_open(domain: int, kind: int, protocol: int, proxied: int) -> None:
    nr = SYSCALLS["socket"]
    assert run_filter(build_filter(allow_network=False, proxy=True), nr, (domain, kind, protocol)) == proxied
    assert run_filter(build_filter(allow_network=False), nr, (domain, kind, protocol)) == EPERM


def test_the_proxy_keeps_the_socket_pairs_of_a_run_without_network() -> None:
    nr = SYSCALLS["socketpair"]
    for domain, kind in ((1, 1), (1, 5), (1, 2), (2, 1), (16, 1)):
        offline = run_filter(build_filter(allow_network=False), nr, (domain, kind, 0))
        assert run_filter(build_filter(allow_network=False, proxy=True), nr, (domain, kind, 0)) == offline


def test_the_network_and_the_proxy_are_never_both_built() -> None:
    with pytest.raises(ValueError, match="not both"):
        build_filter(allow_network=True, proxy=True)


@pytest.mark.skipif(not UNISTD_64.exists(), reason="kernel uapi headers not installed")
def test_syscall_table_matches_the_kernel_headers() -> None:
    header = dict(
        (parts[1].removeprefix("__NR_"), int(parts[2]))
        for parts in (line.split() for line in UNISTD_64.read_text().splitlines())
        if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("__NR_")
    )
    assert {name: nr for name, nr in SYSCALLS.items() if name in header} == {
        name: header[name] for name in SYSCALLS if name in header
    }


# Real children: the filter installed with preexec_fn, as the runner will.

needs_x86_64_linux = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="the filter is for x86_64 Linux"
)
PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if result == 0 and nr == 56:
        os._exit(0)  # a clone that should have failed: the copy leaves at once
    return ctypes.get_errno() if result == -1 else 0
probes = json.loads(sys.argv[1])
print(json.dumps({name: call(*args) for name, args in probes.items()}))
"""
PROBES: dict[str, tuple[int, ...]] = {
    "ptrace_traceme": (101, 0, 0, 0, 0),
    "unshare_newnet": (272, 0x40000000),
    "mount": (165, 0, 0, 0, 0, 0),
    "fsopen": (430, 0, 0),
    "bpf": (321, 0, 0, 0),
    "keyctl": (250, 0, -2, 0),
    "io_uring_setup": (425, 1, 0),
    "process_vm_readv": (310, 1, 0, 0, 0, 0, 0),
    "setns": (308, -1, 0),
    "personality_set": (135, 0),
    "ioctl_tiocsti": (16, 0, 0x5412, 0),
    "clone_newns": (56, 0x20000 | 17, 0, 0, 0, 0),
}
# PTRACE_TRACEME would make pytest the tracer of the unfiltered child; it is not a control.
CONTROLS = {name: args for name, args in PROBES.items() if name != "ptrace_traceme"}


def spawn(
    code: str, *args: str, allow_network: bool = False, confined: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        preexec_fn=seccomp.prepare(allow_network).apply if confined else None,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def probe(probes: dict[str, tuple[int, ...]], *, confined: bool) -> dict[str, int]:
    done = spawn(PROBE, json.dumps(probes), confined=confined)
    assert done.returncode == 0, done.stderr
    result: dict[str, int] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def confined_errnos() -> dict[str, int]:
    return probe(PROBES, confined=True)


@pytest.fixture(scope="module")
def unconfined_errnos() -> dict[str, int]:
    return probe(CONTROLS, confined=False)


@needs_x86_64_linux
@pytest.mark.parametrize("name", PROBES)
def test_a_confined_child_gets_eperm(confined_errnos: dict[str, int], name: str) -> None:
    assert confined_errnos[name] == errno.EPERM


@needs_x86_64_linux
@pytest.mark.parametrize("name", CONTROLS)
def test_the_same_calls_unconfined_do_not_get_eperm(unconfined_errnos: dict[str, int], name: str) -> None:
    """The control: without the filter each probe reaches the kernel's own checks."""
    assert unconfined_errnos[name] != errno.EPERM


@needs_x86_64_linux
def test_clone3_is_enosys_and_the_personality_query_works() -> None:
    assert probe({"clone3": (435, 0, 0), "personality_query": (135, 0xFFFFFFFF)}, confined=True) == {
        "clone3": errno.ENOSYS,
        "personality_query": 0,
    }


@needs_x86_64_linux
def test_an_x32_syscall_kills_the_child() -> None:
    done = spawn(PROBE, json.dumps({"x32_getpid": (0x40000000 | 39,)}))
    assert done.returncode == -signal.SIGSYS


SOCKETS = """
import json, socket
seen = {}
for name in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"):
    try:
        socket.socket(getattr(socket, name), socket.SOCK_DGRAM).close()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = exc.errno
a, b = socket.socketpair()
a.sendall(b"x")
seen["socketpair"] = b.recv(1).decode()
try:
    socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    seen["socketpair_dgram"] = "ok"
except OSError as exc:
    seen["socketpair_dgram"] = exc.errno
print(json.dumps(seen))
"""


@needs_x86_64_linux
def test_without_network_only_a_connected_unix_pair_opens() -> None:
    done = spawn(SOCKETS)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "AF_INET": errno.EPERM,
        "AF_INET6": errno.EPERM,
        "AF_NETLINK": errno.EPERM,
        "AF_UNIX": errno.EPERM,
        "socketpair": "x",
        "socketpair_dgram": errno.EPERM,
    }


@needs_x86_64_linux
def test_with_network_a_child_reaches_a_listener_the_test_opened() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        port = server.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=30).sendall(b'hello')"
        with subprocess.Popen(
            [sys.executable, "-c", code],
            preexec_fn=seccomp.prepare(allow_network=True).apply,  # noqa: PLW1509 the layer under test runs in preexec_fn
            stdin=subprocess.DEVNULL,
        ) as child:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(30)
                assert conn.recv(5) == b"hello"
            assert child.wait(timeout=30) == 0
    # The rest of the filter still holds with the network on.
    assert probe({"unshare_newnet": (272, 0x40000000)}, confined=True) == {"unshare_newnet": errno.EPERM}


@needs_x86_64_linux
def test_fork_threads_and_subprocess_still_work_inside() -> None:
    code = """
import os, subprocess, sys, threading
pid = os.fork()
if pid == 0:
    os._exit(7)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
thread = threading.Thread(target=print, args=("thread",))
thread.start(); thread.join()
print(subprocess.run([sys.executable, "-c", "print('grandchild')"], capture_output=True, text=True, check=True).stdout, end="")
"""
    done = spawn(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["thread", "grandchild"]


@needs_x86_64_linux
@pytest.mark.skipif(os.geteuid() != 0, reason="the control needs root to create a network namespace")
def test_unshare_tool_fails_inside_and_works_outside() -> None:
    code = "import subprocess, sys; sys.exit(subprocess.run(['unshare', '-n', 'true']).returncode)"
    assert spawn(code, confined=False).returncode == 0
    inside = spawn(code)
    assert inside.returncode != 0
    assert "Operation not permitted" in inside.stderr


@needs_x86_64_linux
def test_an_ordinary_python_program_runs() -> None:
    done = spawn("import json, ssl, asyncio; asyncio.run(asyncio.sleep(0)); print('ok')")
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


@needs_x86_64_linux
def test_a_failed_install_aborts_the_spawn(tmp_path: Path) -> None:
    """Fail closed: if the kernel refuses the filter, the command never runs unfiltered."""
    broken = dataclasses.replace(seccomp.prepare(allow_network=False), _fprog_address=0)
    marker = tmp_path / "ran"
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        subprocess.run(
            [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            preexec_fn=broken.apply,
            check=False,
            timeout=60,
        )
    assert not marker.exists()


def test_prepare_refuses_a_platform_the_filter_was_not_written_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(SandboxStartError, match="seccomp_unsupported_platform"):
        seccomp.prepare(allow_network=False)
