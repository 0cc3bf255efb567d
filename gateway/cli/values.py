"""Command-line values read once argparse is done (docs/operations.md; decision 70): a bad one is a `UsageError`, exit 2,
one line naming the flag and the form it takes, as argparse says of the values it checks itself."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from gateway.clock import iso_utc, parse_iso
from gateway.consent.stage import parse_duration
from gateway.errors import UsageError
from gateway.visible import visible

MAX_GRANT_LIFETIME_S = 100 * 365 * 86400
"""`--expires-in` past a century is a typo (and far past it, past datetime's range): refused as usage."""

_JSON_EXAMPLE = """'{"path": "tests"}'"""


def json_object_arg(text: str, flag: str = "--args") -> dict[str, Any]:
    """A JSON object given on the command line."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: not valid JSON; give a JSON object, e.g. {_JSON_EXAMPLE}") from exc
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: give a JSON object, e.g. {_JSON_EXAMPLE}, not a JSON {type(value).__name__}")
    return value


def since_arg(text: str, flag: str = "--since") -> str:
    """An ISO 8601 time (a naive one is UTC), as the audit log's own spelling."""
    try:
        return iso_utc(parse_iso(text))
    except (ValueError, OverflowError) as exc:
        raise UsageError(f"{flag} {visible(text)!r}: give an ISO 8601 time, e.g. 2026-11-22T10:00:00Z") from exc


def lifetime_arg(text: str, flag: str = "--expires-in") -> float:
    """A lifetime such as `90s`, `15m`, `8h`, `7d`, in seconds."""
    try:
        lifetime = parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{flag} {visible(text)!r}: give a lifetime such as 90s, 15m, 8h or 7d") from exc
    if lifetime > MAX_GRANT_LIFETIME_S:
        raise UsageError(f"{flag} {visible(text)!r}: at most 36500d")
    return lifetime


def check_db_url(url: str, source: str | None) -> None:
    """A database URL given by `source` (a flag or an environment variable) must at least parse."""
    if source is None:
        return
    try:
        make_url(url)
    except ArgumentError as exc:
        raise UsageError(
            f"{source}: not a database URL; give e.g. sqlite:////abs/path/gateway.db"
            " or postgresql+psycopg://USER@HOST/DB"
        ) from exc


def check_tls_pair(cert: str | None, key: str | None) -> None:
    """`--tls-cert` and `--tls-key`: a PEM certificate and its private key that load together."""
    if cert is None and key is None:
        return
    if cert is None or key is None:
        raise UsageError("--tls-cert and --tls-key go together: give both PEM files")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except OSError as exc:  # ssl.SSLError is an OSError too
        why = exc.strerror or exc.__class__.__name__
        raise UsageError(
            f"--tls-cert {visible(cert)} / --tls-key {visible(key)}: cannot load them ({why});"
            " give a readable PEM certificate and its private key"
        ) from exc


def check_home_folder(home: Path, source: str) -> None:
    """The state folder, when it exists, must be a folder (`source`: the flag or variable that named it)."""
    if os.path.lexists(home) and not os.path.isdir(home):
        raise UsageError(
            f"{source} {visible(str(home))}: not a folder; give a state folder (`mcp-gateway --home DIR init`)"
        )
