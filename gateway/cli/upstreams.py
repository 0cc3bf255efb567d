"""`upstream list|accept` (docs/operations.md, "Upstream tool definitions"; decision 85).

The upstreams are the policy's (`offered_tools`) and any the database holds pins for. Every name a
server chose is printed escaped (`shown_name`: `visible`, and a backslash as `\\u005c`); `--format json` writes them as JSON escapes (ASCII
only), so neither a terminal nor a reader of the JSON sees a control or bidi character act.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from gateway.approvals import approver_name
from gateway.clock import iso_utc
from gateway.consent.actions import Actor
from gateway.consent.store import Channel
from gateway.errors import CommandError
from gateway.policy_trust import policy_for
from gateway.services import open_stores
from gateway.settings import Settings
from gateway.tools.registry import TOOL_NAMES
from gateway.upstreams.pins import PinState, ToolLine, ToolPin, definition_diff, offered_tools, shown_name, tool_lines
from gateway.visible import visible

LIST_COLUMNS = ("upstream", "tool", "state", "offered", "pinned_sha256", "seen_sha256", "pinned_at", "accepted_by")
"""`upstream list`'s columns: the text header line, and the JSON keys (with `reason`)."""


def cmd_upstream_list(settings: Settings, args: argparse.Namespace) -> int:
    policy = policy_for(settings, TOOL_NAMES)
    stores = open_stores(settings)
    lines = tool_lines(offered_tools(policy), stores.pins.pins())
    if args.format == "json":
        document = {
            "upstreams": [
                {"name": upstream, "in_policy": upstream in offered_tools(policy), "tools": [_row(t) for t in tools]}
                for upstream, tools in lines.items()
            ]
        }
        print(json.dumps(document, indent=2, ensure_ascii=True))  # every non-ASCII character as an escape
        return 0
    print("\t".join(LIST_COLUMNS), file=sys.stderr)  # the header for a person; stdout stays rows only
    for tools in lines.values():
        for line in tools:
            fields = [str(v) if v is not None else "-" for v in _row(line).values()][: len(LIST_COLUMNS)]
            print("\t".join(shown_name(field) for field in fields))
            if line.pin is not None and line.pin.reason is not None:
                print(f"\t{visible(line.pin.reason)}")
    return 0


def _row(line: ToolLine) -> dict[str, object]:
    pin = line.pin
    return {
        "upstream": line.upstream,
        "tool": line.tool,
        "state": line.state,
        "offered": "yes" if line.offered else "no",
        "pinned_sha256": pin.pinned_sha256 if pin else None,
        "seen_sha256": pin.seen_sha256 if pin else None,
        "pinned_at": iso_utc(pin.pinned_at) if pin and pin.pinned_at is not None else None,
        "accepted_by": pin.accepted_by if pin else None,
        "reason": pin.reason if pin else None,
    }


def cmd_upstream_accept(settings: Settings, args: argparse.Namespace) -> int:
    """Show each changed definition of NAME (or of its TOOL) as a diff, then accept exactly what was shown.

    Whoever runs it holds the state folder and the database, as for `consent revoke`: the CLI has no
    signed-in user to check for ADMIN; the events name the terminal's user and host."""
    policy = policy_for(settings, TOOL_NAMES)
    stores = open_stores(settings)
    offered = offered_tools(policy)
    pins = stores.pins.pins(args.name)
    if args.name not in offered and not pins:
        known = sorted({*offered, *(p.upstream for p in stores.pins.pins())})
        raise CommandError(
            f"no upstream named '{shown_name(args.name)}' (known: {', '.join(shown_name(k) for k in known) or 'none'}; "
            "see `mcp-gateway upstream list`)"
        )
    chosen = pins if args.tool is None else [_tool_of(args.name, args.tool, pins, offered.get(args.name, ()))]
    refused = [p for p in chosen if p.state is PinState.REFUSED]
    changed = [p for p in chosen if p.state is PinState.CHANGED]
    if not changed:
        if refused:
            pin = refused[0]
            raise CommandError(
                f"{shown_name(pin.upstream)} / {shown_name(pin.tool)}: its latest definition was refused "
                f"({visible(pin.reason or '')}), so there is nothing to accept: the server must list one that "
                "can be pinned"
            )
        what = "every tool of" if args.tool is None else f"'{shown_name(args.tool)}' of"
        raise CommandError(f"nothing to accept: {what} {shown_name(args.name)} is pinned as the server lists it")
    for pin in changed:
        if pin.pinned is None or pin.seen is None:
            continue
        print(f"# {shown_name(pin.upstream)} / {shown_name(pin.tool)}")
        print(visible(definition_diff(pin.pinned, pin.seen), lines=True), end="")
    sys.stdout.flush()
    by = Actor(f"cli:{approver_name().removeprefix('approvals:')}", Channel.CLI)
    shown = {p.tool: p.seen_sha256 for p in changed if p.seen_sha256 is not None}
    tool = None if args.tool is None else changed[0].tool  # the name as stored, however TOOL spelt it
    accepted = stores.pins.accept(args.name, tool, by, expected=shown)
    for pin in accepted:
        print(
            f"accepted {shown_name(pin.upstream)} / {shown_name(pin.tool)}: sha256 {pin.pinned_sha256}", file=sys.stderr
        )
    missed = sorted(set(shown) - {p.tool for p in accepted})
    if missed:
        names = ", ".join(shown_name(t) for t in missed)
        raise CommandError(f"not accepted: {names} changed again while shown; run `upstream accept` again")
    for pin in refused:
        print(f"not accepted {shown_name(pin.upstream)} / {shown_name(pin.tool)}: refused", file=sys.stderr)
    return 0


def _tool_of(upstream: str, given: str, pins: Sequence[ToolPin], offered: Sequence[str]) -> ToolPin:
    """The pin TOOL names: as `upstream list` shows it (escaped), else as the server spells it (a script's)."""
    for matches in ([p for p in pins if shown_name(p.tool) == given], [p for p in pins if p.tool == given]):
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise CommandError(
                f"'{shown_name(given)}' names {len(matches)} tools of {shown_name(upstream)}: give the name as "
                "`upstream list --format json` spells it"
            )
    if given in offered:
        raise CommandError(
            f"nothing to accept: the server has not listed '{shown_name(given)}' of {shown_name(upstream)}"
        )
    names = ", ".join(shown_name(p.tool) for p in pins) or "none seen yet"
    raise CommandError(f"upstream {shown_name(upstream)} has no tool '{shown_name(given)}' (its tools: {names})")
