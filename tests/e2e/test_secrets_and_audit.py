"""No token or key leaks anywhere a person or an agent can read; the audit chain detects tampering."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]


def _all_text_under(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file() and p.suffix != ".db")


def test_no_token_or_key_in_logs_audit_errors_or_artifacts(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = open_session(gateway, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    good, viewer = gateway.token("alice"), gateway.token("vic")
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    revoked = gateway.token("alice")
    gateway.cli("token", "revoke", revoked)
    responses = [
        session.call_tool("run_pytest", {"test_path": "tests"}, good),
        session.call_tool("run_pytest", {"test_path": "tests"}, viewer),
        session.call_tool("run_pytest", {"test_path": "tests"}, forged),
        session.call_tool("run_pytest", {"test_path": "tests"}, revoked),
        session.call_tool("run_pytest", {"test_path": "../x"}, good),
        session.call_tool("list_artifacts", {}, "Bearer " + good),
    ]
    assert "result" in responses[0]
    # The sandboxed suite can see its own environment: make sure nothing secret was in it.
    env_dump = gateway.workspace / "tests" / "test_env_dump.py"
    env_dump.write_text("import os\n\ndef test_dump():\n    print(sorted(os.environ.items()))\n")
    dumped = session.call_tool("run_pytest", {"test_path": "tests/test_env_dump.py"}, good)
    assert "result" in dumped
    session.close()

    secrets = {
        "alice token": good,
        "viewer token": viewer,
        "forged token": forged,
        "revoked token": revoked,
        "token signature": good.rsplit(".", 1)[1],
        "signing key": (gateway.home / "signing.key").read_text().strip(),
    }
    exported = gateway.cli("audit", "export").stdout
    places = {
        "serve stderr": session.stderr_text(),
        "audit export": exported,
        "responses": json.dumps(responses),
        "artifacts": _all_text_under(gateway.home / "artifacts"),
    }
    for place, text in places.items():
        for name, secret in secrets.items():
            assert secret not in text, f"{name} leaked into {place}"
    with sqlite3.connect(gateway.home / "gateway.db") as db:
        dump = "\n".join(db.iterdump())
    for name, secret in secrets.items():
        assert secret not in dump, f"{name} stored in the database"


def _tamper(gateway: GatewayHome, sql: str) -> None:
    with sqlite3.connect(gateway.home / "gateway.db") as db:
        db.execute(sql)


def _verify(gateway: GatewayHome) -> tuple[int, str]:
    result = gateway.cli("audit", "verify")
    return result.returncode, result.stdout + result.stderr


def test_audit_verify_detects_edits_deletions_and_reordering(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    for _ in range(4):
        session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("vic"))
    session.close()
    export = gateway.cli("audit", "export")
    lines = [json.loads(line) for line in export.stdout.splitlines()]
    assert [e["id"] for e in lines] == list(range(1, len(lines) + 1))
    required = {
        "id",
        "ts",
        "event_type",
        "run_id",
        "user",
        "workspace",
        "tool_name",
        "args_hash",
        "code",
        "detail",
        "prev_hash",
        "hash",
    }
    assert all(required <= set(e) for e in lines)
    since = gateway.cli("audit", "export", "--since", lines[-1]["ts"]).stdout.splitlines()
    assert 1 <= len(since) < len(lines)
    assert _verify(gateway)[0] == 0

    db_path = gateway.home / "gateway.db"
    pristine = sqlite3.connect(":memory:")
    with sqlite3.connect(db_path) as source:
        source.backup(pristine)

    def restore() -> None:
        with sqlite3.connect(db_path) as target:
            pristine.backup(target)
        assert _verify(gateway)[0] == 0

    for sql, bad_id in (
        ("UPDATE audit_events SET code = -32001 WHERE id = 4", 4),
        ("UPDATE audit_events SET user_name = 'alice' WHERE id = 2", 2),
        ("UPDATE audit_events SET detail = '{}' WHERE id = 6", 6),
        ("DELETE FROM audit_events WHERE id = 3", 3),
        (f"DELETE FROM audit_events WHERE id = {len(lines)}", len(lines)),
        ("UPDATE audit_events SET id = 1000 WHERE id = 2", 2),
        ("UPDATE audit_events SET id = -1 WHERE id = 2", -1),
    ):
        _tamper(gateway, sql)
        code, output = _verify(gateway)
        assert code == 1, sql
        assert f"first bad event id {bad_id}" in output, (sql, output)
        restore()
    # Swap two events' positions, rehashing nothing: the chain breaks at the first of them.
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE audit_events SET id = 1000 WHERE id = 3")
        db.execute("UPDATE audit_events SET id = 3 WHERE id = 4")
        db.execute("UPDATE audit_events SET id = 4 WHERE id = 1000")
    code, output = _verify(gateway)
    assert code == 1 and "first bad event id 3" in output
