"""What a review's copy would gain in two processes (decision 104): the bench's project copied by one, and split with a second.

The gateway's copy (`copy_workspace`) runs on one thread; two threads of one process lose to the
GIL's hand-off (decision 104), so the one way to put its system calls on both CPUs is a second
process, as `tar | tar` does. This measures that way before it is built: a helper process forked
while this one has a single thread, sent the workspace's and the view's root fds (SCM_RIGHTS) and
half the folders; it copies their files with the copy's own per-file step (`_Copier._file`: the
identity taken before a byte is read, owners, modes, times) and sends its Originals back (marshal),
while this process copies the other half. Folders are made first and finished after their files,
as the copy does. Interleaved rounds, each into a fresh view (a WorkspaceView, root's):

- wall p50 of the whole copy, one process and two;
- CPU of this process (the helper's half not counted) and the helper's own: its CPU and the time
  it waited for a CPU (`/proc/thread-self/schedstat`): on a busy machine the second CPU is not free,
  and the wait says so; each side's wall less its wait for a CPU, what an idle machine would give
  if nothing but the CPU held it;
- both again with an interpreter's start (`python -I -S -c pass`) begun with each copy: the shape a
  review's copy runs in, filled while the run's child starts on the other CPU.

Not the copy itself: no caps, no racy-window hashing choice beyond `_file`'s, no failure paths. Must
run as root (the copy gives files away as to a run's pool uid). A few seconds.

    .venv/bin/python bench/copy_split.py [--rounds 30] [--files 2000] [--blocks 12]
"""

from __future__ import annotations

import argparse
import marshal
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.change_set import make_project  # noqa: E402
from sandbox.backends.view import WorkspaceView  # noqa: E402
from sandbox.pinned import pin  # noqa: E402
from sandbox.workspace_copy import LAZY_FILESYSTEMS, RACY_NS, Original, Owner, _Copier, copy_workspace  # noqa: E402

OWNER = Owner(64076, 64076)
"""Given away as to a run's pool uid (as bench/change_set.py's copy_floors)."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MESSAGE = 1 << 22
WITH_START = ", a start beside"
BESIDE = [sys.executable, "-I", "-S", "-c", "pass"]
"""Started as each copy of the `WITH_START` sides starts: an interpreter's start, about the CPU a run's child spends
starting while its copy is filled (read-only's cost over bare), competing for the second CPU as the child does."""
SIDES = ("one process", "two processes", f"one process{WITH_START}", f"two processes{WITH_START}")


def copy_files(source_root: int, target_root: int, folders: list[str]) -> dict[str, Original]:
    """The files of `folders` (top-level, made already in the target), by the copy's own per-file step."""
    copier = _Copier(OWNER, 1_000_000, 1 << 40, time.time_ns() - RACY_NS, LAZY_FILESYSTEMS)
    for folder in folders:
        source = os.open(folder, _DIR, dir_fd=source_root)
        target = os.open(folder, _DIR, dir_fd=target_root)
        try:
            for name in sorted(os.listdir(source)):
                copier._file(source, target, name, f"{folder}/{name}")
        finally:
            os.close(source)
            os.close(target)
    return copier.originals


def queue_wait_ns() -> int:
    """How long this thread has waited for a CPU, in all (the second field of its schedstat)."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1])


def helper(end: socket.socket) -> None:
    """The second process: copy the folders it is sent, answer with its Originals and its own times."""
    while True:
        message, fds, _, _ = socket.recv_fds(end, _MESSAGE, 2)
        if not message:
            os._exit(0)
        wall, cpu, waited = time.perf_counter(), time.thread_time(), queue_wait_ns()
        originals = copy_files(fds[0], fds[1], marshal.loads(message))  # noqa: S302 (from its own parent)
        times = (time.perf_counter() - wall, time.thread_time() - cpu, (queue_wait_ns() - waited) / 1e9)
        rows = [
            (path, (str(o.kind), *o[1:7], None if o.identity is None else tuple(o.identity)))
            for path, o in originals.items()
        ]
        end.send(marshal.dumps((times, rows)))
        for fd in fds:
            os.close(fd)


def split_copy(end: socket.socket, workspace: int, view: int, helpers: list[tuple[float, float, float, float]]) -> int:
    """The copy split by top-level folders between this process and the helper; how many files it made. Notes the
    helper's wall, CPU and wait for a CPU, and this process's own half's wall less its wait for a CPU."""
    source = os.open(".", _DIR, dir_fd=workspace)
    target = os.open(".", _DIR, dir_fd=view)
    try:
        folders = sorted(os.listdir(source))
        for folder in folders:
            os.mkdir(folder, 0o700, dir_fd=target)
        socket.send_fds(end, [marshal.dumps(folders[1::2])], [source, target])
        started, waited = time.perf_counter(), queue_wait_ns()
        mine = copy_files(source, target, folders[0::2])
        own = time.perf_counter() - started - (queue_wait_ns() - waited) / 1e9
        times, theirs = marshal.loads(end.recv(_MESSAGE))  # noqa: S302 (from its own fork)
        helpers.append((*times, own))
        for folder in folders:  # finished after their files, as the copy does
            inner = os.open(folder, _DIR, dir_fd=target)
            try:
                os.fchown(inner, OWNER.uid, OWNER.gid)
                os.fchmod(inner, 0o755)
                os.fstat(inner)
            finally:
                os.close(inner)
        return len(mine) + len(theirs)
    finally:
        os.close(source)
        os.close(target)


def cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=12)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-copy-split-"))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = os.fork()  # one thread here: nothing else runs yet
    if child == 0:
        ours.close()
        helper(theirs)
    theirs.close()
    try:
        make_project(folder / "project", args.files, args.blocks)
        pinned = pin(folder / "project")
        time.sleep(RACY_NS / 1e9 + 0.5)  # past the racy window: files copied by sendfile, as in a review
        sides: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in SIDES}
        helpers: list[tuple[float, float, float, float]] = []
        unqueued: list[float] = []
        """One process's copy, wall less its wait for a CPU."""
        for index in range(args.rounds):
            names = list(sides)
            for name in names if index % 2 else reversed(names):
                with WorkspaceView(1 << 30, 1_000_000) as view:
                    started, used = time.perf_counter(), cpu_s()
                    beside = subprocess.Popen(BESIDE) if name.endswith(WITH_START) else None
                    if name.startswith("one process"):
                        waited = queue_wait_ns()
                        made = len(
                            copy_workspace(pinned.fd, view.mount_fd, OWNER, max_entries=10**6, max_bytes=1 << 40)
                        )
                        if beside is None:
                            unqueued.append(time.perf_counter() - started - (queue_wait_ns() - waited) / 1e9)
                    else:
                        made = split_copy(ours, pinned.fd, view.mount_fd, helpers if beside is None else [])
                    sides[name][0].append(time.perf_counter() - started)
                    sides[name][1].append(cpu_s() - used)
                    if beside is not None:
                        beside.wait()
                if made < args.files:
                    raise SystemExit(f"{name} copied {made} files of {args.files}")
        print(
            f"the copy of {args.files} files of {args.blocks} blocks, {args.rounds} interleaved rounds, p50, load {os.getloadavg()[0]:.1f}:"
        )
        for name, (wall, cpu) in sides.items():
            print(
                f"  {name:<32} {statistics.median(wall) * 1000:6.1f} ms wall, this process's CPU {statistics.median(cpu) * 1000:5.1f} ms"
            )
        its_wall, its_cpu, its_wait, own = (statistics.median(times[i] for times in helpers) * 1000 for i in range(4))
        print(f"  the helper's half: {its_wall:.1f} ms wall, {its_cpu:.1f} ms CPU, {its_wait:.1f} ms waiting for a CPU")
        print(
            f"  wall less the wait for a CPU (an idle machine's, if nothing else held them): one process"
            f" {statistics.median(unqueued) * 1000:.1f} ms; two, this process's half {own:.1f} ms, the helper's"
            f" {its_wall - its_wait:.1f} ms"
        )
    finally:
        ours.send(b"")
        ours.close()
        os.waitpid(child, 0)
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
