"""What the hardening of decisions 30-38 costs: the tree before it against the working tree, side by side in one run.

The cost of the fixes (a trivial spawn, the sample suite, a refused
call) next to the figures before, in one run. Two trees are measured:

- before: a commit (`--old`, default 3006320, the commit an outside review attacked), written out
  with `git archive` into a temporary folder;
- after: the working tree as it is when the script starts (tracked and untracked files,
  what .gitignore leaves out excepted), copied into the same temporary folder, so that edits
  made while the bench runs do not land half-way through it.

Each tree runs in an interpreter of its own (this venv's python, `-P`, PYTHONPATH=that tree,
cwd that tree, so `python -m gateway` starts that tree's server too), a worker that imports
`gateway`, `sandbox`, `tests.harness` and that tree's own `bench/sandbox_cost.py` and
`bench/stdio_refusals.py` (with the venv's editable-install finder removed, so a module the
tree lacks is not taken from the repository), checks that every one came from its tree, and answers
"take N samples of row R" on its stdin. The driver (this script, importing nothing of the
project) asks the two workers in turn, before then after, then after then before, and so on,
so that machine noise falls on both. Each sample is timed inside its worker. Rows:

- trivial spawn: `sandbox_cost.TRIVIAL` (`<venv python> -I -c pass`) through
  `sandbox.run_sandboxed`, `sandbox_cost.generous_limits`, every layer of the backend
  required, a fresh scratch folder per run; native, then bubblewrap backend;
- the sample suite through `run_sandboxed` as `run_pytest` builds it (`pytest_argv`,
  `sandbox_environment`, junit.xml collected, the workspace pinned by `sandbox.pinned.pin`
  where the tree has it), in the workspace `tests.harness.GatewayHome` copies
  `examples/sample_project` to; native, then bubblewrap backend;
- the sample suite through `mcp-gateway serve` over stdio (`sandbox_cost.gateway_side`: a
  USER, consent answered allow_once), the whole call;
- a refused call over stdio (`stdio_refusals`: a VIEWER's `run_pytest`, -32003), in blocks.

For each row: p50 and p90 of each tree, the difference of the p50s, after/before at p50
(with a 90% bootstrap interval over the paired rounds: it holds 1.00 when this run cannot tell
the trees apart) and at p90. Then the layers each tree's runs got, and the audit checks of
the stdio rows. Exits 0 with the figures; 1 if a row could not be measured on a tree, an
audit check failed, or the run outlived `--deadline`. Must run as root.

The adapter: `run_sandboxed`, `pytest_argv` and `sandbox_environment` are called by
parameter name with the values this script knows (`call_with`); a tree whose function
requires a parameter not known here fails that row with a message naming it.

    .venv/bin/python bench/hardening_cost.py [--quick] [--old 3006320] [--only ROW]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import anyio

REPO = Path(__file__).resolve().parents[1]
OLD_REV = "3006320"
PROJECT_MODULES = ("gateway", "sandbox", "tests", "sandbox_cost", "stdio_refusals", "bare_server")
"""Top-level modules that must come from the worker's own tree."""
TREES = ("before", "after")
BOOTSTRAP_RESAMPLES = 1000


class BenchError(Exception):
    """A tree could not be measured, a check failed, or the bench ran out of time."""


# --- the worker: one tree, in its own interpreter -----------------------------------------------

Sampler = Callable[[int], Awaitable[list[int]]]


def call_with(function: Callable[..., Any], **known: Any) -> Any:
    """The adapter: `function` called with those of `known` it takes, by name.

    A parameter it requires and this script does not know is an API change the bench must follow.
    """
    parameters = inspect.signature(function).parameters
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    unknown = [
        name
        for name, parameter in parameters.items()
        if name not in known and parameter.default is parameter.empty and parameter.kind not in variadic
    ]
    if unknown:
        raise BenchError(
            f"{function.__module__}.{function.__qualname__}{inspect.signature(function)} requires {unknown},"
            " which bench/hardening_cost.py does not pass: update call_with's callers"
        )
    return function(**{name: value for name, value in known.items() if name in parameters})


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


class TreeWorker:
    """The rows, run against the modules of one tree; each row is prepared the first time it is asked for."""

    def __init__(self, tree: Path, root: Path) -> None:
        self.tree = tree
        self.root = root
        # The venv's editable install adds a finder that serves `gateway.*` and `sandbox.*` from the
        # repository when a module is not found on sys.path: a module the tree lacks would come from
        # the working tree. Without it, such an import fails, as it would in that tree alone.
        sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
        sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
        sys.path_importer_cache.clear()
        sys.path.insert(0, str(tree / "bench"))  # that tree's sandbox_cost and stdio_refusals
        self.sandbox = importlib.import_module("sandbox")
        self.run_pytest = importlib.import_module("gateway.tools.run_pytest")
        self.harness = importlib.import_module("tests.harness")
        self.samplers: dict[str, Sampler] = {}
        self.layers: dict[str, list[str]] = {}
        self.notes: dict[str, str] = {}
        self.finishers: list[tuple[str, Callable[[], str]]] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self._suite_home: Any = None
        self.check_origins()

    def module(self, name: str) -> ModuleType:
        """A module of the tree, imported now (the bench helpers only when a row needs them)."""
        module = importlib.import_module(name)
        self.check_origins()
        return module

    def check_origins(self) -> None:
        foreign = [
            f"{name} from {module.__file__}"
            for name, module in list(sys.modules.items())
            if name.split(".")[0] in PROJECT_MODULES
            and getattr(module, "__file__", None)
            and not Path(str(module.__file__)).resolve().is_relative_to(self.tree)
        ]
        if foreign:
            raise BenchError(f"modules from outside {self.tree}: {foreign[:5]}")

    def hello(self) -> dict[str, Any]:
        probe = getattr(self.sandbox, "probe_host", None) or self.sandbox.layers  # layers(): the older trees' name
        report = probe()
        fields = dataclasses.asdict(report) if dataclasses.is_dataclass(report) and not isinstance(report, type) else {}
        names = [f"{k} (ABI {v})" if k == "landlock" else k for k, v in fields.items() if v]
        return {"layers": names or [repr(report)], "python": platform.python_version()}

    # --- rows

    def sampler(self, row: str) -> Sampler:
        if row not in self.samplers:
            kind, _, backend = row.partition(":")
            prepare: dict[str, Callable[[], Sampler]] = {
                "spawn": lambda: self.spawn_row(backend),
                "suite": lambda: self.suite_row(backend),
                "gateway-suite": self.gateway_suite_row,
                "refusal": self.refusal_row,
            }
            self.samplers[row] = prepare[kind]()
        return self.samplers[row]

    def folders(self) -> tuple[Path, Path]:
        """A fresh scratch folder and output folder for one run, made before its clock starts."""
        return Path(tempfile.mkdtemp(prefix="scratch-", dir=self.root)), Path(
            tempfile.mkdtemp(prefix="out-", dir=self.root)
        )

    async def sandboxed(self, argv: list[str], cwd: Path, limits: Any, scratch: Path, out: Path, **extra: Any) -> Any:
        """run_sandboxed through the adapter; its output files (if it still takes them) in `out`."""
        known = {"stdout_path": out / "stdout.txt", "stderr_path": out / "stderr.txt", **extra}
        return await call_with(self.sandbox.run_sandboxed, argv=argv, cwd=cwd, limits=limits, scratch=scratch, **known)

    def check(self, row: str, result: Any, out: Path) -> None:
        self.layers.setdefault(row, list(getattr(result, "layers", ())))
        if result.exit_code != 0 or result.killed_by is not None:
            output = "".join(p.read_text(errors="replace")[-1500:] for p in sorted(out.glob("*.txt")))
            raise BenchError(f"{row}: exit code {result.exit_code}, killed by {result.killed_by}\n{output}")

    def spawn_row(self, backend: str) -> Sampler:
        cost = self.module("sandbox_cost")
        cwd = self.root / "cwd"
        if not cwd.exists():
            cwd.mkdir()
            self.harness.reachable_by_everyone(cwd)  # 0755, as a workspace must be for the run uid
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        limits = dataclasses.replace(cost.generous_limits(env), backend=backend)

        async def sample(count: int) -> list[int]:
            samples = []
            for _ in range(count):
                scratch, out = self.folders()
                started = time.perf_counter_ns()
                result = await self.sandboxed(list(cost.TRIVIAL), cwd, limits, scratch, out)
                samples.append(time.perf_counter_ns() - started)
                self.check(f"spawn:{backend}", result, out)
            return samples

        return sample

    @property
    def suite_home(self) -> Any:
        """One state folder and workspace for the suite rows, as sandbox_cost's (b) has."""
        if self._suite_home is None:
            (self.root / "suite").mkdir()
            # The default budget allows 30 runs an hour; the bench makes one a round.
            budget = {"attempts_total": 10_000, "elapsed_ms_total": 1_000_000_000}
            self._suite_home = self.harness.GatewayHome(self.root / "suite", {"budget": budget})
            self._suite_home.add_user(self.module("sandbox_cost").USER, "USER")
        return self._suite_home

    def pinned_workspace(self, workspace: Path) -> Any:
        """The workspace as the tree's policy load hands it to run_pytest: pinned by fd where the tree pins."""
        try:
            pinned = self.module("sandbox.pinned")
        except ModuleNotFoundError as exc:
            if exc.name != "sandbox.pinned":
                raise
            return workspace
        return pinned.pin(workspace)

    def suite_row(self, backend: str) -> Sampler:
        cost = self.module("sandbox_cost")
        workspace = self.suite_home.workspace
        cwd = self.pinned_workspace(workspace)
        self.notes[f"suite:{backend}"] = f"the workspace passed to run_sandboxed as a {type(cwd).__name__}"
        policy = importlib.import_module("gateway.policy").SandboxPolicy()
        run_pytest = self.run_pytest
        # The scrubbed environment moved to gateway/tools/confined.py with the declared tools.
        environment = getattr(run_pytest, "sandbox_environment", None)
        environment = environment or importlib.import_module("gateway.tools.confined").sandbox_environment

        async def sample(count: int) -> list[int]:
            samples = []
            for _ in range(count):
                scratch, out = self.folders()
                started = time.perf_counter_ns()
                argv = call_with(
                    run_pytest.pytest_argv,
                    root=workspace, arguments=cost.SUITE_ARGUMENTS, junit_path=scratch / "junit.xml",
                    plugins=policy.pytest_plugins,
                )  # fmt: skip
                env = call_with(environment, policy=policy, scratch=scratch, environ=os.environ)
                limits = dataclasses.replace(cost.generous_limits(env), backend=backend)
                collect = {"junit.xml": out / "junit.xml"}
                result = await self.sandboxed(argv, cwd, limits, scratch, out, collect=collect)
                samples.append(time.perf_counter_ns() - started)
                self.check(f"suite:{backend}", result, out)
            return samples

        return sample

    def gateway_suite_row(self) -> Sampler:
        cost = self.module("sandbox_cost")
        home = self.suite_home
        session = self.harness.StdioSession(home)
        side, run_ids = cost.gateway_side(home, session, [])

        async def sample(count: int) -> list[int]:
            samples = []
            for _ in range(count):
                started = time.perf_counter_ns()
                try:
                    await side.once()
                except Exception as exc:
                    raise BenchError(f"{exc}\nserve's stderr ends with:\n{session.stderr_text()[-3000:]}") from exc
                samples.append(time.perf_counter_ns() - started)
            return samples

        def finish() -> str:
            code = session.close()
            if code != 0:
                raise BenchError(f"serve exited with {code}; its stderr:\n{session.stderr_text()[-2000:]}")
            if not run_ids:
                return "no run completed"
            trails = {tuple(e["event_type"] for e in home.events_of(run_id)) for run_id in run_ids}
            if len(trails) != 1 or not home.chain_ok():
                raise BenchError(f"audit: the runs logged {len(trails)} different trails; chain: {home.chain_ok()}")
            return f"each of {len(run_ids)} runs logged exactly {', '.join(trails.pop())}; the chain verifies"

        self.finishers.append(("gateway-suite", finish))
        return sample

    def refusal_row(self) -> Sampler:
        refusals = self.module("stdio_refusals")
        (self.root / "refusal").mkdir()
        home, token = refusals.gateway_home(self.root / "refusal", "normal")
        client = refusals.RawClient("serve", refusals.serve_argv(home), self.root / "refusal.log", self.children)
        side = refusals.Side("gateway", client, token, home)
        client.initialize()

        async def sample(count: int) -> list[int]:
            return [side.one() for _ in range(count)]

        def finish() -> str:
            code = client.close()
            if code != 0:
                raise BenchError(f"serve exited with {code}; its stderr ends with:\n{client.stderr_tail()}")
            checked: str = refusals.check_audit(side)
            home.engine.dispose()
            return checked

        self.finishers.append(("refusal", finish))
        return sample

    def finish(self) -> dict[str, Any]:
        checks: dict[str, str] = {}
        for row, finisher in self.finishers:
            try:
                checks[row] = finisher()
            except Exception as exc:
                traceback.print_exc()
                checks[row] = f"FAILED: {type(exc).__name__}: {exc}"
        if self._suite_home is not None:
            self._suite_home.engine.dispose()
        return {"checks": checks, "layers": self.layers, "notes": self.notes, "rss_mib": rss_mib()}


async def serve_driver(tree: Path, root: Path, protocol: IO[str]) -> None:
    """Answer the driver's requests, one JSON line each way, until `finish` or end of input."""
    worker: TreeWorker | None = None
    while line := sys.stdin.readline():
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            if request["op"] == "hello":
                worker = TreeWorker(tree, root)
                reply = worker.hello()
            elif worker is None:
                raise BenchError("no hello")
            elif request["op"] == "sample":
                reply = {"samples": await worker.sampler(request["row"])(request["count"])}
            else:
                reply = worker.finish()
        except Exception as exc:
            traceback.print_exc()  # into the worker's log
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
        if request["op"] == "finish":
            return


def worker_main(tree: Path, root: Path) -> int:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the project prints goes to the log, not into the replies
    anyio.run(serve_driver, tree, root, protocol)
    return 0


# --- the driver ---------------------------------------------------------------------------------


@dataclass
class Row:
    key: str
    label: str
    rounds: int
    count: int = 1
    """Samples per request (refusals come in blocks)."""
    samples: dict[str, list[int]] = field(default_factory=lambda: {tree: [] for tree in TREES})
    error: str | None = None


class Worker:
    """A worker process, and its requests."""

    def __init__(self, name: str, tree: Path, root: Path, log: Path) -> None:
        self.name = name
        self.log = log
        root.mkdir(mode=0o755)  # the run uid must reach the scratch folders made in it
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "MCP_GATEWAY_TOKEN")}
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-P", str(Path(__file__).resolve()), "--worker", str(tree), str(root)],
                cwd=tree,
                env={**env, "PYTHONPATH": str(tree)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # so a deadline can stop its servers with it
            )

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise BenchError(f"the {self.name} worker ended; its log ends with:\n{self.log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def archive(rev: str, dest: Path) -> None:
    """The tree of `rev`, as `git archive` writes it: nothing in the repository changes."""
    dest.mkdir()
    writer = subprocess.Popen(["git", "-C", str(REPO), "archive", "--format=tar", rev], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=writer.stdout, check=True)
    assert writer.stdout is not None
    writer.stdout.close()
    if writer.wait() != 0:
        raise BenchError(f"git archive {rev} failed")


def snapshot(dest: Path) -> int:
    """A copy of the working tree (tracked and untracked files, not ignored); returns how many files."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    copied = 0
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_symlink() and not source.is_file():
            continue  # deleted in the working tree, or a submodule
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name, follow_symlinks=False)
        copied += 1
    return copied


def measure(row: Row, workers: Sequence[Worker], warmup: int, deadline: float) -> None:
    """`warmup` unmeasured rounds, then `row.rounds`; each round asks both trees, first one then the other first."""
    for index in range(warmup + row.rounds):
        if time.monotonic() > deadline:
            raise BenchError("not done by --deadline")
        order = workers if index % 2 == 0 else list(reversed(workers))
        for worker in order:
            reply = worker.ask("sample", row=row.key, count=row.count)
            if "error" in reply:
                row.error = f"{worker.name}: {reply['error']}"
                return
            if index >= warmup:
                row.samples[worker.name].extend(reply["samples"])


def nearest_rank(ordered: Sequence[int], q: float) -> int:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ratio_interval(before: Sequence[int], after: Sequence[int]) -> tuple[float, float]:
    """A 90% bootstrap interval of median(after) / median(before), resampling the pairs of the same round."""
    pairs = list(zip(before, after, strict=True))
    draw = random.Random(0)  # noqa: S311  (resampling, not secrets)
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        resample = draw.choices(pairs, k=len(pairs))
        ratios.append(statistics.median(a for _, a in resample) / statistics.median(b for b, _ in resample))
    ratios.sort()
    return ratios[int(0.05 * len(ratios))], ratios[int(0.95 * len(ratios)) - 1]


def ms(ns: float) -> str:
    value = ns / 1e6
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def print_table(rows: Sequence[Row]) -> None:
    print(f"  {'':<52}{'':>5}{'before':>17}{'after':>17}")
    print(
        f"  {'ms':<52}{'n':>5}{'p50':>9}{'p90':>8}{'p50':>9}{'p90':>8}{'+ms p50':>9}"
        f"{'after/before p50 (90% CI)':>28}{'p90':>8}"
    )
    for row in rows:
        before, after = sorted(row.samples["before"]), sorted(row.samples["after"])
        if row.error or not before or not after:
            print(f"  {row.label:<52}  not measured: {(row.error or 'no samples').splitlines()[0][:200]}")
            continue
        b50, a50 = statistics.median(before), statistics.median(after)
        b90, a90 = nearest_rank(before, 0.9), nearest_rank(after, 0.9)
        low, high = ratio_interval(row.samples["before"], row.samples["after"])
        print(
            f"  {row.label:<52}{len(before):>5}{ms(b50):>9}{ms(b90):>8}{ms(a50):>9}{ms(a90):>8}"
            f"{(a50 - b50) / 1e6:>+9.2f}{f'{a50 / b50:.2f}x ({low:.2f}-{high:.2f})':>28}{a90 / b90:>7.2f}x"
        )


def note(text: str, indent: int = 2) -> None:
    print(textwrap.fill(text, 118, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2)))


def rows_for(args: argparse.Namespace) -> list[Row]:
    blocks = max(1, math.ceil(args.calls / args.block))
    return [
        Row("spawn:native", "trivial spawn, run_sandboxed, native", args.rounds),
        Row("spawn:bubblewrap", "trivial spawn, run_sandboxed, bubblewrap", args.rounds),
        Row("suite:native", "sample suite, run_sandboxed as run_pytest, native", args.suite_rounds),
        Row("suite:bubblewrap", "sample suite, run_sandboxed as run_pytest, bwrap", args.suite_rounds),
        Row("gateway-suite", "sample suite, run_pytest over stdio (USER, consent)", args.suite_rounds),
        Row("refusal", "refused run_pytest over stdio (VIEWER, -32003)", blocks, args.block),
    ]


def run(args: argparse.Namespace, tmp: Path, workers: list[Worker], deadline: float) -> int:
    old = git("rev-parse", "--short", f"{args.old}^{{commit}}")
    archive(old, tmp / "before")
    head = git("rev-parse", "--short", "HEAD")
    changed = len(git("status", "--porcelain").splitlines())
    files = snapshot(tmp / "after")
    taken = time.strftime("%H:%M:%S")
    for name in TREES:
        workers.append(Worker(name, tmp / name, tmp / f"work-{name}", tmp / f"{name}.log"))
    hello = {worker.name: worker.ask("hello") for worker in workers}
    for worker in workers:
        if "error" in hello[worker.name]:
            raise BenchError(f"the {worker.name} tree does not load: {hello[worker.name]['error']}")
    print(
        f"hardening cost (decisions 30-38): before = {old} (git archive); after = the working tree"
        f" (HEAD {head} + {changed} changed or new paths; {files} files copied at {taken})"
    )
    print(
        f"python {hello['before']['python']}, Linux {platform.release()}, {os.cpu_count()} cpus;"
        " each tree in its own interpreter (PYTHONPATH=that tree); rounds alternate before/after and after/before"
    )
    for name in TREES:
        print(f"  layers this host offers, {name}: {', '.join(hello[name]['layers'])}")
    print()
    rows = [row for row in rows_for(args) if not args.only or row.key in args.only]
    for row in rows:
        print(f"measuring: {row.label}", file=sys.stderr)
        measure(row, workers, args.warmup, deadline)
    finished = {worker.name: worker.ask("finish") for worker in workers}
    print_table(rows)
    note(
        f"{args.warmup} warm-up rounds per row not measured; refusals in blocks of {args.block} calls."
        " 90% CI: bootstrap of the ratio of the medians over the rounds, pairs kept (a refusal's pair is the same"
        " call of the same block); where it holds 1.00 this run cannot tell the trees apart"
    )
    print()
    failed = any(row.error for row in rows)
    for name in TREES:
        reply = finished[name]
        if "error" in reply:
            print(f"{name}: finish failed: {reply['error']}")
            failed = True
            continue
        for row, layers in reply["layers"].items():
            print(f"{name}, layers of a {row} run: {', '.join(layers) or '(none reported)'}")
        for row, text in reply["notes"].items():
            print(f"{name}, {row}: {text}")
        for row, check in reply["checks"].items():
            print(f"{name}, audit of {row}: {check}")
            failed = failed or check.startswith("FAILED")
        print(f"{name}, worker memory at the end: {reply['rss_mib']:.0f} MiB RSS")
    errors = [f"not measured: {row.label}: {row.error}" for row in rows if row.error]
    if errors:
        print("\n" + "\n".join(errors))
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--old", default=OLD_REV, help=f"the commit before the hardening (default {OLD_REV})")
    parser.add_argument("--rounds", type=int, default=50, help="measured rounds of each trivial spawn row (50)")
    parser.add_argument("--suite-rounds", type=int, default=12, help="measured rounds of each suite row (12)")
    parser.add_argument("--calls", type=int, default=1000, help="measured refused calls per tree (1000)")
    parser.add_argument("--block", type=int, default=50, help="refused calls per block (50)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds before each row (2)")
    parser.add_argument("--quick", action="store_true", help="12 spawn rounds, 3 suite rounds, 200 refusals")
    parser.add_argument(
        "--only",
        action="append",
        choices=[row.key for row in rows_for(argparse.Namespace(rounds=1, suite_rounds=1, calls=1, block=1))],
        help="measure only this row (repeatable)",
    )
    parser.add_argument("--deadline", type=float, default=170.0, help="give up after this many seconds (170)")
    parser.add_argument("--worker", nargs=2, metavar=("TREE", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(Path(args.worker[0]), Path(args.worker[1]))
    if args.quick:
        args.rounds, args.suite_rounds, args.calls = 12, 3, 200
    if min(args.rounds, args.suite_rounds, args.calls, args.block) < 1 or args.warmup < 0:
        parser.error("--rounds, --suite-rounds, --calls and --block must be at least 1, --warmup at least 0")
    if os.geteuid() != 0:
        print("hardening_cost: must run as root (the sandbox drops each run to a pool uid)", file=sys.stderr)
        return 1
    workers: list[Worker] = []
    expired = threading.Event()

    def stop() -> None:  # past the deadline, a worker waiting on a hung server is killed with its servers
        expired.set()
        for worker in workers:
            worker.kill()

    timer = threading.Timer(args.deadline + 30, stop)
    timer.daemon = True
    timer.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-hardening-") as tmp:
            try:
                Path(tmp).chmod(0o755)  # the run uid must reach the scratch folders below it
                return run(args, Path(tmp).resolve(), workers, time.monotonic() + args.deadline)
            finally:
                for worker in workers:
                    worker.close()
    except (BenchError, subprocess.CalledProcessError) as exc:
        hard = " (hard stop: the workers were killed)" if expired.is_set() else ""
        print(f"hardening_cost: {exc}{hard}", file=sys.stderr)
        return 1
    finally:
        timer.cancel()


if __name__ == "__main__":
    raise SystemExit(main())
