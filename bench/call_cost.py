"""The cost of a call, before and after, side by side: every row a ratio against its anchor in the same run.

One command for the table of what a call costs (see bench/README.md, "Cost per call"). Two trees
run side by side: before (a commit, default 4934e5f, written out with `git archive` into a temp
folder) and after (this working tree). Both run on this venv's interpreter (the same runtime
dependencies), each gateway with its own tree as cwd and on PYTHONPATH, on a state folder made by
that tree's own `mcp-gateway init`, its users added and its tokens issued by that tree's own
commands. Rows, each against its anchor measured in the same run:

- refused: a VIEWER's `run_pytest` (-32003) over stdio, p50, on SQLite and on PostgreSQL, against
  bench/bare_server.py, all driven by bench/stdio_refusals.py's raw client in rotating blocks
  (aim: at most 1.5x the bare server);
- cpu: the gateway process's CPU per refused call (user + system from /proc) against the bare
  server's per call (aim: at most 1.5x), from the same calls;
- startup: `serve` answering `initialize` after its spawn, then `tools/list` (bench/startup.py),
  with the floors beside: `python -c pass` and the SDK's import (aim: `initialize` in 0.5 s);
- spawn (root): `python -I -c pass` through `run_sandboxed`, native and bubblewrap, against bare
  `subprocess.run` (bench/sandbox_cost.py's sides, in a worker process of each tree; aim 1.35x);
- fleet: 8 gateways on PostgreSQL against 1 on SQLite, calls/s and p99 (bench/fleet_scale.py;
  aim: at least 1.5x with a p99 of at most 40 ms);
- suite (root): an allowed `run_pytest` of the sample suite through `serve` (a USER, the consent
  question answered allow_once) against plain `python -m pytest -q tests` (aim: at most 1.0x).

For each call row it also prints the CPU each process spent per call: gateway(s), database server
(PostgreSQL: the gateway's own backends, or the whole cluster for the fleet; SQLite works inside the
gateway), client. The checks run in the same run: every answer right, each refused call's
MCP_TOOL_CALL then POLICY_BLOCKED, each fleet call's two events and budget burst exact, each allowed
run's trail, `audit verify` on every database, no token in any log. Rows that need root say
"skipped: needs root"; rows that need PostgreSQL's programs say so when they are absent. Exits 0
with the figures whether or not an aim is met, 1 when a check fails or a process dies.

    .venv/bin/python bench/call_cost.py [--quick] [--rows refused,cpu,startup,spawn,fleet,suite] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy
import yaml
from sqlalchemy.pool import NullPool

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))  # the other benches, and tests.harness's helpers they use

import fleet_scale  # noqa: E402
import startup  # noqa: E402
import stdio_refusals  # noqa: E402
from sandbox_cost import EXPECTED_EVENTS as ALLOWED_RUN_EVENTS  # noqa: E402

from tests.harness import FORM_ELICITATION, SAMPLE_PROJECT, deep_merge, reachable_by_everyone  # noqa: E402
from tests.pg_cluster import drop_database, new_database, server_programs  # noqa: E402

BEFORE = "4934e5f"
FLOOR = "floor"
"""bench/floor_server.py on each engine, its database made by this tree's `init` (decision 100)."""
FLOOR_ONE_TRIP = "floor, one trip"
"""The same on PostgreSQL with `--one-trip`: the caller's read and the append in one statement."""
ROWS = ("refused", "cpu", "startup", "spawn", "fleet", "suite")
AIM_RATIO = 1.5
AIM_INITIALIZE_MS = 500.0
AIM_SPAWN_RATIO = 1.35
AIM_FLEET_RATIO, AIM_FLEET_P99_MS = 1.5, 40.0
AIM_SUITE_RATIO = 1.0
SUITE_CALL = {"test_path": "tests"}
SUITE_TIMEOUT_S = 120


class BenchError(Exception):
    """A process died or answered wrongly, or a check failed."""


@dataclass(frozen=True)
class Sizes:
    """How much each row measures: the defaults take about 5 minutes on 2 quiet CPUs, `--quick` about one."""

    calls: int = 1000
    warmup: int = 50
    blocks: int = 10
    startup_runs: int = 11
    spawn_rounds: int = 30
    fleet_gateways: int = 8
    fleet_calls: int = 3000
    fleet_rounds: int = 4
    suite_rounds: int = 8


QUICK = Sizes(
    calls=60, warmup=5, blocks=3, startup_runs=2, spawn_rounds=3,
    fleet_gateways=2, fleet_calls=80, fleet_rounds=2, suite_rounds=1,
)  # fmt: skip


# --- the trees and their state folders ---------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """A tree of the gateway's code: its gateways run with it as cwd and on PYTHONPATH."""

    name: str
    path: Path

    def env(self) -> dict[str, str]:
        return startup.tree_env(self.path)


_COMMANDS = """
import contextlib, io, json, sys
from gateway.cli import main

done = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    done.append([argv, code or 0, out.getvalue(), err.getvalue()])
json.dump(done, sys.__stdout__)
"""
"""Runs the `mcp-gateway` commands given on stdin (a JSON list of argvs) through the tree's own `main`, in
one interpreter: a state folder's making pays the gateway's imports once, not once per command."""


class TreeHome:
    """A state folder made by the tree's own `mcp-gateway init` (the database migrated by its own code),
    its policy then changed by `overrides`, its users added and tokens issued by the tree's own commands."""

    def __init__(
        self, tree: Tree, root: Path, url: str | None, users: Sequence[tuple[str, str]], overrides: Mapping[str, Any]
    ) -> None:
        self.tree = tree
        self.root = root
        root.mkdir(parents=True)
        self.home = root / "state"
        self.url = url or f"sqlite:///{self.home / 'gateway.db'}"
        self.policy_path = self.home / "policy.yaml"
        self.workspace = root / "workspace"
        shutil.copytree(SAMPLE_PROJECT, self.workspace, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        reachable_by_everyone(self.workspace)  # the sandbox's run uid reads it
        self.commands(("init", "--workspace", str(self.workspace)))
        if overrides:
            policy = deep_merge(yaml.safe_load(self.policy_path.read_text()), overrides)
            self.policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))
        added = [("user", "add", name, "--role", role, "--workspace", "default") for name, role in users]
        issued = self.commands(
            *added, *[("token", "issue", "--ttl", "3600", name) for name, _ in users], ("audit", "export")
        )
        self.tokens = {name: out.strip() for (name, _), out in zip(users, issued[len(users) : -1], strict=True)}
        self.setup_events = len(issued[-1].splitlines())
        """USER_ADDED and TOKEN_ISSUED: what the commands above logged, before any call."""
        self.engine = sqlalchemy.create_engine(self.url, poolclass=NullPool)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gateway", *self.options(args), *args]

    def options(self, args: Sequence[str]) -> list[str]:
        # `init` writes <home>/policy.yaml, and refuses --policy naming any other: the path is that one.
        policy = [] if args[:1] == ("init",) else ["--policy", str(self.policy_path)]
        return ["--home", str(self.home), "--db", self.url, *policy]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), cwd=self.tree.path, env=self.tree.env(),
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    def commands(self, *commands: Sequence[str]) -> list[str]:
        """Each command's stdout; every command must exit 0."""
        argvs = [[*self.options(tuple(args)), *args] for args in commands]
        done = subprocess.run(
            [sys.executable, "-c", _COMMANDS], input=json.dumps(argvs), cwd=self.tree.path, env=self.tree.env(),
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise BenchError(f"{self.tree.name}: the commands' process failed: {done.stderr.strip()[-2000:]}")
        outputs = []
        for argv, code, out, err in json.loads(done.stdout):
            if code != 0:
                raise BenchError(f"{self.tree.name}: mcp-gateway {' '.join(argv)} exited {code}: {err.strip()}")
            outputs.append(out)
        return outputs

    def events(self) -> list[dict[str, Any]]:
        """Every event as the tree's own `audit export` prints it; no token may be in it."""
        export = self.commands(("audit", "export"))[0]
        if any(token in export for token in self.tokens.values()):
            raise BenchError(f"{self.tree.name}: the audit log of {self.url} contains a token")
        return [json.loads(line) for line in export.splitlines()]

    def logged(self) -> list[tuple[str | None, str]]:
        return [(event["run_id"], event["event_type"]) for event in self.events()]

    def verify(self) -> str:
        return self.commands(("audit", "verify"))[0].strip()


# --- figures and the table ----------------------------------------------------------------------------


def p50(values: Sequence[float]) -> float:
    return statistics.median(values)


def nearest_rank(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class Row:
    """One line of the final table. `before`/`after`/`anchor` in `unit`; a ratio is a tree's figure over its anchor."""

    name: str
    unit: str
    before: float | None
    after: float | None
    anchor: float | None
    anchor_name: str
    ratio_before: float | None
    ratio_after: float | None
    aim: str
    met: bool | None
    floors: list[str] = field(default_factory=list)
    """Shown where the aim is missed: the measured floor that stops it."""
    skipped: str = ""


@dataclass
class Cpu:
    """CPU ms per call of each process of one side of a call row."""

    row: str
    side: str
    gateway: float
    database: float | None
    client: float
    note: str = ""


@dataclass
class Floor:
    """A refused-call figure, ms, of bench/floor_server.py beside the bare SDK's and the gateway's (decision 100).
    CPU figures count the database's backends on PostgreSQL."""

    row: str
    bare: float
    floor: float
    gateway: float


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    floor: list[Floor] = field(default_factory=list)
    cpu: list[Cpu] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    """One line per check passed; a failed check raises BenchError."""


def cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} {unit}" if unit == "calls/s" else f"{value:.2f} {unit}".strip()


def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(results: Results) -> list[str]:
    header = ("row", "before", "after", "anchor", "ratio before", "ratio after", "aim", "met/missed")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in results.rows:
        if row.skipped:
            lines.append(f"| {row.name} | {row.skipped} |" + " |" * (len(header) - 2))
            continue
        verdict = "-" if row.met is None else ("met" if row.met else "missed")
        anchor = f"{row.anchor_name} {cell(row.anchor, row.unit)}" if row.anchor is not None else row.anchor_name
        cells = (
            row.name, cell(row.before, row.unit), cell(row.after, row.unit), anchor,
            ratio_cell(row.ratio_before), ratio_cell(row.ratio_after), row.aim, verdict,
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    missed = [row for row in results.rows if row.met is False and row.floors]
    if missed:
        lines.append("")
        lines.append("where an aim is missed, the floor under it (measured in this run):")
        lines += [f"- {row.name}: {floor}" for row in missed for floor in row.floors]
    return lines


def floor_table(results: Results) -> list[str]:
    header = ("row", "bare SDK", "floor", "floor/bare", "gateway", "gateway/bare", "gateway/floor", "gateway - floor")
    lines = [
        "the floor under a refused call (bench/floor_server.py: the bare SDK server, the caller read, the refusal's",
        "events and card committed, one thread hop; decision 100), measured in the same rounds:",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for f in results.floor:
        cells = (
            f.row, f"{f.bare:.3f} ms", f"{f.floor:.3f} ms", f"{f.floor / f.bare:.2f}x", f"{f.gateway:.3f} ms",
            f"{f.gateway / f.bare:.2f}x", f"{f.gateway / f.floor:.2f}x", f"{f.gateway - f.floor:+.3f} ms",
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cpu_table(results: Results) -> list[str]:
    lines = [
        "CPU per call, ms (user + system):",
        f"  {'row':<34}{'side':<24}{'gateway(s)':>11}{'database':>10}{'client':>8}  note",
    ]
    for c in results.cpu:
        database = "-" if c.database is None else f"{c.database:.3f}"
        lines.append(f"  {c.row:<34}{c.side:<24}{c.gateway:>11.3f}{database:>10}{c.client:>8.3f}  {c.note}")
    return lines


# --- CPU of processes -----------------------------------------------------------------------------------


_TICK = os.sysconf("SC_CLK_TCK")


def own_and_reaped_cpu_s(pid: int) -> float:
    """User + system CPU of `pid` and of the children it has waited for (a sandboxed run's processes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / _TICK  # utime, stime, cutime, cstime


def backend_pids(admin: sqlalchemy.Engine, url: str) -> list[int]:
    """The PostgreSQL backends connected to the database `url` names."""
    database = sqlalchemy.make_url(url).database
    with admin.connect() as connection:
        rows = connection.execute(
            sqlalchemy.text("SELECT pid FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid()"),
            {"name": database},
        )
        return [int(pid) for (pid,) in rows]


# --- refused calls and their CPU ------------------------------------------------------------------


class TimedSide(stdio_refusals.Side):
    """A side whose client CPU (this thread's) is counted per call."""

    client_cpu_ns = 0

    def one(self) -> int:
        before = time.thread_time_ns()
        elapsed = super().one()
        self.client_cpu_ns += time.thread_time_ns() - before
        return elapsed


def refused_calls(
    trees: Sequence[Tree],
    engines: Mapping[str, str | None],
    root: Path,
    sizes: Sizes,
    results: Results,
    *,
    rows: set[str],
) -> None:
    """The refused-call and CPU rows: the bare server and each tree's gateway on each engine, interleaved."""
    homes = {
        (tree.name, engine): TreeHome(
            tree, root / f"refused-{tree.name}-{engine}", None if url is None else fresh_database(url), [("vic", "VIEWER")], {}
        )
        for engine, url in engines.items()
        for tree in [*trees, Tree(FLOOR, REPO), *([Tree(FLOOR_ONE_TRIP, REPO)] if engine == "postgresql" else [])]
    }  # fmt: skip
    pg_base = engines.get("postgresql")
    admin = sqlalchemy.create_engine(pg_base, poolclass=NullPool) if pg_base else None
    sides: list[TimedSide] = []

    def body(children: list[subprocess.Popen[bytes]]) -> None:
        bare_argv = [sys.executable, str(REPO / "bench" / "bare_server.py")]
        bare = stdio_refusals.RawClient("bare", bare_argv, root / "bare.log", children)
        sides.append(TimedSide("bare SDK server", bare, "", None))
        for (tree_name, engine), home in homes.items():
            label = f"{tree_name}, {engine}"
            one_trip = tree_name == FLOOR_ONE_TRIP
            floor = tree_name in {FLOOR, FLOOR_ONE_TRIP}
            argv = stdio_refusals.floor_argv(home.url, one_trip=one_trip) if floor else home.argv("serve")
            client = stdio_refusals.RawClient(
                label, argv, root / f"serve-{tree_name}-{engine}.log", children,
                cwd=home.tree.path, env=home.tree.env(),
            )  # fmt: skip
            sides.append(TimedSide(label, client, home.tokens["vic"], home))
        sides[0].params = sides[1].params  # the very same request bytes, auth included
        try:
            for side in sides:
                side.client.initialize()
            stdio_refusals.warm_up(sides, sizes.warmup)
            backends = {
                f"{tree_name}, {engine}": backend_pids(admin, home.url)
                for (tree_name, engine), home in homes.items()
                if admin is not None and engine == "postgresql"
            }
            pids = [side.client.process.pid for side in sides]
            before = [fleet_scale.cpu_s([pid]) for pid in pids]
            database_before = {label: fleet_scale.cpu_s(found) for label, found in backends.items()}
            for side in sides:
                side.client_cpu_ns = 0
            stdio_refusals.measure(sides, sizes.calls, sizes.blocks)
            spent = [fleet_scale.cpu_s([pid]) - b for pid, b in zip(pids, before, strict=True)]
            database = {label: fleet_scale.cpu_s(backends[label]) - b for label, b in database_before.items()}
        finally:
            codes = [side.client.close() for side in sides]
        for side, code in zip(sides, codes, strict=True):
            if code != 0:
                raise BenchError(f"{side.label} exited with {code}: {side.client.stderr_tail()}")
        for side, seconds in zip(sides, spent, strict=True):
            database_ms = 1000 * database[side.label] / sizes.calls if side.label in database else None
            note = "the database's own backends" if database_ms is not None else ""
            if side.label.endswith("sqlite"):
                note = "SQLite works inside the gateway"
            results.cpu.append(
                Cpu("refused call", side.label, 1000 * seconds / sizes.calls, database_ms,
                    side.client_cpu_ns / 1e6 / sizes.calls, note)
            )  # fmt: skip

    stdio_refusals.run_with_deadline("call_cost", 60 + sizes.calls * 0.25, body)
    for side, home in zip(sides[1:], homes.values(), strict=True):
        results.checks.append(f"refused calls, {side.label}: {stdio_refusals.check_audit(side, home.setup_events)}")
    for home in homes.values():
        home.engine.dispose()
    if admin is not None:
        admin.dispose()

    refused_rows(trees, engines, sides, results, rows)


def refused_rows(
    trees: Sequence[Tree], engines: Iterable[str], sides: Sequence[TimedSide], results: Results, rows: set[str]
) -> None:
    """The refused-call and CPU rows of the sides just measured, and the floor's beside them."""
    bare = stdio_refusals.Figures.of(sides[0].samples)
    bare_cpu = results.cpu[-len(sides)].gateway
    by_label = {side.label: side for side in sides}
    cpu_by_label = {c.side: c for c in results.cpu[-len(sides) :]}
    for engine in engines:
        figures = {t.name: stdio_refusals.Figures.of(by_label[f"{t.name}, {engine}"].samples).p50_ms for t in trees}
        variants = [name for name in (FLOOR, FLOOR_ONE_TRIP) if f"{name}, {engine}" in by_label]
        floors = {name: stdio_refusals.Figures.of(by_label[f"{name}, {engine}"].samples).p50_ms for name in variants}
        floor_cpus = {name: cpu_by_label[f"{name}, {engine}"] for name in variants}
        floor_totals = {name: c.gateway + (c.database or 0.0) for name, c in floor_cpus.items()}
        floor, floor_total = min(floors.values()), min(floor_totals.values())  # the lowest floor measured
        cpus = {t.name: cpu_by_label[f"{t.name}, {engine}"].gateway for t in trees}
        database = {t.name: cpu_by_label[f"{t.name}, {engine}"].database or 0.0 for t in trees}
        if "refused" in rows:
            results.rows.append(
                ratio_row(f"refused call p50, {engine}", "ms", figures, bare.p50_ms, anchor_name="bare SDK", aim=AIM_RATIO, floors=
                          [f"the bare SDK server's p50 {bare.p50_ms:.3f} ms is the round trip every server pays",
                           above_floor("p50", figures["after"], floor, bare.p50_ms)])
            )  # fmt: skip
            for name, value in floors.items():
                results.floor.append(
                    Floor(f"refused call p50, {engine}{_variant(name)}", bare.p50_ms, value, figures["after"])
                )
        if "cpu" in rows:
            total = cpus["after"] + database["after"]
            results.rows.append(
                ratio_row(f"server CPU per refused call, {engine}", "ms", cpus, bare_cpu, anchor_name="bare SDK", aim=AIM_RATIO, floors=
                          [f"the bare SDK server's CPU per call {bare_cpu:.3f} ms (the SDK's own parse, dispatch, "
                           "validation and write of one call)",
                           above_floor("CPU (the database's backends included)", total, floor_total, bare_cpu)])
            )  # fmt: skip
            for name, value in floor_totals.items():
                row = f"server CPU per refused call, {engine}{_variant(name)}"
                results.floor.append(Floor(row, bare_cpu, value, total))


def _variant(floor: str) -> str:
    return " (one trip)" if floor == FLOOR_ONE_TRIP else ""


def above_floor(what: str, gateway: float, floor: float, bare: float) -> str:
    return (
        f"the floor server's {what} is {floor:.3f} ms, {floor / bare:.2f}x bare (decision 100): the gateway stands "
        f"{gateway - floor:+.3f} ms, {gateway / floor:.2f}x, above it"
    )


def ratio_row(
    name: str,
    unit: str,
    figures: Mapping[str, float],
    anchor: float,
    *,
    anchor_name: str,
    aim: float,
    floors: list[str],
) -> Row:
    before, after = figures.get("before"), figures.get("after")
    ratio_before = None if before is None else before / anchor
    ratio_after = None if after is None else after / anchor
    met = None if ratio_after is None else ratio_after <= aim
    return Row(name, unit, before, after, anchor, anchor_name, ratio_before, ratio_after, f"<= {aim}x", met, floors)


# --- start-up --------------------------------------------------------------------------------------------


def start_up(trees: Sequence[Tree], root: Path, sizes: Sizes, results: Results) -> None:
    """`serve` until its `initialize` answer, then its `tools/list` answer, against the two floors, interleaved."""
    homes = {}
    for tree in trees:
        homes[tree.name] = root / f"startup-{tree.name}"
        startup._init(tree.path, homes[tree.name])
    samples: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def timed(key: str, measure: Callable[[], dict[str, float]]) -> None:
        before = startup._children_cpu_s()
        figures = measure()
        cpu.setdefault(key, []).append(1000 * (startup._children_cpu_s() - before))
        if "initialize" in figures:
            samples.setdefault(key, []).append(figures["initialize"])
            samples.setdefault(f"{key} tools/list", []).append(figures["tools/list"])
        else:
            (value,) = figures.values()
            samples.setdefault(key, []).append(value)

    after = trees[-1]
    for tree in trees:  # warm-up: bytecode caches and the page cache
        startup.time_serve(tree.path, homes[tree.name])
    startup.time_pass(after.path, homes[after.name])
    startup.time_sdk_import(after.path, homes[after.name])
    for round_no in range(sizes.startup_runs):
        order = list(trees) if round_no % 2 == 0 else list(reversed(trees))
        timed("pass", lambda: startup.time_pass(after.path, homes[after.name]))
        timed("import", lambda: startup.time_sdk_import(after.path, homes[after.name]))
        for tree in order:
            timed(tree.name, lambda tree=tree: startup.time_serve(tree.path, homes[tree.name]))  # type: ignore[misc]
    floor_pass, floor_import = p50(samples["pass"]), p50(samples["import"])
    floors = [
        f'`python -c pass` {floor_pass:.0f} ms; the SDK\'s import (`python -c "{startup.SDK_IMPORT}"`) '
        f"{floor_import:.0f} ms, {p50(cpu['import']):.0f} ms of CPU: any server on the SDK pays it before it answers"
    ]
    for key, name in (("", "`initialize` answered after spawn"), (" tools/list", "then `tools/list` answered")):
        figures = {t.name: p50(samples[f"{t.name}{key}"]) for t in trees}
        row = Row(name, "ms", figures.get("before"), figures.get("after"), floor_pass, "python -c pass",
                  None, None, f"<= {AIM_INITIALIZE_MS:.0f} ms" if not key else "(shown)", None, floors)  # fmt: skip
        row.ratio_before = None if row.before is None else row.before / floor_pass
        row.ratio_after = None if row.after is None else row.after / floor_pass
        if not key and row.after is not None:
            row.met = row.after <= AIM_INITIALIZE_MS
        results.rows.append(row)
    for tree in trees:
        results.cpu.append(Cpu("serve start (per process)", tree.name, p50(cpu[tree.name]), None, 0.0,
                               "start to exit, tools/list included"))  # fmt: skip
    results.cpu.append(Cpu("serve start (per process)", "SDK import floor", p50(cpu["import"]), None, 0.0, ""))
    results.checks.append(
        f"start-up: {sizes.startup_runs} spawns of each tree answered initialize and listed the tools"
    )


# --- a sandboxed spawn -----------------------------------------------------------------------------------

_SPAWN_WORKER = """
import dataclasses, os, pathlib, resource, subprocess, sys, time
import anyio
from bench.sandbox_cost import TRIVIAL, confined, generous_limits

root = pathlib.Path(sys.argv[1])
cwd, out = root / "cwd", root / "out"
env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
limits = generous_limits(env)
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

async def bare():
    subprocess.run(TRIVIAL, cwd=cwd, env=env, check=True, **quiet)

async def floor():
    # The PID namespace alone (decision 95): a preexec_fn that makes it and forks the run's two
    # supervisors, nothing else; only the tree after decision 95 has RunSupervisor, so imported here.
    from sandbox.backends import pidns
    supervisor = pidns.RunSupervisor(timeout_s=30, status_fd=-1)
    def preexec():
        supervisor.enter()
        supervisor.fork()
    process = subprocess.Popen(TRIVIAL, cwd=cwd, env=env, start_new_session=True, preexec_fn=preexec, **quiet)
    if process.wait() != 0:
        raise SystemExit("the floor's spawn failed")

sides = {
    "bare": bare,
    "native": confined(root, cwd, out, limits),
    "bubblewrap": confined(root, cwd, out, dataclasses.replace(limits, backend="bubblewrap")),
    "floor": floor,
}

def cpu_ns():
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return int(1e9 * (own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime))

async def main():
    while line := await anyio.to_thread.run_sync(sys.stdin.readline):
        cpu, started = cpu_ns(), time.perf_counter_ns()
        await sides[line.strip()]()
        elapsed = time.perf_counter_ns() - started
        print(elapsed, cpu_ns() - cpu, flush=True)

anyio.run(main)
"""
"""Runs in a process of the tree's own code: bench/sandbox_cost.py's sides of that tree, one per request line."""


class SpawnWorker:
    def __init__(self, tree: Tree, root: Path) -> None:
        for sub in ("cwd", "out"):
            (root / sub).mkdir(parents=True)
        reachable_by_everyone(root / "cwd")
        self.tree = tree
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SPAWN_WORKER, str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tree.path, env=tree.env(),
        )  # fmt: skip

    def once(self, side: str) -> tuple[int, int]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(side.encode() + b"\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().split()
        if len(answer) != 2:
            raise BenchError(f"{self.tree.name}: the spawn worker died on {side} (its traceback is above)")
        return int(answer[0]), int(answer[1])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def spawn(trees: Sequence[Tree], root: Path, sizes: Sizes, results: Results) -> None:
    """The trivial spawn in each tree's worker, rounds interleaved over trees and sides."""
    kinds = ("bare", "native", "bubblewrap")
    after = trees[-1].name
    workers = [SpawnWorker(tree, root / f"spawn-{tree.name}") for tree in trees]
    samples: dict[tuple[str, str], list[int]] = {(t.name, k): [] for t in trees for k in (*kinds, "floor")}
    cpu: dict[tuple[str, str], list[int]] = {(t.name, k): [] for t in trees for k in (*kinds, "floor")}
    try:
        for round_no in range(2 + sizes.spawn_rounds):  # two warm-up rounds
            for worker in workers if round_no % 2 == 0 else reversed(workers):
                # The floor only in the tree after: the PID namespace alone, in the same worker and rounds.
                own = (*kinds, "floor") if worker.tree.name == after else kinds
                shift = round_no % len(own)
                for kind in [*own[shift:], *own[:shift]]:
                    elapsed, spent = worker.once(kind)
                    if round_no >= 2:
                        samples[(worker.tree.name, kind)].append(elapsed)
                        cpu[(worker.tree.name, kind)].append(spent)
    finally:
        for worker in workers:
            worker.close()
    floor_ms = p50(samples[(after, "floor")]) / 1e6
    for backend in kinds[1:]:
        figures = {t.name: p50(samples[(t.name, backend)]) / 1e6 for t in trees}
        bare = {t.name: p50(samples[(t.name, "bare")]) / 1e6 for t in trees}
        row = Row(f"sandboxed spawn, {backend}", "ms", figures.get("before"), figures.get("after"), bare[after],
                  "subprocess.run", None, None, f"<= {AIM_SPAWN_RATIO}x", None)  # fmt: skip
        # Each tree's ratio is against the bare spawn its own worker timed in the same rounds.
        row.ratio_before = figures["before"] / bare["before"] if "before" in figures else None
        row.ratio_after = figures[after] / bare[after]
        row.met = row.ratio_after <= AIM_SPAWN_RATIO
        row.floors = [
            f"the PID namespace alone (a preexec_fn that makes it and forks the run's two supervisors, no other "
            f"layer, decision 95) {floor_ms:.1f} ms, {floor_ms / bare[after]:.2f}x bare subprocess.run "
            f"{bare[after]:.1f} ms in the same worker and rounds ({p50(cpu[(after, 'floor')]) / 1e6:.1f} and "
            f"{p50(cpu[(after, 'bare')]) / 1e6:.1f} ms of CPU); every layer but that one costs "
            f"{figures[after] - floor_ms:.1f} ms; bench/sandbox_cost.py splits the rest by layer"
        ]
        results.rows.append(row)
    for tree in trees:
        for kind in (*kinds, "floor") if tree.name == after else kinds:
            results.cpu.append(Cpu("trivial spawn", f"{tree.name}, {kind}", p50(cpu[(tree.name, kind)]) / 1e6,
                                   None, 0.0, "the spawning process and what it reaped"))  # fmt: skip
    results.checks.append(f"spawn: {sizes.spawn_rounds + 2} rounds, every run exited 0 with its layers")


# --- the fleet --------------------------------------------------------------------------------------------


def fleet(trees: Sequence[Tree], pg_base: str, root: Path, sizes: Sizes, results: Results) -> None:
    """1 gateway on SQLite and N on PostgreSQL for each tree, bench/fleet_scale.py's slices taken in turn."""
    budget = 6 if sizes.fleet_calls < 1000 else 20
    policy = {**fleet_scale.POLICY, "budget": {"attempts_total": budget}}
    configurations = []
    try:
        for tree in trees:
            for engine, count in (("sqlite", 1), ("postgresql", sizes.fleet_gateways)):
                url = fresh_database(pg_base) if engine == "postgresql" else None
                home = TreeHome(tree, root / f"fleet-{tree.name}-{engine}", url, fleet_scale.USERS, policy)
                configurations.append(
                    fleet_scale.start_configuration(
                        engine, home, home.tokens, count, warmup=20 if sizes.fleet_calls >= 1000 else 3,
                        logs=home.root, tree=tree.path, read_events=home.logged,
                    )
                )  # fmt: skip
        for _ in range(sizes.fleet_rounds):
            for configuration in configurations:
                fleet_scale.measure(configuration, sizes.fleet_calls // sizes.fleet_rounds)
        done: list[tuple[TreeHome, fleet_scale.Result]] = []
        while configurations:
            configuration = configurations.pop(0)
            # check() reads the log through home.logged, which refuses a log holding a token
            owner = configuration.home
            assert isinstance(owner, TreeHome)
            done.append((owner, fleet_scale.check(configuration, budget)))
    finally:
        for configuration in configurations:
            fleet_scale.stop_fleet(configuration.fleet)
    per_tree: dict[str, dict[str, fleet_scale.Result]] = {}
    for home, result in done:
        per_tree.setdefault(home.tree.name, {})[result.engine] = result
        label = f"{home.tree.name}, {result.engine} x{result.gateways}"
        if not result.correct:
            raise BenchError(f"fleet, {label}: {fleet_scale.report([result])[1]}")
        results.checks.append(
            f"fleet, {label}: {result.calls} calls, 0 wrong, 0 missing, verify ok, "
            f"budget {result.admitted}/{result.budget}, no token"
        )
        results.cpu.append(Cpu("fleet call", label, result.gateway_cpu_ms,
                                result.database_cpu_ms if result.engine == "postgresql" else None,
                                result.client_cpu_ms, f"{result.rate:.0f} calls/s, p99 {result.p99_ms:.1f} ms"))  # fmt: skip
    after = trees[-1].name
    anchor = per_tree[after]["sqlite"]
    rates = {name: r["postgresql"].rate for name, r in per_tree.items()}
    n = sizes.fleet_gateways
    row = Row(f"{n} gateways on PostgreSQL vs 1 on SQLite", "calls/s", rates.get("before"), rates.get(after),
              anchor.rate, "1 on SQLite", None, None,
              f">= {AIM_FLEET_RATIO}x, p99 <= {AIM_FLEET_P99_MS:.0f} ms", None)  # fmt: skip
    # Each tree's ratio is against its own 1-gateway SQLite run, in the same rounds.
    ratios = {name: r["postgresql"].rate / r["sqlite"].rate for name, r in per_tree.items()}
    row.ratio_before, row.ratio_after = ratios.get("before"), ratios[after]
    p99 = per_tree[after]["postgresql"].p99_ms
    row.met = ratios[after] >= AIM_FLEET_RATIO and p99 <= AIM_FLEET_P99_MS
    busy = per_tree[after]["postgresql"].cpus_busy
    pg = per_tree[after]["postgresql"]
    row.floors = [
        f"p99 {p99:.1f} ms after, {per_tree['before']['postgresql'].p99_ms if 'before' in per_tree else math.nan:.1f} "
        f"ms before; the CPU a call costs with {n} gateways on PostgreSQL, {pg.gateway_cpu_ms + pg.database_cpu_ms + pg.client_cpu_ms:.2f} ms "
        f"(gateway {pg.gateway_cpu_ms:.2f}, database {pg.database_cpu_ms:.2f}, client {pg.client_cpu_ms:.2f}), "
        f"bounds the fleet at {len(os.sched_getaffinity(0))} CPUs / that = "
        f"{1000 * len(os.sched_getaffinity(0)) / max(0.001, pg.gateway_cpu_ms + pg.database_cpu_ms + pg.client_cpu_ms):.0f} "
        f"calls/s; {busy:.2f} CPUs were busy"
    ]
    results.rows.append(row)


# --- the sample suite ---------------------------------------------------------------------------------------


class ConsentingClient(stdio_refusals.RawClient):
    """Answers each consent question Allow once, as sandbox_cost.py's gateway side does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capabilities = dict(FORM_ELICITATION)

    def answer(self, request: Mapping[str, Any]) -> None:
        if request["method"] != "elicitation/create":
            super().answer(request)
        result = {"action": "accept", "content": {"decision": "allow_once"}}
        self._send({"jsonrpc": "2.0", "id": request["id"], "result": result})


@dataclass
class SuiteSide:
    """One way the sample suite is run: its samples (ns), its CPU per run (ms), its client's CPU per run (ms)."""

    name: str
    once: Callable[[], tuple[int, float, float]]
    samples: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)


def plain_pytest(workspace: Path) -> Callable[[], tuple[int, float, float]]:
    """`python -m pytest -q tests` in `workspace`, as a developer runs it (PYTEST_* variables dropped)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

    def once() -> tuple[int, float, float]:
        before, started = startup._children_cpu_s(), time.perf_counter_ns()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "tests"], cwd=workspace, env=env,
            stdin=subprocess.DEVNULL, capture_output=True, timeout=SUITE_TIMEOUT_S, check=False,
        )  # fmt: skip
        elapsed = time.perf_counter_ns() - started
        if done.returncode != 0:
            raise BenchError(f"plain pytest: exit code {done.returncode}\n{done.stdout.decode()[-2000:]}")
        return elapsed, 1000 * (startup._children_cpu_s() - before), 0.0

    return once


def allowed_run(home: TreeHome, client: ConsentingClient, run_ids: list[str]) -> Callable[[], tuple[int, float, float]]:
    """A USER's run_pytest through `serve`; its run id is added to `run_ids`."""
    params = {"name": "run_pytest", "arguments": SUITE_CALL, "auth": {"token": home.tokens["alice"]}}

    def once() -> tuple[int, float, float]:
        pid = client.process.pid
        before, client_before = own_and_reaped_cpu_s(pid), time.thread_time_ns()
        response, elapsed = client.request("tools/call", params)
        spent, client_spent = own_and_reaped_cpu_s(pid) - before, time.thread_time_ns() - client_before
        result = response.get("result") or {}
        structured = result.get("structuredContent") or {}
        if result.get("isError", True) or structured.get("exit_code") != 0:
            raise BenchError(f"{home.tree.name}: run_pytest through serve: {response}")
        run_ids.append(structured["run_id"])
        return elapsed, 1000 * spent, client_spent / 1e6

    return once


def check_runs(home: TreeHome, run_ids: Sequence[str]) -> str:
    """Each allowed run logged exactly its trail; the chain verifies."""
    logged: dict[str | None, list[str]] = {}
    for run_id, event_type in home.logged():
        logged.setdefault(run_id, []).append(event_type)
    wrong = [run_id for run_id in run_ids if logged.get(run_id) != ALLOWED_RUN_EVENTS]
    if wrong:
        raise BenchError(f"{home.tree.name}: {len(wrong)} runs without {ALLOWED_RUN_EVENTS}: {logged.get(wrong[0])}")
    return (
        f"suite, {home.tree.name}: {len(run_ids)} runs passed, each logged {', '.join(ALLOWED_RUN_EVENTS)};"
        f" verify: {home.verify()}"
    )


def suite(trees: Sequence[Tree], root: Path, sizes: Sizes, results: Results) -> None:
    """An allowed run_pytest through each tree's `serve`, against plain pytest in a copy of its own, interleaved."""
    plain_workspace = root / "suite-plain"
    shutil.copytree(SAMPLE_PROJECT, plain_workspace, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    policy = {"budget": {"attempts_total": sizes.suite_rounds + 12}}
    homes = [TreeHome(tree, root / f"suite-{tree.name}", None, [("alice", "USER")], policy) for tree in trees]
    children: list[subprocess.Popen[bytes]] = []
    clients = [
        ConsentingClient(f"{home.tree.name} serve", home.argv("serve"), root / f"suite-{home.tree.name}.log",
                         children, cwd=home.tree.path, env=home.tree.env())
        for home in homes
    ]  # fmt: skip
    run_ids: dict[str, list[str]] = {home.tree.name: [] for home in homes}
    sides = [SuiteSide("plain pytest", plain_pytest(plain_workspace))]
    sides += [
        SuiteSide(home.tree.name, allowed_run(home, client, run_ids[home.tree.name]))
        for home, client in zip(homes, clients, strict=True)
    ]
    try:
        for client in clients:
            client.initialize()
        for round_no in range(1 + sizes.suite_rounds):  # one warm-up round
            shift = round_no % len(sides)
            for side in [*sides[shift:], *sides[:shift]]:
                elapsed, spent, client_spent = side.once()
                if round_no:
                    side.samples.append(elapsed)
                    side.cpu.append(spent)
                    side.client_cpu.append(client_spent)
    finally:
        codes = [client.close() for client in clients]
    if any(codes):
        raise BenchError(f"a suite gateway exited with {codes}")
    for home in homes:
        results.checks.append(check_runs(home, run_ids[home.tree.name]))
        home.engine.dispose()
    plain, *gateways = sides
    anchor = p50(plain.samples) / 1e6
    figures = {side.name: p50(side.samples) / 1e6 for side in gateways}
    floors = [f"plain pytest {anchor:.0f} ms ({p50(plain.cpu):.0f} ms of CPU): the run itself"]
    results.rows.append(
        ratio_row("allowed run_pytest, sample suite", "ms", figures, anchor, anchor_name="plain pytest",
                  aim=AIM_SUITE_RATIO, floors=floors)
    )  # fmt: skip
    results.cpu.append(Cpu("allowed run_pytest", "plain pytest", p50(plain.cpu), None, 0.0, "pytest's own process"))
    for side in gateways:
        results.cpu.append(Cpu("allowed run_pytest", side.name, p50(side.cpu), None, p50(side.client_cpu),
                               "the gateway and the run it reaped"))  # fmt: skip


# --- main ---------------------------------------------------------------------------------------------


def skipped(results: Results, names: Sequence[str], why: str) -> None:
    for name in names:
        results.rows.append(Row(name, "", None, None, None, "", None, None, "", None, skipped=f"skipped: {why}"))


_DATABASES: list[tuple[str, str]] = []
"""(base URL, URL) of each database this run made: dropped at its end (a `--pg-url` server keeps running)."""


def fresh_database(base: str) -> str:
    url = new_database(base)
    _DATABASES.append((base, url))
    return url


@contextlib.contextmanager
def postgres(given: str | None, scratch: Path) -> Iterator[str | None]:
    """A PostgreSQL server's base URL (fleet_scale.py's throwaway cluster, or `given`); None without its programs."""
    if given is None and server_programs() is None:
        yield None
        return
    with fleet_scale.postgres_server(given, scratch) as base:
        try:
            yield base
        finally:
            while _DATABASES:
                drop_database(*_DATABASES.pop())


def run(args: argparse.Namespace, sizes: Sizes, rows: set[str], scratch: Path) -> Results:
    results = Results()
    trees = [Tree("after", REPO)]
    if not args.no_before:
        trees.insert(0, Tree("before", startup.extract_tree(args.before, scratch / "before")))
    is_root = os.geteuid() == 0
    cluster = scratch / "cluster"  # fleet_scale.py gives this folder to the cluster's user: nothing else in it
    cluster.mkdir()
    no_pg = "needs PostgreSQL's programs (`make postgresql` as root, or --pg-url)"
    if "postgresql" not in args.engines.split(","):
        no_pg = "PostgreSQL not chosen (--engines)"
    with (
        postgres(args.pg_url, cluster)
        if "postgresql" in args.engines.split(",")
        else contextlib.nullcontext() as pg_base
    ):
        engines: dict[str, str | None] = {"sqlite": None} | ({"postgresql": pg_base} if pg_base else {})
        steps: list[tuple[str, Callable[[], None], str | None, list[str]]] = [
            (
                "refused",
                lambda: refused_calls(trees, engines, scratch / "refused", sizes, results, rows=rows),
                None,
                [],
            ),
            ("startup", lambda: start_up(trees, scratch / "startup", sizes, results), None, []),
            (
                "spawn",
                lambda: spawn(trees, scratch / "spawn", sizes, results),
                None if is_root else "needs root",
                ["sandboxed spawn"],
            ),
            (
                "fleet",
                lambda: fleet(trees, pg_base or "", scratch / "fleet", sizes, results),
                None if pg_base else no_pg,
                ["gateways on PostgreSQL vs 1 on SQLite"],
            ),
            (
                "suite",
                lambda: suite(trees, scratch / "suite", sizes, results),
                None if is_root else "needs root",
                ["allowed run_pytest, sample suite"],
            ),
        ]
        for name, measure, why_not, names in steps:
            wanted = rows & {"refused", "cpu"} if name == "refused" else rows & {name}
            if not wanted:
                continue
            if why_not is not None:
                skipped(results, names, why_not)
                continue
            started = time.monotonic()
            measure()
            print(f"  {name}: measured and checked in {time.monotonic() - started:.0f} s", flush=True)
        if pg_base is None and rows & {"refused", "cpu"}:
            skipped(results, [f"{r}, postgresql" for r in ("refused call p50", "server CPU per refused call")], no_pg)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a run of under a minute: the shape, not the figures")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to measure, comma-separated ({','.join(ROWS)})")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this file")
    parser.add_argument("--before", default=BEFORE, help=f"the commit measured as before (default {BEFORE})")
    parser.add_argument("--no-before", action="store_true", help="measure the working tree alone")
    parser.add_argument("--engines", default="sqlite,postgresql", help="sqlite, or both (default)")
    parser.add_argument("--pg-url", default=None, help="a PostgreSQL server to use instead of a throwaway cluster")
    args = parser.parse_args(argv)
    rows = set(args.rows.split(","))
    if not rows <= set(ROWS):
        parser.error(f"--rows: unknown {sorted(rows - set(ROWS))}; known: {', '.join(ROWS)}")
    sizes = QUICK if args.quick else Sizes()
    load = load_start = os.getloadavg()
    print(
        f"call cost: python {platform.python_version()}, {len(os.sched_getaffinity(0))} CPUs, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start; before = {args.before}, after = this tree",
        flush=True,
    )
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="bench-call-cost-"))
    scratch.chmod(0o755)  # the throwaway cluster's user and the sandbox's run uids go through it
    try:
        results = run(args, sizes, rows, scratch)
    except (BenchError, stdio_refusals.BenchError, fleet_scale.BenchError) as exc:
        print(f"call_cost: check failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load = os.getloadavg()
    print()
    print("\n".join(cpu_table(results)))
    print()
    print("checks (all passed):")
    print("\n".join(f"  {line}" for line in results.checks))
    print()
    print(f"took {time.monotonic() - started:.0f} s; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    print()
    print("\n".join(table(results)))
    if results.floor:
        print()
        print("\n".join(floor_table(results)))
    if args.json is not None:
        machine = {"cpus": len(os.sched_getaffinity(0)), "load_start": load_start, "load_end": load}
        saved = {"before": args.before, "machine": machine, "sizes": asdict(sizes), **asdict(results)}
        args.json.write_text(json.dumps(saved, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
