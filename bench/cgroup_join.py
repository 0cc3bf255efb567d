"""What joining the run's cgroup costs a spawn, v1 against v2, side by side in one run (decision 58).

Spawns `/bin/true` with `subprocess.run` and a `preexec_fn`, in interleaved rounds, with a pause
between spawns as a gateway has between runs (back to back, the cost hides: the kernel's
threadgroup lock stays in its slow mode for a grace period after a writer):
    - bare: an empty preexec_fn (the same fork path, no join);
    - v1 `tasks` (RunCgroup.join: the thread moves itself) and v1 `cgroup.procs` (diagnostic);
    - v2 `cgroup.procs` (RunCgroup2.join: v2 has no `tasks`; the move waits for an RCU grace period);
    - v2 `clone3(CLONE_INTO_CGROUP)` + exec, by ctypes, without subprocess (diagnostic: the
      child is born in the group, nothing moves).
A side whose hierarchy this host lacks is left out. Must run as root; the groups it makes are
removed at the end.

    .venv/bin/python bench/cgroup_join.py [--rounds 40] [--pause-ms 50]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sandbox.backends import cgroup, cgroup2
from sandbox.backends.cgroup2 import RunCgroup2, V2Root

TRUE = "/bin/true"
CLONE_INTO_CGROUP = 0x200000000
SYS_CLONE3 = 435  # x86_64


class CloneArgs(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls", "set_tid",
            "set_tid_size", "cgroup",
        )
    ]  # fmt: skip


def timed(spawn: Callable[[], None]) -> float:
    started = time.perf_counter()
    spawn()
    return (time.perf_counter() - started) * 1000


def by_subprocess(preexec: Callable[[], None]) -> Callable[[], None]:
    return lambda: subprocess.run([TRUE], preexec_fn=preexec, check=True)  # single-threaded: preexec_fn is safe


def by_clone3(folder: Path) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    args = CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=folder_fd)

    def spawn() -> None:
        pid = libc.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:
            os.execv(TRUE, [TRUE])  # noqa: S606  (a fixed argv, no shell)  the child: straight to exec, as a spawn helper would
        if pid < 0:
            raise OSError(ctypes.get_errno(), "clone3")
        os.waitpid(pid, 0)

    return spawn


@contextlib.contextmanager
def sides() -> Iterator[dict[str, Callable[[], None]]]:
    found: dict[str, Callable[[], None]] = {"bare": by_subprocess(lambda: None)}
    with contextlib.ExitStack() as stack:
        roots = cgroup.discover()
        if roots is not None:
            v1 = cgroup.RunCgroup(roots, "bench-join", 256 << 20, 64)
            stack.callback(v1.close)
            stack.callback(v1.kill_all)
            procs_fd = os.open(roots.group("freezer", "bench-join") / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            stack.callback(os.close, procs_fd)
            found["v1 tasks"] = by_subprocess(v1.join)

            def join_by_procs() -> None:
                os.write(procs_fd, b"0")

            found["v1 cgroup.procs"] = by_subprocess(join_by_procs)
        mount = cgroup2.parse_v2_mount(Path("/proc/self/mountinfo").read_text())
        if mount is not None:
            folder = mount[0] / f"bench-join-{os.getpid()}"
            folder.mkdir()
            stack.callback(folder.rmdir)
            v2 = RunCgroup2(V2Root(folder, frozenset({"kill"})), "run", 256 << 20, 64)
            stack.callback(v2.close)
            stack.callback(v2.kill_all)
            found["v2 cgroup.procs"] = by_subprocess(v2.join)
            found["v2 clone3 into"] = by_clone3(folder / "run")
        yield found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--pause-ms", type=float, default=50.0)
    options = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/cgroup_join.py makes cgroups: run it as root")
    with sides() as spawns:
        times: dict[str, list[float]] = {name: [] for name in spawns}
        for _ in range(options.rounds):
            for name, spawn in spawns.items():
                time.sleep(options.pause_ms / 1000)
                times[name].append(timed(spawn))
    bare = statistics.median(times["bare"])
    print(
        f"{'side':<18} {'p50 ms':>7} {'p90 ms':>7} {'x bare':>7}   ({options.rounds} rounds, {options.pause_ms:g} ms apart)"
    )
    for name, values in times.items():
        p50, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        print(f"{name:<18} {p50:7.2f} {p90:7.2f} {p50 / bare:7.2f}")


if __name__ == "__main__":
    main()
