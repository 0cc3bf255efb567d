"""The guest's pid 1 (tests/guest.py): runs the host's commands, one JSON line each, over a virtio-serial port.

Started by the initramfs' /init after `switch_root` onto the host's root (9p, read-only), as
`python -I -u guest_agent.py <port name>`, with the standard library only. It enables the
memory and pids controllers from the root of the cgroup2 hierarchy down to
/sys/fs/cgroup/guest, says `{"ready": ...}`, then answers each request line

    {"argv": [...], "user": uid | null, "delegated": bool, "timeout_s": float, "env": {...}, "cwd": "..."}

with `{"returncode": n, "stdout": b64, "stderr": b64, "timed_out": bool}` (or `{"error": "..."}`).
Each command runs in a cgroup of its own, /sys/fs/cgroup/guest/cmd-<n>: delegated, that
cgroup is handed to the uid as systemd's `Delegate=` does (the folder, cgroup.procs,
cgroup.subtree_control and cgroup.threads owned by it; its limits stay the parent's). When the
command ends or its time is up, `cgroup.kill` ends whatever it left behind and the cgroup is
removed, so no command outlives its answer. As pid 1 the agent also reaps the orphans that
reach it. If it stops, the kernel panics and QEMU (`-no-reboot`) exits.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
COMMANDS = CGROUP_ROOT / "guest"
CONTROLLERS = ("memory", "pids")
DELEGATED_FILES = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")
OUTPUT_CAP = 32 << 20


def enable_controllers() -> None:
    """+memory +pids in the root's and /guest's subtree_control, so each command's cgroup has both."""
    wanted = " ".join(f"+{name}" for name in CONTROLLERS)
    (CGROUP_ROOT / "cgroup.subtree_control").write_text(wanted)
    COMMANDS.mkdir(exist_ok=True)
    (COMMANDS / "cgroup.subtree_control").write_text(wanted)


def find_port(name: str, deadline_s: float = 60.0) -> Path:
    """/dev/vportNpM of the virtio-serial port QEMU named `name` (devtmpfs creates the node)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for entry in Path("/sys/class/virtio-ports").glob("*"):
            if (entry / "name").read_text().strip() == name and Path("/dev", entry.name).exists():
                return Path("/dev", entry.name)
        time.sleep(0.02)
    raise RuntimeError(f"no virtio-serial port named {name!r} (is virtio_console loaded?)")


def kill_cgroup(cgroup: Path) -> None:
    """cgroup.kill, wait until nothing is left in it (5 s at most), then remove it and its children."""
    try:
        (cgroup / "cgroup.kill").write_text("1")
    except OSError:
        return
    end = time.monotonic() + 5
    while time.monotonic() < end and "populated 1" in (cgroup / "cgroup.events").read_text():
        reap_orphans()
        time.sleep(0.01)
    for folder in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        folder.rmdir()
    cgroup.rmdir()


def reap_orphans() -> None:
    """Collect the exit status of orphans reparented to pid 1 (none of them is a command still running)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def entering(cgroup: Path, user: int | None) -> Callable[[], None]:
    """The child's step before exec: into its cgroup (as root), then the uid (no passwd entry needed)."""

    def enter() -> None:
        with open(cgroup / "cgroup.procs", "w") as procs:
            procs.write("0")
        if user is not None:
            os.setgroups([])
            os.setgid(user)
            os.setuid(user)

    return enter


def run(request: dict[str, Any], number: int) -> dict[str, Any]:
    user: int | None = request["user"]
    cgroup = COMMANDS / f"cmd-{number}"
    cgroup.mkdir()
    if request["delegated"] and user is not None:
        os.chown(cgroup, user, user)
        for name in DELEGATED_FILES:
            os.chown(cgroup / name, user, user)
    timed_out = False
    try:
        child = subprocess.Popen(
            request["argv"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=request["cwd"],
            env=request["env"],
            start_new_session=True,
            preexec_fn=entering(cgroup, user),  # noqa: PLW1509 (the agent is single-threaded)
        )
    except OSError as exc:
        kill_cgroup(cgroup)
        return {"error": f"cannot start {request['argv'][0]}: {exc}"}
    try:
        stdout, stderr = child.communicate(timeout=request["timeout_s"])
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_cgroup(cgroup)
        stdout, stderr = child.communicate(timeout=10)
    kill_cgroup(cgroup)
    reap_orphans()
    return {
        "returncode": child.returncode,
        "timed_out": timed_out,
        "stdout": base64.b64encode(stdout[:OUTPUT_CAP]).decode(),
        "stderr": base64.b64encode(stderr[:OUTPUT_CAP]).decode(),
    }


def write_line(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


def serve(fd: int) -> None:
    pending = b""
    number = 0
    while True:
        while b"\n" not in pending:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                time.sleep(0.05)  # the host is not connected (yet or any more); the host kills QEMU at the end
                continue
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        number += 1
        try:
            answer = run(json.loads(line), number)
        except Exception as exc:  # the agent must answer and keep going: it is pid 1
            answer = {"error": f"agent: {type(exc).__name__}: {exc}"}
        write_line(fd, answer)


def main() -> None:
    enable_controllers()
    fd = os.open(find_port(sys.argv[1]), os.O_RDWR)
    write_line(fd, {"ready": True, "kernel": os.uname().release})
    serve(fd)


if __name__ == "__main__":
    main()
