"""The upstream bench (bench/upstream_cost.py) still runs and still checks what it claims to.

A small run (12 calls a side) on SQLite, and on the suite's PostgreSQL where there is one: the bench
exits 0 only when every call was answered with a result and every gateway call's trail is whole (entry,
decision, start, UPSTREAM_CALL, end) with `audit verify` ok; its table has a row per side with the
CPU of each process, and a verdict per gateway side against the aim.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_fleet_bench import engines
from tests.pg_cluster import URL_VARIABLE

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not (Path(sys.executable).parent / "mcp-server-git").exists() or shutil.which("git") is None,
        reason="mcp-server-git (the test extra) and git are needed",
    ),
]

REPO = Path(__file__).resolve().parents[2]
CALLS = 12


def test_the_upstream_bench_measures_every_side_and_checks_every_trail(tmp_path: Path) -> None:
    chosen = engines()
    argv = [
        sys.executable, str(REPO / "bench" / "upstream_cost.py"), "--calls", str(CALLS), "--warmup", "2",
        "--blocks", "2", "--engines", ",".join(chosen),
    ]  # fmt: skip
    if "postgresql" in chosen:
        argv += ["--pg-url", os.environ[URL_VARIABLE]]
    bench = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=tmp_path, check=False)
    assert bench.returncode == 0, bench.stdout + bench.stderr

    lines = bench.stdout.splitlines()
    rows = {line[:32].strip(): line[32:].split() for line in lines if line.startswith(("echo,", "git_status,"))}
    direct = {"echo, direct", "git_status, direct"}
    through = {f"{server}, {engine} {view}" for server in ("echo", "git_status") for engine in chosen for view in ("read_only", "write")}  # fmt: skip
    assert set(rows) == direct | through, bench.stdout
    for name, row in rows.items():
        p50, p90, p99, gateway, server, client = row
        assert 0 < float(p50) <= float(p90) <= float(p99), row
        assert (gateway == "-") is (name in direct), row
        # CPU per call, from rusage: a trivial server's few calls can round to 0.00 ms; git's never do.
        assert float(server) >= 0 and float(client) >= 0, row
        if name.startswith("git_status"):
            assert float(server) > 0, row
    verdicts = {line.split(":")[0].strip(): line.rsplit(":", 1)[1].strip() for line in lines if " direct, +" in line}
    assert set(verdicts) == through, bench.stdout
    assert set(verdicts.values()) <= {"met", "NOT met"}, verdicts
    assert "aim: <= 1.5x + server time" in bench.stdout
    for engine in chosen:
        audit = next(line for line in bench.stdout.splitlines() if line.startswith(f"audit ({engine}):"))
        assert f"{4 * CALLS} measured calls each" in audit and "no token" in audit and "hash chain intact" in audit
