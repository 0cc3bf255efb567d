"""What a writing run costs (decision 78): a formatter over a 2,000-file project, in review mode and bare, side by side.

(a) `ruff format --no-cache .` over a generated project of 2,000 Python files (a tenth of them
    unformatted), in interleaved rounds:
    - bare: `subprocess.run` in a fresh copy of the project (copies made before the clock starts);
    - review, native: `run_sandboxed(writes=ChangeRules(...))` on the pinned project: the copy into
      the view's tmpfs, every layer, the freeze, the change set read;
    - review, bubblewrap: the same with `sandbox.backend: bubblewrap`;
    - read-only, native: `run_sandboxed` without `writes` (ruff then fails to write: the sandbox's
      own cost without the copy, for the split).
    Target: review p50 at most 1.3x bare. Each side prints its p50 and p10-p90, the ratio of its p50 to
    bare's and the p50 and p10-p90 of the ratio within each round (a busy machine moves whole rounds),
    then the CPU time of each run, the gateway's and its waited children's (bubblewrap's left out: its
    own init reaps the tool), which other work on the machine moves less than the wall clock.
(b) the pieces beside their floors (decision 101), 10 interleaved rounds: the gateway's copy of the project into a
    view against `cp -a` and `tar | tar` of it into the same kind of tmpfs; reading back a copy `ruff format`
    changed against one bare `scandir` + `lstat` walk of it; then the floor of any copy-based review,
    bare + read-only's start + C copy + bare walk, from (a)'s p50s of the same run. For 1, 4 and 16 MiB of
    changed files (64 KiB each), reading the change set plus rendering the patch, per changed MiB;
    and, for comparison with the rejected overlayfs, the time to make (not mount) an overlay over
    the project with its upper on a tmpfs; and what two threads of one process make of a copy's
    system calls (40,000 fstat calls on one thread and split over two, decision 104).

(c) (a) again as an ordinary uid (`--rootless-uid`, setpriv): a rootless gateway's runs, where the
    run's child makes the copy's tmpfs and the gateway fills it.

Must run as root. About 15 s.

`--blocks N` makes each module N times as long (N functions and classes; 1: 16 lines, 12: about
190, the size of a typical module), so the formatter's work grows with the bytes to copy.

    .venv/bin/python bench/change_set.py [--rounds 10] [--files 2000] [--blocks 1] [--rootless-uid 64076]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandbox import Limits, probe_host, run_sandboxed  # noqa: E402
from sandbox.backends.view import WorkspaceView  # noqa: E402
from sandbox.change_set import ChangeRules, read_changes  # noqa: E402
from sandbox.limits import Backend  # noqa: E402
from sandbox.patch import render_patch  # noqa: E402
from sandbox.pinned import Pinned, pin  # noqa: E402
from sandbox.workspace_copy import Owner, copy_workspace  # noqa: E402

TARGET_RATIO = 1.3
ROOTLESS_UID = 64076
"""An ordinary uid with no account, for the rootless side (not a pool uid, not the tests' own)."""
RUFF = Path(sys.prefix) / "bin" / "ruff"
ARGV = [str(RUFF), "format", "--no-cache", "."]
RULES = ChangeRules(max_files=1000, max_bytes=16 << 20)
MIB = 1 << 20

FORMATTED = '''"""Module {n}."""


def function_{n}(value: int) -> int:
    total = 0
    for index in range(value):
        total += index * {n}
    return total


class Thing{n}:
    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> str:
        return f"{{self.name}} #{n}"
'''
UNFORMATTED = "def  f_{n}( a,b ) :\n  return {{'a':a,'b':b}}\nx_{n}=[1,2,3 ,4]\n"


def make_project(root: Path, files: int, blocks: int = 1) -> None:
    """`files` modules in 40 packages, each of `blocks` functions and classes; one in ten needs formatting."""
    random.seed(files)
    for n in range(files):
        package = root / f"pkg{n % 40:02}"
        package.mkdir(parents=True, exist_ok=True)
        body = "\n\n".join(FORMATTED.format(n=n * 1000 + k) for k in range(blocks))
        text = body + (UNFORMATTED.format(n=n) if n % 10 == 0 else "")
        (package / f"mod{n}.py").write_text(text)
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


def limits(folder: Path, backend: Backend) -> Limits:
    return Limits(
        timeout_s=120,
        memory_limit_mb=2048,
        max_processes=128,  # ruff's threads count as tasks
        max_output_bytes=1 << 22,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(folder / "scratch"), "HOME": str(folder / "scratch")},
        backend=backend,
    )


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def spread(samples: list[float], scale: float = 1000, digits: int = 1) -> str:
    """p10-p90 of `samples` (nearest rank), scaled (ms by default)."""
    ordered = sorted(samples)
    low, high = ordered[len(ordered) // 10], ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)]
    return f"{low * scale:.{digits}f}-{high * scale:.{digits}f}"


def cpu_s() -> float:
    """CPU time (user + system) of this process and of every child it has waited for: a busy machine moves it less."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def timed(samples: list[float], action: Callable[[], Awaitable[None]], cpu: list[float] | None = None) -> None:
    started, used = time.perf_counter(), cpu_s()
    await action()
    samples.append(time.perf_counter() - started)
    if cpu is not None:
        cpu.append(cpu_s() - used)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=1, help="functions and classes per module (12: ~190 lines)")
    parser.add_argument("--rootless-uid", type=int, default=ROOTLESS_UID, help="0: no rootless side")
    parser.add_argument("--inner-rootless", type=Path, help=argparse.SUPPRESS)  # the rootless side, as that uid
    args = parser.parse_args()
    if args.inner_rootless is not None:
        return anyio.run(
            functools.partial(run_all, args.inner_rootless, args.rounds, args.files, args.blocks, rootless=True)
        )
    if os.geteuid() != 0:
        print("run as root: the workspace view is made by root, and the rootless side is run as another uid")
        return 1
    folder = Path(tempfile.mkdtemp(prefix="bench-change-set-"))
    folder.chmod(0o755)
    try:
        code = anyio.run(run_all, folder, args.rounds, args.files, args.blocks)
    finally:
        shutil.rmtree(folder)
    if code == 0 and args.rootless_uid:
        code = rootless_side(args.rootless_uid, args.rounds, args.files, args.blocks)
    return code


def rootless_side(uid: int, rounds: int, files: int, blocks: int) -> int:
    """The same as an ordinary user's gateway runs it (decision 57): this script again, as `uid`, in its own folder."""
    folder = Path(tempfile.mkdtemp(prefix="bench-change-set-rootless-"))
    folder.chmod(0o755)
    os.chown(folder, uid, uid)
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", sys.executable, __file__]
    command += [
        "--inner-rootless",
        str(folder),
        "--rounds",
        str(rounds),
        "--files",
        str(files),
        "--blocks",
        str(blocks),
    ]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    try:
        done = subprocess.run(command, env=env, cwd="/", check=False, timeout=600)
    finally:
        shutil.rmtree(folder)
    return done.returncode


async def run_all(folder: Path, rounds: int, files: int, blocks: int = 1, *, rootless: bool = False) -> int:
    project = folder / "project"
    make_project(project, files, blocks)
    (folder / "scratch").mkdir()
    bare_copies = []
    for index in range(rounds + 1):
        copy = folder / f"bare{index}"
        shutil.copytree(project, copy)
        bare_copies.append(copy)
    pinned = pin(project)
    sides: dict[str, list[float]] = {"bare": [], "review native": [], "review bubblewrap": [], "read-only native": []}
    backends: list[Backend] = ["native", "bubblewrap"] if probe_host().mount_tree else ["native"]
    if "bubblewrap" not in backends:
        del sides["review bubblewrap"]
    changed: list[int] = []
    cpu: dict[str, list[float]] = {name: [] for name in sides}

    async def bare(copy: Path) -> None:
        result = await anyio.to_thread.run_sync(
            lambda: subprocess.run(ARGV, cwd=copy, capture_output=True, check=False)
        )
        if result.returncode != 0:
            raise SystemExit(f"bare ruff failed: {result.stderr[-500:]!r}")

    async def sandboxed(backend: Backend, *, writes: bool) -> None:
        out, err = folder / f"{uuid.uuid4().hex}.out", folder / f"{uuid.uuid4().hex}.err"
        result = await run_sandboxed(
            ARGV,
            pinned,
            limits(folder, backend),
            out,
            err,
            scratch=folder / "scratch",
            writes=RULES if writes else None,
        )
        if writes:
            if result.exit_code != 0 or result.changes is None:
                raise SystemExit(f"review run failed: {result} {err.read_text()[-500:]}")
            changed.append(len(result.changes.changes))

    for index in range(rounds + 1):  # the first round warms up
        order: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("bare", functools.partial(bare, bare_copies[index])),
            ("review native", lambda: sandboxed("native", writes=True)),
            ("read-only native", lambda: sandboxed("native", writes=False)),
        ]
        if "bubblewrap" in backends:
            order.append(("review bubblewrap", lambda: sandboxed("bubblewrap", writes=True)))
        shift = index % len(order)
        for name, action in order[shift:] + order[:shift]:
            samples: list[float] = [] if index == 0 else sides[name]
            await timed(samples, action, [] if index == 0 else cpu[name])
    base = p50_ms(sides["bare"])
    who = f"rootless (uid {os.getuid()}, rootless={probe_host().rootless})" if rootless else "root"
    print(
        f"(a) {who}: ruff format over {files} files of {blocks} blocks ({files // 10} to reformat), {rounds} rounds,"
        " p50 (p10-p90), its ratio to bare's p50, and the p50 (p10-p90) of the ratio within each round:"
    )
    for name, samples in sides.items():
        paired = [side / bare for side, bare in zip(samples, sides["bare"], strict=True)]
        print(
            f"  {name:<22}{p50_ms(samples):>9.1f} ms ({spread(samples)}){p50_ms(samples) / base:>8.2f}x"
            f"   per round {statistics.median(paired):.2f}x ({spread(paired, 1, 2)})"
        )
    print("  CPU time of each run (the gateway's and its children's), p50 (p10-p90) and its ratio to bare's:")
    for name, used in cpu.items():
        if "bubblewrap" in name:  # bwrap's own init reaps the tool: its time never reaches this process
            continue
        print(f"  {name:<22}{p50_ms(used):>9.1f} ms ({spread(used)}){p50_ms(used) / p50_ms(cpu['bare']):>8.2f}x")
    ratio = p50_ms(sides["review native"]) / base
    print(
        f"  review native / bare: {ratio:.2f}x ({'met' if ratio <= TARGET_RATIO else 'NOT met'}, aim {TARGET_RATIO}x)"
    )
    print(f"  files in each review's change set: {sorted(set(changed))}", flush=True)
    if not rootless:
        walls = {name: p50_ms(sides[name]) for name in ("bare", "read-only native", "review native")}
        cpus = {name: p50_ms(cpu[name]) for name in walls}
        pieces(folder, pinned, walls, cpus)
    return 0


def pieces(folder: Path, pinned: Pinned, walls: dict[str, float], cpus: dict[str, float]) -> None:
    """(b): the review's pieces beside their floors, in interleaved rounds, then the floor of any copy-based review
    from (a)'s p50s (`walls`, `cpus`: bare, read-only native and review native), in wall and in CPU time."""
    floors = copy_floors(folder / "project", pinned)
    print(
        "(b) the pieces beside their floors, p50 of 10 interleaved rounds, wall (CPU of this process and its children):"
    )
    for name, (wall, used) in floors.items():
        print(f"    {name:<44}{p50_ms(wall):>7.1f} ms ({p50_ms(used):.1f} ms CPU)")
    cheapest = min(("cp -a", "tar -cf - | tar -xpf -"), key=lambda name: p50_ms(floors[name][0]))
    walk = floors["bare walk of the copy (scandir + lstat)"]
    for what, sides, index in (("wall", walls, 0), ("CPU", cpus, 1)):
        bare, start = sides["bare"], sides["read-only native"] - sides["bare"]
        c_copy, bare_read = p50_ms(floors[cheapest][index]), p50_ms(walk[index])
        floor = bare + start + c_copy + bare_read
        review = sides["review native"]
        print(
            f"    floor ({what}): bare {bare:.1f} + read-only's start {start:.1f} + C copy ({cheapest}) {c_copy:.1f}"
            f" + bare walk {bare_read:.1f} = {floor:.1f} ms, {floor / bare:.2f}x bare; review {review:.1f} ms"
            f" ({review / bare:.2f}x), {review - floor:+.1f} ms above it"
        )
    for mib in (1, 4, 16):
        with WorkspaceView(1 << 30, 100_000) as view:
            originals = copy_workspace(pinned.fd, view.mount_fd, Owner(0, 0), max_entries=100_000, max_bytes=1 << 30)
            root = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=view.mount_fd)
            try:
                base = Path(f"/proc/self/fd/{root}")
                line = b"    value = compute(first, second) + offset  # 48\n"
                for n in range(mib * 16):
                    (base / f"pkg{n % 40:02}" / f"changed{n}.py").write_bytes(line * (64 * 1024 // len(line) + 1))
                view.freeze()
                started = time.perf_counter()
                rules = ChangeRules(max_files=10_000, max_bytes=64 << 20)
                changes = read_changes(view.mount_fd, originals, rules, pinned.fd)
                read = time.perf_counter() - started
                render_patch(changes)
                rendered = time.perf_counter() - started - read
            finally:
                os.close(root)
        print(
            f"    {mib:>2} MiB in {len(changes.changes)} new files of 48-byte lines: read {read * 1000:.1f} ms"
            f" ({read * 1000 / mib:.1f} per MiB), patch {rendered * 1000:.1f} ms ({rendered * 1000 / mib:.1f} per MiB)"
        )
    print(
        f"    overlayfs made over the project (rejected): {overlay_ms(folder, pinned):.2f} ms (p50 of 10, not mounted)"
    )
    handoff = gil_handoff(pinned.fd)
    print(
        f"    {HANDOFF_CALLS:,} fstat calls (a copy's calls, decision 104), wall (CPU) p50 of 10: one thread"
        f" {p50_ms(handoff[1][0]):.1f} ms ({p50_ms(handoff[1][1]):.1f}), split over two threads"
        f" {p50_ms(handoff[2][0]):.1f} ms ({p50_ms(handoff[2][1]):.1f})"
    )


def copy_floors(project: Path, pinned: Pinned) -> dict[str, tuple[list[float], list[float]]]:
    """The gateway's copy against the cheapest copies C tools make of the same tree into the same kind of tmpfs
    (a WorkspaceView, root's: `cp -a` and a tar pipe keep owners, modes and times, as the copy does), and reading
    back a copy ruff changed against one bare scandir + lstat walk of it, in interleaved rounds."""
    found: dict[str, tuple[list[float], list[float]]] = {}
    owner = Owner(ROOTLESS_UID, ROOTLESS_UID)  # given away, as to a run's pool uid

    def note(name: str, started: float, used: float) -> None:
        wall, cpu = found.setdefault(name, ([], []))
        wall.append(time.perf_counter() - started)
        cpu.append(cpu_s() - used)

    def into(view: WorkspaceView) -> str:
        return f"/proc/{os.getpid()}/fd/{view.mount_fd}"

    for _ in range(10):
        with WorkspaceView(1 << 30, 100_000) as view:
            started, used = time.perf_counter(), cpu_s()
            originals = copy_workspace(pinned.fd, view.mount_fd, owner, max_entries=100_000, max_bytes=1 << 30)
            note("the gateway's copy (copy_workspace)", started, used)
            subprocess.run([*ARGV[:-1], into(view)], capture_output=True, check=True)  # ruff's 200 changes
            view.freeze()
            started, used = time.perf_counter(), cpu_s()
            changes = read_changes(view.mount_fd, originals, RULES, pinned.fd, run_owner=owner)
            note(f"reading the set back ({len(changes.changes)} files changed)", started, used)
            root = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=view.mount_fd)
            try:
                started, used = time.perf_counter(), cpu_s()
                bare_walk(root)
                note("bare walk of the copy (scandir + lstat)", started, used)
            finally:
                os.close(root)
        with WorkspaceView(1 << 30, 100_000) as view:
            started, used = time.perf_counter(), cpu_s()
            subprocess.run(["cp", "-a", "--", f"{project}/.", f"{into(view)}/"], check=True)
            note("cp -a", started, used)
        with WorkspaceView(1 << 30, 100_000) as view:
            started, used = time.perf_counter(), cpu_s()
            pipe = f"tar -C {project} -cf - . | tar -C {into(view)} -xpf -"
            subprocess.run(["sh", "-c", pipe], check=True)
            note("tar -cf - | tar -xpf -", started, used)
    return found


HANDOFF_CALLS = 40_000
"""About the system calls of the bench project's copy (2,000 files, 10 a file, twice): what two threads of one
process make of them (decision 104: each call hands the GIL to the other thread and takes it back)."""


def gil_handoff(fd: int) -> dict[int, tuple[list[float], list[float]]]:
    """HANDOFF_CALLS `os.fstat` calls on one thread, and split over two, in interleaved rounds: wall and CPU."""

    def calls(count: int) -> None:
        for _ in range(count):
            os.fstat(fd)

    found: dict[int, tuple[list[float], list[float]]] = {1: ([], []), 2: ([], [])}
    for _ in range(10):
        for threads in (1, 2):
            started, used = time.perf_counter(), cpu_s()
            workers = [threading.Thread(target=calls, args=(HANDOFF_CALLS // threads,)) for _ in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            found[threads][0].append(time.perf_counter() - started)
            found[threads][1].append(cpu_s() - used)
    return found


def bare_walk(folder: int) -> int:
    """One lstat per entry beneath `folder`, nothing else: the floor of reading a copy back."""
    count = 0
    for entry in os.scandir(folder):
        os.stat(entry.name, dir_fd=folder, follow_symlinks=False)
        count += 1
        if entry.is_dir(follow_symlinks=False):
            inner = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            try:
                count += bare_walk(inner)
            finally:
                os.close(inner)
    return count


def overlay_ms(folder: Path, pinned: Pinned) -> float:
    """fsopen("overlay") + fsconfig + fsmount over the project, its upper and work folders on a tmpfs; no mount."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    upper = folder / "overlay"
    upper.mkdir()
    samples = []
    for index in range(10):
        with WorkspaceView(64 << 20, 1000) as tmpfs:
            started = time.perf_counter()
            root = f"/proc/self/fd/{tmpfs.mount_fd}"
            os.mkdir(f"{root}/u{index}")
            os.mkdir(f"{root}/w{index}")
            context = libc.syscall(430, b"overlay", 1)
            if context < 0:
                return float("nan")
            options = {
                b"lowerdir": f"/proc/self/fd/{pinned.fd}".encode(),
                b"upperdir": f"{root}/u{index}".encode(),
                b"workdir": f"{root}/w{index}".encode(),
            }
            for key, value in options.items():
                if libc.syscall(431, context, 1, key, value, 0) < 0:
                    os.close(context)
                    return float("nan")
            created = libc.syscall(431, context, 6, None, None, 0)
            mount = libc.syscall(432, context, 1, 0) if created == 0 else -1
            samples.append(time.perf_counter() - started)
            os.close(context)
            if mount >= 0:
                os.close(mount)
            else:
                return float("nan")
    return p50_ms(samples)


if __name__ == "__main__":
    sys.exit(main())
