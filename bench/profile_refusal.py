"""Where a refused tools/call spends its time inside the gateway: an in-process companion to bench/stdio_refusals.py.

No stdio and no MCP SDK: this opens the gateway's real `Services` on the same two kinds of
state folder as the stdio benchmark (SQLite `synchronous=normal`, the default, and a URL
ending in `?synchronous=full`) and times, call by call:

- on the normal folder, each stage of a VIEWER's refused `run_pytest` in pipeline order
  (docs/architecture.md), through the gateway's public functions: ids and the arguments' hash,
  `Authenticator.authenticate` (and, apart, its two parts: the JWT checks, then the
  revocation and user reads on one read-only connection), authorization (-32003), the
  one `AuditLog.append` of MCP_TOOL_CALL and POLICY_BLOCKED, `to_mcp_error`;
- normal against full, interleaved call by call: that audit append, the whole
  `Pipeline.call`, and the floor under both (sqlite3 alone: one transaction of two inserts);

then verifies both audit chains. `--cprofile` adds the top functions of `Pipeline.call`
(normal) by own time. The gap between the whole call here and the stdio benchmark's
gateway p50 is the transport and the SDK's server.

    .venv/bin/python bench/profile_refusal.py [--calls 1000] [--cprofile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio

# `python bench/profile_refusal.py` puts bench/ first on sys.path: the sibling script imports as a module.
from stdio_refusals import CALL, gateway_home

from gateway import db
from gateway.audit import EventDraft, EventType, verify_chain
from gateway.auth import check_lifetime, decode_token
from gateway.canonical import args_hash
from gateway.errors import PermissionDeniedError
from gateway.pipeline import CallRequest, Pipeline
from gateway.server import to_mcp_error
from gateway.services import Services, open_services

ARGUMENTS: dict[str, Any] = dict(CALL["arguments"])
TOOL = str(CALL["name"])
PART = "  of which: "
"""Rows so marked are inside the row above them and are not added to the sum."""


class Stopwatch:
    """Named samples in ns; `with watch("stage"): ...` adds one."""

    def __init__(self) -> None:
        self.samples: dict[str, list[int]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter_ns()
        try:
            yield
        finally:
            self.samples.setdefault(name, []).append(time.perf_counter_ns() - started)


def refusal_events(s: Services, run_id: str, hashed: str, user: str, exc: PermissionDeniedError) -> list[EventDraft]:
    """The two events a refused call leaves: MCP_TOOL_CALL and POLICY_BLOCKED, naming the caller."""
    common: dict[str, Any] = {"run_id": run_id, "user": user, "tool_name": TOOL, "args_hash": hashed}
    detail = {"blocked_reason": exc.reason}
    return [
        EventDraft(EventType.MCP_TOOL_CALL, **common),
        EventDraft(EventType.POLICY_BLOCKED, code=exc.code, detail=detail, **common),
    ]


def stage_samples(s: Services, token: str, calls: int) -> dict[str, list[int]]:
    """A refused call's stages, in pipeline order, each timed on its own."""
    pipeline = Pipeline(s)
    reads = db.reader(s.engine)
    auth = s.policy.auth
    watch = Stopwatch()
    for _ in range(calls):
        with watch("new_run_id + args_hash"):
            run_id = s.new_run_id()
            hashed = args_hash(dict(ARGUMENTS))
        with watch("authenticate"):
            principal = s.authenticator.authenticate(token)
        with watch(f"{PART}JWT decode + lifetime (pyjwt, HS256)"):
            claims = check_lifetime(decode_token(token, s.keys, auth), s.clock.now(), auth)
        with watch(f"{PART}revocation + user reads, 1 read txn"), reads.connect() as connection:
            s.tokens.is_revoked(claims.jti, connection)
            s.users.fetch(claims.sub, connection)
        with watch("authorize -> PermissionDeniedError"):
            try:
                pipeline.admit(principal, TOOL, ARGUMENTS)
            except PermissionDeniedError as exc:
                refusal = exc
            else:
                raise RuntimeError("the VIEWER was not refused")
        events = refusal_events(s, run_id, hashed, principal.name, refusal)
        with watch("audit append, 2 events in 1 txn"):
            s.audit.append(*events)
        with watch("to_mcp_error"):
            to_mcp_error(refusal, run_id)
    return watch.samples


def whole_calls(services: Sequence[tuple[str, Services, str]], calls: int) -> dict[str, list[int]]:
    """`Pipeline.call` on each of `services` (label, services, token) in turn, in one event loop."""
    pipelines = [(label, Pipeline(s), CallRequest(TOOL, ARGUMENTS, token)) for label, s, token in services]
    watch = Stopwatch()

    async def drive() -> None:
        for _ in range(calls):
            for label, pipeline, request in pipelines:
                with watch(label), contextlib.suppress(PermissionDeniedError):
                    await pipeline.call(request)

    anyio.run(drive)
    return watch.samples


def sync_samples(services: dict[str, tuple[Services, str]], calls: int) -> dict[str, list[int]]:
    """Normal against full, one call of each in turn: the audit append, then the whole call."""
    watch = Stopwatch()
    refusal = PermissionDeniedError("missing_permission", "bench")
    for _ in range(calls):
        for sync, (s, _token) in services.items():
            events = refusal_events(s, s.new_run_id(), "0" * 64, "viewer", refusal)
            with watch(f"audit append, 2 events in 1 txn, synchronous={sync}"):
                s.audit.append(*events)
    labelled = [(f"Pipeline.call (refused, -32003), synchronous={sync}", *pair) for sync, pair in services.items()]
    return {**watch.samples, **whole_calls(labelled, calls)}


def sqlite_floor(path: Path, calls: int) -> dict[str, list[int]]:
    """Bare sqlite3, no SQLAlchemy, WAL: BEGIN IMMEDIATE, two INSERTs, COMMIT, in a scratch database."""
    watch = Stopwatch()
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("CREATE TABLE IF NOT EXISTS scratch (id INTEGER PRIMARY KEY, body TEXT)")
    for _ in range(calls):
        for sync in ("normal", "full"):
            connection.execute(f"PRAGMA synchronous = {sync}")
            with watch(f"sqlite3, 1 txn of 2 inserts, synchronous={sync}"):
                connection.execute("BEGIN IMMEDIATE")
                connection.executemany("INSERT INTO scratch (body) VALUES (?)", [("x" * 400,), ("x" * 400,)])
                connection.execute("COMMIT")
    connection.close()
    return watch.samples


def print_rows(title: str, samples: dict[str, list[int]]) -> None:
    print(title)
    print(f"  {'':<52}{'p50 ms':>9}{'mean ms':>9}")
    for name, values in samples.items():
        print(f"  {name:<52}{statistics.median(values) / 1e6:>9.3f}{statistics.fmean(values) / 1e6:>9.3f}")
    print()


def print_cprofile(s: Services, token: str, calls: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    whole_calls([("normal", s, token)], calls)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    print(f"cProfile of {calls} Pipeline.call (synchronous=normal), top 25 by own time")
    print(out.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1000, help="calls per measurement (default 1000)")
    parser.add_argument("--cprofile", action="store_true", help="also profile Pipeline.call")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        homes = {sync: gateway_home(Path(tmp) / sync, sync) for sync in ("normal", "full")}
        services = {sync: (open_services(home.settings), token) for sync, (home, token) in homes.items()}
        s, token = services["normal"]
        whole_calls([(sync, *pair) for sync, pair in services.items()], 50)  # warm-up
        stages = stage_samples(s, token, args.calls)
        total = sum(statistics.median(v) for k, v in stages.items() if not k.startswith(PART)) / 1e6
        print_rows(
            f"stages of a refused call, synchronous=normal, {args.calls} calls (sum of p50s {total:.3f} ms)", stages
        )
        print_rows("synchronous=normal against full, interleaved", sync_samples(services, args.calls))
        print_rows("floor", sqlite_floor(Path(tmp) / "floor.db", args.calls))
        if args.cprofile:
            print_cprofile(s, token, args.calls)
        for sync, (s, _) in services.items():
            report = verify_chain(s.audit.events(), s.audit.head())
            print(f"audit chain ({sync}): {'intact' if report.ok else 'BROKEN'} ({report.checked} events)")
            s.engine.dispose()
            homes[sync][0].engine.dispose()
            if not report.ok:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
