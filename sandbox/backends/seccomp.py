"""The seccomp layer (docs/security-model.md, layer 8): a default-allow BPF filter that shuts the kernel's escape hatches.

`build_filter` is pure: it returns the classic BPF program (an array of `struct sock_filter`)
as bytes, so tests can read it back. `prepare` runs in the gateway and does everything that
allocates or looks up symbols; `SeccompProgram.apply` runs in the child and only makes the two
system calls that install the filter (see its docstring for why that split matters).

Verdicts, x86_64 only:
- another architecture, or an x32 system call number: the whole process is killed;
- ptrace and friends, io_uring, bpf, keyrings, mounts (old and new API), namespaces,
  modules, kexec, open_by_handle_at: EPERM;
- personality: EPERM unless it is the read-only query personality(0xffffffff);
- clone3: ENOSYS, so libc falls back to clone, whose flags a classic filter can read;
- clone with any CLONE_NEW* flag: EPERM;
- ioctl TIOCSTI/TIOCLINUX (typing into the controlling terminal): EPERM;
- without network: socket() for every family, AF_UNIX included: EPERM. A pathname unix
  socket is a file Landlock ABI 7 cannot guard (its RESOLVE_UNIX right arrives with ABI 9), and
  a network namespace does not hide it: a world-writable host socket (a system bus, a dev
  server) would otherwise be reachable. socketpair() stays for AF_UNIX stream and seqpacket
  pairs (asyncio's self-pipe, multiprocessing.Pipe): such a socket is born connected and
  cannot be pointed anywhere else, unlike a datagram pair, whose sendto() takes any address;
- through the gateway's proxy (`proxy`, decision 89): the same, except socket() for a TCP
  stream, AF_INET or AF_INET6 with protocol 0 or IPPROTO_TCP, which is how a client reaches
  the proxy's listener on the run's loopback: raw and packet sockets, UDP (so no DNS query
  leaves a resolver), SCTP and MPTCP streams, netlink and AF_UNIX sockets stay EPERM;
- everything else: allowed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sandbox.errors import SandboxStartError

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

CLONE_NEW_FLAGS = 0x7E020000 | 0x00000080  # NS, CGROUP, UTS, IPC, USER, PID, NET | TIME
PERSONALITY_QUERY = 0xFFFFFFFF
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
IPPROTO_TCP = 6
SOCK_STREAM = 1
SOCK_SEQPACKET = 5
SOCK_TYPE_MASK = 0xF  # the type argument also carries SOCK_NONBLOCK and SOCK_CLOEXEC
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# x86_64 numbers, from the kernel's asm/unistd_64.h.
SYSCALLS: Mapping[str, int] = MappingProxyType(
    {
        "ioctl": 16,
        "socket": 41,
        "socketpair": 53,
        "clone": 56,
        "ptrace": 101,
        "personality": 135,
        "pivot_root": 155,
        "chroot": 161,
        "mount": 165,
        "umount2": 166,
        "init_module": 175,
        "delete_module": 176,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "perf_event_open": 298,
        "open_by_handle_at": 304,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "finit_module": 313,
        "seccomp": 317,
        "kexec_file_load": 320,
        "bpf": 321,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "clone3": 435,
        "pidfd_getfd": 438,
        "mount_setattr": 442,
        "open_tree_attr": 467,
    }
)

# EPERM whatever the arguments. The new mount API (open_tree .. open_tree_attr) mounts without
# mount(2), and pidfd_getfd steals another process's descriptor like ptrace; both are denied
# with the calls they stand in for.
DENIED: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_tree_attr",
    "unshare",
    "setns",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
)

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR_OFFSET = 0
_ARCH_OFFSET = 4


def _arg_low(index: int) -> int:
    """Offset of the low 32 bits of args[index] (x86_64 is little-endian).

    Every argument this filter inspects is an int or unsigned int in the kernel (or, for
    clone, truncated to 32 bits before use), so the high half never changes the outcome.
    """
    return 16 + 8 * index


# Classic BPF opcodes (linux/filter.h): class | size | mode, class | op | source.
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_ALU_AND_K = 0x54
BPF_RET_K = 0x06
_INSN = struct.Struct("=HBBI")  # struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; }

_Target = int | str  # a literal offset, or a label resolved by _assemble
_Line = tuple[int, _Target, _Target, int] | str  # an instruction, or a label


def build_filter(allow_network: bool, *, proxy: bool = False) -> bytes:
    """The filter as `struct sock_filter[]` bytes, ready for `struct sock_fprog`; `proxy`: TCP client sockets too."""
    if allow_network and proxy:
        raise ValueError("a run has the host's network or the gateway's proxy, not both")
    lines: list[_Line] = [
        (BPF_LD_W_ABS, 0, 0, _ARCH_OFFSET),
        (BPF_JEQ_K, 0, "kill", AUDIT_ARCH_X86_64),
        (BPF_LD_W_ABS, 0, 0, _NR_OFFSET),
        (BPF_JGE_K, "kill", 0, X32_SYSCALL_BIT),
        *((BPF_JEQ_K, "eperm", 0, SYSCALLS[name]) for name in DENIED),
        (BPF_JEQ_K, "enosys", 0, SYSCALLS["clone3"]),
        (BPF_JEQ_K, "clone", 0, SYSCALLS["clone"]),
        (BPF_JEQ_K, "personality", 0, SYSCALLS["personality"]),
        (BPF_JEQ_K, "ioctl", 0, SYSCALLS["ioctl"]),
    ]
    if not allow_network:
        lines += [
            (BPF_JEQ_K, "tcp_socket" if proxy else "eperm", 0, SYSCALLS["socket"]),
            (BPF_JEQ_K, "socketpair", 0, SYSCALLS["socketpair"]),
        ]
    lines += [
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        "clone",
        (BPF_LD_W_ABS, 0, 0, _arg_low(0)),
        (BPF_JSET_K, "eperm", "allow", CLONE_NEW_FLAGS),
        "personality",
        (BPF_LD_W_ABS, 0, 0, _arg_low(0)),
        (BPF_JEQ_K, "allow", "eperm", PERSONALITY_QUERY),
        "ioctl",
        (BPF_LD_W_ABS, 0, 0, _arg_low(1)),
        (BPF_JEQ_K, "eperm", 0, TIOCSTI),
        (BPF_JEQ_K, "eperm", "allow", TIOCLINUX),
        "socketpair",
        (BPF_LD_W_ABS, 0, 0, _arg_low(0)),
        (BPF_JEQ_K, 0, "eperm", AF_UNIX),
        (BPF_LD_W_ABS, 0, 0, _arg_low(1)),
        (BPF_ALU_AND_K, 0, 0, SOCK_TYPE_MASK),
        (BPF_JEQ_K, "allow", 0, SOCK_STREAM),
        (BPF_JEQ_K, "allow", "eperm", SOCK_SEQPACKET),
        "tcp_socket",
        (BPF_LD_W_ABS, 0, 0, _arg_low(0)),
        (BPF_JEQ_K, 1, 0, AF_INET),
        (BPF_JEQ_K, 0, "eperm", AF_INET6),
        (BPF_LD_W_ABS, 0, 0, _arg_low(1)),
        (BPF_ALU_AND_K, 0, 0, SOCK_TYPE_MASK),
        (BPF_JEQ_K, 0, "eperm", SOCK_STREAM),
        (BPF_LD_W_ABS, 0, 0, _arg_low(2)),
        (BPF_JEQ_K, "allow", 0, 0),
        (BPF_JEQ_K, "allow", "eperm", IPPROTO_TCP),
        "allow",
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        "eperm",
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        "enosys",
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
        "kill",
        (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ]
    return _assemble(lines)


def _assemble(lines: list[_Line]) -> bytes:
    labels: dict[str, int] = {}
    insns: list[tuple[int, _Target, _Target, int]] = []
    for line in lines:
        if isinstance(line, str):
            labels[line] = len(insns)
        else:
            insns.append(line)

    def offset(pc: int, target: _Target) -> int:
        if isinstance(target, int):
            return target
        distance = labels[target] - pc - 1
        if not 0 <= distance <= 0xFF:  # classic BPF only jumps forward, by a byte
            raise ValueError(f"jump to {target} out of range")
        return distance

    return b"".join(_INSN.pack(code, offset(pc, jt), offset(pc, jf), k) for pc, (code, jt, jf, k) in enumerate(insns))


PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


@dataclass(frozen=True, slots=True, eq=False)
class SeccompProgram:
    """A filter built and bound in the gateway, waiting to be installed in a child."""

    code: bytes
    _buffer: ctypes.Array[ctypes.c_char]  # owns the memory _fprog.filter points at
    _fprog: _SockFprog
    _fprog_address: int
    _prctl: Callable[[int, int, int, int, int], int]
    _syscall: Callable[[int, int, int, int], int]

    def apply(self) -> None:
        """Install the filter in the calling process; safe as a `preexec_fn` after fork.

        After fork only the forking thread exists; a lock another gateway thread held (the
        malloc arena, the dynamic loader's, an import lock) stays held forever. So `prepare`
        already did every lookup, allocation and struct build, and this method only calls two
        function pointers with integers. What remains is preexec_fn's own caveat: it runs
        Python code in the child. Any failure raises, so subprocess aborts the spawn (fail closed).
        """
        if self._prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxStartError("seccomp_no_new_privs_failed") from _errno_error()
        if self._syscall(SYSCALLS["seccomp"], SECCOMP_SET_MODE_FILTER, 0, self._fprog_address) != 0:
            raise SandboxStartError("seccomp_filter_failed") from _errno_error()


def prepare(allow_network: bool, *, proxy: bool = False) -> SeccompProgram:
    """Build the filter and resolve prctl/syscall now, in the parent, so `apply` does neither."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise SandboxStartError("seccomp_unsupported_platform")  # elsewhere the filter would kill every process
    code = build_filter(allow_network, proxy=proxy)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // _INSN.size, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    c_long, c_ulong = ctypes.c_long, ctypes.c_ulong
    prctl = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, c_ulong, c_ulong, c_ulong, c_ulong, use_errno=True)
    syscall = ctypes.CFUNCTYPE(c_long, c_long, c_ulong, c_ulong, c_ulong, use_errno=True)
    return SeccompProgram(
        code=code,
        _buffer=buffer,
        _fprog=fprog,
        _fprog_address=ctypes.addressof(fprog),
        _prctl=prctl(("prctl", libc)),
        _syscall=syscall(("syscall", libc)),
    )


def _errno_error() -> OSError:
    number = ctypes.get_errno()
    return OSError(number, os.strerror(number))
