"""What a console card adds to a refused call: the refusal's audit append with and without its card.

A refused tools/call commits MCP_TOOL_CALL and POLICY_BLOCKED in one transaction; since the web
console, the call's card (gateway/calls.py) is inserted in that same transaction. This script
times that append in process on a fresh SQLite database (WAL, synchronous=NORMAL, as `init`
makes it), alternating calls with and without the card so that machine noise falls on both
alike, and prints p50 and mean of each and the difference. bench/stdio_refusals.py measures the
whole round trip over stdio.

    .venv/bin/python bench/card_cost.py [--calls 4000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway import db  # noqa: E402
from gateway.audit import AuditLog, EventDraft, EventType  # noqa: E402
from gateway.calls import Opened  # noqa: E402
from gateway.clock import SystemClock  # noqa: E402

MESSAGE = "Permission denied: role VIEWER lacks ORCHESTRATION_RUN"


def refused(log: AuditLog, i: int, with_card: bool) -> float:
    """One refusal's append; its duration in ms."""
    run_id = f"r{i}"
    entry = EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, user="vic", tool_name="run_pytest", args_hash="a" * 64)
    blocked = EventDraft(
        EventType.POLICY_BLOCKED, run_id=run_id, user="vic", tool_name="run_pytest", code=-32003,
        detail={"blocked_reason": "missing_permission"},
    )  # fmt: skip
    card = Opened(
        run_id, "vic", None, "mcp-write-gateway", "run_pytest", {"test_path": "tests"}, "error", time.time(),
        code=-32003, reason="missing_permission", message=MESSAGE,
    )  # fmt: skip
    started = time.perf_counter()
    log.append(entry, blocked, along=[card] if with_card else [])
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-card-") as folder:
        engine = db.make_engine(f"sqlite:///{Path(folder) / 'gateway.db'}")
        db.migrate(engine)
        log = AuditLog(engine, SystemClock())
        for i in range(200):  # warm-up, unmeasured
            refused(log, i, i % 2 == 0)
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(200, 200 + 2 * args.calls):
            times[i % 2 == 0].append(refused(log, i, i % 2 == 0))
        engine.dispose()
    without, with_card = statistics.median(times[False]), statistics.median(times[True])
    print(f"{'refusal append':24} {'p50 ms':>8} {'mean ms':>8}")
    print(f"{'without its card':24} {without:8.3f} {statistics.mean(times[False]):8.3f}")
    print(f"{'with its card':24} {with_card:8.3f} {statistics.mean(times[True]):8.3f}")
    print(f"the card adds {with_card - without:.3f} ms at p50 ({with_card / without:.2f}x the append)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
