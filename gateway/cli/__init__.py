"""The `mcp-gateway` command (docs/operations.md). Exit 0 success, 1 refused or failed, 2 usage.

This module holds the argument parser and nothing heavy: the commands, with the database,
the policy and the MCP SDK behind them, are imported from `gateway.cli.commands` once the
arguments parse, so `--help` and a usage error answer at interpreter speed (decision 48).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from gateway import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="A security gateway for MCP write tools.")
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--home", help="state folder (env MCP_GATEWAY_HOME, default ~/.mcp-gateway)")
    parser.add_argument("--db", help="SQLAlchemy database URL (env MCP_GATEWAY_DB)")
    parser.add_argument("--policy", help="policy file (env MCP_GATEWAY_POLICY)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = sub.add_parser(
        "init", help="create the state folder, database schema, signing key and <home>/policy.yaml (if absent)"
    )
    init.add_argument(
        "--workspace", metavar="PATH", help="the folder the written policy's `default` workspace names (made absolute)"
    )

    user = sub.add_parser("user", help="manage users").add_subparsers(dest="action", required=True)
    add = user.add_parser("add", help="add a user")
    add.add_argument("name")
    add.add_argument("--role", required=True)
    add.add_argument("--workspace", action="append", default=[], help="a workspace the user may use (repeatable)")
    add.add_argument("--password-stdin", action="store_true", help="read a password (for the web console) on stdin")
    _format(user.add_parser("list", help="list users"))
    disable = user.add_parser("disable", help="disable a user; their tokens stop working at once")
    disable.add_argument("name")
    passwd = user.add_parser("passwd", help="set the password for the web console (read from stdin unless a terminal)")
    passwd.add_argument("name")
    set_role = user.add_parser("set-role", help="change a user's role")
    set_role.add_argument("name")
    set_role.add_argument("role")

    token = sub.add_parser("token", help="issue and revoke tokens").add_subparsers(dest="action", required=True)
    issue = token.add_parser("issue", help="print a new token for a user")
    issue.add_argument("name")
    issue.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds (default 3600)")
    issue.add_argument("--workspace", help="limit the token to one workspace")
    revoke = token.add_parser("revoke", help="revoke a token (give the token or its jti)")
    revoke.add_argument("token_or_jti")

    sub.add_parser("serve", help="run the stdio MCP server")

    add_policy_commands(sub)

    audit = sub.add_parser("audit", help="read the audit log").add_subparsers(dest="action", required=True)
    export = audit.add_parser("export", help="print the audit log as JSON Lines")
    export.add_argument("--since", help="only events at or after this ISO 8601 time")
    _format(audit.add_parser("verify", help="check the hash chain"))

    add_consent_commands(sub)
    add_upstream_commands(sub)
    console = sub.add_parser("console", help="the web console: invocation cards, approvals, grants, audit, runs")
    console.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1, loopback)")
    console.add_argument("--port", type=_port, default=8765, help="port (default 8765)")
    console.add_argument("--tls-cert", help="PEM certificate: required to listen on any non-loopback interface")
    console.add_argument("--tls-key", help="PEM private key of --tls-cert")
    sub.add_parser("demo", help="what `make demo` runs: a real MCP client session against the gateway")
    doctor = sub.add_parser(
        "doctor", help="probe this host as this user: each sandbox guarantee, held or missing, why, and the fix"
    )
    _format(doctor)
    return parser


def add_policy_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = sub.add_parser("policy", help="check or explain the policy").add_subparsers(dest="action", required=True)
    check = policy.add_parser("check", help="validate a policy file and warn about risky settings")
    check.add_argument("file", nargs="?")
    check.add_argument("--strict", action="store_true", help="warnings fail the check too (exit 1)")
    _format(check)
    explain = policy.add_parser("explain", help="dry run of the pipeline for a user (or a role) and a tool")
    who = explain.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="a user of the gateway's database")
    who.add_argument("--role", help="a role of the policy instead of a user: no database needed")
    explain.add_argument("--workspace", help="with --role: the workspace (default: the policy's first)")
    explain.add_argument("--tool", required=True)
    explain.add_argument("--args", default="{}", help="the tool's arguments as JSON")
    explain.add_argument(
        "--agent", action="store_true", help="TOOL is one of Claude Code's tools: how check_permission would answer"
    )
    _format(explain)


def add_consent_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    consent = sub.add_parser("consent", help="stored consent decisions").add_subparsers(dest="action", required=True)
    listing = consent.add_parser("list", help="list stored decisions")
    listing.add_argument("--user", help="only this user's")
    listing.add_argument("--all", action="store_true", help="revoked ones too")
    _format(listing)
    grant = consent.add_parser("grant", help="store a decision ahead of the call (allow always or deny always)")
    grant.add_argument("user")
    grant.add_argument("tool")
    kind = grant.add_mutually_exclusive_group(required=True)
    kind.add_argument("--always", action="store_true", help="allow always (not for a destructive tool)")
    kind.add_argument("--deny", action="store_true", help="deny always")
    grant.add_argument("--workspace", help="the workspace (default: the user's first)")
    grant.add_argument(
        "--expires-in", help="lifetime, e.g. 90s, 15m, 8h, 7d (default: consent.expiry_days of the tier)"
    )
    grant.add_argument("--args", help="only for these arguments (a JSON object); default: any arguments")
    grant.add_argument(
        "--agent",
        action="store_true",
        help="TOOL is one of Claude Code's own tools (Bash, Edit, ...: check_permission)",
    )
    withdraw = consent.add_parser("revoke", help="revoke a stored decision by its id (see consent list)")
    withdraw.add_argument("grant_id", type=int)
    sub.add_parser("approvals", help="terminal approver for pending consent requests")


def add_upstream_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    upstream = sub.add_parser("upstream", help="upstream MCP servers: their tools' pinned definitions").add_subparsers(
        dest="action", required=True
    )
    _format(upstream.add_parser("list", help="each upstream, its tools and their state (pinned, changed, not seen)"))
    accept = upstream.add_parser("accept", help="show a changed tool definition as a diff and accept it as the new pin")
    accept.add_argument("name", help="the upstream (policy.yaml `upstreams.<name>`)")
    accept.add_argument(
        "tool", nargs="?", help="one tool (its name as the server lists it); default: every changed one"
    )


def _port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535: argparse reports anything else as a usage error."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: give a port from 0 to 65535")
    return int(text)


def _format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text", help="json: one JSON document on stdout")


COMMAND_MODULES = {
    "serve": "gateway.server",
    "console": "gateway.console.serve",
    "demo": "gateway.cli.demo",
    "doctor": "gateway.cli.doctor",
}
"""What a command loads beyond gateway.cli.commands (the MCP SDK, Starlette): loaded with the rest of start-up."""


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """Start-up's imports with the cyclic garbage collector off, and what they built frozen after (decision 79).

    `serve` builds about 140,000 objects on its way to answering `initialize` (the SDK's pydantic
    models, SQLAlchemy) and its imports leave some 800 objects of cyclic garbage, yet the collector
    ran 340 times over them: 120 ms of the 1.16 s of CPU a `serve` spends to its `initialize`
    answer. Frozen (`gc.freeze`), they stay out of every later collection too, so no call pays
    to walk them again (a full collection of them costs 43 ms). The collector is on again when
    this ends, whatever happened inside.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main(argv: Sequence[str] | None = None) -> int:
    # Everything the gateway creates (database, keys, artifacts) is private to its user.
    os.umask(0o077)
    args = _parser().parse_args(argv)
    # After the arguments parse: --help and usage errors stay at interpreter speed.
    with imports_without_gc():
        from gateway.cli.commands import dispatch  # noqa: PLC0415
        from gateway.logs import GatewayLogHandler  # noqa: PLC0415

        if args.command in COMMAND_MODULES:
            importlib.import_module(COMMAND_MODULES[args.command])
    handler = GatewayLogHandler(sys.stderr)  # one line per record, rate-limited (operations.md "Logs")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return dispatch(args)
