"""What a real `serve` and a short command load before their first call (decision 94).

Read from the process itself: started as `python -m gateway` (never forked from the suite's helper,
which has everything imported) with PYTHONPROFILEIMPORTTIME, which makes the interpreter write one
line per module an import statement loads to stderr, whichever thread runs it (not for the module
`importlib.import_module` itself names, as `gateway.cli.main` names `gateway.server`: its own imports
are statements). `serve` is driven through
`initialize` and `tools/list` and then closed: what it loaded by its exit is what a session that
made no call paid for.
"""

from __future__ import annotations

import os
import subprocess

from tests.harness import GatewayHome, StdioSession

NOT_BEFORE_A_CALL = ("jwt", "passlib", "alembic", "mako", "pygments", "jsonschema", "sqlalchemy.orm")
"""Loaded at the first call that needs them, or by other commands: a token's check (pyjwt), a password
(passlib), a migration (Alembic and what it brings), a checked argument (jsonschema); the ORM never."""
NOT_BEFORE_A_TOKEN = ("cryptography.hazmat.primitives.serialization", "cryptography.hazmat.primitives.asymmetric")
"""The key formats and the RSA and Ed25519 keys: only with a key file of a policy's RS256 or EdDSA (SDK's AEAD aside)."""
IMPORT_TIME = {"PYTHONPROFILEIMPORTTIME": "1"}


def _imported(stderr: str) -> set[str]:
    return {line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _among(imported: set[str], names: tuple[str, ...]) -> set[str]:
    return {m for m in imported if any(m == n or m.startswith(n + ".") for n in names)}


def test_serve_answers_initialize_and_tools_list_before_loading_what_only_a_call_needs(gateway: GatewayHome) -> None:
    session = StdioSession(gateway, env=IMPORT_TIME, forked=False)
    try:
        assert "result" in session.initialize()
        tools = session.request("tools/list")["result"]["tools"]
    finally:
        assert session.close() == 0
    assert "run_pytest" in {tool["name"] for tool in tools}
    imported = _imported(session.stderr_text())
    assert {"gateway.transport", "mcp.server.lowlevel", "sqlalchemy"} <= imported, "the import lines were not read"
    assert not _among(imported, NOT_BEFORE_A_CALL + NOT_BEFORE_A_TOKEN)


def test_serve_loads_pyjwt_at_the_first_token_and_checks_it(gateway: GatewayHome) -> None:
    """Deferred, not skipped: the first call with a token loads pyjwt in the thread that checks it."""
    session = StdioSession(gateway, env=IMPORT_TIME, forked=False)
    try:
        session.initialize()
        forged = session.call_tool("list_artifacts", {}, token=gateway.token("alice")[:-4] + "AAAA")
        good = session.call_tool("list_artifacts", {}, token=gateway.token("alice"))
    finally:
        session.close()
    assert forged["error"]["code"] == -32001
    assert forged["error"]["data"]["reason"] == "bad_signature"
    assert "result" in good, good
    assert "jwt" in _imported(session.stderr_text())


def test_user_list_loads_neither_pyjwt_nor_passlib_nor_cryptography(gateway: GatewayHome) -> None:
    done = subprocess.run(
        gateway.cli_argv("user", "list"),
        capture_output=True, text=True, timeout=120, check=False, env=os.environ | IMPORT_TIME,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "alice" in done.stdout
    imported = _imported(done.stderr)
    assert "gateway.cli.commands" in imported, "the import lines were not read"
    assert not _among(imported, (*NOT_BEFORE_A_CALL, "cryptography"))
