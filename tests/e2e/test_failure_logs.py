"""What a serving gateway writes to stderr (docs/operations.md, "Logs") when it fails, and when clients err.

Before the fix, calls refused with -32603 `audit_unavailable` / `database_unavailable` left no
line on stderr, while every malformed notification left one (the MCP SDK's warning), so a client
decided how fast the log grew. Now a failure of the gateway's own is logged with its cause, once,
then summarised; a client mistake is one line, and a repeated one is summarised too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
CALLS = 50


@dataclass(frozen=True)
class Fault:
    sql: tuple[str, ...]
    """Run by the test on the database while the gateway serves: the fault."""
    tool: tuple[str, dict[str, Any]]
    reason: str
    line: str
    """What the first ERROR line must say: what failed and the driver's own words."""


FAULTS = {
    "audit insert aborted": Fault(
        ("CREATE TRIGGER fault BEFORE INSERT ON audit_events BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",),
        ("list_artifacts", {}),
        "audit_unavailable",
        "the audit log could not be written (audit_unavailable): sqlite3.IntegrityError: refused by the test",
    ),
    "audit insert into a missing table": Fault(
        (
            "CREATE TABLE doomed (x)",
            "CREATE TRIGGER fault BEFORE INSERT ON audit_events BEGIN INSERT INTO doomed VALUES (1); END",
            "DROP TABLE doomed",
        ),
        ("list_artifacts", {}),
        "audit_unavailable",
        "the audit log could not be written (audit_unavailable): sqlite3.OperationalError: no such table: main.doomed",
    ),
    "users table gone": Fault(
        ("ALTER TABLE users RENAME TO users_elsewhere",),
        ("list_artifacts", {}),
        "database_unavailable",
        "the user database could not be read (database_unavailable): sqlite3.OperationalError: no such table: users",
    ),
    "budget insert aborted": Fault(
        ("CREATE TRIGGER fault BEFORE INSERT ON budget_charges BEGIN SELECT RAISE(ABORT, 'no budget today'); END",),
        ("run_pytest", {"test_path": "tests"}),
        "database_unavailable",
        "the budget could not be read (database_unavailable): sqlite3.IntegrityError: no budget today",
    ),
}


def _break(gateway: GatewayHome, statements: tuple[str, ...]) -> None:
    connection = sqlite3.connect(gateway.home / "gateway.db")
    try:
        for statement in statements:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


def _lines(text: str, level: str) -> list[str]:
    return [line for line in text.splitlines() if f" {level} " in line]


@pytest.mark.parametrize("name", FAULTS)
def test_a_failing_database_is_logged_once_with_its_cause(
    gateway: GatewayHome, open_session: SessionFactory, name: str
) -> None:
    fault = FAULTS[name]
    session = open_session(gateway)
    token = gateway.token("alice")
    assert "result" in session.call_tool("list_artifacts", {}, token)  # served, and written to, before the fault
    _break(gateway, fault.sql)

    for _ in range(CALLS):
        response = session.call_tool(*fault.tool, token)
        assert response["error"]["code"] == -32603, response
        assert response["error"]["data"]["reason"] == fault.reason, response

    serving = session.stderr_text()
    errors = _lines(serving, "ERROR")
    assert errors, f"{CALLS} calls refused with -32603 and not a line on stderr:\n{serving}"
    assert fault.line in errors[0], serving
    assert len(errors) <= 2, serving  # the store's line (and the pipeline's), not one per call

    assert session.close() == 0
    text = session.stderr_text()
    errors = _lines(text, "ERROR")
    assert len(errors) <= 4, text  # ... and, as the gateway stops, what was not shown, counted
    assert any(f"{CALLS - 1} more like" in line for line in errors), text
    assert "Traceback" not in text
    assert token not in text and "SELECT" not in text and "INSERT" not in text, "no token, no SQL"


# Client mistakes: each kind, repeated. Every one of them is answered or dropped as before; the
# log says so once per kind, then counts.
MISTAKES: dict[str, dict[str, Any]] = {
    "cancelled with a requestId that is an object": {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": {}},
    },
    "cancelled with a reason that is a number": {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": 5},
    },
    "initialized with _meta that is a number": {
        "jsonrpc": "2.0",
        "method": "notifications/initialized",
        "params": {"_meta": 5},
    },
    "progress that is a string": {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": "p", "progress": "half"},
    },
    "roots changed with _meta that is a list": {
        "jsonrpc": "2.0",
        "method": "notifications/roots/list_changed",
        "params": {"_meta": [1]},
    },
    "tools/call with a name that is a number": {
        "jsonrpc": "2.0",
        "id": "m1",
        "method": "tools/call",
        "params": {"name": 5},
    },
    "logging/setLevel to no level": {
        "jsonrpc": "2.0",
        "id": "m2",
        "method": "logging/setLevel",
        "params": {"level": "loudest"},
    },
}
RAW_MISTAKES = (
    b'{"jsonrpc": "2.0", "id": 7, "method": "ping"',  # cut short
    b'{"jsonrpc": "2.0", "id": 8, "method": "\\ud800"}',  # a lone surrogate
    b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": NaN}}',
    b"\xff\xfe not even UTF-8",
    b"[1, 2, 3]",
)
REPEATS = 40


def test_client_mistakes_are_one_line_per_kind_not_per_message(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    before = len(session.stderr_text().splitlines())
    sent = 0
    for round_ in range(REPEATS):
        for message in MISTAKES.values():
            session.send(message | ({"id": f"{message['id']}-{round_}"} if "id" in message else {}))
            sent += 1
        for raw in RAW_MISTAKES:
            session.send_raw(raw + b"\n")
            sent += 1
    assert "result" in session.request("ping"), "the gateway answers after all of them"
    assert session.close() == 0

    text = session.stderr_text()
    added = text.splitlines()[before:]
    assert "Traceback" not in text, text[-3000:]
    # one line per kind that logs at all, and one summary of its repeats at the end
    assert len(added) <= 2 * len(MISTAKES), "\n".join(added)
    assert len("\n".join(added)) <= 300 * len(MISTAKES), f"{sent} mistakes; the log grew by {len(added)} lines"
    dropped = [line for line in added if "malformed params" in line]
    assert dropped, "each kind is still said once"
    # the SDK's line has one template for every malformed notification: one kind, counted whole
    notifications = sum("id" not in message for message in MISTAKES.values())
    assert any(f"{REPEATS * notifications - 1} more like" in line for line in added), "\n".join(added)
