"""100 calls in flight while another connection holds the lock they need for 60 s (decision 67).

For SQLite (`BEGIN IMMEDIATE` on the file) and PostgreSQL (`audit_head` `FOR UPDATE`, on a
throwaway cluster of tests/pg_cluster.py): one `serve` with the default start bound
(`MCP_GATEWAY_DB_WAIT_S`, 10 s) and a sweep/lease period of 5 s, 100 `list_artifacts` calls written
to its stdin at once, the lock held `--hold` seconds. Prints, per engine: the slowest answer and the
answers by outcome, the lease (`alive_until`) at the start, during and after the hold, calls with
two decisions or two terminal events, and whether stderr holds a traceback. Exits 1 when a check
fails: an answer later than the bound (start bound + the lock wait + 5 s), an answer other than a
result or a storage reason, a lease that did not move (during the hold on PostgreSQL; after it on
SQLite, where the held file lock holds back every write), a doubled end, a traceback.
The scenario is tests/db_stall.py's, which tests/e2e/test_database_saturation.py runs shorter.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.harness and tests.pg_cluster, as the tests build theirs

from tests.db_stall import SQLITE_BUSY_S, Stall, run_stall  # noqa: E402
from tests.harness import GatewayHome, StdioSession  # noqa: E402
from tests.pg_cluster import own_cluster  # noqa: E402

START_WAIT_S = 10.0
LOCK_WAIT_S = {"sqlite": SQLITE_BUSY_S, "postgres": 2 * SQLITE_BUSY_S}
"""A started statement's wait: SQLite's busy timeout; on PostgreSQL a row lock's two waits of lock_timeout."""
SLACK_S = 5.0


def one(engine: str, url: str | None, calls: int, hold_s: float) -> tuple[Stall, list[str]]:
    bound_s = START_WAIT_S + LOCK_WAIT_S[engine] + SLACK_S
    with tempfile.TemporaryDirectory(prefix="db-stall-") as scratch:
        gateway = GatewayHome(Path(scratch), {}, url)
        gateway.add_user("alice", "USER")
        gateway.engine.dispose()
        env = {"MCP_GATEWAY_SWEEP_S": "5", "MCP_GATEWAY_DB_WAIT_S": str(START_WAIT_S)}
        session = StdioSession(gateway, env=env)
        try:
            session.initialize()
            stall = run_stall(gateway, session, calls=calls, hold_s=hold_s, answer_by_s=hold_s + bound_s)
        finally:
            session.close()
    failures = []
    if stall.slowest() >= bound_s:
        failures.append(f"slowest answer {stall.slowest():.1f} s, over the bound {bound_s} s")
    if set(stall.outcomes()) - {"ok", "-32603 database_unavailable", "-32603 audit_unavailable"}:
        failures.append(f"answers other than a result or a storage reason: {stall.outcomes()}")
    moved = stall.lease_moved_during_hold() if engine == "postgres" else stall.lease_moved_after_hold()
    if not moved:
        failures.append("the lease did not move")
    if stall.doubled:
        failures.append(f"{stall.doubled} calls with two decisions or two ends")
    if "Traceback" in stall.stderr:
        failures.append("a traceback in stderr")
    return stall, failures


def report(engine: str, stall: Stall, failures: list[str]) -> None:
    during = sorted({alive for at, alive in stall.lease if at < stall.hold_s})
    after = [alive for at, alive in stall.lease if at >= stall.hold_s]
    first = stall.lease[0][1] if stall.lease else 0.0
    print(f"{engine}: {len(stall.answers)} calls, lock held {stall.hold_s:.0f} s")
    print(f"  slowest answer {stall.slowest():.1f} s; answers {stall.outcomes()}")
    print(
        f"  lease: {len(during)} distinct alive_until during the hold (+{during[-1] - first:.1f} s),"
        f" {'+%.1f s' % (max(after) - first) if after else 'none'} after it"
    )
    print(f"  doubled ends {stall.doubled}; traceback {'yes' if 'Traceback' in stall.stderr else 'no'}")
    for failure in failures:
        print(f"  FAIL: {failure}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--hold", type=float, default=60.0, help="seconds the lock is held")
    parser.add_argument("--engines", default="sqlite,postgres")
    args = parser.parse_args(argv)
    failed = False
    for engine in args.engines.split(","):
        if engine == "sqlite":
            stall, failures = one(engine, None, args.calls, args.hold)
        else:
            with own_cluster() as cluster:
                stall, failures = one(engine, cluster.url, args.calls, args.hold)
        report(engine, stall, failures)
        failed = failed or bool(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
