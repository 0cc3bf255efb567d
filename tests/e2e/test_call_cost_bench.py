"""The cost-per-call bench (bench/call_cost.py) still runs, prints its whole table, and checks what it claims to.

One `--quick` run of the working tree, on SQLite and on the suite's PostgreSQL where there is one,
and one of the start-up row with the tree before (4934e5f, by `git archive`) beside it, which a clone
without that commit cannot make (skipped there): the bench exits 0 only when every check passed (each
refused call's two events, each fleet call's events and the budget burst, each allowed run's
trail, `audit verify` on every database, no token in a log). The table has every row, each with
its figures, anchor, ratios, aim and verdict, or says why it was skipped (no root, no PostgreSQL).
The figures themselves depend on the machine and are not judged here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_fleet_bench import engines
from tests.pg_cluster import URL_VARIABLE

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
HEADER = "| row | before | after | anchor | ratio before | ratio after | aim | met/missed |"


def expected_rows(chosen: list[str], root: bool) -> dict[str, str | None]:
    """Each row's name, and None where it is measured or the start of its skip reason."""
    no_pg = None if "postgresql" in chosen else "skipped: PostgreSQL not chosen"
    no_root = None if root else "skipped: needs root"
    return {
        "refused call p50, sqlite": None,
        "server CPU per refused call, sqlite": None,
        "refused call p50, postgresql": no_pg,
        "server CPU per refused call, postgresql": no_pg,
        "`initialize` answered after spawn": None,
        "then `tools/list` answered": None,
        **({"sandboxed spawn, native": None, "sandboxed spawn, bubblewrap": None} if root else {}),
        **({} if root else {"sandboxed spawn": no_root}),
        (
            "2 gateways on PostgreSQL vs 1 on SQLite" if no_pg is None else "gateways on PostgreSQL vs 1 on SQLite"
        ): no_pg,
        "allowed run_pytest, sample suite": no_root,
    }


def test_the_call_cost_bench_prints_every_row_against_its_anchor_and_passes_its_checks(tmp_path: Path) -> None:
    chosen = engines()
    root = os.geteuid() == 0
    saved = tmp_path / "results.json"
    argv = [
        sys.executable, str(REPO / "bench" / "call_cost.py"), "--quick", "--json", str(saved),
        "--engines", ",".join(chosen), "--no-before",
    ]  # fmt: skip
    if "postgresql" in chosen:
        argv += ["--pg-url", os.environ[URL_VARIABLE]]
    bench = subprocess.run(argv, capture_output=True, text=True, timeout=840, cwd=tmp_path, check=False)
    assert bench.returncode == 0, bench.stdout + bench.stderr

    table = bench.stdout[bench.stdout.index(HEADER) :].split("\n\n")[0].splitlines()
    assert table[1] == "|---|---|---|---|---|---|---|---|", bench.stdout
    cells = {line.split(" | ")[0].removeprefix("| "): line.strip("| ").split(" | ") for line in table[2:]}
    wanted = expected_rows(chosen, root)
    assert list(cells) == list(wanted), bench.stdout
    for name, skip in wanted.items():
        row = cells[name]
        if skip is not None:
            assert row[1].startswith(skip), row
            continue
        assert len(row) == 8, row
        _, before, after, anchor, ratio_before, ratio_after, aim, verdict = row
        assert before == "-" and ratio_before == "-", row  # the tree before is left out (--no-before)
        assert after != "-" and anchor != "-" and ratio_after.endswith("x"), row
        assert aim != "", row
        assert verdict in ({"-"} if aim == "(shown)" else {"met", "missed"}), row

    results = json.loads(saved.read_text())
    measured = [row for row in results["rows"] if not row["skipped"]]
    assert {row["name"] for row in measured} == {name for name, skip in wanted.items() if skip is None}
    for row in measured:
        assert row["after"] > 0 and row["anchor"] > 0, row
        if row["met"] is False:
            assert row["floors"], f"a missed aim shows the floor under it: {row}"
    # Every call row's CPU, per process and tree: the refused calls' five sides first.
    sides = [(cpu["row"], cpu["side"]) for cpu in results["cpu"]]
    assert sides[0] == ("refused call", "bare SDK server"), sides
    for engine in chosen:
        assert ("refused call", f"after, {engine}") in sides, sides
    if root:  # the spawn's floor, the PID namespace alone, is measured in the same worker and rounds
        assert ("trivial spawn", "after, floor") in sides, sides
        spawn_floors = [
            floor for row in measured if row["name"].startswith("sandboxed spawn") for floor in row["floors"]
        ]
        assert all("the PID namespace alone" in floor for floor in spawn_floors), spawn_floors
    checks = results["checks"]
    for engine in chosen:
        assert any(line.startswith(f"refused calls, after, {engine}:") and "no token" in line for line in checks)
    if "postgresql" in chosen:
        assert sum(line.startswith("fleet, after, ") and "verify ok" in line for line in checks) == 2, checks
    if root:
        assert any(line.startswith("suite, after:") and "hash chain intact" in line for line in checks), checks


def test_the_tree_before_is_measured_beside_the_working_tree(tmp_path: Path) -> None:
    """The before tree comes from the repository's history by `git archive`, runs with its own code and state
    folders, and its row is shown with its own ratio beside the working tree's."""
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", "4934e5f^{commit}"], capture_output=True, check=False, timeout=60
    )
    if known.returncode != 0:
        pytest.skip("this clone lacks commit 4934e5f (a shallow clone): the tree before cannot be extracted")
    argv = [sys.executable, str(REPO / "bench" / "call_cost.py"), "--quick", "--rows", "startup"]
    bench = subprocess.run(argv, capture_output=True, text=True, timeout=840, cwd=tmp_path, check=False)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    table = bench.stdout[bench.stdout.index(HEADER) :].split("\n\n")[0].splitlines()
    cells = {line.split(" | ")[0].removeprefix("| "): line.strip("| ").split(" | ") for line in table[2:]}
    row = cells["`initialize` answered after spawn"]
    _, before, after, anchor, ratio_before, ratio_after, _aim, verdict = row
    assert before.endswith(" ms") and after.endswith(" ms") and anchor != "-", row
    assert ratio_before.endswith("x") and ratio_after.endswith("x") and verdict in {"met", "missed"}, row


def test_an_unknown_row_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    bench = subprocess.run(
        [sys.executable, str(REPO / "bench" / "call_cost.py"), "--rows", "refused,latency"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert bench.returncode == 2, bench.stdout + bench.stderr
    assert "unknown ['latency']" in bench.stderr and "refused, cpu, startup, spawn, fleet, suite" in bench.stderr
