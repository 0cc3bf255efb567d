"""The scale bench (bench/fleet_scale.py) still runs and still checks what it claims to.

A small run (1 and 2 gateways, 40 calls) on SQLite and on the suite's PostgreSQL: the bench exits 0
only when every configuration's checks pass (every answer right, every event present, `audit
verify` ok, the budget burst admitted exactly), and its table says so row by row.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg_cluster import URL_VARIABLE, pg_missing, pg_required

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
BUDGET = 6


def engines() -> list[str]:
    missing = pg_missing()
    if missing is None:
        return ["sqlite", "postgresql"]
    if pg_required():
        pytest.fail(f"{missing}: as root the suite runs on PostgreSQL too; `make system-deps` installs it")
    return ["sqlite"]


def test_the_fleet_bench_measures_and_checks_every_configuration(tmp_path: Path) -> None:
    chosen = engines()
    argv = [
        sys.executable, str(REPO / "bench" / "fleet_scale.py"), "--gateways", "1,2", "--calls", "40",
        "--rounds", "2", "--warmup", "3", "--budget", str(BUDGET), "--engines", ",".join(chosen),
    ]  # fmt: skip
    if "postgresql" in chosen:
        argv += ["--pg-url", os.environ[URL_VARIABLE]]
    bench = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=tmp_path, check=False)
    assert bench.returncode == 0, bench.stdout + bench.stderr

    table = bench.stdout.split("\n\n")[-2].splitlines()  # the summary: a header, then a row per configuration
    assert table[0].split()[:3] == ["database", "gateways", "calls"], bench.stdout
    rows = {(row.split()[0], int(row.split()[1])): row.split() for row in table[1:]}
    assert sorted(rows) == sorted((engine, size) for engine in chosen for size in (1, 2)), bench.stdout
    for row in rows.values():
        calls, wrong, missing, verify, admitted, over_grants = row[2], row[6], row[7], row[8], row[9], row[10]
        assert int(calls) == 40 and (wrong, missing, verify) == ("0", "0", "ok"), row
        assert (admitted, over_grants) == (f"{BUDGET}/{BUDGET}", "0"), row
    assert "1 gateway: SQLite / PostgreSQL" in bench.stdout or chosen == ["sqlite"], bench.stdout
