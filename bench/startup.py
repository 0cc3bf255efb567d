"""How long the gateway takes to start (decision 48): `--help`, and `serve` answering `initialize`.

Hosts start one `serve` per session, so the time to the `initialize` answer is paid on every
session. Rows, each a fresh process, timed from `Popen` to the end of the output the row waits
for (`time.perf_counter_ns`):

- `python -c pass`: the floor, this venv's interpreter doing nothing;
- `--help`: `python -m gateway --help`, until it exits;
- `initialize`: `python -m gateway ... serve` on a state folder `mcp-gateway init` made (SQLite),
  until its answer to `initialize` (protocol 2025-11-25) is read; then stdin is closed and the
  process reaped, unmeasured;
- `user list`: `python -m gateway ... user list` (a one-shot command with the database), until it exits.

Each row also reports the CPU (user + system) its process spent from start to exit, shutdown
included (`RUSAGE_CHILDREN` before and after): what a test suite or a host that starts many
gateways pays.

Trees: the working tree, and with `--old COMMIT` that commit too, written out with `git archive`
into a temporary folder. Each tree runs with cwd and PYTHONPATH set to it and `-P` unset, so
`python -m gateway` takes that tree's `gateway`. Rounds interleave rows and trees, so machine
noise falls on all alike. Prints median and p90 of each row and tree, in ms, the median
less the `python -c pass` median, and the median CPU. Exits 0 with the figures; 1 if a row fails.

    .venv/bin/python bench/startup.py [--runs 15] [--old COMMIT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def _env(tree: Path) -> dict[str, str]:
    # Bytecode caches are written (the warm-up round writes them), as an installed package has them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    return env


def _gateway(home: Path) -> list[str]:
    return [sys.executable, "-m", "gateway", "--home", str(home), "--db", f"sqlite:///{home}/gateway.db"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def extract_tree(commit: str, into: Path) -> Path:
    """`commit`'s files written out into the new folder `into` (`git archive`), which is returned."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


SDK_IMPORT = "import mcp.server.lowlevel, mcp_types"
"""What any MCP server built on the SDK imports before it can answer: bench/call_cost.py's import floor."""


def time_sdk_import(tree: Path, _home: Path) -> float:
    """A fresh interpreter importing the SDK's server half and its types, until it exits."""
    start = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", SDK_IMPORT], cwd=tree, env=_env(tree), check=True)
    return (time.perf_counter_ns() - start) / 1e6


def time_pass(tree: Path, _home: Path) -> float:
    start = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", "pass"], cwd=tree, env=_env(tree), check=True)
    return (time.perf_counter_ns() - start) / 1e6


def time_help(tree: Path, _home: Path) -> float:
    start = time.perf_counter_ns()
    subprocess.run(
        [sys.executable, "-m", "gateway", "--help"], cwd=tree, env=_env(tree), check=True, stdout=subprocess.DEVNULL
    )
    return (time.perf_counter_ns() - start) / 1e6


def time_initialize(tree: Path, home: Path) -> float:
    return time_serve(tree, home, list_tools=False)[0]


def time_serve(tree: Path, home: Path, *, list_tools: bool) -> tuple[float, float | None]:
    """ms from `Popen` to the `initialize` answer read, and (`list_tools`) to the answer of the `tools/list`
    sent right after it (bench/call_cost.py: what a host sees before it can offer the tools); then stdin is
    closed and the process reaped, unmeasured."""
    argv = [*_gateway(home), "--policy", str(home / "policy.yaml"), "serve"]
    start = time.perf_counter_ns()
    process = subprocess.Popen(
        argv, cwd=tree, env=_env(tree), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    process.stdin.flush()
    line = process.stdout.readline()
    elapsed = (time.perf_counter_ns() - start) / 1e6
    listed = listing = None
    if list_tools and line:
        process.stdin.write(json.dumps(INITIALIZED).encode() + b"\n" + json.dumps(LIST_TOOLS).encode() + b"\n")
        process.stdin.flush()
        listing = process.stdout.readline()
        listed = (time.perf_counter_ns() - start) / 1e6
    process.stdin.close()
    process.wait(timeout=30)
    answer = json.loads(line) if line else {}
    if "result" not in answer:
        raise RuntimeError(f"{tree}: serve did not answer initialize: {line!r}")
    if list_tools and not (json.loads(listing or b"{}").get("result") or {}).get("tools"):
        raise RuntimeError(f"{tree}: serve did not list its tools: {listing!r}")
    return elapsed, listed


def time_user_list(tree: Path, home: Path) -> float:
    start = time.perf_counter_ns()
    subprocess.run(
        [*_gateway(home), "--policy", str(home / "policy.yaml"), "user", "list"],
        cwd=tree, env=_env(tree), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return (time.perf_counter_ns() - start) / 1e6


ROWS = {"python -c pass": time_pass, "--help": time_help, "initialize": time_initialize, "user list": time_user_list}


def _init(tree: Path, home: Path) -> None:
    subprocess.run([*_gateway(home), "init"], cwd=tree, env=_env(tree), check=True, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="samples of each row and tree (default 15)")
    parser.add_argument("--old", metavar="COMMIT", help="also measure this commit (git archive)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        root = Path(scratch)
        trees = {"working tree": REPO}
        if args.old:
            trees = {args.old: extract_tree(args.old, root / "old"), **trees}
        homes = {}
        for name, tree in trees.items():
            homes[name] = root / f"home-{len(homes)}"
            _init(tree, homes[name])
        samples: dict[tuple[str, str], list[float]] = {(t, r): [] for t in trees for r in ROWS}
        cpu: dict[tuple[str, str], list[float]] = {(t, r): [] for t in trees for r in ROWS}
        for name, tree in trees.items():  # warm-up: bytecode caches, page cache
            for measure in ROWS.values():
                measure(tree, homes[name])
        try:
            for round_no in range(args.runs):
                order = list(trees.items()) if round_no % 2 == 0 else list(reversed(trees.items()))
                for name, tree in order:
                    for row, measure in ROWS.items():
                        before = _children_cpu_s()
                        samples[(name, row)].append(measure(tree, homes[name]))
                        cpu[(name, row)].append((_children_cpu_s() - before) * 1000)
        except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
            print(f"startup: {exc}", file=sys.stderr)
            return 1
    print(f"{args.runs} runs each, ms (Python {sys.version.split()[0]})")
    print(f"{'tree':<14}{'row':<16}{'median':>9}{'p90':>9}{'- pass':>9}{'cpu':>9}")
    for name in trees:
        floor = statistics.median(samples[(name, "python -c pass")])
        for row in ROWS:
            values = sorted(samples[(name, row)])
            median = statistics.median(values)
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            spent = statistics.median(cpu[(name, row)])
            print(f"{name[:13]:<14}{row:<16}{median:>9.1f}{p90:>9.1f}{median - floor:>9.1f}{spent:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
