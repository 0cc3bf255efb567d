"""`mcp-gateway demo` (README.md, "Quick start"): a real MCP client session against `mcp-gateway serve`.

It builds a throw-away state folder, adds a USER and a VIEWER, issues tokens, and drives
the gateway over stdio with the SDK's own client, sending `params.auth` on every call
and answering the consent prompt as a person would. It prints each call, who made it,
the decision and code, and the audit trail each call left.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.context import ClientRequestContext
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from gateway.auth import ensure_keys, issue_token, load_keyring
from gateway.clock import new_token_id
from gateway.db import migrate
from gateway.default_policy import SHIPPED_POLICY
from gateway.errors import ConfigError
from gateway.policy import load_policy
from gateway.server import RUN_ID_META
from gateway.services import open_stores
from gateway.settings import Settings
from gateway.tools.registry import TOOL_NAMES


class AuthedCallToolParams(types.CallToolRequestParams):
    """tools/call params with the gateway's per-call `auth` object (docs/clients.md)."""

    auth: dict[str, str]


class AuthedCallToolRequest(types.CallToolRequest):
    params: AuthedCallToolParams


async def call_with_token(
    session: ClientSession, name: str, arguments: Mapping[str, Any], token: str | None
) -> types.CallToolResult:
    """Send tools/call with `params.auth.token` (or without `auth` when token is None)."""
    if token is None:
        return await session.call_tool(name, dict(arguments))
    params = AuthedCallToolParams(name=name, arguments=dict(arguments), auth={"token": token})
    return await session.send_request(AuthedCallToolRequest(params=params), types.CallToolResult)


def _line(out: TextIO, text: str = "") -> None:
    out.write(text + "\n")


async def _approve_once(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    message = getattr(params, "message", "")
    print("    consent prompt shown to the person:", file=sys.stdout)
    for text in message.splitlines():
        print(f"      | {text}", file=sys.stdout)
    print("    the person answers: allow_once", file=sys.stdout)
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


async def _session(home: Path, policy: Path, tokens: Mapping[str, str], out: TextIO, log_path: Path) -> list[str]:
    run_ids: list[str] = []
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "--home", str(home), "--policy", str(policy), "serve"],
    )
    with log_path.open("w") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write, elicitation_callback=_approve_once) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            _line(out, f"tools/list (no token): {', '.join(t.name for t in listed.tools)}")
            _line(out)
            steps: list[tuple[str, str, dict[str, Any], str | None]] = [
                ("alice (USER) runs the sample suite", "run_pytest", {"test_path": "tests"}, tokens["alice"]),
                ("vic (VIEWER) tries run_pytest", "run_pytest", {"test_path": "tests"}, tokens["vic"]),
                ("a call without a token", "run_pytest", {"test_path": "tests"}, None),
                (
                    "alice tries a path outside the workspace",
                    "run_pytest",
                    {"test_path": "../../etc"},
                    tokens["alice"],
                ),
                (
                    "alice passes a free-form flag",
                    "run_pytest",
                    {"test_path": "tests", "args": "-x"},
                    tokens["alice"],
                ),
                ("alice with a revoked token", "list_artifacts", {}, tokens["revoked"]),
                ("alice asks for an unknown tool", "run_shell", {"cmd": "id"}, tokens["alice"]),
                ("vic lists runs", "list_artifacts", {}, tokens["vic"]),
            ]
            for title, tool, arguments, token in steps:
                _line(out, f"» {title}: {tool} {json.dumps(arguments)}")
                try:
                    result = await call_with_token(session, tool, arguments, token)
                except MCPError as exc:
                    data = exc.data if isinstance(exc.data, dict) else {}
                    run_ids.append(str(data.get("run_id")))
                    _line(out, f"    refused {exc.code}: {exc.message} (reason {data.get('reason')})")
                    _line(out)
                    continue
                structured = result.structured_content or {}
                run_ids.append(str((result.meta or {}).get(RUN_ID_META)))
                first = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
                _line(out, f"    ok: {first.splitlines()[0] if first else ''}")
                if tool == "run_pytest":
                    counts = {k: structured.get(k) for k in ("passed", "failed", "skipped", "errors", "exit_code")}
                    _line(out, f"    counts: {counts}")
                _line(out)
    return run_ids


def run_demo(settings: Settings, environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    # The demo is the shipped default at work, unless a policy is named: never one in the working folder.
    policy_path = settings.policy_path if settings.policy_given is not None else SHIPPED_POLICY
    if not policy_path.is_file():
        raise ConfigError("no policy to run the demo with; pass --policy FILE", str(policy_path))
    policy = load_policy(policy_path, TOOL_NAMES)
    home = Path(tempfile.mkdtemp(prefix="mcp-gateway-demo-"))
    (home / "artifacts").mkdir(mode=0o700)
    ensure_keys(home, policy.auth.algorithms)
    stores = open_stores(Settings(home=home, db_url=f"sqlite:///{home / 'gateway.db'}", policy_path=policy_path))
    migrate(stores.engine)
    stores.users.add("alice", "USER", ("default",))
    stores.users.add("vic", "VIEWER", ("default",))
    keys = load_keyring(home)
    now = stores.clock.now()
    tokens = {
        name: issue_token(keys, policy.auth, name, now=now, ttl_s=600, jti=new_token_id()) for name in ("alice", "vic")
    }
    revoked_jti = new_token_id()
    tokens["revoked"] = issue_token(keys, policy.auth, "alice", now=now, ttl_s=600, jti=revoked_jti)
    stores.tokens.revoke(revoked_jti, now)

    _line(out, "mcp-write-gateway demo")
    _line(
        out, f"  state folder {home} · policy {policy_path} · workspace 'default' = {policy.workspaces.get('default')}"
    )
    _line(out, "  users: alice (USER), vic (VIEWER); each call carries its own JWT in params.auth.token")
    _line(out)
    log_path = home / "serve.log"
    try:
        run_ids = anyio.run(_session, home, policy_path, tokens, out, log_path)
    except Exception as exc:
        # The session broke (serve died, the client failed): say so in one line, keep what explains it.
        _line(out, f"the demo's session failed ({type(exc).__name__}: {exc}); kept {home}, serve's log: {log_path}")
        return 1

    _line(out)
    _line(out, "audit trail (one MCP_TOOL_CALL and one terminal event per call, hash-chained):")
    audit = stores.audit
    for event in audit.events():
        if event.run_id not in run_ids:
            continue
        code = "" if event.code is None else f" code={event.code}"
        detail = json.dumps(dict(event.detail), sort_keys=True)
        who = event.user or "-"
        _line(
            out,
            f"  #{event.id:<3} {event.event_type:<24} run={event.run_id[:8] if event.run_id else '-'} user={who}{code} {detail}",
        )
    report = audit.verify()
    stores.engine.dispose()
    _line(out)
    _line(out, f"audit verify: {'ok' if report.ok else 'BROKEN'} ({report.checked} events)")
    if report.ok and "MCP_GATEWAY_DEMO_KEEP" not in environ:
        shutil.rmtree(home, ignore_errors=True)  # a throw-away state folder: nothing of the demo stays behind
        _line(out, f"removed the demo's state folder {home} (set MCP_GATEWAY_DEMO_KEEP=1 to keep it and serve's log)")
        return 0
    _line(out, f"kept the demo's state folder {home}; server log (stderr of serve): {log_path}")
    return 0 if report.ok else 1
