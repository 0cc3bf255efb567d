"""How long the gateway takes to start (decision 48): `--help`, and `serve` answering `initialize`.

Hosts start one `serve` per session, so the time to the `initialize` answer is paid on every
session. Rows, each a fresh process, timed from `Popen` to the end of the output the row waits
for (`time.perf_counter_ns`):

- `python -c pass`: the floor, this venv's interpreter doing nothing;
- `SDK import`: `python -c "import gc; gc.disable(); import mcp.server.lowlevel, mcp_types"`, the
  MCP SDK's server and types imported as `serve` imports them (collector off, decision 79): the floor
  under `initialize` for any `serve` that loads the SDK before it answers;
- `--help`: `python -m gateway --help`, until it exits;
- `initialize`: `python -m gateway ... serve` on a state folder `mcp-gateway init` made (SQLite),
  until its answer to `initialize` (protocol 2025-11-25) is read;
- `tools/list`: the same process, then sent `notifications/initialized` and `tools/list` (no token),
  until that answer is read, still from `Popen`: what a host sees before it can offer the tools;
  then stdin is closed and the process reaped, unmeasured;
- `user list`: `python -m gateway ... user list` (a one-shot command with the database), until it exits.

Each row also reports the CPU (user + system) its process spent from start to exit, shutdown
included (`RUSAGE_CHILDREN` before and after): what a test suite or a host that starts many
gateways pays.

Trees: the working tree, and with `--old COMMIT` that commit too, written out with `git archive`
into a temporary folder. Each tree runs with cwd and PYTHONPATH set to it and `-P` unset, so
`python -m gateway` takes that tree's `gateway`. Rounds interleave rows and trees, so machine
noise falls on all alike. Prints median and p90 of each row and tree, in ms, the median
less the `python -c pass` median, and the median CPU (`initialize` and `tools/list` are one process: the
same CPU). Exits 0 with the figures; 1 if a row fails.

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
SDK_IMPORT = "import gc; gc.disable(); import mcp.server.lowlevel, mcp_types"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
}
TOOLS_LIST = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n'


def tree_env(tree: Path) -> dict[str, str]:
    # Bytecode caches are written (the warm-up round writes them), as an installed package has them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    return env


def _gateway(home: Path) -> list[str]:
    return [sys.executable, "-m", "gateway", "--home", str(home), "--db", f"sqlite:///{home}/gateway.db"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_pass(tree: Path, _home: Path) -> dict[str, float]:
    start = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", "pass"], cwd=tree, env=tree_env(tree), check=True)
    return {"python -c pass": (time.perf_counter_ns() - start) / 1e6}


def time_sdk_import(tree: Path, _home: Path) -> dict[str, float]:
    start = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", SDK_IMPORT], cwd=tree, env=tree_env(tree), check=True)
    return {"SDK import": (time.perf_counter_ns() - start) / 1e6}


def time_help(tree: Path, _home: Path) -> dict[str, float]:
    start = time.perf_counter_ns()
    subprocess.run(
        [sys.executable, "-m", "gateway", "--help"], cwd=tree, env=tree_env(tree), check=True, stdout=subprocess.DEVNULL
    )
    return {"--help": (time.perf_counter_ns() - start) / 1e6}


def serve_session(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """ms from `Popen` of a `serve` to its `initialize` answer, and to its `tools/list` answer; the process reaped."""
    start = time.perf_counter_ns()
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    process.stdin.flush()
    line = process.stdout.readline()
    initialized = (time.perf_counter_ns() - start) / 1e6
    process.stdin.write(TOOLS_LIST)
    process.stdin.flush()
    listed_line = process.stdout.readline()
    listed = (time.perf_counter_ns() - start) / 1e6
    process.stdin.close()
    process.wait(timeout=60)
    answer = json.loads(line) if line else {}
    if "result" not in answer:
        raise RuntimeError(f"{argv[:4]}: serve did not answer initialize: {line[:300]!r}")
    tools = json.loads(listed_line).get("result", {}).get("tools") if listed_line else None
    if not tools:
        raise RuntimeError(f"{argv[:4]}: serve did not list its tools: {listed_line[:300]!r}")
    return initialized, listed


def time_serve(tree: Path, home: Path) -> dict[str, float]:
    argv = [*_gateway(home), "--policy", str(home / "policy.yaml"), "serve"]
    initialized, listed = serve_session(argv, tree, tree_env(tree))
    return {"initialize": initialized, "tools/list": listed}


def time_user_list(tree: Path, home: Path) -> dict[str, float]:
    start = time.perf_counter_ns()
    subprocess.run(
        [*_gateway(home), "--policy", str(home / "policy.yaml"), "user", "list"],
        cwd=tree, env=tree_env(tree), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return {"user list": (time.perf_counter_ns() - start) / 1e6}


MEASURES = (time_pass, time_sdk_import, time_help, time_serve, time_user_list)
ROWS = ("python -c pass", "SDK import", "--help", "initialize", "tools/list", "user list")


def extract_tree(commit: str, into: Path) -> Path:
    """`commit`'s files written out into the new folder `into` (`git archive`), which is returned."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _init(tree: Path, home: Path) -> None:
    subprocess.run([*_gateway(home), "init"], cwd=tree, env=tree_env(tree), check=True, stderr=subprocess.DEVNULL)


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
            for measure in MEASURES:
                measure(tree, homes[name])
        try:
            for round_no in range(args.runs):
                order = list(trees.items()) if round_no % 2 == 0 else list(reversed(trees.items()))
                for name, tree in order:
                    for measure in MEASURES:
                        before = _children_cpu_s()
                        figures = measure(tree, homes[name])
                        spent = (_children_cpu_s() - before) * 1000
                        for row, elapsed in figures.items():
                            samples[(name, row)].append(elapsed)
                            cpu[(name, row)].append(spent)
        except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
            print(f"startup: {exc}", file=sys.stderr)
            return 1
    print(f"{args.runs} runs each, ms (Python {sys.version.split()[0]}; load {os.getloadavg()[0]:.2f} at the end)")
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
