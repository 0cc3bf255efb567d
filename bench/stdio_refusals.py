"""What a refused tools/call costs over stdio: `mcp-gateway serve` against a bare MCP SDK server.

The servers run as subprocesses of this script and are driven by the same raw client:
newline-delimited JSON-RPC on their stdin/stdout, `initialize` (protocol 2025-11-25) and
`notifications/initialized`, then sequential `tools/call` requests, one in flight at a
time, each round trip timed with `time.perf_counter_ns`.

- bare: bench/bare_server.py, the SDK's lowlevel `Server` over its own `stdio_server`,
  answering every call at once.
- a gateway per engine of `--engines`: `sqlite` (a SQLite URL as `mcp-gateway init` writes it:
  WAL, `PRAGMA synchronous=NORMAL`, the default), `sqlite-full` (the same ending in
  `?synchronous=full`: every commit fsynced) and `postgresql` (a database of its own on a
  throwaway cluster this script starts with the server's defaults, fsync on; Debian's
  `postgresql` programs needed, else it is left out with a line saying so). Each on its own
  state folder.
- with `--baseline TREE` (a copy of another commit: `git archive C | tar -x -C TREE`), a gateway
  running that tree's code beside each of this tree's, on a state folder and database its own
  `init` made, so the two are measured in the same run.

On each gateway a VIEWER calls `run_pytest` with a valid token in `params.auth.token`. It
passes authentication and is refused at authorization with -32003 once MCP_TOOL_CALL and
POLICY_BLOCKED are committed, in one transaction, to the hash-chained log (docs/architecture.md,
"The call pipeline").

All servers stay up for the whole run. After an unmeasured warm-up on each, the measured
calls run in blocks whose order rotates so machine noise falls on all alike. The script
prints p50, p99 and mean of each, the ratios to bare, what each gateway adds to the bare p50,
and the CPU each server process spent per call (user + system, from /proc, over its own
blocks) and the PostgreSQL server's over the same blocks; with two verdicts per gateway: p50
at most 1.5x bare, and server CPU per call (the database server's included) at most 1.5x
bare's. Then, for each gateway, it checks that the audit log holds exactly MCP_TOOL_CALL then
POLICY_BLOCKED (-32003) per refused call and no token, and that `audit verify` passes. It
exits 0 whether or not the targets are met (the figures are the output), and 1 if a server
misbehaves, an audit log is wrong, or the run outlives `--deadline`.

    .venv/bin/python bench/stdio_refusals.py [--calls 1000] [--warmup 50] [--blocks 10]
        [--engines sqlite,postgresql] [--baseline TREE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.harness: the state folder the end-to-end tests use

from fleet_scale import cpu_s, database_pids, postgres_server  # noqa: E402  (bench/ is first on sys.path)

from tests.harness import GatewayHome  # noqa: E402
from tests.pg_cluster import new_database, server_programs  # noqa: E402

PROTOCOL_VERSION = "2025-11-25"
PERMISSION_DENIED = -32003
TARGET_MEDIAN_RATIO = 1.5
TARGET_ADDED_MS = 1.0
TARGET_CPU_RATIO = 1.5
ENGINES = ("sqlite", "sqlite-full", "postgresql")
VIEWER = "viewer"
CALL: dict[str, Any] = {"name": "run_pytest", "arguments": {"test_path": "tests"}}


class BenchError(Exception):
    """A server answered wrongly, died, or left a wrong audit trail."""


def gateway_home(root: Path, synchronous: str) -> tuple[GatewayHome, str]:
    """A fresh state folder with a VIEWER, and a token of theirs; `synchronous` is "normal" or "full".

    "normal" keeps the URL `mcp-gateway init` writes; "full" adds `?synchronous=full` to it.
    """
    query = "" if synchronous == "normal" else f"?synchronous={synchronous}"
    root.mkdir(parents=True)  # GatewayHome makes its state folder inside an existing root
    home = GatewayHome(root, db_url=f"sqlite:///{root / 'state' / 'gateway.db'}{query}")
    home.add_user(VIEWER, "VIEWER")
    return home, home.token(VIEWER, ttl_s=3600)


def tree_env(tree: Path) -> dict[str, str]:
    """This process's environment, the gateway's own token left out, with `tree`'s code first on the path."""
    environment = {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_TOKEN"}
    if tree != REPO:
        environment["PYTHONPATH"] = str(tree)
    return environment


def serve_argv(home: GatewayHome) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway",
        *("--home", str(home.home), "--db", home.url, "--policy", str(home.policy_path)),
        "serve",
    ]


def floor_argv(url: str, *, one_trip: bool = False) -> list[str]:
    """bench/floor_server.py on a database `mcp-gateway init` made: the refusal's floor (decision 100); with
    `one_trip` (PostgreSQL), the caller's read and the append in one statement."""
    return [sys.executable, str(REPO / "bench" / "floor_server.py"), "--db", url, *(["--one-trip"] if one_trip else [])]


# --- the raw client ---------------------------------------------------------------------------


class RawClient:
    """One server subprocess, spoken to in newline-delimited JSON-RPC, one request at a time.

    No reader thread (unlike tests.harness.StdioSession): the timed read is a plain
    `readline` on the pipe, so the client adds the same small cost to every server.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        stderr_path: Path,
        children: list[subprocess.Popen[bytes]],
        *,
        cwd: Path = REPO,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`cwd` and `env` (default: this repository and this environment) start another tree's gateway with
        its own code (`--baseline`, bench/call_cost.py)."""
        self.name = name
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("wb")
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=cwd,
            env=None if env is None else dict(env),
        )
        children.append(self.process)
        self._next_id = 0
        self.capabilities: dict[str, Any] = {}
        """What `initialize` declares the client can do."""

    def _send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """Send one request and wait for its response; return it with the round trip in ns."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self._next_id += 1
        request_id = self._next_id
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n"
        stdin, stdout = self.process.stdin, self.process.stdout
        started = time.perf_counter_ns()
        stdin.write(line)
        stdin.flush()
        while True:
            reply = stdout.readline()
            elapsed = time.perf_counter_ns() - started
            if not reply:
                raise BenchError(f"{self.name} closed its stdout; its stderr ends with:\n{self.stderr_tail()}")
            message: dict[str, Any] = json.loads(reply)
            if message.get("id") == request_id and "method" not in message:
                return message, elapsed
            if "id" in message and "method" in message:
                self.answer(message)
            # a notification (e.g. a log message): not ours, keep reading

    def answer(self, request: Mapping[str, Any]) -> None:
        """A request from the server (none is expected here; bench/upstream_cost.py answers consent questions)."""
        raise BenchError(f"{self.name} sent an unexpected request: {request['method']}")

    def stderr_tail(self, lines: int = 15) -> str:
        self._stderr.flush()
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def initialize(self) -> None:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": self.capabilities,
            "clientInfo": {"name": "bench", "version": "1"},
        }
        response, _ = self.request("initialize", params)
        if "result" not in response:
            raise BenchError(f"{self.name} refused initialize: {response}")
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> int:
        """Close stdin (the server's cue to exit), drain stdout, and return the exit code."""
        try:
            self.process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
        finally:
            self._stderr.close()
        return self.process.returncode


# --- the calls ---------------------------------------------------------------------------------


class Side:
    """One server under measurement: its client, what a correct answer is, and its samples."""

    def __init__(
        self,
        label: str,
        client: RawClient,
        token: str,
        home: AuditedHome | None,
        *,
        engine: str = "",
        tree: Path = REPO,
    ) -> None:
        self.label = label
        self.client = client
        self.token = token
        self.home = home
        """The gateway's state folder; None for the bare server, which answers instead of refusing."""
        self.engine = engine
        self.tree = tree
        # The same request bytes, auth included, for every server; the bare one ignores `auth`.
        self.params = {**CALL, "auth": {"token": token}}
        self.samples: list[int] = []
        self.run_ids: list[str] = []
        self.cpu_s = 0.0
        """The server process's CPU over its measured blocks."""
        self.database_cpu_s = 0.0
        """The PostgreSQL server's CPU over the same blocks (0 on SQLite and for the bare server)."""

    def one(self) -> int:
        response, elapsed = self.client.request("tools/call", self.params)
        if self.home is None:
            if "result" not in response:
                raise BenchError(f"{self.label}: expected a result, got {response}")
            return elapsed
        error = response.get("error")
        if not isinstance(error, dict) or error.get("code") != PERMISSION_DENIED:
            raise BenchError(f"{self.label}: expected a {PERMISSION_DENIED} error, got {response}")
        self.run_ids.append(error["data"]["run_id"])
        return elapsed

    def block(self, size: int) -> None:
        """`size` calls, timed, with the CPU the server (and PostgreSQL's) spent over them."""
        server = [self.client.process.pid]
        database = database_pids(self.engine)
        cpu, database_cpu = cpu_s(server), cpu_s(database)
        self.samples.extend(self.one() for _ in range(size))
        self.cpu_s += cpu_s(server) - cpu
        self.database_cpu_s += cpu_s(database) - database_cpu


# --- figures ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    p50_ms: float
    p99_ms: float
    mean_ms: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Figures:
        ordered = sorted(samples_ns)
        p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]  # nearest rank
        return cls(statistics.median(ordered) / 1e6, p99 / 1e6, statistics.fmean(ordered) / 1e6)


def block_sizes(calls: int, blocks: int) -> list[int]:
    base, extra = divmod(calls, blocks)
    return [base + (1 if i < extra else 0) for i in range(blocks) if base or i < extra]


def warm_up(sides: Sequence[Side], calls: int) -> None:
    for _ in range(calls):
        for side in sides:
            side.one()


def measure(sides: Sequence[Side], calls: int, blocks: int) -> None:
    """Blocks of calls per server, the order rotated each block so no server always goes first."""
    for index, size in enumerate(block_sizes(calls, blocks)):
        shift = index % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            side.block(size)


def print_table(sides: Sequence[Side], calls: int, warmup: int, blocks: int) -> None:
    """The first side is the baseline every ratio and difference is taken against."""
    blocks = len(block_sizes(calls, blocks))
    print(
        f"stdio tools/call round trip: {calls} calls per server in {blocks} rotating blocks,"
        f" {warmup} warm-up calls each not measured"
    )
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpus, load {load()}")
    print()
    figures = [Figures.of(side.samples) for side in sides]
    base, base_cpu = figures[0], cpu_ms(sides[0])
    print(
        f"{'':<34}{'p50 ms':>8}{'p99 ms':>8}{'mean ms':>9}{'p50/bare':>10}{'+ms p50':>9}"
        f"{'cpu ms':>8}{'db ms':>7}{'cpu/bare':>10}"
    )
    for side, f in zip(sides, figures, strict=True):
        server, database = cpu_ms(side), side.database_cpu_s * 1000 / len(side.samples)
        print(
            f"{side.label:<34}{f.p50_ms:>8.3f}{f.p99_ms:>8.3f}{f.mean_ms:>9.3f}{f.p50_ms / base.p50_ms:>9.2f}x"
            f"{f.p50_ms - base.p50_ms:>9.3f}{server:>8.3f}{database:>7.3f}{(server + database) / base_cpu:>9.2f}x"
        )
    print(
        "(the bare server answers every call; the gateways and the floor refuse a VIEWER's run_pytest with -32003; cpu ms: the"
        " server process's user + system CPU per call, db ms: PostgreSQL's, both in cpu/bare)"
    )
    print()
    print(f"targets: p50 <= {TARGET_MEDIAN_RATIO}x bare p50; server CPU per call <= {TARGET_CPU_RATIO}x bare's")
    for side, f in zip(sides[1:], figures[1:], strict=True):
        ratio = f.p50_ms / base.p50_ms
        cpu_ratio = (cpu_ms(side) + side.database_cpu_s * 1000 / len(side.samples)) / base_cpu
        ratio_verdict = "met" if ratio <= TARGET_MEDIAN_RATIO else "NOT met"
        cpu_verdict = "met" if cpu_ratio <= TARGET_CPU_RATIO else "NOT met"
        print(f"  {side.label + ':':<34}p50 {ratio:.2f}x: {ratio_verdict:<9}CPU {cpu_ratio:.2f}x: {cpu_verdict}")


def cpu_ms(side: Side) -> float:
    return side.cpu_s * 1000 / len(side.samples)


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


# --- the audit trail ----------------------------------------------------------------------------


class AuditedHome(Protocol):
    """A state folder whose audit log `check_audit` reads through the `mcp-gateway` command of its own tree:
    a GatewayHome (this tree's or a `--baseline`'s), or another tree's folder made by that tree's own `init`
    (bench/call_cost.py)."""

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]: ...


def cli(side: Side, *args: str) -> subprocess.CompletedProcess[str]:
    """`mcp-gateway ARGS` of the side's tree, on its state folder and database."""
    assert side.home is not None
    if not isinstance(side.home, GatewayHome):
        return side.home.cli(*args)
    argv = serve_argv(side.home)[:-1]  # without "serve"
    return subprocess.run(
        [*argv, *args], cwd=side.tree, env=tree_env(side.tree), capture_output=True, text=True, timeout=120, check=False
    )


def check_audit(side: Side, setup_events: int = 0) -> str:
    """Exactly MCP_TOOL_CALL then POLICY_BLOCKED (-32003) per refused call, no token, chain intact.

    Every refused call of the run is counted, warm-up included: the log holds no call before them
    but the first `setup_events`, logged while the state folder was made (bench/call_cost.py adds its
    users and issues their tokens with the `mcp-gateway` command), and events of no run (a baseline's
    `user add` left its USER_ADDED).
    """
    export = cli(side, "audit", "export")
    if export.returncode != 0:
        raise BenchError(f"{side.label}: audit export failed: {export.stderr.strip()}")
    if side.token in export.stdout:
        raise BenchError(f"{side.label}: the audit log contains the token")
    logged = export.stdout.splitlines()[setup_events:]
    events = [event for line in logged if (event := json.loads(line))["run_id"] is not None]
    run_ids = side.run_ids
    if len(events) != 2 * len(run_ids):
        raise BenchError(f"{side.label}: {len(events)} audit events for {len(run_ids)} refused calls (expected 2 each)")
    trails: dict[str, list[tuple[str, int | None]]] = {}
    for event in events:
        trails.setdefault(event["run_id"], []).append((event["event_type"], event["code"]))
    expected = [("MCP_TOOL_CALL", None), ("POLICY_BLOCKED", PERMISSION_DENIED)]
    wrong = [run_id for run_id in run_ids if trails.get(run_id) != expected]
    if wrong or len(trails) != len(run_ids):
        raise BenchError(f"{side.label}: {len(wrong)} refused calls without exactly {expected}, e.g. {wrong[:1]}")
    verify = cli(side, "audit", "verify")
    if verify.returncode != 0:
        raise BenchError(f"{side.label}: audit verify failed: {verify.stdout.strip()} {verify.stderr.strip()}")
    kinds = dict(Counter(e["event_type"] for e in events))
    return f"{len(events)} events for {len(run_ids)} refused calls {kinds}, no token; verify: {verify.stdout.strip()}"


# --- main ---------------------------------------------------------------------------------------


def engine_home(root: Path, engine: str, pg_base: str | None, baseline: Path | None) -> tuple[GatewayHome, str]:
    """A state folder for a gateway on `engine`, with a VIEWER and a token of theirs. For `baseline`, the
    database is a fresh one that the baseline tree's own `init` and `user add` make (its schema may be older)."""
    root.mkdir(parents=True)
    if engine == "postgresql":
        assert pg_base is not None
        url = new_database(pg_base)
    else:
        url = f"sqlite:///{root / 'state' / 'gateway.db'}" + ("?synchronous=full" if engine == "sqlite-full" else "")
    if baseline is None:
        home = GatewayHome(root, db_url=url)
        home.add_user(VIEWER, "VIEWER")
        return home, home.token(VIEWER, ttl_s=3600)
    # This tree's harness makes the folder (workspace, policy, keys) on a throwaway database; the
    # baseline's commands then make theirs, which the baseline's gateway serves from.
    throwaway = new_database(pg_base) if engine == "postgresql" and pg_base else f"sqlite:///{root / 'scratch.db'}"
    home = GatewayHome(root, db_url=throwaway)
    home.url = url
    for args in (("init",), ("user", "add", VIEWER, "--role", "VIEWER", "--workspace", "default")):
        done = subprocess.run(
            [*serve_argv(home)[:-1], *args],
            cwd=baseline, env=tree_env(baseline), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise BenchError(f"the baseline's {' '.join(args)} failed: {done.stderr.strip()}")
    return home, home.token(VIEWER, ttl_s=3600)


def run(
    root: Path,
    children: list[subprocess.Popen[bytes]],
    *,
    calls: int,
    warmup: int,
    blocks: int,
    engines: Sequence[str],
    baseline: Path | None,
    pg_base: str | None,
    floor: bool = True,
) -> None:
    clients: list[RawClient] = []
    homes: list[GatewayHome] = []

    def start(
        label: str, argv: Sequence[str], token: str, home: GatewayHome | None, *, engine: str, tree: Path
    ) -> Side:
        client = RawClient(label, argv, root / f"stderr-{len(clients)}.log", children, cwd=tree, env=tree_env(tree))
        clients.append(client)
        return Side(label, client, token, home, engine=engine, tree=tree)

    bare = [sys.executable, str(REPO / "bench" / "bare_server.py")]
    sides = [start("bare SDK server", bare, "", None, engine="", tree=REPO)]
    trees = [("gateway", REPO)] + ([] if baseline is None else [("baseline", baseline)])
    for engine in engines:
        for name, tree in trees:
            home, token = engine_home(root / f"{name}-{engine}", engine, pg_base, None if tree == REPO else tree)
            homes.append(home)
            sides.append(start(f"{name}, {engine}", serve_argv(home), token, home, engine=engine, tree=tree))
        for one_trip in [False, True] if floor and engine == "postgresql" else [False] if floor else []:
            name = "floor, one trip" if one_trip else "floor"
            home, token = engine_home(root / f"{name.replace(', ', '-')}-{engine}", engine, pg_base, None)
            homes.append(home)
            argv = floor_argv(home.url, one_trip=one_trip)
            sides.append(start(f"{name}, {engine}", argv, token, home, engine=engine, tree=REPO))
    sides[0].params = sides[1].params  # the bare server gets the very same request bytes
    try:
        for side in sides:
            side.client.initialize()
        warm_up(sides, warmup)
        measure(sides, calls, blocks)
    finally:
        codes = [client.close() for client in clients]
    for client, code in zip(clients, codes, strict=True):
        if code != 0:
            raise BenchError(f"{client.name} exited with {code}; its stderr ends with:\n{client.stderr_tail()}")
    print_table(sides, calls, warmup, blocks)
    print()
    for side in sides[1:]:
        print(f"audit, {side.label}: {check_audit(side)}")
    for home in homes:
        home.engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per server (default 1000)")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured calls per server first (default 50)")
    parser.add_argument("--blocks", type=int, default=10, help="blocks the calls are split into (default 10)")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    parser.add_argument(
        "--engines", default="sqlite,postgresql", help=f"comma-separated, of {', '.join(ENGINES)} (sqlite,postgresql)"
    )
    parser.add_argument("--baseline", type=Path, help="a tree of another commit to run beside this one")
    parser.add_argument("--pg-url", help="a PostgreSQL server to use instead of a throwaway cluster")
    parser.add_argument("--no-floor", action="store_true", help="leave out bench/floor_server.py on each engine")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.warmup < 0 or args.blocks < 1:
        parser.error("--calls and --blocks must be at least 1, --warmup at least 0")
    args.engines = [engine for engine in args.engines.split(",") if engine]
    if not args.engines or any(engine not in ENGINES for engine in args.engines):
        parser.error(f"--engines takes some of {', '.join(ENGINES)}")
    if "postgresql" in args.engines and args.pg_url is None and server_programs() is None:
        print("stdio_refusals: no PostgreSQL server programs (`make postgresql` as root): postgresql left out")
        args.engines.remove("postgresql")
    if args.baseline is not None and not (args.baseline / "gateway").is_dir():
        parser.error(f"--baseline {args.baseline}: no gateway/ there")
    try:
        run_with_deadline("stdio_refusals", args.deadline, lambda children: _run_in_temp(children, args))
    except BenchError:
        return 1
    return 0


def _run_in_temp(children: list[subprocess.Popen[bytes]], args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-stdio-") as tmp, contextlib.ExitStack() as stack:
        pg_base = None
        if "postgresql" in args.engines:
            pg_base = stack.enter_context(postgres_server(args.pg_url, Path(tmp)))  # as fleet_scale.py's: tmp/pg
        run(
            Path(tmp), children, calls=args.calls, warmup=args.warmup, blocks=args.blocks,
            engines=args.engines, baseline=None if args.baseline is None else args.baseline.resolve(), pg_base=pg_base,
            floor=not args.no_floor,
        )  # fmt: skip


def run_with_deadline(name: str, deadline: float, body: Callable[[list[subprocess.Popen[bytes]]], None]) -> None:
    """`body(children)`, its servers (appended to `children`) killed past `deadline` s; a BenchError is printed.

    A hung server would block readline forever: past the deadline its process is killed, so the read
    ends (EOF) and the run fails with a clear line instead of hanging.
    """
    children: list[subprocess.Popen[bytes]] = []
    expired = threading.Event()

    def kill_children() -> None:
        expired.set()
        for child in children:
            child.kill()

    timer = threading.Timer(deadline, kill_children)
    timer.daemon = True
    timer.start()
    try:
        body(children)
    except BenchError as exc:
        why = f"not done after {deadline:.0f} s (--deadline); the servers were killed" if expired.is_set() else exc
        print(f"{name}: {why}", file=sys.stderr)
        raise
    finally:
        timer.cancel()


if __name__ == "__main__":
    raise SystemExit(main())
