"""What an upstream call costs through the gateway: the same MCP server called directly and through `mcp-gateway serve`.

Two servers, each called straight over stdio and as an upstream of one `mcp-gateway serve`
(docs/upstreams.md, decision 84) in both workspace views:
- a trivial server, bench/bare_server.py (`--tool echo`, read-only and closed world, answering at
  once), so the server's own time is about nil and what is left is the hops and the gateway;
- mcp-server-git (the test extra), `git_status` on a real repository (the sample project, committed,
  one file staged): a server no one here wrote, with work of its own.
The gateway's upstreams are `echo` and `git` (`workspace: read_only`) and `echo_w` and `git_w`
(`workspace: write`: the server works on a copy, synced back after every call, decision 83); all
trusted. A USER calls them with a token in `params.auth`; the first call of each is asked and
answered Allow always when it is offered, else Allow for the session (the default policy's in-band
channel offers no Allow always: decision 43), so no person is in the loop afterwards, as for an
agent whose tools were approved once; every later call's decision is still checked and recorded.
Every side is driven by the same raw client (bench/stdio_refusals.py's: newline-delimited JSON-RPC,
one request in flight, each round trip timed with `perf_counter_ns`), after unmeasured warm-up
calls, in blocks whose order rotates. `--engines sqlite,postgresql` runs a gateway on each (a
throwaway cluster, or `--pg-url`), side by side in the same rotation.

Per side it prints p50/p90/p99 and the CPU each process spent per call (around each block, from
/proc: the gateway's own; the server's, with whatever it spawned and waited for; the client's);
then, per server and view, the ratio to the direct p50 and the aim: at most 1.5x the trivial
server's direct p50 plus the server's own time (its direct p50 less the trivial server's). Then it
checks every gateway call's audit trail (MCP_TOOL_CALL, the decision, TOOL_STARTED, UPSTREAM_CALL
with is_error false, TOOL_FINISHED) and `audit verify`. Exits 1 if a server answers wrongly or a
trail is wrong, 0 with the figures otherwise (met or not).

    .venv/bin/python bench/upstream_cost.py [--calls 300] [--warmup 20] [--blocks 6] [--engines sqlite,postgresql]
        [--pg-url URL] [--cprofile FILE]

`--cprofile FILE` runs the gateway under cProfile (its loop's thread; the figures are then the
profiler's, not the gateway's) and writes the statistics to FILE. `--old DIR` adds, on each engine, a
gateway run from another source tree (`git archive COMMIT | tar -x -C DIR`) on a state folder of its
own, labelled `<engine>-old`, in the same rotation: a change and the tree before it side by side
(decision 93). Both trees must share the database's schema.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from fleet_scale import postgres_server  # noqa: E402
from stdio_refusals import BenchError, RawClient, block_sizes, run_with_deadline, serve_argv  # noqa: E402

from gateway.audit import AuditLog  # noqa: E402
from gateway.clock import SystemClock  # noqa: E402
from tests.e2e.test_upstream_git import IDENTITY  # noqa: E402  (what git needs of its environment, confined)
from tests.harness import FORM_ELICITATION, GatewayHome, reachable_by_everyone  # noqa: E402
from tests.pg_cluster import new_database  # noqa: E402

GIT_SERVER = Path(sys.executable).parent / "mcp-server-git"
SHARED_0644 = {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_1": "core.sharedRepository", "GIT_CONFIG_VALUE_1": "0644"}
TARGET_RATIO = 1.5
TRAIL = ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "UPSTREAM_CALL", "TOOL_FINISHED"]
USER = "alice"


class Client(RawClient):
    """The raw client, declaring form elicitation and answering the gateway's consent questions with an Allow."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.capabilities = FORM_ELICITATION
        self.answered: list[str] = []
        """The decision given to each consent question."""

    def answer(self, request: Mapping[str, Any]) -> None:
        if request["method"] != "elicitation/create":
            super().answer(request)
        result = allow(request["params"])
        self.answered.append(result["content"]["decision"])
        self._send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def allow(params: Mapping[str, Any]) -> dict[str, Any]:
    """Allow always when the question offers it (a low or medium tier), else Allow for the session."""
    offered = params["requestedSchema"]["properties"]["decision"]["enum"]
    for decision in ("allow_always", "allow_session"):
        if decision in offered:
            return {"action": "accept", "content": {"decision": decision}}
    raise BenchError(f"the consent question offers no lasting Allow: {offered}")


# --- CPU ------------------------------------------------------------------------------------------


def tree_cpu(pid: int) -> tuple[float, float]:
    """(the process's own CPU s, its descendants' and what it waited for): user + system from /proc."""
    root = psutil.Process(pid)
    own = root.cpu_times()
    below = own.children_user + own.children_system
    for child in root.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue  # gone between the listing and the read: its parent's children_* have it
        below += times.user + times.system + times.children_user + times.children_system
    return own.user + own.system, below


@dataclass(slots=True)
class Cpu:
    gateway_s: float = 0.0
    server_s: float = 0.0
    client_s: float = 0.0


# --- the sides ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Side:
    label: str
    server: str
    """The server it calls: `echo` or `git`."""
    view: str
    """`direct`, `read_only` or `write`."""
    client: Client
    params: Mapping[str, Any]
    home: GatewayHome | None
    """The gateway's state folder; None for a server called directly."""
    samples: list[int] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    cpu: Cpu = field(default_factory=Cpu)

    def one(self) -> int:
        response, elapsed = self.client.request("tools/call", self.params)
        result = response.get("result")
        if not isinstance(result, dict) or result.get("isError"):
            raise BenchError(f"{self.label}: expected a result, got {json.dumps(response)[:2000]}")
        if self.home is not None:
            self.run_ids.append(result["_meta"]["mcp-write-gateway/run_id"])
        return elapsed

    def block(self, calls: int) -> None:
        pid = self.client.process.pid
        gateway_before, below_before = tree_cpu(pid)
        client_before = time.process_time()
        self.samples.extend(self.one() for _ in range(calls))
        client_after = time.process_time()
        gateway_after, below_after = tree_cpu(pid)
        if self.home is not None:
            self.cpu.gateway_s += gateway_after - gateway_before
            self.cpu.server_s += below_after - below_before
        else:
            self.cpu.server_s += gateway_after - gateway_before + below_after - below_before
        self.cpu.client_s += client_after - client_before


def prepare(root: Path, db_url: str | None = None) -> GatewayHome:
    """A state folder whose policy has the four upstreams, a USER, and the workspace a git repository."""
    root.mkdir(parents=True)
    home = GatewayHome(root, db_url=db_url)
    workspace = home.workspace
    git = ["git", "-C", str(workspace)]
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(root), **IDENTITY}
    for step in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the sample project"]):
        subprocess.run([*git, *step], check=True, capture_output=True, env=environ)
    (workspace / "NOTES.md").write_text("staged\n")
    subprocess.run([*git, "add", "NOTES.md"], check=True, capture_output=True, env=environ)
    reachable_by_everyone(workspace)
    folder = home.policy_path.parent / "bin"
    folder.mkdir()
    script = folder / "bare_server"
    script.write_text(f"#!{sys.executable}\n" + (BENCH / "bare_server.py").read_text())
    script.chmod(0o755)
    reachable_by_everyone(folder)
    echo = {"command": ["bin/bare_server", "--tool", "echo"], "tools": ["echo"], "trust": "trusted"}
    git_status = {
        "command": [str(GIT_SERVER), "--repository", "{workspace}"],
        "tools": ["git_status"],
        "trust": "trusted",
        "env": IDENTITY,
    }
    upstreams = {
        "echo": {**echo, "workspace": "read_only"},
        "echo_w": {**echo, "workspace": "write"},
        "git": {**git_status, "workspace": "read_only"},
        # git in the write upstream's copy refreshes the index at its first git_status and writes it 0600
        # there; the sync brings it back with that mode (root's, 0600), which the read_only server's uid
        # then cannot read: git is told to make its files 0644, as the developer's own git does.
        "git_w": {**git_status, "workspace": "write", "env": {**IDENTITY, **SHARED_0644}},
    }
    offered = ["echo__echo", "echo_w__echo", "git__git_status", "git_w__git_status"]
    home.write_policy(
        {
            "tools": {"allowlist": ["run_pytest", *offered]},
            "budget": {"attempts_total": 1_000_000, "elapsed_ms_total": 1_000_000_000},  # charged, never reached
            # git takes a temporary file's name from /dev/urandom, which a run may not read by default.
            "sandbox": {"allowed_paths": ["bin", "/dev/urandom"]},
            "upstreams": upstreams,
        }
    )
    home.add_user(USER, "USER")
    return home


def start_direct(root: Path, workspace: Path, children: list[subprocess.Popen[bytes]]) -> list[Side]:
    """Each server called straight over stdio: the trivial one, and mcp-server-git on the same repository."""
    echo = Client(
        "echo", [sys.executable, str(BENCH / "bare_server.py"), "--tool", "echo"], root / "echo.log", children
    )
    git = Client("mcp-server-git", [str(GIT_SERVER), "--repository", str(workspace)], root / "git.log", children)
    for client in (echo, git):
        client.initialize()
    return [
        Side("echo, direct", "echo", "direct", echo, ECHO_CALL, None),
        Side("git_status, direct", "git", "direct", git, git_call(workspace), None),
    ]


def start_gateway(
    root: Path,
    home: GatewayHome,
    engine: str,
    children: list[subprocess.Popen[bytes]],
    cprofile: str | None,
    *,
    source: Path | None = None,
) -> list[Side]:
    """One `mcp-gateway serve` on `home` (run from `source`'s tree when given: `--old`), and its four upstream sides."""
    token = home.token(USER, ttl_s=3600)
    argv = serve_argv(home)
    if cprofile is not None:
        argv = [argv[0], "-m", "cProfile", "-o", cprofile, *argv[1:]]
    if source is not None:  # `python -m` imports from its working folder first; exec keeps the pid measured
        argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(source), *argv]
    gateway = Client(f"gateway ({engine})", argv, root / f"gateway-{engine}.log", children)
    gateway.initialize()

    def through(upstream: str, call: Mapping[str, Any]) -> dict[str, Any]:
        return {**call, "name": f"{upstream}__{call['name']}", "auth": {"token": token}}

    git = git_call(home.workspace)
    sides = [
        Side(f"echo, {engine} read_only", "echo", "read_only", gateway, through("echo", ECHO_CALL), home),
        Side(f"echo, {engine} write", "echo", "write", gateway, through("echo_w", ECHO_CALL), home),
        Side(f"git_status, {engine} read_only", "git", "read_only", gateway, through("git", git), home),
        Side(f"git_status, {engine} write", "git", "write", gateway, through("git_w", git), home),
    ]
    listed, _ = gateway.request("tools/list", {"auth": {"token": token}})
    names = {tool["name"] for tool in listed.get("result", {}).get("tools", [])}
    missing = {side.params["name"] for side in sides} - names
    if missing:
        raise BenchError(f"the gateway does not list {sorted(missing)}; its stderr ends with:\n{gateway.stderr_tail()}")
    return sides


ECHO_CALL: Mapping[str, Any] = {"name": "echo", "arguments": {"test_path": "tests"}}


def git_call(workspace: Path) -> dict[str, Any]:
    return {"name": "git_status", "arguments": {"repo_path": str(workspace)}}


# --- the run --------------------------------------------------------------------------------------


def measure(sides: Sequence[Side], calls: int, warmup: int, blocks: int) -> None:
    for _ in range(warmup):
        for side in sides:
            side.one()
    for side in sides:
        side.run_ids.clear()  # the warm-up's trails are checked too, but not counted as measured calls
    for index, size in enumerate(block_sizes(calls, blocks)):
        shift = index % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            side.block(size)


def percentile(ordered: Sequence[int], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))] / 1e6


@dataclass(frozen=True, slots=True)
class Figures:
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, samples: Sequence[int]) -> Figures:
        ordered = sorted(samples)
        return cls(statistics.median(ordered) / 1e6, percentile(ordered, 0.9), percentile(ordered, 0.99))


def print_figures(sides: Sequence[Side], calls: int, warmup: int, blocks: int) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"upstream tools/call round trip: {calls} calls per side in {len(block_sizes(calls, blocks))} rotating"
        f" blocks, {warmup} warm-up calls each; {os.cpu_count()} CPUs, load {load} (1, 5, 15 min)"
    )
    print()
    print(
        f"{'':<32}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}   CPU ms per call: {'gateway':>8}{'server':>8}{'client':>8}"
    )
    for side in sides:
        f, n = Figures.of(side.samples), len(side.samples)
        cpu = side.cpu
        gateway = f"{cpu.gateway_s * 1000 / n:>8.2f}" if side.home is not None else f"{'-':>8}"
        print(
            f"{side.label:<32}{f.p50:>8.2f}{f.p90:>8.2f}{f.p99:>8.2f}{'':<20}"
            f"{gateway}{cpu.server_s * 1000 / n:>8.2f}{cpu.client_s * 1000 / n:>8.2f}"
        )
    print()
    floor = Figures.of(next(s for s in sides if s.server == "echo" and s.view == "direct").samples).p50
    print(
        f"aim: <= {TARGET_RATIO}x + server time (the trivial server's direct p50, {floor:.2f} ms, times {TARGET_RATIO},"
    )
    print("plus the server's own time: its direct p50 less the trivial server's)")
    for server in ("echo", "git"):
        direct = Figures.of(next(s for s in sides if s.server == server and s.view == "direct").samples).p50
        aim = TARGET_RATIO * floor + (direct - floor)
        for side in (s for s in sides if s.server == server and s.home is not None):
            p50 = Figures.of(side.samples).p50
            verdict = "met" if p50 <= aim else "NOT met"
            print(
                f"  {side.label + ':':<32}{p50 / direct:6.2f}x direct, +{p50 - direct:6.2f} ms;"
                f" aim {aim:6.2f} ms: {verdict}"
            )


def check_trails(home: GatewayHome, sides: Sequence[Side]) -> str:
    """Every measured call's trail is exactly TRAIL with UPSTREAM_CALL's is_error false; no token; verify ok."""
    log = AuditLog(home.engine, SystemClock())
    events = list(log.events())
    trails: dict[str, list[Any]] = {}
    for event in events:
        trails.setdefault(event.run_id, []).append(event)
    calls = 0
    token = ""
    for side in (s for s in sides if s.home is home):
        token = side.params["auth"]["token"]
        upstream = side.params["name"].split("__")[0]
        for run_id in side.run_ids:
            trail = trails.get(run_id, [])
            if [e.event_type for e in trail] != TRAIL:
                raise BenchError(f"{side.label}: run {run_id} has {[e.event_type for e in trail]}, not {TRAIL}")
            detail = trail[3].detail
            if detail.get("upstream") != upstream or detail.get("is_error") is not False:
                raise BenchError(f"{side.label}: run {run_id}'s UPSTREAM_CALL is {detail}")
            calls += 1
    export = home.cli("audit", "export")
    if export.returncode != 0 or not token or token in export.stdout:
        raise BenchError(f"audit export failed or holds the token: {export.stderr.strip()}")
    verify = home.cli("audit", "verify")
    if verify.returncode != 0:
        raise BenchError(f"audit verify failed: {verify.stdout.strip()} {verify.stderr.strip()}")
    return f"{len(events)} events; {calls} measured calls each {' > '.join(TRAIL)}; no token; {verify.stdout.strip()}"


def run(root: Path, children: list[subprocess.Popen[bytes]], args: argparse.Namespace) -> None:
    engines = args.engines.split(",")
    with postgres_server(args.pg_url, root) if "postgresql" in engines else nullcontext("") as pg_base:
        labels = [*engines, *(f"{engine}-old" for engine in engines if args.old is not None)]
        homes = {
            label: prepare(root / label, new_database(pg_base) if label.startswith("postgresql") else None)
            for label in labels
        }
        every = [
            side
            for label, home in homes.items()
            for side in start_gateway(
                root,
                home,
                label,
                children,
                None if label.endswith("-old") else args.cprofile,
                source=args.old if label.endswith("-old") else None,
            )
        ]
        direct = start_direct(root, next(iter(homes.values())).workspace, children)
        sides = [side for server in ("echo", "git") for side in (*direct, *every) if side.server == server]
        clients = list({id(side.client): side.client for side in sides}.values())
        try:
            measure(sides, args.calls, args.warmup, args.blocks)
        finally:
            codes = [client.close() for client in clients]
        for client, code in zip(clients, codes, strict=True):
            if code != 0:
                raise BenchError(f"{client.name} exited with {code}; its stderr ends with:\n{client.stderr_tail()}")
        print_figures(sides, args.calls, args.warmup, args.blocks)
        print()
        answered = Counter(decision for client in clients for decision in client.answered)
        print(f"consent: {sum(answered.values())} questions, one per upstream and gateway, answered {dict(answered)}")
        for engine, home in homes.items():
            print(f"audit ({engine}): {check_trails(home, sides)}")
            home.engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="measured calls per side (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured calls per side first (default 20)")
    parser.add_argument("--blocks", type=int, default=6, help="blocks the calls are split into (default 6)")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    parser.add_argument("--cprofile", metavar="FILE", help="run the gateway under cProfile, statistics to FILE")
    parser.add_argument("--engines", default="sqlite", help="sqlite, postgresql or both, comma-separated")
    parser.add_argument("--pg-url", help="a PostgreSQL server's base URL (default: a throwaway cluster)")
    parser.add_argument("--old", type=Path, metavar="DIR", help="also a gateway from this source tree, side by side")
    args = parser.parse_args(argv)
    if args.old is not None and not (args.old / "gateway" / "__main__.py").is_file():
        parser.error(f"--old {args.old}: no gateway/__main__.py there (git archive COMMIT | tar -x -C DIR)")
    if args.calls < 1 or args.warmup < 1 or args.blocks < 1:
        parser.error("--calls, --warmup and --blocks must be at least 1")
    if not args.engines or not set(args.engines.split(",")) <= {"sqlite", "postgresql"}:
        parser.error("--engines takes sqlite, postgresql or both")
    if args.cprofile is not None and args.engines != "sqlite":
        parser.error("--cprofile profiles one gateway: --engines sqlite")
    if not GIT_SERVER.exists() or shutil.which("git") is None:
        parser.error(f"{GIT_SERVER} (the test extra) and git are needed")

    def body(children: list[subprocess.Popen[bytes]]) -> None:
        with tempfile.TemporaryDirectory(prefix="bench-upstream-") as tmp:
            run(Path(tmp), children, args)

    try:
        run_with_deadline("upstream_cost", args.deadline, body)
    except BenchError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
