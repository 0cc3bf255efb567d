"""What the sandbox costs, side by side in one run: a trivial command, and the sample suite through the gateway.

(a) `<venv python> -I -c pass`, started in interleaved rounds by
    - bare `subprocess.run`, no timeout (CPython then blocks in waitpid);
    - `sandbox.run_sandboxed`: a uid from the pool, its own session and cgroup, rlimits,
      network and mount namespaces with the scratch tmpfs, Landlock, seccomp, watched on a
      pidfd, then the cgroup emptied;
    - the same as an ordinary user's gateway runs it (rootless: a user namespace per run, made
      by the child; decision 57), through a worker process of an ordinary uid, one pipe round trip
      a run; and as root without CAP_SYS_ADMIN (a pool uid, then the rootless steps);
    - `sandbox.run_unsafe_unconfined`: the same supervision (session, pidfd wait, output
      cap) with no confinement;
    - diagnostics, to see where the difference goes: `subprocess.run(timeout=...)` (CPython
      polls), an empty `preexec_fn` (fork instead of vfork), the layers alone (cgroup and
      tmpfs made, `ChildPlan` as `preexec_fn`, blocking wait, one uid held for the whole
      run), the same without the cgroup, the uid pool's acquire + release, and the sweep of
      a uid with no process.
    Target: run_sandboxed p50 at most 1.35x bare.
(b) the sample project's suite (`examples/sample_project`, `tests`), in the workspace that
    tests.harness.GatewayHome copies it to, in interleaved rounds, all in that one folder:
    - bare `python -m pytest -q tests`, as a developer runs it (PYTEST_* variables dropped);
    - bare pytest with the gateway's argv and environment (`gateway.tools.run_pytest`:
      `python -I -B`, `--rootdir`/`--confcutdir`/`-c`, `-p no:cacheprovider`,
      PYTEST_DISABLE_PLUGIN_AUTOLOAD=1), not confined; the same under `run_unsafe_unconfined`;
    - the run_pytest tool in this process (`run_pytest.execute`: the sandbox, the junit copy and
      parse; no server, no consent, no audit);
    - a `run_pytest` tools/call through `mcp-gateway serve` over stdio by a USER whose client
      answers the consent prompt (elicitation) with allow_once: it includes that round trip,
      authentication, the audit appends, the artifacts and evidence.json.
    Target: the gateway's p50 at most 1.0x bare `python -m pytest`.
    The bare sides wait without a timeout, as a developer's shell does.
(c) the trivial command again, the tree before decision 95 (`--before`, default 4934e5f, by `git
    archive`) against this one, each side an interpreter of its own tree (only that tree's `sandbox`
    importable) that times its own spawns, in interleaved rounds: bare `subprocess.run`, run_sandboxed
    on both backends, and the floor of a native run (a `preexec_fn` that makes the PID namespace and
    forks its two supervisors, no other layer), each in a small process (`sandbox` imported, about
    20 MB) and in one holding 100 MB more of Python objects, the size of a `serve` (a run forks it:
    its page tables are copied, then torn down). The difference between the two sizes is the most a
    small spawner forked before the heavy imports could save; a request to one is measured too
    (a socket pair to another process, four descriptors). Prints p50/p90, each side's CPU time per
    spawn (its own and its children's), and the ratios.

Every side gets unmeasured warm-up rounds first; the measured rounds rotate the order so
machine noise falls on all alike. Must run as root (the sandbox drops to a pool uid). Exits
0 with the figures whether or not the targets are met; 1 if a run fails, if a round would
start past `--deadline`, or (a hard stop, for a wait with no timeout) `--deadline` + 30 s.

    .venv/bin/python bench/sandbox_cost.py [--rounds 30] [--suite-rounds 10] [--warmup 2] [--parts abc]
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import math
import os
import pickle
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.harness: the state folder the end-to-end tests use

from gateway.policy import SandboxPolicy  # noqa: E402
from gateway.tools import run_pytest  # noqa: E402
from gateway.tools.base import ExecutionRequest  # noqa: E402
from gateway.tools.confined import sandbox_environment  # noqa: E402
from sandbox import Limits, probe_host, run_sandboxed, run_unsafe_unconfined  # noqa: E402
from sandbox import runner as sandbox_runner  # noqa: E402
from sandbox.backends.cgroup import CgroupRoots, RunCgroup, discover  # noqa: E402
from sandbox.backends.cgroup2 import discover_v2  # noqa: E402
from sandbox.backends.containment import sweep  # noqa: E402
from sandbox.backends.identity import RunIdentity, UidPool  # noqa: E402
from sandbox.backends.landlock import runtime_read_only_paths  # noqa: E402
from sandbox.backends.scratch import ScratchSpace, files_for  # noqa: E402
from sandbox.confine import ChildPlan, LayerReport, RunGroups  # noqa: E402
from sandbox.errors import SandboxStartError  # noqa: E402
from sandbox.layers import Layer  # noqa: E402
from sandbox.limits import LAYERS  # noqa: E402
from sandbox.pinned import pin  # noqa: E402
from tests.harness import GatewayHome, StdioSession, reachable_by_everyone  # noqa: E402

TARGET_TRIVIAL_RATIO = 1.35
TARGET_SUITE_RATIO = 1.0
USER = "alice"
CALL_TIMEOUT_S = 30
TRIVIAL = [sys.executable, "-I", "-c", "pass"]
SUITE_ARGUMENTS = {"test_path": "tests"}
# The diagnostics' own uids, apart from the default pool (gateways) and the tests' pools: the sweep
# diagnostic kills whatever runs as its uid, so that uid must never be a live gateway's run's.
BENCH_POOL = range(62500, 62600)
EXPECTED_EVENTS = ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "SANDBOX_EXEC", "TOOL_FINISHED"]


def outputs(folder: Path) -> tuple[Path, Path]:
    """New stdout and stderr paths for one run (the capture creates its files, never reuses one)."""
    name = uuid.uuid4().hex
    return folder / f"{name}.stdout", folder / f"{name}.stderr"


class BenchError(Exception):
    """A run failed or answered wrongly, or the bench ran out of time."""


@dataclass
class Side:
    """One way of running the thing measured: an awaitable that raises unless the run went right."""

    label: str
    once: Callable[[], Awaitable[None]]
    samples: list[int] = field(default_factory=list)

    def p50_ms(self) -> float:
        return statistics.median(self.samples) / 1e6

    def p90_ms(self) -> float:
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)] / 1e6  # nearest rank

    def mean_ms(self) -> float:
        return statistics.fmean(self.samples) / 1e6


async def measure(sides: Sequence[Side], rounds: int, warmup: int, deadline: float) -> None:
    """`warmup` unmeasured rounds, then `rounds` measured, each in an order rotated by one."""
    for index in range(warmup + rounds):
        if time.monotonic() > deadline:
            raise BenchError("not done by --deadline")
        shift = index % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            started = time.perf_counter_ns()
            await side.once()
            elapsed = time.perf_counter_ns() - started
            if index >= warmup:
                side.samples.append(elapsed)


def print_rows(sides: Sequence[Side], base: Side, base_name: str) -> None:
    print(f"  {'':<58}{'p50 ms':>8}{'p90 ms':>8}{'mean ms':>9}{'p50/' + base_name:>12}")
    for side in sides:
        figures = f"{side.p50_ms():>8.1f}{side.p90_ms():>8.1f}{side.mean_ms():>9.1f}"
        print(f"  {side.label:<58}{figures}{side.p50_ms() / base.p50_ms():>11.2f}x")


def note(text: str, indent: int = 2) -> None:
    """A paragraph under a table, wrapped."""
    print(textwrap.fill(text, 118, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2)))


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x: {'met' if ratio <= target else 'NOT met'}"


# --- (a) a trivial command ----------------------------------------------------------------------


def generous_limits(env: dict[str, str]) -> Limits:
    """Limits no run of this bench comes near: the cost measured is the layers', not a limit's."""
    return Limits(timeout_s=CALL_TIMEOUT_S, memory_limit_mb=1024, max_processes=64, max_output_bytes=1 << 22, env=env)


@dataclass(frozen=True)
class LayersAlone:
    """What one run of the layers-alone diagnostic needs: one uid for the whole bench, run_sandboxed's grants."""

    identity: RunIdentity
    scratch: Path
    read_only: tuple[Path, ...]
    limits: Limits
    cwd: Path
    env: dict[str, str]


def layers_alone(alone: LayersAlone, group_roots: CgroupRoots | None) -> Callable[[], Awaitable[None]]:
    """Every layer as run_sandboxed applies it (the cgroup only with `group_roots`), with a blocking wait."""
    limits, identity = alone.limits, alone.identity
    quiet: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

    async def once() -> None:
        group = RunCgroup(group_roots, f"run-{identity.uid}", 1 << 30, 64) if group_roots else None
        space = ScratchSpace(
            alone.scratch, limits.scratch_bytes, files_for(limits.scratch_bytes), identity.uid, identity.gid
        )
        read_write = (alone.scratch, Path(os.devnull))
        try:
            with space, ChildPlan(limits, identity, alone.read_only, read_write, group=group, scratch=space) as preexec:
                process = subprocess.Popen(
                    TRIVIAL,
                    cwd=alone.cwd,
                    env=alone.env,
                    start_new_session=True,
                    preexec_fn=preexec,  # noqa: PLW1509  (the bench spawns from one thread)
                    **quiet,
                )
                if process.wait() != 0:
                    raise BenchError(f"layers alone: exit code {process.returncode}")
        finally:
            if group is not None:
                group.kill_all()
                group.close()

    return once


ROOTLESS_UID = 64090
"""The ordinary uid of the rootless side (no account needed): not root, not a pool uid."""

_ROOTLESS_WORKER = """
import pathlib, shutil, sys, tempfile
import anyio
from sandbox import Limits, run_sandboxed
cwd, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
argv = sys.argv[3:]
limits = Limits(timeout_s=30, memory_limit_mb=1024, max_processes=64, max_output_bytes=1 << 22,
                env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
for line in sys.stdin:
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="scratch-", dir=out))
    name = scratch.name
    result = anyio.run(lambda: run_sandboxed(argv, cwd, limits, out / f"{name}.out", out / f"{name}.err", scratch=scratch))
    shutil.rmtree(scratch, ignore_errors=True)
    ok = result.exit_code == 0 and "user_namespace" in result.layers and "uid_drop" not in result.layers
    print("ok" if ok else f"bad {result}", flush=True)
"""


class RootlessWorker:
    """A process of an ordinary uid that runs `run_sandboxed` on request: the rootless side, interleaved with the others.

    Its runs take the rootless path because the worker is not root; each request is one line
    on a pipe and one answer back, a round trip of tens of microseconds next to the spawn.
    """

    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        for sub in ("cwd", "out"):
            (folder / sub).mkdir()
        os.chown(folder / "out", ROOTLESS_UID, ROOTLESS_UID)
        reachable_by_everyone(folder)
        command = ["setpriv", f"--reuid={ROOTLESS_UID}", f"--regid={ROOTLESS_UID}", "--clear-groups", "--"]
        command += [sys.executable, "-c", _ROOTLESS_WORKER, str(folder / "cwd"), str(folder / "out"), *TRIVIAL]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd="/")

    async def once(self) -> None:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(b"go\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline().decode().strip()
        if answer != "ok":
            raise BenchError(f"rootless run_sandboxed: {answer or 'the worker died'}")

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=CALL_TIMEOUT_S)


def confined(
    root: Path,
    cwd: Path,
    out: Path,
    limits: Limits,
    *,
    host: LayerReport | None = None,
    layers: frozenset[Layer] = frozenset(),
) -> Callable[[], Awaitable[None]]:
    """`run_sandboxed` of the trivial command, as `host` says this host is (default: probed); it must get `layers`."""

    async def once() -> None:
        scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=root))
        result = await run_sandboxed(TRIVIAL, cwd, limits, *outputs(out), scratch=scratch, host=host)
        if result.exit_code != 0 or result.killed_by is not None or not layers <= set(result.layers):
            raise BenchError(f"run_sandboxed ({limits.backend}): {result}")

    return once


def on_cgroup_v2(root: Path, cwd: Path, out: Path, limits: Limits) -> Callable[[], Awaitable[None]]:
    """`run_sandboxed` with the run's group made on cgroup v2, as a v2-only host's gateway makes it.

    This host's probe picks v1 (it has the memory and pids hierarchies); for this side alone the
    runner is handed the unified hierarchy's groups, which here can kill and freeze but hold no
    memory or pids controller (v1 has them): what is measured is a v2 group's making, joining
    (through cgroup.procs) and killing, the part of a v2 run that differs from v1."""
    found = discover_v2()
    if found.root is None:
        raise BenchError(f"no cgroup v2 groups here: {found.reason}")
    groups = RunGroups(2, found.root)
    side = confined(root, cwd, out, limits, host=dataclasses.replace(probe_host(), cgroup_version=2))

    async def once() -> None:
        saved = sandbox_runner.run_groups
        sandbox_runner.run_groups = lambda: groups  # this side only; restored below
        try:
            await side()
        finally:
            sandbox_runner.run_groups = saved

    return once


def trivial_sides(root: Path, pool: UidPool) -> tuple[list[Side], Callable[[], None]]:
    """The sides of (a), and what to call afterwards to give back the diagnostic's uid."""
    cwd = root / "cwd"
    cwd.mkdir()
    reachable_by_everyone(cwd)  # 0755, as a workspace must be for the run uid
    out = root / "out"
    out.mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    limits = generous_limits(env)
    quiet: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

    def check(label: str, exit_code: int | None, killed_by: object = None) -> None:
        if exit_code != 0 or killed_by is not None:
            raise BenchError(f"{label}: exit code {exit_code}, killed by {killed_by}")

    async def bare() -> None:
        # No timeout: CPython then waits in a blocking waitpid (bounded by the hard stop in main).
        check("bare", subprocess.run(TRIVIAL, cwd=cwd, env=env, check=False, **quiet).returncode)

    async def bare_timeout() -> None:
        done = subprocess.run(TRIVIAL, cwd=cwd, env=env, check=False, timeout=CALL_TIMEOUT_S, **quiet)
        check("bare with a timeout", done.returncode)

    sandboxed = confined(root, cwd, out, limits)
    sandboxed_bubblewrap = confined(root, cwd, out, dataclasses.replace(limits, backend="bubblewrap"))

    async def unconfined() -> None:
        result = await run_unsafe_unconfined(TRIVIAL, cwd, limits, *outputs(out))
        check("run_unsafe_unconfined", result.exit_code, result.killed_by)

    # Root without CAP_SYS_ADMIN (a default container): a pool uid, then the rootless steps.
    no_sys_admin = dataclasses.replace(probe_host(), user_namespace=True)
    sandboxed_pool_userns = confined(
        root, cwd, out, limits, host=no_sys_admin, layers=frozenset({Layer.UID_DROP, Layer.USER_NAMESPACE})
    )
    rootless = RootlessWorker(root / "rootless")
    sandboxed_v2 = on_cgroup_v2(root, cwd, out, limits)

    # The layers alone: one uid for the whole run, the Landlock grants run_sandboxed gives.
    identity = pool.acquire()
    scratch = Path(tempfile.mkdtemp(prefix="scratch-layers-", dir=root))
    read_only = tuple(dict.fromkeys((*runtime_read_only_paths(), cwd)))
    roots = discover()
    if roots is None:
        raise BenchError("no cgroup v1 memory, pids and freezer hierarchies: the cgroup layer is missing")
    alone = LayersAlone(identity, scratch, read_only, limits, cwd, env)

    async def fork_only() -> None:
        process = subprocess.Popen(TRIVIAL, cwd=cwd, env=env, start_new_session=True, preexec_fn=int, **quiet)  # noqa: PLW1509
        check("empty preexec_fn", process.wait())

    async def uid_pool() -> None:
        pool.release(pool.acquire())

    async def empty_sweep() -> None:
        if sweep(identity.uid):
            raise BenchError("the sweep found a survivor of the layers-alone runs")

    def give_back() -> None:
        rootless.close()
        sweep(identity.uid)
        pool.release(identity)

    sides = [
        Side("subprocess.run (bare; blocking wait)", bare),
        Side("sandbox.run_sandboxed", sandboxed),
        Side("sandbox.run_sandboxed, bubblewrap backend", sandboxed_bubblewrap),
        Side("sandbox.run_sandboxed, rootless (ordinary user)", rootless.once),
        Side("sandbox.run_sandboxed, root w/o CAP_SYS_ADMIN", sandboxed_pool_userns),
        Side("sandbox.run_sandboxed, cgroup v2 group", sandboxed_v2),
        Side("sandbox.run_unsafe_unconfined (supervision, no layers)", unconfined),
        Side(f"diagnostic: subprocess.run(timeout={CALL_TIMEOUT_S})", bare_timeout),
        Side("diagnostic: preexec_fn=int (fork, not vfork), blocking", fork_only),
        Side("diagnostic: the layers alone, blocking wait", layers_alone(alone, group_roots=roots)),
        Side("diagnostic: the layers but the cgroup, blocking wait", layers_alone(alone, group_roots=None)),
        Side("diagnostic: UidPool acquire + release", uid_pool),
        Side("diagnostic: sweep of a uid with no process", empty_sweep),
    ]
    return sides, give_back


async def trivial(root: Path, rounds: int, warmup: int, deadline: float) -> None:
    sides, give_back = trivial_sides(root, UidPool(BENCH_POOL))
    try:
        await measure(sides, rounds, warmup, deadline)
    finally:
        give_back()
    (
        bare,
        sandboxed,
        bubblewrap,
        rootless,
        pool_userns,
        cgroup_v2,
        unconfined,
        bare_timeout,
        forked,
        layers_alone,
        no_cgroup,
        pool,
        swept,
    ) = sides
    print(f"(a) a trivial command, `{' '.join(TRIVIAL)}`: {rounds} rounds interleaved, {warmup} warm-up not measured")
    print_rows(sides, bare, "bare")
    ratio = sandboxed.p50_ms() / bare.p50_ms()
    note(f"target: run_sandboxed p50 <= {TARGET_TRIVIAL_RATIO}x bare: {verdict(ratio, TARGET_TRIVIAL_RATIO)}")
    note(
        f"the bubblewrap backend: {bubblewrap.p50_ms() / bare.p50_ms():.2f}x bare,"
        f" {bubblewrap.p50_ms() - sandboxed.p50_ms():+.1f} ms over the native backend at p50"
    )
    note(
        f"rootless, as an ordinary user: {rootless.p50_ms() / bare.p50_ms():.2f}x bare,"
        f" {rootless.p50_ms() - sandboxed.p50_ms():+.1f} ms over root at p50 (its worker's pipe round trip included);"
        f" root without CAP_SYS_ADMIN: {pool_userns.p50_ms() / bare.p50_ms():.2f}x bare"
    )
    note(
        f"the run's group on cgroup v2 (this host's unified hierarchy: kill and freeze, its memory and pids are v1's):"
        f" {cgroup_v2.p50_ms() / bare.p50_ms():.2f}x bare, {cgroup_v2.p50_ms() - sandboxed.p50_ms():+.1f} ms over v1"
        " at p50 (the join through cgroup.procs waits for an RCU grace period; v1's tasks file does not)"
    )
    note(f"against subprocess.run with a timeout, which polls too: {sandboxed.p50_ms() / bare_timeout.p50_ms():.2f}x")
    note(
        f"where run_sandboxed's {sandboxed.mean_ms() - bare.mean_ms():.1f} ms over bare go (differences of the means,"
        " which add up where medians need not):"
    )
    note(
        f"- the runner's supervision (unconfined - bare): {unconfined.mean_ms() - bare.mean_ms():+.1f} ms. It"
        " waits on a pidfd, so it sees the exit at once; the timer only paces the time-limit and output checks",
        indent=4,
    )
    note(
        f"- the layers (layers alone - bare): {layers_alone.mean_ms() - bare.mean_ms():+.1f} ms, of which"
        f" {forked.mean_ms() - bare.mean_ms():+.1f} ms is fork instead of vfork (any preexec_fn),"
        f" {layers_alone.mean_ms() - no_cgroup.mean_ms():+.1f} ms the cgroup (made, joined, emptied, removed:"
        " a cgroup v1 attach waits for an RCU grace period) and"
        f" {no_cgroup.mean_ms() - forked.mean_ms():+.1f} ms the network and mount namespaces, the scratch tmpfs,"
        " rlimits, uid drop, Landlock and seccomp",
        indent=4,
    )
    note(
        f"- the uid pool's scan of the process table (psutil): {pool.mean_ms():.1f} ms, made while the run before"
        " starts, not before this one (its uid was set aside then, decision 95); a run with a cgroup"
        f" skips the uid sweep ({swept.mean_ms():.1f} ms, another scan)",
        indent=4,
    )
    print()


# --- (c) before and after, and a gateway-sized process -----------------------------------------

BEFORE = "4934e5f"
"""The tree before decision 95: the supervisors forked by os.fork, the pool scanned before each spawn."""
BALLAST_MB = 100
"""About what a `serve` holds (its modules imported and its state, decision 95): the forks of a run copy its page tables."""

_TREE_WORKER = """
import asyncio, os, resource, subprocess, sys, tempfile, time
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
import sandbox
from pathlib import Path
from sandbox import Limits, run_sandboxed
from sandbox.backends import pidns
tree, mode, backend, ballast_mb, cwd, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]), Path(sys.argv[6])
if not sandbox.__file__.startswith(tree):
    sys.exit(f"sandbox from {sandbox.__file__}, not from {tree}")
ballast = [str(i) * 3 for i in range(ballast_mb * 12_000)]  # about ballast_mb MB of small objects, as a heap holds
argv = [sys.executable, "-I", "-c", "pass"]
env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
limits = Limits(timeout_s=30, memory_limit_mb=1024, max_processes=64, max_output_bytes=1 << 22, env=env, backend=backend)
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
loop = asyncio.new_event_loop()  # one for every run, as a gateway has (anyio runs on it)

def floor():
    supervisor = pidns.RunSupervisor(timeout_s=30, status_fd=-1)
    def preexec():
        supervisor.enter()
        supervisor.fork()
    process = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, preexec_fn=preexec, **quiet)
    return process.wait() == 0

def once():
    if mode == "bare":
        return subprocess.run(argv, cwd=cwd, env=env, check=False, **quiet).returncode == 0
    if mode == "floor":
        return floor()
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=out))
    name = scratch.name
    result = loop.run_until_complete(run_sandboxed(argv, cwd, limits, out / f"{name}.out", out / f"{name}.err", scratch=scratch))
    return result.exit_code == 0 and result.killed_by is None

def used():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

print("ready", int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20, flush=True)
for line in sys.stdin:
    started, cpu = time.perf_counter_ns(), used()
    ok = once()
    wall, cpu = time.perf_counter_ns() - started, used() - cpu
    print(f"ok {wall} {int(cpu * 1e9)}" if ok else "bad", flush=True)
"""


@dataclass(frozen=True)
class TreeSpawn:
    """One side of (c): whose `sandbox` (`tree`), what it spawns (`mode`: bare, sandboxed, floor), how big the
    process is, and whether it runs as an ordinary uid."""

    label: str
    tree: Path
    mode: str
    backend: str = "native"
    ballast_mb: int = 0
    rootless: bool = False


class TreeWorker:
    """An interpreter of one tree (`sandbox` from `tree` only) that runs one trivial spawn per request and
    answers its wall time and the CPU time it and its children spent, both measured inside it."""

    def __init__(self, spawn: TreeSpawn, *, cwd: Path, out: Path) -> None:
        """`out` must be writable by the worker's uid: ROOTLESS_UID's for a rootless spawn."""
        command = [sys.executable, "-c", _TREE_WORKER, str(spawn.tree), spawn.mode, spawn.backend]
        command += [str(spawn.ballast_mb), str(cwd), str(out)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(spawn.tree), "HOME": "/"}
        if spawn.rootless:  # an ordinary uid's gateway: a user namespace per run, no pool uid (decision 57)
            uid = f"--reuid={ROOTLESS_UID}", f"--regid={ROOTLESS_UID}"
            command = ["setpriv", *uid, "--clear-groups", "--", *command]
        tree = spawn.tree
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tree)
        self.rss_mb = int(self._answer().removeprefix("ready "))
        self.cpu_ns: list[int] = []

    def _answer(self) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline().decode().strip()
        if not line.startswith(("ready", "ok")):
            raise BenchError(f"a tree worker answered {line or 'nothing (it died)'}")
        return line

    def once(self) -> int:
        """One spawn: its wall time in ns (its CPU time goes to `cpu_ns`)."""
        assert self._process.stdin is not None
        self._process.stdin.write(b"go\n")
        self._process.stdin.flush()
        _, wall, cpu = self._answer().split()
        self.cpu_ns.append(int(cpu))
        return int(wall)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=CALL_TIMEOUT_S)


@dataclass
class WorkerSide(Side):
    worker: TreeWorker | None = None


_ECHO = """
import os, socket, sys
channel = socket.socket(fileno=int(sys.argv[1]))
while True:
    data, fds, _, _ = socket.recv_fds(channel, 1 << 16, 16)
    if not data:
        break
    for fd in fds:
        os.close(fd)
    channel.sendall(b"ok")
"""


def spawner_request_us(rounds: int = 300) -> float:
    """What asking a spawner process to start a run would add: a request (the run's argv and Limits pickled, and
    four descriptors: the status memfd, stdout's and stderr's pipe ends, the cwd) over a socket pair to another
    process, and its short answer; p50 in microseconds."""
    ours, theirs = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-I", "-c", _ECHO, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    request = pickle.dumps((TRIVIAL, generous_limits({"PATH": "/usr/local/bin:/usr/bin:/bin"})))
    status, (out_read, out_write), cwd = os.memfd_create("status"), os.pipe(), os.open("/", os.O_PATH)
    fds = [status, out_write, out_write, cwd]
    samples: list[int] = []
    try:
        with ours:
            for _ in range(rounds):
                started = time.perf_counter_ns()
                socket.send_fds(ours, [request], fds)
                if ours.recv(16) != b"ok":
                    raise BenchError("the spawner stand-in did not answer")
                samples.append(time.perf_counter_ns() - started)
    finally:
        for fd in (status, out_read, out_write, cwd):
            os.close(fd)
        echo.wait(timeout=CALL_TIMEOUT_S)
    return statistics.median(samples) / 1e3


def archive(rev: str, dest: Path) -> None:
    """The tree of `rev` in `dest`, as `git archive` writes it: nothing in the repository changes."""
    tarball = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=False)
    if tarball.returncode != 0:
        raise BenchError(f"git archive {rev}: {tarball.stderr.decode(errors='replace').strip()}")
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tarball.stdout, check=True)


async def before_after(root: Path, before: str, rounds: int, warmup: int, deadline: float) -> None:
    """(c): the trivial spawn by the tree before and by this one, both backends, in a small process and in one
    holding BALLAST_MB of objects; the floor a native run stands on; each in a worker of its own."""
    archive(before, root / "before")
    cwd, out = root / "cwd", root / "out"
    cwd.mkdir()
    out.mkdir()
    reachable_by_everyone(cwd)
    out_rootless = root / "out-rootless"
    out_rootless.mkdir()
    os.chown(out_rootless, ROOTLESS_UID, ROOTLESS_UID)
    reachable_by_everyone(root)  # the rootless workers read the before tree and the cwd
    old_tree, big = root / "before", BALLAST_MB
    spawns = [
        TreeSpawn("bare subprocess.run", REPO, "bare"),
        TreeSpawn(f"run_sandboxed, before ({before})", old_tree, "sandboxed"),
        TreeSpawn("run_sandboxed, after", REPO, "sandboxed"),
        TreeSpawn(f"run_sandboxed bubblewrap, before ({before})", old_tree, "sandboxed", "bubblewrap"),
        TreeSpawn("run_sandboxed bubblewrap, after", REPO, "sandboxed", "bubblewrap"),
        TreeSpawn("floor: preexec_fn with the PID namespace and its two forks", REPO, "floor"),
        TreeSpawn(f"bare subprocess.run, {big} MB process", REPO, "bare", ballast_mb=big),
        TreeSpawn(f"run_sandboxed, before, {big} MB process", old_tree, "sandboxed", ballast_mb=big),
        TreeSpawn(f"run_sandboxed, after, {big} MB process", REPO, "sandboxed", ballast_mb=big),
        TreeSpawn(f"run_sandboxed bubblewrap, after, {big} MB process", REPO, "sandboxed", "bubblewrap", big),
        TreeSpawn(f"floor, {big} MB process", REPO, "floor", ballast_mb=big),
        TreeSpawn("rootless: run_sandboxed, before", old_tree, "sandboxed", rootless=True),
        TreeSpawn("rootless: run_sandboxed, after", REPO, "sandboxed", rootless=True),
        TreeSpawn("rootless: run_sandboxed bubblewrap, before", old_tree, "sandboxed", "bubblewrap", rootless=True),
        TreeSpawn("rootless: run_sandboxed bubblewrap, after", REPO, "sandboxed", "bubblewrap", rootless=True),
    ]
    sides: list[WorkerSide] = []
    try:
        for spawn in spawns:
            worker = TreeWorker(spawn, cwd=cwd, out=out_rootless if spawn.rootless else out)
            sides.append(WorkerSide(f"{spawn.label} [{worker.rss_mb} MB]", lambda: anyio.sleep(0), worker=worker))
        for index in range(warmup + rounds):
            if time.monotonic() > deadline:
                raise BenchError("not done by --deadline")
            shift = index % len(sides)
            for side in [*sides[shift:], *sides[:shift]]:
                assert side.worker is not None
                wall = side.worker.once()
                if index >= warmup:
                    side.samples.append(wall)
                else:
                    side.worker.cpu_ns.pop()
    finally:
        for side in sides:
            if side.worker is not None:
                side.worker.close()
    bare, old, new, old_bw, new_bw, floor, big_bare, big_old, big_new, big_new_bw, big_floor = sides[:11]
    rootless_old, rootless_new, rootless_old_bw, rootless_new_bw = sides[11:]
    print(
        f"(c) before ({before}, git archive) and after, each side an interpreter of its own tree timing its own"
        f" spawns ([its size]): {rounds} rounds interleaved, {warmup} warm-up not measured"
    )
    print(f"  {'':<70}{'p50 ms':>8}{'p90 ms':>8}{'CPU ms':>8}{'p50/bare':>10}")
    for side in sides:
        assert side.worker is not None
        anchor = big_bare if BALLAST_MB and "MB process" in side.label else bare
        cpu = statistics.median(side.worker.cpu_ns) / 1e6
        ratio = side.p50_ms() / anchor.p50_ms()
        print(f"  {side.label:<70}{side.p50_ms():>8.1f}{side.p90_ms():>8.1f}{cpu:>8.1f}{ratio:>9.2f}x")
    note(
        f"target: run_sandboxed p50 <= {TARGET_TRIVIAL_RATIO}x bare: before {old.p50_ms() / bare.p50_ms():.2f}x,"
        f" after {verdict(new.p50_ms() / bare.p50_ms(), TARGET_TRIVIAL_RATIO)};"
        f" bubblewrap before {old_bw.p50_ms() / bare.p50_ms():.2f}x, after {new_bw.p50_ms() / bare.p50_ms():.2f}x"
    )
    note(
        f"in a {BALLAST_MB} MB process (a gateway's size): before {big_old.p50_ms() / big_bare.p50_ms():.2f}x,"
        f" after {big_new.p50_ms() / big_bare.p50_ms():.2f}x bare (bubblewrap {big_new_bw.p50_ms() / big_bare.p50_ms():.2f}x);"
        " the size itself costs a native run"
        f" {big_new.p50_ms() - new.p50_ms():+.1f} ms (after) and the floor {big_floor.p50_ms() - floor.p50_ms():+.1f} ms:"
        " the most a small spawner forked before the heavy imports could take off a run (decision 95)"
    )
    note(
        f"rootless (an ordinary uid's gateway): before {rootless_old.p50_ms() / bare.p50_ms():.2f}x, after"
        f" {rootless_new.p50_ms() / bare.p50_ms():.2f}x bare; bubblewrap before {rootless_old_bw.p50_ms() / bare.p50_ms():.2f}x,"
        f" after {rootless_new_bw.p50_ms() / bare.p50_ms():.2f}x (no pool uid: only the fork hooks differ)"
    )
    note(
        "a request to such a spawner (the run's argv and Limits pickled, four descriptors, over a socket"
        f" pair, and the answer): {spawner_request_us():.0f} us p50"
    )
    note(
        f"the floor, every layer left out but the PID namespace and its supervisors' forks:"
        f" {floor.p50_ms() / bare.p50_ms():.2f}x bare ({floor.p50_ms() - bare.p50_ms():+.1f} ms); a native run"
        f" adds {new.p50_ms() - floor.p50_ms():+.1f} ms of layers, cgroup and supervision to it"
    )
    print()


# --- (b) the sample suite -----------------------------------------------------------------------


def suite_sides(root: Path, workspace: Path) -> tuple[list[Side], list[dict[str, Any]]]:
    """The sides of (b) that run pytest without the server, and the counts the tool in process reported."""
    policy = SandboxPolicy()
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    tool_counts: list[dict[str, Any]] = []

    def bare_pytest(label: str, argv: list[str], env: dict[str, str]) -> None:
        # No timeout: CPython then waits in a blocking waitpid (bounded by the hard stop in main).
        done = subprocess.run(argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if done.returncode != 0:
            raise BenchError(f"{label}: exit code {done.returncode}\n{done.stdout.decode(errors='replace')[-2000:]}")

    def hygiene_run(scratch: Path) -> tuple[list[str], dict[str, str]]:
        """The gateway's pytest argv and environment for a run whose scratch folder is `scratch`."""
        argv = run_pytest.pytest_argv(workspace, SUITE_ARGUMENTS, scratch / "junit.xml")
        return argv, sandbox_environment(policy, scratch, os.environ)

    async def plain() -> None:
        bare_pytest("bare pytest", [sys.executable, "-m", "pytest", "-q", "tests"], plain_env)

    async def hygiene() -> None:
        scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=root))
        bare_pytest("bare pytest, gateway argv", *hygiene_run(scratch))
        shutil.rmtree(scratch)

    async def unconfined() -> None:
        scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=root))
        argv, env = hygiene_run(scratch)
        result = await run_unsafe_unconfined(
            argv, workspace, generous_limits(env), scratch / "stdout", scratch / "stderr"
        )
        if result.exit_code != 0:
            raise BenchError(f"run_unsafe_unconfined: exit code {result.exit_code}, killed by {result.killed_by}")
        shutil.rmtree(scratch)

    async def tool() -> None:
        run_id = uuid.uuid4().hex
        done = await run_pytest.execute(ExecutionRequest(
            run_id=run_id, root=pin(workspace), allowed_paths=(), arguments=SUITE_ARGUMENTS, policy=policy,
            timeout_s=CALL_TIMEOUT_S, run_dir=root / "runs" / run_id, environ=os.environ, host=probe_host(),
        ))  # fmt: skip
        if done.result.exit_code != 0:
            raise BenchError(f"run_pytest.execute: {done.read_outcome().text}")
        tool_counts.append(done.read_outcome().structured)

    sides = [
        Side("python -m pytest -q tests (bare, plain)", plain),
        Side("bare pytest, the gateway's argv and env (hygiene)", hygiene),
        Side("the same, run_unsafe_unconfined (supervision only)", unconfined),
        Side("run_pytest tool in process (sandboxed, no server)", tool),
    ]
    return sides, tool_counts


def gateway_side(home: GatewayHome, session: StdioSession, tool_counts: list[dict[str, Any]]) -> tuple[Side, list[str]]:
    """run_pytest through `mcp-gateway serve`, and the run ids it answers (to check their audit trails)."""
    token = home.token(USER, ttl_s=3600)
    session.responder = lambda _prompt: {"action": "accept", "content": {"decision": "allow_once"}}
    if "result" not in session.initialize({"elicitation": {"form": {}}}):
        raise BenchError(f"the gateway refused initialize; its stderr:\n{session.stderr_text()[-2000:]}")
    run_ids: list[str] = []

    async def through_gateway() -> None:
        response = session.call_tool("run_pytest", SUITE_ARGUMENTS, token, timeout=CALL_TIMEOUT_S)
        result = response.get("result")
        if not result or result["isError"] or result["structuredContent"]["exit_code"] != 0:
            raise BenchError(f"the gateway's run_pytest: {response}")
        structured = result["structuredContent"]
        counts = {k: structured[k] for k in ("passed", "failed", "errors", "skipped")}
        if tool_counts and counts != {k: tool_counts[-1][k] for k in counts}:
            raise BenchError(f"the gateway counted {counts}, the tool in process {tool_counts[-1]}")
        run_ids.append(structured["run_id"])

    return Side("gateway: stdio tools/call, consent, audit", through_gateway), run_ids


async def suite(root: Path, rounds: int, warmup: int, deadline: float) -> None:
    (root / "gateway").mkdir()
    # The default budget allows 30 runs an hour; the bench makes one a round.
    home = GatewayHome(root / "gateway", {"budget": {"attempts_total": rounds + warmup + 10}})
    home.add_user(USER, "USER")
    session = StdioSession(home)
    try:
        sides, tool_counts = suite_sides(root, home.workspace)
        gateway, gateway_runs = gateway_side(home, session, tool_counts)
        sides.append(gateway)
        await measure(sides, rounds, warmup, deadline)
    finally:
        code = session.close()
    bytecode = len(list(home.workspace.rglob("*.pyc")))
    trails = [[e["event_type"] for e in home.events_of(run_id)] for run_id in gateway_runs]
    chain_ok = home.chain_ok()
    home.engine.dispose()
    if code != 0:
        raise BenchError(f"the gateway exited with {code}; its stderr:\n{session.stderr_text()[-2000:]}")
    wrong = sum(trail != EXPECTED_EVENTS for trail in trails)
    if wrong or not chain_ok:
        raise BenchError(f"audit: {wrong} runs without {EXPECTED_EVENTS}; chain intact: {chain_ok}")
    plain, hygiene, unconfined, tool, gateway = sides
    print(
        f"(b) the sample suite (examples/sample_project, `tests`): {rounds} rounds interleaved,"
        f" {warmup} warm-up not measured, all in one folder"
    )
    print_rows(sides, plain, "plain")
    ratio = gateway.p50_ms() / plain.p50_ms()
    note(f"target: gateway p50 <= {TARGET_SUITE_RATIO}x bare plain pytest: {verdict(ratio, TARGET_SUITE_RATIO)}")
    note(f"on the means: gateway {gateway.mean_ms() / plain.mean_ms():.2f}x bare plain pytest")
    note(
        f"against bare pytest with the same hygiene flags: gateway {gateway.p50_ms() / hygiene.p50_ms():.2f}x"
        f" ({gateway.p50_ms() - hygiene.p50_ms():+.1f} ms), the tool in process"
        f" {tool.p50_ms() / hygiene.p50_ms():.2f}x ({tool.p50_ms() - hygiene.p50_ms():+.1f} ms)"
    )
    note(
        f"differences of the means: the hygiene flags take {plain.mean_ms() - hygiene.mean_ms():.1f} ms off plain"
        f" pytest; the runner's supervision (a pidfd wait) adds {unconfined.mean_ms() - hygiene.mean_ms():+.1f} ms"
        f" to them; the layers, uid pool, cgroup and junit copy {tool.mean_ms() - unconfined.mean_ms():+.1f} ms;"
        f" the gateway {gateway.mean_ms() - tool.mean_ms():+.1f} ms more"
    )
    note(
        "the gateway side is a whole real call: stdio, authentication, the consent prompt answered allow_once"
        " (an elicitation round trip), the audit appends, the artifacts and evidence.json. Audit: each of its"
        f" {len(gateway_runs)} runs (warm-up included) logged exactly {', '.join(EXPECTED_EVENTS)}; the chain verifies"
    )
    note(
        f"plain pytest left .pytest_cache and {bytecode} .pyc files in the folder"
        f" (PYTHONDONTWRITEBYTECODE={'set' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'unset'});"
        " the other sides (-B, no cache plugin) write nothing there, and read any bytecode it left"
    )


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=30, help="measured rounds of (a) (default 30)")
    parser.add_argument("--suite-rounds", type=int, default=10, help="measured rounds of (b) (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds before each (default 2)")
    parser.add_argument("--deadline", type=float, default=150.0, help="give up after this many seconds")
    parser.add_argument("--before", default=BEFORE, help=f"the tree (c) compares with (default {BEFORE})")
    parser.add_argument("--parts", default="abc", help="which parts to run, of a, b, c (default abc)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.suite_rounds < 1 or args.warmup < 0:
        parser.error("--rounds and --suite-rounds must be at least 1, --warmup at least 0")
    if not args.parts or set(args.parts) - set("abc"):
        parser.error("--parts takes letters of a, b, c")
    if os.geteuid() != 0:
        print("sandbox_cost: must run as root (the sandbox drops each run to a pool uid)", file=sys.stderr)
        return 1
    report = probe_host()
    active = [
        f"{layer} (ABI {report.landlock})" if layer is Layer.LANDLOCK else layer
        for layer in LAYERS
        if report.has(layer)
    ]
    print(
        f"sandbox cost: python {platform.python_version()}, Linux {platform.release()}, {os.cpu_count()} cpus;"
        f" layers: {', '.join(active) or 'none'}"
    )
    print()
    deadline = time.monotonic() + args.deadline
    # The hard stop: a wait with no timeout (the bare sides) cannot outlive it.
    faulthandler.dump_traceback_later(args.deadline + CALL_TIMEOUT_S, exit=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
            root = Path(tmp)
            for part in "abc":
                (root / part).mkdir()
            if "a" in args.parts:
                anyio.run(trivial, root / "a", args.rounds, args.warmup, deadline)
            if "c" in args.parts:
                anyio.run(before_after, root / "c", args.before, args.rounds, args.warmup, deadline)
            if "b" in args.parts:
                anyio.run(suite, root / "b", args.suite_rounds, args.warmup, deadline)
    except (BenchError, SandboxStartError) as exc:
        print(
            f"sandbox_cost: {exc!r}" if isinstance(exc, SandboxStartError) else f"sandbox_cost: {exc}", file=sys.stderr
        )
        return 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
