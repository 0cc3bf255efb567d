"""The SQLite file deleted or replaced under a serving gateway (decision 45).

Before the fix every call after `rm gateway.db*` succeeded (runs ran) and its events went to the
unlinked inode. Now the gateway compares the path's (st_dev, st_ino) with the file it opened before
each transaction: every call is refused with -32603, nothing runs, and stderr says why, once.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
RUN = ("run_pytest", {"test_path": "tests"})
READ: tuple[str, dict[str, Any]] = ("list_artifacts", {})
LINE = "while this gateway was using it: nothing more will run"


def _serving(gateway: GatewayHome, open_session: SessionFactory) -> StdioSession:
    """A session whose gateway has already written to the database (a read tool is audited too)."""
    session = open_session(gateway)
    response = session.call_tool(*READ, gateway.token("alice"))
    assert "result" in response, response
    return session


def _assert_refused_and_told(session: StdioSession, gateway: GatewayHome, artifacts_before: set[Path]) -> None:
    for name, arguments in (RUN, READ, RUN):
        response = session.call_tool(name, arguments, gateway.token("alice"))
        assert response["error"]["code"] == -32603, response
        assert response["error"]["data"]["reason"] in ("audit_unavailable", "database_unavailable"), response
    assert set((gateway.home / "artifacts").iterdir()) == artifacts_before, "nothing ran"
    assert "result" in session.request("ping"), "the gateway still answers; it just runs nothing"
    lines = [line for line in session.stderr_text().splitlines() if LINE in line]
    assert len(lines) == 1, session.stderr_text()  # one line, not one per refused call
    assert str(gateway.home / "gateway.db") in lines[0] and "restart the gateway" in lines[0]


@pytest.mark.parametrize("removed", ["gateway.db*", "gateway.db-wal"])
def test_deleting_the_database_files_refuses_every_call_with_32603(
    gateway: GatewayHome, open_session: SessionFactory, removed: str
) -> None:
    session = _serving(gateway, open_session)
    before = set((gateway.home / "artifacts").iterdir())
    gone = list(gateway.home.glob(removed))
    assert gone, f"{removed} exists while the gateway serves"
    for path in gone:
        path.unlink()
    _assert_refused_and_told(session, gateway, before)


def test_a_database_replaced_by_a_fresh_init_is_refused_too(gateway: GatewayHome, open_session: SessionFactory) -> None:
    session = _serving(gateway, open_session)
    before = set((gateway.home / "artifacts").iterdir())
    aside = gateway.root / "old"
    aside.mkdir()
    for path in gateway.home.glob("gateway.db*"):
        shutil.move(str(path), aside / path.name)  # the old chain is kept, just not at the path any more
    init = gateway.cli("init")
    assert init.returncode == 0, init.stderr
    assert (gateway.home / "gateway.db").exists()
    _assert_refused_and_told(session, gateway, before)
