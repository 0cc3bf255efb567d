"""Many gateways on one database (decision 62): calls/s, p50/p99 and the correctness counts.

For each engine (SQLite, PostgreSQL) and each fleet size N (default 1, 8, 32), N `mcp-gateway
serve` processes share one fresh database, state folder and policy, as a team's agent hosts
share theirs. One raw client (newline-delimited JSON-RPC on each gateway's pipes, driven by one
selector loop, so the client costs the same little per call whatever N) keeps one call in
flight on every gateway, as an agent does, alternating the issue's two cheap calls:

- a VIEWER's `run_pytest`: authenticated, refused at authorization (-32003), MCP_TOOL_CALL and
  POLICY_BLOCKED committed in one transaction with the call's card;
- a USER's `list_artifacts`: a read tool, its entry committed before it reads, then
  TOOL_FINISHED.

Every configuration's fleet is started first, each on its own database, and warmed up
unmeasured. Then `--calls` calls per configuration are measured in `--rounds` slices, every
configuration in turn in each round (SQLite 1, PostgreSQL 1, SQLite 8, ... then again): this
VM's speed drifts by a third from one second to the next (a fixed loop's CPU time, measured),
so configurations measured minutes apart are not comparable, while slices taken in turn share
the drift. calls/s is the calls over the wall time of the configuration's slices; each ratio is
also printed for each round, to show how far one measurement can be off. Each configuration
then checks:

- answers: every refusal is -32003 and every `list_artifacts` a result;
- events missing: each answered call's run_id has exactly its two events in the log, in order;
- chain: `mcp-gateway audit verify` (the real command) exits 0;
- over-grants: a burst of `run_pytest` calls by a user whose budget allows `--budget` attempts,
  3 per gateway sent at once over every gateway, with the sandbox disabled so an admitted call
  costs nothing more (its attempt is charged at stage 6, then stage 7 answers -32006); admitted
  must be exactly the budget (more: an over-grant; fewer: a lost attempt).

PostgreSQL is a throwaway cluster of Debian's `postgresql` started here on 127.0.0.1 with the
server's defaults (fsync and synchronous_commit on, unlike the test suite's `fsync=off`), or the
server `--pg-url` names (its user must be able to create databases). It exits 0 with the figures,
1 when a check fails or a server dies.

    .venv/bin/python bench/fleet_scale.py [--gateways 1,8,32] [--calls 4000] [--rounds 4] [--engines sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import Engine

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.harness and tests.pg_cluster, as the tests build theirs

from gateway.audit import AuditLog  # noqa: E402
from gateway.clock import SystemClock  # noqa: E402
from tests.harness import GatewayHome  # noqa: E402
from tests.pg_cluster import new_database, server_programs  # noqa: E402

PROTOCOL_VERSION = "2025-11-25"
RUN_ID_META = "mcp-write-gateway/run_id"
PERMISSION_DENIED, BUDGET_EXCEEDED, SANDBOX_VIOLATION = -32003, -32005, -32006
REFUSED = "refused"
READ = "read"
EXPECTED_EVENTS = {REFUSED: ["MCP_TOOL_CALL", "POLICY_BLOCKED"], READ: ["MCP_TOOL_CALL", "TOOL_FINISHED"]}
USERS = (("vic", "VIEWER"), ("alice", "USER"), ("bob", "USER"))
"""The configuration's users: the refused calls' VIEWER, the reads' USER, the budget burst's USER."""
# Sandbox off: a budgeted run_pytest is charged at stage 6, then answered -32006 at stage 7, running nothing.
POLICY = {"sandbox": {"enabled": False}}


class BenchError(Exception):
    """A gateway answered wrongly or died, or a check failed."""


class FleetHome(Protocol):
    """The state folder a fleet shares: this tree's GatewayHome, or another tree's made by that tree's own
    `init` (bench/call_cost.py). `engine` reaches its database (connections, `dispose`); `cli` runs the
    `mcp-gateway` command on it."""

    home: Path
    url: str
    policy_path: Path
    engine: Engine

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]: ...


def request_line(request_id: int, tool: str, token: str, arguments: dict[str, Any]) -> bytes:
    params = {"name": tool, "arguments": arguments, "auth": {"token": token}}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


@dataclass
class Gateway:
    """One `serve` subprocess and what the selector loop keeps for it."""

    process: subprocess.Popen[bytes]
    buffer: bytearray = field(default_factory=bytearray)
    queue: list[tuple[str, bytes]] = field(default_factory=list)
    """(kind, request line) still to send, in order."""
    sent: tuple[str, int] | None = None
    """(kind, perf_counter_ns at send) of the call in flight."""
    answers: list[tuple[str, bytes, int]] = field(default_factory=list)
    """(kind, response line, latency ns) of each answered call."""

    @property
    def out(self) -> int:
        assert self.process.stdout is not None
        return self.process.stdout.fileno()

    def write(self, line: bytes) -> None:
        assert self.process.stdin is not None
        os.write(self.process.stdin.fileno(), line)

    def send_next(self) -> None:
        kind, line = self.queue.pop(0)
        self.sent = (kind, time.perf_counter_ns())
        self.write(line)


def start_fleet(home: FleetHome, count: int, logs: Path, tree: Path = REPO) -> list[Gateway]:
    """`count` gateways running the code of `tree` (this repository, or a baseline's work tree)."""
    argv = [
        sys.executable, "-m", "gateway",
        "--home", str(home.home), "--db", home.url, "--policy", str(home.policy_path), "serve",
    ]  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_TOKEN"}
    environment["PYTHONPATH"] = str(tree)
    fleet = []
    for index in range(count):
        with (logs / f"serve-{index}.log").open("wb") as stderr:
            process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=environment, cwd=tree
            )
        fleet.append(Gateway(process))
    hello = {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
    }  # fmt: skip
    for gateway in fleet:
        gateway.queue.append(("initialize", json.dumps(hello).encode() + b"\n"))
    drive(fleet, deadline_s=120)
    for gateway in fleet:
        gateway.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        gateway.answers.clear()
    return fleet


def drive(fleet: Sequence[Gateway], deadline_s: float) -> float:
    """Send every gateway's queue, one call in flight on each, until all are answered; the wall time in s."""
    selector = selectors.DefaultSelector()
    for gateway in fleet:
        os.set_blocking(gateway.out, False)
        if gateway.queue:
            selector.register(gateway.out, selectors.EVENT_READ, gateway)
    waiting = sum(len(g.queue) for g in fleet)
    began = time.perf_counter_ns()
    for gateway in fleet:
        if gateway.queue:
            gateway.send_next()
    stop = time.monotonic() + deadline_s
    while waiting:
        if time.monotonic() > stop:
            raise BenchError(f"{waiting} calls unanswered after {deadline_s} s")
        for key, _ in selector.select(timeout=1.0):
            gateway = key.data
            chunk = os.read(gateway.out, 1 << 16)
            if not chunk:
                raise BenchError(f"gateway pid {gateway.process.pid} closed its stdout (see its serve-*.log)")
            gateway.buffer += chunk
            while (end := gateway.buffer.find(b"\n")) >= 0:
                line = bytes(gateway.buffer[:end])
                del gateway.buffer[: end + 1]
                now = time.perf_counter_ns()
                assert gateway.sent is not None
                kind, sent_at = gateway.sent
                gateway.answers.append((kind, line, now - sent_at))
                waiting -= 1
                if gateway.queue:
                    gateway.send_next()
                else:
                    gateway.sent = None
                    selector.unregister(gateway.out)
    selector.close()
    return (time.perf_counter_ns() - began) / 1e9


def stop_fleet(fleet: Sequence[Gateway]) -> None:
    for gateway in fleet:
        assert gateway.process.stdin is not None
        gateway.process.stdin.close()
    for gateway in fleet:
        try:
            gateway.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait(timeout=20)
        assert gateway.process.stdout is not None
        gateway.process.stdout.close()


@dataclass(frozen=True)
class Result:
    engine: str
    gateways: int
    calls: int
    wall_s: float
    p50_ms: float
    p99_ms: float
    wrong_answers: int
    events_missing: int
    chain_ok: bool
    admitted: int
    budget: int
    gateway_cpu_ms: float
    """CPU time of the gateway processes per measured call (user + system)."""
    database_cpu_ms: float
    """The same for the database server's processes (0 for SQLite: in the gateways' own)."""
    client_cpu_ms: float
    connections: int
    """Connections the fleet held open on its PostgreSQL database after the measured calls."""
    switches: float
    """Context switches of the gateways' threads per measured call."""
    rates: tuple[float, ...] = ()
    """calls/s of each round's slice."""
    baseline: bool = False
    """Measured on the `--baseline` tree's gateways."""

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s

    @property
    def cpus_busy(self) -> float:
        """CPUs kept busy by the measured calls: the gateways', the database server's and the client's CPU time
        over the wall time. At the machine's CPU count, the CPUs are the limit, not a lock."""
        return self.rate * (self.gateway_cpu_ms + self.database_cpu_ms + self.client_cpu_ms) / 1000

    @property
    def over_grants(self) -> int:
        return max(0, self.admitted - self.budget)

    @property
    def correct(self) -> bool:
        return not self.wrong_answers and not self.events_missing and self.chain_ok and self.admitted == self.budget


_TICK = os.sysconf("SC_CLK_TCK")
POSTMASTER: list[int] = []
"""The pid of the PostgreSQL server this script started, if it started one."""


def cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of `pids` so far (those still there)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    return total / _TICK


def switches(pids: Sequence[int]) -> int:
    """Context switches (voluntary and not) of every thread of `pids` so far: each thread hop in a
    gateway costs some, whatever the CPU's speed, so this counts what the wall clock only blurs."""
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                lines = status.read_text().splitlines()
            except OSError:
                continue
            total += sum(int(line.split()[1]) for line in lines if "ctxt_switches:" in line)
    return total


def database_pids(engine: str) -> list[int]:
    """The processes of the PostgreSQL server started here: the postmaster and its children."""
    if engine != "postgresql" or not POSTMASTER:
        return []
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == POSTMASTER[0]:
                    children.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return [POSTMASTER[0], *children]


def connections_open(home: FleetHome) -> int:
    with home.engine.connect() as connection:  # this one, counted, is taken off
        count = connection.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).scalar_one()
    return int(count) - 1


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def answered(kind: str, line: bytes) -> tuple[str | None, bool]:
    """The run_id of an answer and whether it is the one its kind must get."""
    message = json.loads(line)
    if kind == REFUSED:
        error = message.get("error") or {}
        return (error.get("data") or {}).get("run_id"), error.get("code") == PERMISSION_DENIED
    result = message.get("result") or {}
    return (result.get("_meta") or {}).get(RUN_ID_META), "result" in message and not result.get("isError")


@dataclass
class Configuration:
    """One engine and fleet size: its gateways, kept running from the first round to the checks."""

    engine: str
    home: FleetHome
    fleet: list[Gateway]
    tokens: dict[str, str]
    baseline: bool = False
    """Its gateways run the `--baseline` tree's code."""
    read_events: Callable[[], Iterable[tuple[str | None, str]]] | None = None
    """(run_id, event_type) of every logged event, in the log's order; None: read in process (this tree's AuditLog)."""
    ids: Iterator[int] = field(default_factory=lambda: iter(range(1, 10**9)))
    wall_s: float = 0.0
    cpu_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Gateways, database server, client: over the measured slices."""
    switched: int = 0
    measured: list[tuple[str, bytes, int]] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    """calls/s of each slice (one per round)."""

    @property
    def gateways(self) -> int:
        return len(self.fleet)

    def call(self, kind: str) -> tuple[str, bytes]:
        if kind == REFUSED:
            return kind, request_line(next(self.ids), "run_pytest", self.tokens["vic"], {"test_path": "tests"})
        return kind, request_line(next(self.ids), "list_artifacts", self.tokens["alice"], {})


def open_configuration(
    engine: str, url: str, gateways: int, *, warmup: int, budget: int, root: Path, baseline: Path | None = None
) -> Configuration:
    """A fresh database and state folder, its users, and its fleet (of `baseline`'s code if given) started and warmed up."""
    root.mkdir(parents=True)
    home = GatewayHome(root, {**POLICY, "budget": {"attempts_total": budget}}, db_url=url)
    for name, role in USERS:
        home.add_user(name, role)
    tokens = {name: home.token(name, ttl_s=3600) for name, _ in USERS}
    return start_configuration(
        engine, home, tokens, gateways, warmup=warmup, logs=root, tree=baseline or REPO, baseline=baseline is not None
    )


def start_configuration(
    engine: str,
    home: FleetHome,
    tokens: dict[str, str],
    gateways: int,
    *,
    warmup: int,
    logs: Path,
    tree: Path = REPO,
    baseline: bool = False,
    read_events: Callable[[], Iterable[tuple[str | None, str]]] | None = None,
) -> Configuration:
    """The fleet of `tree`'s code on a state folder made already (`USERS`' `tokens`), started and warmed up."""
    fleet = start_fleet(home, gateways, logs, tree)
    configuration = Configuration(engine, home, fleet, tokens, baseline, read_events=read_events)
    for gateway in configuration.fleet:
        gateway.queue = [configuration.call((REFUSED, READ)[i % 2]) for i in range(warmup)]
    drive(configuration.fleet, deadline_s=300)
    for gateway in configuration.fleet:
        gateway.answers.clear()
    return configuration


def measure(configuration: Configuration, calls: int) -> None:
    """One slice: `calls` calls shared out among the fleet, added to the configuration's totals."""
    fleet = configuration.fleet
    share = max(2, calls // len(fleet))
    for index, gateway in enumerate(fleet):
        gateway.queue = [configuration.call((REFUSED, READ)[(i + index) % 2]) for i in range(share)]
    server = database_pids(configuration.engine)
    pids = [g.process.pid for g in fleet]
    before = (cpu_s(pids), cpu_s(server), client_cpu_s())
    switched = switches(pids)
    wall = drive(fleet, deadline_s=600)
    configuration.switched += switches(pids) - switched
    after = (cpu_s(pids), cpu_s(server), client_cpu_s())
    for index, (a, b) in enumerate(zip(before, after, strict=True)):
        configuration.cpu_s[index] += b - a
    configuration.wall_s += wall
    answered = [a for g in fleet for a in g.answers]
    configuration.rates.append(len(answered) / wall)
    configuration.measured += answered
    for gateway in fleet:
        gateway.answers.clear()


def check(configuration: Configuration, budget: int) -> Result:
    """The budget burst, then the fleet stopped; every answer, every call's events, and the chain checked."""
    engine, home, fleet = configuration.engine, configuration.home, configuration.fleet
    measured = configuration.measured
    connections = connections_open(home) if engine == "postgresql" else 0
    try:
        # The budget burst: every gateway sends 3 of bob's run_pytest at once (one in flight each).
        for gateway in fleet:
            gateway.queue = [
                (
                    "budget",
                    request_line(
                        next(configuration.ids), "run_pytest", configuration.tokens["bob"], {"test_path": "tests"}
                    ),
                )
                for _ in range(max(3, -(-2 * budget // len(fleet))))
            ]
        drive(fleet, deadline_s=300)
        codes = Counter(json.loads(line).get("error", {}).get("code") for g in fleet for _, line, _ in g.answers)
    finally:
        stop_fleet(fleet)
    unexpected = set(codes) - {SANDBOX_VIOLATION, BUDGET_EXCEEDED}
    if unexpected:
        raise BenchError(f"{engine} x{len(fleet)}: unexpected answers to the budget burst: {dict(codes)}")

    wrong = 0
    expected: dict[str, list[str]] = {}
    for kind, line, _ in measured:
        run_id, right = answered(kind, line)
        wrong += not right
        if run_id is not None:
            expected[run_id] = EXPECTED_EVENTS[kind]
    logged: dict[str, list[str]] = defaultdict(list)
    if configuration.read_events is None:
        events: Iterable[tuple[str | None, str]] = (
            (event.run_id, event.event_type) for event in AuditLog(home.engine, SystemClock()).events()
        )
    else:
        events = configuration.read_events()
    for run_id, event_type in events:
        if run_id in expected:
            logged[run_id].append(event_type)
    missing = sum(logged.get(run_id) != types for run_id, types in expected.items())
    verify = home.cli("audit", "verify")
    home.engine.dispose()
    latencies = sorted(ns / 1e6 for _, _, ns in measured)
    gateway_ms, database_ms, client_ms = (1000 * c / len(measured) for c in configuration.cpu_s)
    return Result(
        engine, len(fleet), len(measured), configuration.wall_s,
        percentile(latencies, 0.5), percentile(latencies, 0.99),
        wrong, missing + (len(measured) - len(expected)), verify.returncode == 0,
        codes[SANDBOX_VIOLATION], budget, gateway_ms, database_ms, client_ms, connections,
        configuration.switched / len(measured), tuple(configuration.rates), configuration.baseline,
    )  # fmt: skip


@contextmanager
def postgres_server(given: str | None, scratch: Path) -> Iterator[str]:
    """The base URL of a PostgreSQL server: `given`, or a cluster started here with the server's defaults."""
    if given:
        yield given
        return
    programs = server_programs()
    if programs is None:
        raise BenchError(
            "no PostgreSQL server programs: `make postgresql` (as root) installs Debian's, or pass --pg-url"
        )
    user = "postgres" if os.geteuid() == 0 else None
    data = scratch / "pg"
    data.mkdir()
    if user is not None:
        shutil.chown(scratch, user)
        shutil.chown(data, user)
    port = free_port()
    subprocess.run(
        [str(programs / "initdb"), "-D", str(data / "data"), "-A", "trust", "-U", "postgres"],
        user=user, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c max_connections=300"
    pg_ctl = str(programs / "pg_ctl")
    subprocess.run(
        [pg_ctl, "-D", str(data / "data"), "-o", options, "-l", str(data / "log"), "-w", "start"],
        user=user, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    POSTMASTER.append(int((data / "data" / "postmaster.pid").read_text().split()[0]))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [pg_ctl, "-D", str(data / "data"), "-m", "fast", "stop"],
            user=user,
            capture_output=True,
            timeout=60,
            check=False,
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spread(top: Result, bottom: Result) -> str:
    """The ratio's range over the rounds, each round's slices measured one right after the other."""
    ratios = [a / b for a, b in zip(top.rates, bottom.rates, strict=True)]
    return f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""


def report(results: Sequence[Result]) -> list[str]:
    lines = [
        f"{'database':<11} {'gateways':>8} {'calls':>6} {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7}  "
        f"{'wrong':>5} {'missing':>7} {'verify':>6} {'admitted/budget':>15} {'over-grants':>11}  "
        f"{'CPU ms/call: gateways':>21} {'database':>8} {'client':>6} {'switches/call':>13} {'connections':>11} {'CPUs busy':>9}"
    ]
    for r in results:
        lines.append(
            f"{r.engine + (' (base)' if r.baseline else ''):<11} {r.gateways:>8} {r.calls:>6} {r.rate:>8.0f} {r.p50_ms:>7.1f} {r.p99_ms:>7.1f}  "
            f"{r.wrong_answers:>5} {r.events_missing:>7} {'ok' if r.chain_ok else 'FAIL':>6} "
            f"{f'{r.admitted}/{r.budget}':>15} {r.over_grants:>11}  "
            f"{r.gateway_cpu_ms:>21.2f} {r.database_cpu_ms:>8.2f} {r.client_cpu_ms:>6.2f} {r.switches:>13.1f} "
            f"{r.connections or '':>11} {r.cpus_busy:>9.2f}"
        )
    by = {(r.engine, r.gateways): r for r in results if not r.baseline}
    sqlite_one, pg_one = by.get(("sqlite", 1)), by.get(("postgresql", 1))
    pg_eight, pg_most = by.get(("postgresql", 8)), by.get(("postgresql", max(r.gateways for r in results)))
    lines.append("")
    if sqlite_one and pg_eight:
        ratio = pg_eight.rate / sqlite_one.rate
        verdict = "met" if ratio >= 1.8 and pg_eight.p99_ms < 50 else "NOT met"
        lines.append(
            f"8 gateways on PostgreSQL / 1 on SQLite: {ratio:.2f}x{spread(pg_eight, sqlite_one)}, "
            f"p99 {pg_eight.p99_ms:.1f} ms (target >= 1.8x with p99 < 50 ms: {verdict})"
        )
    if pg_eight and pg_most and pg_most is not pg_eight:
        ratio = pg_most.rate / pg_eight.rate
        verdict = "met" if ratio >= 1.0 else "NOT met"
        lines.append(
            f"{pg_most.gateways} gateways on PostgreSQL / 8: {ratio:.2f}x{spread(pg_most, pg_eight)} "
            f"(target >= 1.0x: {verdict})"
        )
    if pg_eight:
        cpus = len(os.sched_getaffinity(0))
        share = pg_eight.cpus_busy / cpus
        verdict = "the CPUs are the limit" if share >= 0.9 else "CPUs left idle: something else is the limit"
        if not POSTMASTER:
            verdict = "not judged: the server --pg-url names is not measured, its CPU is not counted"
        lines.append(
            f"8 gateways on PostgreSQL keep {pg_eight.cpus_busy:.2f} of {cpus} CPUs busy, {share:.0%} "
            f"(at >= 90%: {verdict})"
        )
    if sqlite_one and pg_one:
        ratio = sqlite_one.rate / pg_one.rate
        verdict = "met" if ratio <= 1.5 else "NOT met"
        lines.append(
            f"1 gateway: SQLite / PostgreSQL {ratio:.2f}x{spread(sqlite_one, pg_one)} (target <= 1.5x: {verdict})"
        )
    for r in results:
        mine = by.get((r.engine, r.gateways))
        if r.baseline and mine is not None:
            lines.append(
                f"{r.engine} x{r.gateways}: this tree / the baseline {mine.rate / r.rate:.2f}x{spread(mine, r)}, "
                f"gateways' CPU per call {mine.gateway_cpu_ms:.2f} / {r.gateway_cpu_ms:.2f} ms, "
                f"switches per call {mine.switches:.1f} / {r.switches:.1f}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateways", default="1,8,32", help="fleet sizes, comma-separated")
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per configuration")
    parser.add_argument(
        "--rounds", type=int, default=4, help="slices the calls are measured in, every configuration in turn"
    )
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured calls per gateway first")
    parser.add_argument("--budget", type=int, default=20, help="attempts the budget burst's user may take")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--pg-url", default=None, help="a PostgreSQL server to use instead of a throwaway cluster")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a work tree of other code (e.g. `git worktree add /tmp/before <commit>`): each configuration also "
        "runs its gateways, in the same rounds, so a change is measured side by side",
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.gateways.split(",")]
    engines = args.engines.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="mcp-gw-fleet-"))
    scratch.chmod(0o755)
    results: list[Result] = []
    configurations: list[Configuration] = []
    try:
        with postgres_server(args.pg_url, scratch) if "postgresql" in engines else nullcontext("") as pg_base:
            for size in sizes:
                for engine in engines:
                    name = f"{engine}-{size}"
                    url = new_database(pg_base) if engine == "postgresql" else f"sqlite:///{scratch / f'{name}.db'}"
                    configurations.append(
                        open_configuration(
                            engine, url, size, warmup=args.warmup, budget=args.budget, root=scratch / name
                        )
                    )
                    if args.baseline is not None:
                        url = (
                            new_database(pg_base)
                            if engine == "postgresql"
                            else f"sqlite:///{scratch / f'{name}-base.db'}"
                        )
                        configurations.append(
                            open_configuration(
                                engine, url, size, warmup=args.warmup, budget=args.budget,
                                root=scratch / f"{name}-base", baseline=args.baseline.resolve(),
                            )
                        )  # fmt: skip
            for _ in range(args.rounds):
                for configuration in configurations:
                    measure(configuration, args.calls // args.rounds)
            while configurations:
                results.append(check(configurations.pop(0), args.budget))
                print(report([results[-1]])[1], flush=True)
    except BenchError as exc:
        print(f"fleet_scale: {exc}", file=sys.stderr)
        return 1
    finally:
        for configuration in configurations:
            stop_fleet(configuration.fleet)
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("\n".join(report(results)))
    return 0 if all(r.correct for r in results) else 1


@contextmanager
def nullcontext(value: str) -> Iterator[str]:
    yield value


if __name__ == "__main__":
    sys.exit(main())
