"""The floor under a refused call (decision 100): the bare SDK server plus the work no refusal may skip.

bench/bare_server.py's server, the SDK's lowlevel `Server` over its own `stdio_server`, whose
`tools/call` does, as directly as Python allows (the sqlite3 or psycopg driver; no SQLAlchemy,
no gateway code), what the gateway's guarantees require of a refused call before its answer:

- the token: its claims remembered after the first sight, as the gateway remembers a verified
  token (decision 92), and its lifetime checked at every call;
- the caller's row read at every call: their role, whether they are disabled, and the token's
  revocation, in one statement;
- the refusal recorded before the answer is written: the interface's two events (MCP_TOOL_CALL,
  then POLICY_BLOCKED with its code), hash-chained after the head read under the chain's lock
  (canonical JSON, sha256), and the call's card, committed in one transaction, with the durability
  the gateway's database URL gives (WAL and `synchronous` as `mcp-gateway init` writes it; on
  PostgreSQL the server's defaults, fsync on);
- that database work off the event loop, in one thread hop, the loop waiting a bounded time for
  it (as gateway/db/threads.py does): a wait for another writer's lock must not stop the loop
  answering pings.

On SQLite it is one transaction, BEGIN IMMEDIATE first: the caller's row, the head, the two events in
one INSERT, the card, the head moved, COMMIT. On PostgreSQL it is two round trips: the caller's row
in autocommit, then the append in one statement, the schema's own `gateway_audit_append` (the chain's
lock held while the server works only, decision 62), which also writes the card. The database
must be one `mcp-gateway init` made, so the tables, indexes and function are the gateway's; the
events it writes pass `mcp-gateway audit verify`.

    python bench/floor_server.py --db URL [--allowed-roles ADMIN,USER]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from queue import SimpleQueue
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import mcp_types as types
import psycopg
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

PERMISSION_DENIED = -32003
AUTH_REQUIRED = -32001
PERMISSION = "ORCHESTRATION_RUN"
LOOP_WAIT_S = 0.005
"""How long the loop's thread waits for the hop before yielding to the loop (gateway/db/threads.py's)."""
GENESIS_HASH = "0" * 64
SERVER_ID = "mcp-write-gateway"

_TOOL = types.Tool(
    name="run_pytest",
    description="Refuses a caller whose role lacks the permission; runs nothing.",
    input_schema={"type": "object", "properties": {"test_path": {"type": "string"}}},
)
_CALLER = (
    "SELECT u.role, u.disabled, (SELECT t.revoked_at FROM tokens AS t WHERE t.jti = {p}) "
    "FROM users AS u WHERE u.name = {p}"
)
_EVENTS = (
    "INSERT INTO audit_events (id, ts, event_type, run_id, user_name, workspace, tool_name, args_hash, code, "
    "detail, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?), (?,?,?,?,?,?,?,?,?,?,?,?)"
)
_CARD = (
    "INSERT INTO tool_calls (run_id, kind, created_at, updated_at, user_name, workspace, server_id, tool_name, "
    "arguments, status, code, reason, message, result, last_event_id, session_id) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,NULL,?,NULL)"
)
_REFUSE = (
    "SELECT o_role, o_refused FROM floor_refuse(%s, %s, %s::text[], %s, %s, %s::text[], %s::text[], %s::text[], "
    "%s::text[], %s::text[], %s::text[], %s::integer[], %s::text[], %s::bytea[], %s::bytea[], %s::jsonb)"
)
_FLOOR_REFUSE = """
CREATE OR REPLACE FUNCTION floor_refuse(
    p_jti text, p_user text, p_allowed text[], p_permission text, p_ts text, p_types text[], p_run_ids text[],
    p_users text[], p_workspaces text[], p_tool_names text[], p_args_hashes text[], p_codes integer[],
    p_details text[], p_heads bytea[], p_tails bytea[], p_cards jsonb
) RETURNS TABLE (o_role text, o_refused boolean) LANGUAGE plpgsql AS $refuse$
DECLARE
    v_disabled boolean;
    v_revoked double precision;
BEGIN
    SELECT u.role, u.disabled, (SELECT t.revoked_at FROM tokens AS t WHERE t.jti = p_jti)
        INTO o_role, v_disabled, v_revoked FROM users AS u WHERE u.name = p_user;
    o_refused := FOUND AND NOT v_disabled AND v_revoked IS NULL AND NOT (o_role = ANY (p_allowed));
    IF o_refused THEN
        PERFORM gateway_audit_append(p_ts, p_types, p_run_ids, p_users, p_workspaces, p_tool_names, p_args_hashes,
            p_codes, p_details, p_heads, p_tails, jsonb_build_array(p_cards->0 || jsonb_build_object('message',
            'Permission denied: role ' || o_role || ' lacks ' || p_permission)));
    ELSIF v_disabled OR v_revoked IS NOT NULL THEN
        o_role := NULL;
    END IF;
    RETURN NEXT;
END
$refuse$
"""
"""The caller's row and the append in one statement (`--one-trip`): this floor's own function, in its database."""
_APPEND = (
    "SELECT o_id FROM gateway_audit_append(%s, %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], "
    "%s::text[], %s::integer[], %s::text[], %s::bytea[], %s::bytea[], %s::jsonb)"
)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Call:
    """A call being refused: what its events and card say."""

    run_id: str
    user: str
    role: str
    ts: str
    now: float
    args_hash: str
    arguments: str
    """Canonical JSON."""


class Refusal(Exception):
    def __init__(self, code: int, reason: str, message: str, run_id: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.run_id = code, reason, message, run_id


class Hop:
    """One worker thread; the loop's thread waits for it up to LOOP_WAIT_S, then yields to the loop."""

    def __init__(self) -> None:
        self._work: SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Lock]] = SimpleQueue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            work, box, done = self._work.get()
            try:
                box.append((True, work()))
            except BaseException as exc:  # handed back to the caller, whatever it is
                box.append((False, exc))
            done.release()

    async def run(self, work: Callable[[], Any]) -> Any:
        done, box = threading.Lock(), []  # type: ignore[var-annotated]
        done.acquire()
        self._work.put((work, box, done))
        if not done.acquire(timeout=LOOP_WAIT_S):
            await anyio.to_thread.run_sync(done.acquire)
        ok, value = box[0]
        if not ok:
            raise value
        return value


class Store:
    """The caller's row and the refusal's trail, on one engine."""

    def __init__(self, url: str, allowed_roles: frozenset[str], *, one_trip: bool = False) -> None:
        self.allowed = allowed_roles
        self.one_trip = one_trip
        self.claims: dict[str, tuple[str, str, float]] = {}
        parts = urlsplit(url)
        self.postgres = parts.scheme.startswith("postgresql")
        if self.postgres:
            conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
            self.pg = psycopg.connect(conninfo, autocommit=True)
            if one_trip:
                self.pg.execute(_FLOOR_REFUSE)
            self.caller_sql = _CALLER.format(p="%s")
        else:
            synchronous = parse_qs(parts.query).get("synchronous", ["normal"])[0]
            self.db = sqlite3.connect(parts.path, isolation_level=None, check_same_thread=False)
            for pragma in ("busy_timeout = 10000", "journal_mode = WAL", f"synchronous = {synchronous}"):
                self.db.execute(f"PRAGMA {pragma}")
            self.caller_sql = _CALLER.format(p="?")

    def claims_of(self, token: str) -> tuple[str, str, float]:
        """(sub, jti, exp), remembered by the token's text: its verification is not per call (decision 92)."""
        known = self.claims.get(token)
        if known is None:
            payload = token.split(".")[1]
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            known = self.claims[token] = (str(body["sub"]), str(body["jti"]), float(body["exp"]))
        return known

    def refuse(self, token: str, arguments: Mapping[str, Any]) -> None:
        """Runs on the hop: the checks of every call, then the refusal committed; raises Refusal."""
        run_id = uuid.uuid4().hex
        sub, jti, exp = self.claims_of(token)
        now = time.time()
        if now >= exp:
            raise Refusal(AUTH_REQUIRED, "token_expired", "the token has expired", run_id)
        ts = iso(now)
        hashed = hashlib.sha256(canonical(dict(arguments)).encode()).hexdigest()
        if self.postgres and self.one_trip:
            role = self._refuse_in_one_trip(jti, Call(run_id, sub, "", ts, now, hashed, canonical(dict(arguments))))
        elif self.postgres:
            row = self.pg.execute(self.caller_sql, (jti, sub)).fetchone()
            role = self._decide(row, run_id)
            self._append_on_server(Call(run_id, sub, role, ts, now, hashed, canonical(dict(arguments))))
        else:
            cursor = self.db.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                row = cursor.execute(self.caller_sql, (jti, sub)).fetchone()
                role = self._decide(row, run_id)
                self._append_here(cursor, Call(run_id, sub, role, ts, now, hashed, canonical(dict(arguments))))
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
        raise Refusal(PERMISSION_DENIED, "missing_permission", _message(role), run_id)

    def _decide(self, row: Sequence[Any] | None, run_id: str) -> str:
        """The role of a caller who is refused at authorization; Refusal for any other outcome."""
        if row is None or row[2] is not None or row[1]:
            raise Refusal(AUTH_REQUIRED, "token_revoked", "the token is not valid", run_id)
        role = str(row[0])
        if role in self.allowed:
            raise Refusal(-32603, "not_a_refusal", "the floor only refuses", run_id)
        return role

    @staticmethod
    def _append_here(cursor: sqlite3.Cursor, call: Call) -> None:
        run_id, user, ts, hashed = call.run_id, call.user, call.ts, call.args_hash
        last_id, prev = cursor.execute("SELECT last_id, last_hash FROM audit_head WHERE id = 1").fetchone()
        rows: list[Any] = []
        for event_type, code, detail in _events():
            last_id += 1
            body = {
                "id": last_id, "ts": ts, "event_type": event_type, "run_id": run_id, "user": user,
                "workspace": None, "tool_name": _TOOL.name, "args_hash": hashed, "code": code, "detail": detail,
            }  # fmt: skip
            digest = hashlib.sha256((prev + canonical(body)).encode()).hexdigest()
            rows += (last_id, ts, event_type, run_id, user, None, _TOOL.name, hashed, code, canonical(detail))
            rows += (prev, digest)
            prev = digest
        cursor.execute(_EVENTS, rows)
        cursor.execute(
            _CARD,
            (run_id, "tool", call.now, call.now, user, None, SERVER_ID, _TOOL.name, call.arguments, "error",
             PERMISSION_DENIED, "missing_permission", _message(call.role), last_id),
        )  # fmt: skip
        cursor.execute("UPDATE audit_head SET last_id = ?, last_hash = ? WHERE id = 1", (last_id, prev))

    def _append_on_server(self, call: Call) -> None:
        self.pg.execute(_APPEND, _append_params(call, _message(call.role))).fetchall()

    def _refuse_in_one_trip(self, jti: str, call: Call) -> str:
        """PostgreSQL, `--one-trip`: the caller's row read and, when the role is refused, the append, in one
        statement (`floor_refuse`, which this server adds to its database); the role, or Refusal."""
        params = (jti, call.user, _array(sorted(self.allowed)), PERMISSION, *_append_params(call, None))
        role, refused = self.pg.execute(_REFUSE, params).fetchone() or (None, False)
        if not refused:
            self._decide(None if role is None else (role, False, None), call.run_id)
        return str(role)


def _append_params(call: Call, message: str | None) -> tuple[Any, ...]:
    """`gateway_audit_append`'s parameters for the two events and the card (its message None: the server's)."""
    run_id, user, ts, hashed, now = call.run_id, call.user, call.ts, call.args_hash, call.now
    events = _events()
    heads, tails = [], []
    for event_type, code, detail in events:
        before = canonical({"args_hash": hashed, "code": code, "detail": detail, "event_type": event_type})
        after = canonical({"run_id": run_id, "tool_name": _TOOL.name, "ts": ts, "user": user, "workspace": None})
        heads.append(before[:-1] + ',"id":')
        tails.append("," + after[1:])
    card = {
        "op": "open", "run_id": run_id, "kind": "tool", "created_at": now, "updated_at": now, "user_name": user,
        "workspace": None, "server_id": SERVER_ID, "tool_name": _TOOL.name, "arguments": call.arguments,
        "status": "error", "code": PERMISSION_DENIED, "reason": "missing_permission", "message": message,
        "result": None, "session_id": None,
    }  # fmt: skip
    return (
        ts, _array([e[0] for e in events]), _array([run_id, run_id]), _array([user, user]), "{NULL,NULL}",
        _array([_TOOL.name, _TOOL.name]), _array([hashed, hashed]), _array([e[1] for e in events]),
        _array([canonical(e[2]) for e in events]), _bytea_array(heads), _bytea_array(tails),
        json.dumps([card], ensure_ascii=False),
    )  # fmt: skip


def _events() -> list[tuple[str, int | None, dict[str, Any]]]:
    return [
        ("MCP_TOOL_CALL", None, {}),
        ("POLICY_BLOCKED", PERMISSION_DENIED, {"blocked_reason": "missing_permission"}),
    ]


def _message(role: str) -> str:
    return f"Permission denied: role {role} lacks {PERMISSION}"


def _array(values: Sequence[str | int | None]) -> str:
    """PostgreSQL's text form of an array, each string quoted, its backslashes and quotes escaped."""
    return "{" + ",".join(_element(value) for value in values) + "}"


def _element(value: str | int | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bytea_array(texts: Sequence[str]) -> str:
    return "{" + ",".join('"\\\\x' + text.encode().hex() + '"' for text in texts) + "}"


async def serve(store: Store) -> None:
    hop = Hop()

    async def list_tools(
        _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_TOOL])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        auth = (ctx.params or {}).get("auth")  # the raw request's params, as the gateway reads them
        token = auth.get("token") if isinstance(auth, dict) else None
        if not isinstance(token, str):
            raise MCPError(code=AUTH_REQUIRED, message="a token is required", data={"reason": "token_missing"})
        arguments = params.arguments or {}
        try:
            await hop.run(lambda: store.refuse(token, arguments))
        except Refusal as refused:
            raise MCPError(
                code=refused.code, message=refused.message, data={"run_id": refused.run_id, "reason": refused.reason}
            ) from None
        raise MCPError(code=-32603, message="the floor only refuses")

    server: Server[Any] = Server("floor-server", version="0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", required=True, help="the database URL of a state folder `mcp-gateway init` made")
    parser.add_argument(
        "--one-trip", action="store_true", help="PostgreSQL: the caller's read and the append in one statement"
    )
    parser.add_argument("--allowed-roles", default="ADMIN,USER", help="roles with the permission (never refused)")
    args = parser.parse_args()
    store = Store(args.db, frozenset(role for role in args.allowed_roles.split(",") if role), one_trip=args.one_trip)
    anyio.run(serve, store)


if __name__ == "__main__":
    main()
