"""A guest with another kernel and a cgroup-v2-only hierarchy, for the host matrix (decision 59).

`Guest.boot(checkout)` starts QEMU on Debian's distribution kernel (`linux-image-amd64`, 6.1:
Landlock ABI 2) with `cgroup_no_v1=all`, 2 vCPUs, 3 GiB of RAM and no network device (loopback
only). A tiny initramfs built here (busybox-static, that kernel's virtio/9p modules, an /init
script) mounts the host's `/` over 9p read-only and puts the guest's own proc, sysfs, cgroup2
(at /sys/fs/cgroup, memory and pids enabled), devtmpfs and a 1 GiB tmpfs at /tmp (SCRATCH) on
top; the checkout and the venv keep their host paths even under /tmp, the rest of the host's
/tmp shows at HOST_TMP (`Guest.visible(path)`). It then `switch_root`s to the host's Python
running tests/guest_agent.py as pid 1, which answers one JSON line per command over a
virtio-serial port backed by a unix socket on the host. Usage:

    done = guest.run([guest.python, "-m", "pytest", "-q", "--noconftest", "tests/hosts/x.py"],
                     user=4242, delegated=True, timeout_s=300)
    assert done.returncode == 0, done.stdout

Commands run in the checkout with PYTHONPATH=<checkout> (the venv's editable install may name
another checkout), `guest.python` is the suite's venv interpreter, and the environment is
`Guest.env` plus `env=`. `user=U` runs as uid U (no passwd entry needed); `delegated=True`
first hands U a cgroup of its own as systemd's `Delegate=` does and starts the command in it
(tests/hosts/in_guest_cgroup2_limits.py and in_guest_sandbox.py show what U can then do). Each command's processes end
with it (`cgroup.kill`); past `timeout_s` it raises `subprocess.TimeoutExpired`. A guest that
does not boot or stops answering raises `GuestError` with the reason, QEMU's stderr and the
console's tail, in every later call too; it is killed at `close()`.

Accelerator: KVM where the CPU has vmx/svm, else TCG (`accelerator()`). This CI machine's
/dev/kvm is PVM (the kvm_pvm module, no vmx): it boots only PVM-built kernels, and Debian's
hangs at "Probing EDD", so the guest runs under TCG here, about 8x slower than the host for
Python (a `sum(range(10**7))` takes 1.45 s against 0.17 s). The kernel is unpacked on the host
(xz, about 1 s) and booted as an ELF through PVH, which skips the firmware and the in-guest
decompressor (11 s -> 4 s to the kernel's init).

Measured here (2 cores shared with other suites): boot to the agent's first answer, unpacking
included, median 9.5 s of 5 boots at load average 2.5 (6.9-10.9 s), 18.7 s of 5 at load 5.7
(11.2-22.6 s); a command such as `cat` 0.1-0.3 s; a pytest of one small file without the root
conftest 9-28 s (the first on a cold 9p cache is the slowest; the root conftest's imports add
about 20 s). tests/hosts (one shared guest, a second boot for the failure test, two nested
pytest runs) takes 49 s at load 3, 94 s at load 5. Install: `make guest-deps` (as root, with
INITRD=No) 14.7 s from the apt cache with the dependencies present; 59 s for everything from
the network when Debian's initramfs was still built (INITRD=No now skips it); 0.02 s when
installed.
"""

from __future__ import annotations

import base64
import json
import lzma
import os
import re
import select
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, NoReturn, Self

from tests.deadlines import scaled

MODULES = ("virtio_pci", "9pnet_virtio", "9p", "virtio_console")
"""Loaded in this order with their dependencies (modules.dep): the disk, the agent's port."""
SCRATCH = Path("/tmp")
"""The guest's own /tmp: a 1 GiB tmpfs, writable by every uid (HOME and TMPDIR of every command)."""
HOST_TMP = Path("/run/host-tmp")
"""Where the host's /tmp is visible in the guest, read-only (`Guest.visible()`)."""
MEMORY_MIB = 3072
BOOT_TIMEOUT_S = 240.0
"""From QEMU's start to the agent's first line, TEST_TIME_SCALE times it (`boot_deadline_s`): about a
minute under TCG on a quiet host, 121 s seen at load 20-25."""
ANSWER_MARGIN_S = 30.0
"""How much longer than a command's own timeout the host waits before declaring the guest dead."""
CONSOLE_TAIL = 8000
FIX = "install the guest's packages with `make guest-deps` (as root)"

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
. /config
fail() { echo "guest-init: $*"; sleep 1; exit 1; }
for module in $MODULES; do insmod /modules/$module.ko || fail "insmod $module"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 root /newroot || fail "mount the host's root over 9p"
mount -t tmpfs -o mode=0755,size=64m run /newroot/run || fail "tmpfs /run"
mkdir /newroot/run/host-tmp
mount --bind /newroot/tmp /newroot/run/host-tmp || fail "bind the host's /tmp"
mount -t tmpfs -o mode=1777,size=1g scratch /newroot/tmp || fail "tmpfs /tmp"
for path in $KEEP; do mkdir -p /newroot$path; mount --bind /newroot/run/host-tmp${path#/tmp} /newroot$path || fail "bind $path"; done
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /newroot/sys/fs/cgroup || fail "mount cgroup2"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
hostname guest
ip link set lo up
echo "guest-init: switch_root"
exec switch_root /newroot $PYTHON -I -S -u $AGENT agent
"""


ACCELERATORS = {
    "kvm": ("-accel", "kvm", "-cpu", "host"),
    "tcg": ("-accel", "tcg,thread=multi", "-cpu", "max"),
}


def boot_deadline_s() -> float:
    """BOOT_TIMEOUT_S times TEST_TIME_SCALE."""
    return scaled(BOOT_TIMEOUT_S)


def accelerator() -> str:
    """`kvm` where the CPU has hardware virtualization (vmx/svm) and /dev/kvm is usable, else `tcg`.

    A /dev/kvm without vmx/svm (this CI machine: the kvm_pvm module, a Pagetable-based VM)
    creates VMs but boots only PVM-built kernels; Debian's stalls at "Probing EDD".
    """
    flags = set(re.findall(r"\b(vmx|svm)\b", Path("/proc/cpuinfo").read_text()))
    return "kvm" if flags and os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"


class GuestError(RuntimeError):
    """The guest could not boot or stopped answering; the message carries the reason and the fix."""


def find_kernel() -> tuple[Path, Path]:
    """The newest /boot/vmlinuz-* whose modules are installed, and its modules folder."""
    kernels = sorted(Path("/boot").glob("vmlinuz-*"), key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])
    for kernel in reversed(kernels):
        modules = Path("/lib/modules", kernel.name.removeprefix("vmlinuz-"))
        if (modules / "modules.dep").is_file():
            return kernel, modules
    raise GuestError(f"no kernel with modules under /boot and /lib/modules: {FIX}")


def extract_vmlinux(kernel: Path, target: Path) -> Path:
    """The ELF inside a bzImage (xz or gzip), which QEMU boots through PVH; else the bzImage itself.

    Under TCG the bzImage's own decompressor is the slowest part of the boot (about 6 s of 11
    measured here); QEMU boots the ELF directly from its PVH note, without firmware or
    decompression, and Python unpacks it in about a second.
    """
    image = kernel.read_bytes()
    for magic, decompress in ((b"\xfd7zXZ\x00", lzma.LZMADecompressor), (b"\x1f\x8b\x08", _gzip_decompressor)):
        start = image.find(magic)
        if start < 0:
            continue
        try:
            elf = decompress().decompress(image[start:])
        except (lzma.LZMAError, zlib.error):
            continue
        if elf.startswith(b"\x7fELF"):
            target.write_bytes(elf)
            return target
    return kernel


def _gzip_decompressor() -> zlib._Decompress:
    return zlib.decompressobj(wbits=31)


def module_order(modules: Path, wanted: tuple[str, ...]) -> list[Path]:
    """The .ko files to insmod, each after its dependencies (modules.dep lists them relative to `modules`)."""
    depends: dict[str, list[str]] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        module, _, needs = line.partition(":")
        depends[module] = needs.split()
    by_name = {Path(path).name.removesuffix(".ko"): path for path in depends}
    builtin = {Path(path).name.removesuffix(".ko") for path in (modules / "modules.builtin").read_text().split()}
    order: list[str] = []

    def visit(path: str) -> None:
        for need in reversed(depends[path]):
            visit(need)
        if path not in order:
            order.append(path)

    for name in wanted:
        if name in builtin:
            continue
        if name not in by_name:
            raise GuestError(f"kernel {modules.name} has no module {name}: the guest needs 9p and virtio; {FIX}")
        visit(by_name[name])
    return [modules / path for path in order]


def _cpio_entry(name: str, mode: int, data: bytes = b"") -> bytes:
    """One entry of a `newc` cpio archive (the initramfs format)."""
    encoded = name.encode() + b"\0"
    fields = [0, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
    header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields) + encoded
    header += b"\0" * (-len(header) % 4)
    return header + data + b"\0" * (-len(data) % 4)


def build_initramfs(target: Path, modules: list[Path], config: dict[str, str]) -> None:
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        raise GuestError(f"/bin/busybox (busybox-static) is missing: {FIX}")
    directory, executable, regular = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries = [_cpio_entry(name, directory) for name in ("bin", "proc", "sys", "dev", "newroot", "modules")]
    entries.append(_cpio_entry("bin/busybox", executable, busybox.read_bytes()))
    entries.append(_cpio_entry("init", executable, INIT.encode()))
    lines = "".join(f"{key}='{value}'\n" for key, value in config.items())
    entries.append(_cpio_entry("config", regular, lines.encode()))
    entries += [_cpio_entry(f"modules/{ko.name}", regular, ko.read_bytes()) for ko in modules]
    entries.append(_cpio_entry("TRAILER!!!", 0))
    target.write_bytes(b"".join(entries))


def paths_under_scratch(paths: list[Path]) -> list[str]:
    """The paths the guest's /tmp tmpfs would hide, outermost first, none inside another."""
    kept: list[str] = []
    for path in sorted({p.resolve() for p in paths if p.resolve().is_relative_to(SCRATCH)}, key=lambda p: len(p.parts)):
        if path == SCRATCH:
            raise GuestError(f"{SCRATCH} itself cannot be shared: the guest's scratch tmpfs is mounted there")
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(str(path))
    for text in kept:
        if not re.fullmatch(r"[\w./+@-]+", text):
            raise GuestError(f"{text!r}: the guest's /init shares only paths without spaces or quotes")
    return kept


KERNEL_ARGS = (
    "console=ttyS0 quiet loglevel=3 panic=-1",  # the console log; a dead /init ends QEMU (-no-reboot)
    "cgroup_no_v1=all",  # the point of the guest: only the cgroup2 hierarchy
    "tsc=reliable no_timer_check",  # skip clock checks that cost seconds under TCG
    "mitigations=off",  # a test machine: no page-table switch per system call, much cheaper under TCG
)


def qemu_argv(qemu: str, accel: str, kernel: Path, folder: Path) -> list[str]:
    """No network device, no default devices; the host's / read-only over 9p, the agent's port, the console to a file."""
    return [
        *("setpriv", "--pdeathsig", "KILL", "--"),  # QEMU dies with the suite even when the suite is killed
        qemu,
        *("-nodefaults", "-no-user-config", "-no-reboot", "-display", "none", "-monitor", "none"),
        *("-machine", "q35", *ACCELERATORS[accel], "-smp", "2", "-m", str(MEMORY_MIB)),
        *("-nic", "none", "-serial", f"file:{folder / 'console.log'}"),
        *("-kernel", str(kernel), "-initrd", str(folder / "initramfs.cpio"), "-append", " ".join(KERNEL_ARGS)),
        *("-fsdev", "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap"),
        *("-device", "virtio-9p-pci,fsdev=root,mount_tag=root"),
        *("-device", "virtio-serial-pci", "-chardev", f"socket,id=agent,path={folder / 'agent.sock'}"),
        *("-device", "virtserialport,chardev=agent,name=agent"),
    ]


class Guest:
    """One running guest: `Guest.boot(checkout)`, then `run()` commands in it; `close()` (or `with`) kills it."""

    def __init__(
        self, checkout: Path, accel: str, qemu: subprocess.Popen[bytes], folder: Path, kept: list[Path]
    ) -> None:
        self.checkout = checkout
        self.python = sys.executable
        """The venv's interpreter (pytest and the project's dependencies), visible at its host path."""
        self.accel = accel
        self.kernel = ""
        """The guest's `uname -r`."""
        self.boot_s = 0.0
        """From `boot()` to the agent's first line (initramfs and kernel unpacking included)."""
        self._qemu = qemu
        self._folder = folder
        self._channel: socket.socket | None = None
        self._pending = b""
        self._dead: str | None = None
        self._kept = kept

    @classmethod
    def boot(cls, checkout: Path, *, modules: tuple[str, ...] = MODULES) -> Self:
        """Start QEMU and wait for the agent (`boot_deadline_s` at most); GuestError with the reason otherwise."""
        started = time.monotonic()
        boot_s = boot_deadline_s()
        qemu = shutil.which("qemu-system-x86_64")
        if qemu is None:
            raise GuestError(f"qemu-system-x86_64 is missing: {FIX}")
        kernel, modules_folder = find_kernel()
        load = module_order(modules_folder, modules)
        agent_python = os.path.realpath(sys.executable)  # the agent needs only the standard library
        keep = paths_under_scratch([checkout, Path(sys.prefix), Path(agent_python)])
        config = {
            "MODULES": " ".join(ko.name.removesuffix(".ko") for ko in load),
            "KEEP": " ".join(keep),
            "PYTHON": agent_python,
            "AGENT": str(Path(__file__).resolve().with_name("guest_agent.py")),
        }
        accel = accelerator()
        folder = Path(tempfile.mkdtemp(prefix="mcp-gw-guest-"))
        try:
            build_initramfs(folder / "initramfs.cpio", load, config)
            argv = qemu_argv(qemu, accel, extract_vmlinux(kernel, folder / "vmlinux"), folder)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(folder / "agent.sock"))
            listener.listen(1)
            with (folder / "qemu.stderr").open("wb") as stderr:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        guest = cls(checkout, accel, process, folder, [Path(path) for path in keep])
        try:
            with listener:
                guest._channel = guest._accept(listener, started + boot_s)
            ready = guest._receive(started + boot_s, "booting")
        except BaseException:
            guest.close()
            raise
        guest.kernel = ready["kernel"]
        guest.boot_s = time.monotonic() - started
        for loaded in (
            "vmlinux",
            "initramfs.cpio",
        ):  # QEMU read them at start; 70 MB left behind if the suite is killed
            (folder / loaded).unlink(missing_ok=True)
        return guest

    def visible(self, path: Path) -> Path:
        """Where the guest sees a host path (read-only): the same path, or under HOST_TMP for the host's /tmp.

        The checkout and the venv keep their paths; anything else under the host's /tmp (a
        test's `tmp_path`) is hidden by the guest's scratch tmpfs and shown under HOST_TMP.
        """
        path = path.resolve()
        if not path.is_relative_to(SCRATCH) or any(path.is_relative_to(kept) for kept in self._kept):
            return path
        return HOST_TMP / path.relative_to(SCRATCH)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def env(self) -> dict[str, str]:
        """The environment every command starts from."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(SCRATCH),
            "TMPDIR": str(SCRATCH),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(self.checkout),
            "PYTHONDONTWRITEBYTECODE": "1",
            "MCP_GATEWAY_TEST_PG": "off",  # no PostgreSQL cluster per nested pytest (and none as a uid without a name)
        }

    def run(
        self,
        argv: list[str],
        *,
        user: int | None = None,
        delegated: bool = False,
        timeout_s: float,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv in the guest (in the checkout, as root or uid `user`); its outcome, or TimeoutExpired."""
        if delegated and user is None:
            raise ValueError("delegated=True hands a cgroup to a uid: give user=")
        request = {
            "argv": argv,
            "user": user,
            "delegated": delegated,
            "timeout_s": timeout_s,
            "env": self.env | (env or {}),
            "cwd": str(cwd or self.checkout),
        }
        self._send(request)
        answer = self._receive(time.monotonic() + timeout_s + ANSWER_MARGIN_S, f"running {shlex.join(argv)}")
        if "error" in answer:
            raise GuestError(answer["error"])
        stdout = base64.b64decode(answer["stdout"]).decode(errors="replace")
        stderr = base64.b64decode(answer["stderr"]).decode(errors="replace")
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout_s, stdout, stderr)
        return subprocess.CompletedProcess(argv, answer["returncode"], stdout, stderr)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self._qemu.poll() is None:
            self._qemu.kill()
        self._qemu.wait(timeout=30)
        shutil.rmtree(self._folder, ignore_errors=True)

    def _accept(self, listener: socket.socket, deadline: float) -> socket.socket:
        while time.monotonic() < deadline:
            self._check_alive("boot")
            if select.select([listener], [], [], 0.1)[0]:
                return listener.accept()[0]
        self._declare_dead(f"QEMU did not connect the agent's port within {boot_deadline_s():.0f} s")

    def _send(self, message: dict[str, Any]) -> None:
        if self._dead is not None:
            raise GuestError(self._dead)
        assert self._channel is not None  # set by boot() before any command
        try:
            self._channel.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            self._declare_dead(f"the agent's port is closed ({exc})")

    def _receive(self, deadline: float, doing: str) -> dict[str, Any]:
        if self._dead is not None:
            raise GuestError(self._dead)
        assert self._channel is not None
        while b"\n" not in self._pending:
            self._check_alive(doing)
            left = deadline - time.monotonic()
            if left <= 0:
                self._declare_dead(f"the guest did not answer in time while {doing}")
            if select.select([self._channel], [], [], min(left, 0.5))[0]:
                chunk = self._channel.recv(1 << 20)
                if not chunk:
                    self._declare_dead(f"the agent's port closed while {doing}")
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _check_alive(self, doing: str) -> None:
        if self._qemu.poll() is not None:
            self._declare_dead(f"QEMU exited with status {self._qemu.returncode} while {doing}")

    def _declare_dead(self, reason: str) -> NoReturn:
        """Kill QEMU and raise with what it and the guest's console said; every later call raises the same."""
        if self._qemu.poll() is None:
            self._qemu.kill()
            self._qemu.wait(timeout=30)
        stderr = _tail(self._folder / "qemu.stderr")
        console = _tail(self._folder / "console.log")
        self._dead = (
            f"{reason}.\nQEMU's stderr: {stderr or '(empty)'}\nthe guest's console ends with:\n{console or '(empty)'}"
        )
        raise GuestError(self._dead)


def _tail(path: Path) -> str:
    try:
        return path.read_bytes()[-CONSOLE_TAIL:].decode(errors="replace").replace("\r\n", "\n").strip()
    except OSError:
        return ""
