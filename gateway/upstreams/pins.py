"""Upstream tools' pinned definitions (docs/upstreams.md, "Pinned definitions"; decision 85).

A server may change a tool after a person approved it (a "rug pull"). The gateway pins every
listed tool's definition on first sight; a later listing whose definition differs leaves the pin
as it was, marks the tool `changed` (the gateway withholds it) and writes one
`TOOL_DEFINITION_CHANGED`; an ADMIN accepts the difference (`mcp-gateway upstream accept`, the
console), which makes the seen definition the pin and writes `TOOL_DEFINITION_ACCEPTED`.

What is pinned (`tool_definition`): the name, title, description, input and output schemas and
annotations, the fields a client or a person reads; the digest is the sha256 of its canonical
JSON. Everything here comes from the server and is untrusted: stored as it came, bounded
(`MAX_DEFINITION_BYTES` per definition, `MAX_LISTED_TOOLS` per listing, `MAX_NAME_CHARS` per
name), shown only through `gateway.visible`. Observing and accepting hold a lock per upstream
(SQLite's write lock, a PostgreSQL advisory lock), so of several gateways seeing the same change
exactly one records it; each event commits in the same transaction as the rows it records.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, insert, select, text, update

from gateway import db
from gateway.audit import AuditLog, EventDraft, EventType
from gateway.canonical import canonical_json, is_text, sha256_hex
from gateway.clock import Clock
from gateway.consent.actions import Actor
from gateway.db.errors import storage_errors
from gateway.policy import Policy
from gateway.visible import visible

log = logging.getLogger("gateway.upstreams.pins")

PINNED_KEYS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
"""A tool's fields that make its definition: what a client is told and a person reads. Not `_meta`
(the server's own notes, never believed) nor `icons`."""
MAX_DEFINITION_BYTES = 64 * 1024
"""A definition larger than this, as canonical JSON in UTF-8, is refused, not pinned."""
MAX_LISTED_TOOLS = 256
"""A listing of more tools than this is refused whole: nothing of it is pinned."""
MAX_NAME_CHARS = 128
"""The longest tool name stored (the MCP specification's own bound on a tool's name)."""
MAX_STORED_TOOLS = 4 * MAX_LISTED_TOOLS
"""Pins kept per upstream, listed now or before: a server renaming its tools at every listing would
otherwise grow the table without end. A listing that would pass it is refused whole."""


class PinState(StrEnum):
    """A pinned tool's state: only `pinned` is offered."""

    PINNED = "pinned"
    """The server lists the pinned definition: offered as pinned."""
    CHANGED = "changed"
    """The server's latest definition differs from the pin: withheld until an ADMIN accepts it."""
    REFUSED = "refused"
    """The server's latest definition cannot be pinned (`ToolPin.reason`): withheld, nothing to accept."""


class ListingRefusedError(ValueError):
    """A tools/list answer the gateway pins nothing of (too many tools, a name it cannot store, a name
    listed twice): its message says why; the pins stay as they were."""


@dataclass(frozen=True, slots=True)
class ToolPin:
    upstream: str
    tool: str
    """The server's own name, as it came: escape it for display (gateway/visible.py)."""
    state: PinState
    pinned: Mapping[str, Any] | None
    """The accepted definition (the first seen, or the last an ADMIN accepted); None only while the
    tool's first definition was refused."""
    pinned_sha256: str | None
    seen: Mapping[str, Any] | None
    """The server's latest definition when it differs (`changed`); None otherwise."""
    seen_sha256: str | None
    """Its digest (`changed`, and `refused` when the definition was not stored)."""
    pinned_at: float | None
    accepted_by: str | None
    """Who accepted the pinned definition (an `Actor` name); None: pinned on first sight."""
    reason: str | None = None
    """Why the latest definition was refused (`refused` only)."""
    changed_at: float | None = None
    """When the latest differing definition was first seen."""


def shown_name(name: str) -> str:
    """A server's name (or any one-line text of it) as every display shows it: `visible`, and a backslash
    itself escaped (`\\u005c`), so a name spelling an escape (`a\\u202e`, typed) never looks like the
    name holding the character (`a` and U+202E)."""
    return visible(name.replace("\\", "\\u005c"))


def tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The pinned part of a tools/list entry: every key of PINNED_KEYS, a missing one as None."""
    return {key: tool.get(key) for key in PINNED_KEYS}


def definition_sha256(definition: Mapping[str, Any]) -> str:
    """sha256 hex of the definition's canonical JSON (gateway/canonical.py)."""
    return sha256_hex(canonical_json(definition))


def pretty_definition(definition: Mapping[str, Any]) -> str:
    """The definition as a person reads it: sorted keys, two-space indent, one line per value (a newline
    in a string stays `\\n`). Raw server text: escape it (`visible`) before showing it."""
    return json.dumps(definition, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)


def definition_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """A unified diff of the two definitions' pretty JSON (whole: every line of each), headed by their
    digests. Raw server text: escape it (`visible(..., lines=True)`) before showing it."""
    before = pretty_definition(old).split("\n")
    after = pretty_definition(new).split("\n")
    lines = difflib.unified_diff(
        before,
        after,
        fromfile=f"pinned sha256:{definition_sha256(old)}",
        tofile=f"seen sha256:{definition_sha256(new)}",
        n=max(len(before), len(after)),
        lineterm="",
    )
    return "\n".join(lines) + "\n"


def offered_tools(policy: Policy) -> Mapping[str, tuple[str, ...]]:
    """The policy's upstreams by name, each with the tools it offers (`upstreams.<name>.tools`)."""
    return {name: upstream.tools for name, upstream in policy.upstreams.items()}


NOT_SEEN = "not seen"
"""The state of an offered tool the server has not listed yet (nothing pinned)."""


@dataclass(frozen=True, slots=True)
class ToolLine:
    """One tool of an upstream as `upstream list` and the console show it."""

    upstream: str
    tool: str
    offered: bool
    """The policy offers it (`upstreams.<name>.tools`)."""
    pin: ToolPin | None
    """None: not seen yet."""

    @property
    def state(self) -> str:
        return NOT_SEEN if self.pin is None else str(self.pin.state)


def tool_lines(offered: Mapping[str, Sequence[str]], pins: Sequence[ToolPin]) -> dict[str, list[ToolLine]]:
    """Every upstream of the policy or of the pins, its tools (offered, then pinned) and their state."""
    by_upstream: dict[str, dict[str, ToolPin]] = {}
    for pin in pins:
        by_upstream.setdefault(pin.upstream, {})[pin.tool] = pin
    lines: dict[str, list[ToolLine]] = {}
    for upstream in sorted({*offered, *by_upstream}):
        named = offered.get(upstream, ())
        pinned = by_upstream.get(upstream, {})
        tools = [*named, *sorted(t for t in pinned if t not in named)]
        lines[upstream] = [ToolLine(upstream, t, t in named, pinned.get(t)) for t in tools]
    return lines


@dataclass(frozen=True, slots=True)
class _Seen:
    """One listed tool as observed: its definition and digest, or why it cannot be pinned."""

    definition: dict[str, Any]
    digest: str
    refused: str | None


def check_listing(tools: Sequence[Mapping[str, Any]]) -> dict[str, _Seen]:
    """Each listed tool's definition by name; ListingRefusedError when the listing as a whole cannot be
    pinned. A definition too large, or not text, is kept with why it is refused."""
    if len(tools) > MAX_LISTED_TOOLS:
        raise ListingRefusedError(f"the server listed {len(tools)} tools, more than {MAX_LISTED_TOOLS}")
    seen: dict[str, _Seen] = {}
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ListingRefusedError(f"entry {index} of the listing is not an object")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ListingRefusedError(f"entry {index} of the listing has no name")
        if len(name) > MAX_NAME_CHARS:
            raise ListingRefusedError(f"entry {index}'s name is {len(name)} characters, more than {MAX_NAME_CHARS}")
        if "\x00" in name or not is_text(name):
            raise ListingRefusedError(f"entry {index}'s name holds a NUL or a lone surrogate: it cannot be stored")
        if name in seen:
            raise ListingRefusedError(f"entry {index}'s name is listed twice")
        seen[name] = _observed(tool_definition(tool))
    return seen


def _observed(definition: dict[str, Any]) -> _Seen:
    try:
        canonical = canonical_json(definition)
    except (TypeError, ValueError):  # NaN or Infinity: not JSON
        return _Seen(definition, sha256_hex(repr(definition)), "the definition is not JSON (NaN or Infinity)")
    if not is_text(canonical):
        digest = sha256_hex(canonical.encode("utf-8", "backslashreplace").decode("ascii"))
        return _Seen(definition, digest, "the definition holds a lone surrogate: it is not text")
    size = len(canonical.encode("utf-8"))
    digest = sha256_hex(canonical)
    if size > MAX_DEFINITION_BYTES:
        return _Seen(definition, digest, f"the definition is {size:,} bytes, more than {MAX_DEFINITION_BYTES:,}")
    return _Seen(definition, digest, None)


class PinStore:
    """The `tool_pins` table: observe a listing, read the pins, accept a changed definition."""

    def __init__(self, engine: Engine, audit: AuditLog, clock: Clock) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        self._audit = audit
        self._clock = clock

    def observe(self, upstream: str, tools: Sequence[Mapping[str, Any]]) -> Mapping[str, ToolPin]:
        """Pin what is new, mark what differs, and return the pin of every listed tool, by name.

        First sight: pinned, no event (a first definition that cannot be pinned: refused). A definition
        differing from the pin: `changed` (or `refused`) and one TOOL_DEFINITION_CHANGED, unless this very
        digest is already recorded as the latest (by this gateway or another). The pinned definition seen
        again: `pinned`. Tools not listed keep their rows. ListingRefusedError: nothing is written."""
        listed = check_listing(tools)
        now = self._clock.now()
        drafts: list[EventDraft] = []
        with storage_errors(f"upstream {upstream}: its tool definitions could not be pinned", log=log):
            with self._engine.begin() as connection:
                _lock_upstream(connection, upstream)
                rows = _rows(connection, upstream)
                _check_room(upstream, rows, listed)
                firsts = [_first_sight(upstream, name, seen, now) for name, seen in listed.items() if name not in rows]
                if firsts:  # one statement for them all: a server's first listing is up to MAX_LISTED_TOOLS
                    connection.execute(insert(db.tool_pins), firsts)
                for name, seen in listed.items():
                    row = rows.get(name)
                    if row is not None and (event := _apply(connection, upstream, name, seen, row=row, now=now)):
                        drafts.append(event)
                if drafts:  # committed with the rows that withhold the tools, or not at all
                    self._audit.append_within(connection, *drafts)
            result = self._fetch(upstream, listed)
        if drafts:
            for draft in drafts:
                log.warning(
                    "upstream %s: tool %s changed its definition; withheld until an ADMIN accepts it "
                    "(mcp-gateway upstream accept)",
                    upstream,
                    json.dumps(draft.detail["tool"]),
                )
        return result

    def pins(self, upstream: str | None = None) -> list[ToolPin]:
        """Every pin, or `upstream`'s, ordered by upstream and tool."""
        query = select(db.tool_pins).order_by(db.tool_pins.c.upstream, db.tool_pins.c.tool)
        if upstream is not None:
            query = query.where(db.tool_pins.c.upstream == upstream)
        with storage_errors("the tool pins could not be read", log=log), self._read.connect() as connection:
            return [_pin_of(row) for row in connection.execute(query).mappings()]

    def accept(
        self, upstream: str, tool: str | None, by: Actor, *, expected: Mapping[str, str] | None = None
    ) -> list[ToolPin]:
        """Make the seen definition the pin of `tool` (None: of every `changed` tool of `upstream`), and
        write one TOOL_DEFINITION_ACCEPTED each; the pins accepted (none: nothing was changed).

        `expected`: tool -> the seen digest the person was shown; a tool whose latest differs now (the
        server changed it again) is not accepted. A `refused` tool is never accepted."""
        now = self._clock.now()
        accepted: list[ToolPin] = []
        with storage_errors(f"upstream {upstream}: the definition could not be accepted", log=log):
            with self._engine.begin() as connection:
                _lock_upstream(connection, upstream)
                query = select(db.tool_pins).where(
                    db.tool_pins.c.upstream == upstream, db.tool_pins.c.state == PinState.CHANGED.value
                )
                if tool is not None:
                    query = query.where(db.tool_pins.c.tool == tool)
                for row in connection.execute(query).mappings().all():
                    shown = None if expected is None else expected.get(row["tool"])
                    if expected is not None and shown != row["seen_sha256"]:
                        continue
                    connection.execute(
                        _at(upstream, row["tool"]).values(
                            state=PinState.PINNED.value,
                            pinned=row["seen"],
                            pinned_sha256=row["seen_sha256"],
                            seen=None,
                            seen_sha256=None,
                            reason=None,
                            pinned_at=now,
                            changed_at=None,
                            accepted_by=by.name,
                        )
                    )
                    accepted.append(_pin_of(row))
                if accepted:  # the act commits with its record, or neither does
                    self._audit.append_within(connection, *(_accepted_event(pin, by) for pin in accepted))
            return [p for p in self.pins(upstream) if any(p.tool == a.tool for a in accepted)]

    def _fetch(self, upstream: str, names: Collection[str]) -> dict[str, ToolPin]:
        return {pin.tool: pin for pin in self.pins(upstream) if pin.tool in names}


def _lock_upstream(connection: Connection, upstream: str) -> None:
    """Serialise the gateways' observations and accepts of one upstream: SQLite's transactions take the
    write lock at BEGIN (gateway/db/__init__.py); PostgreSQL takes an advisory lock for the transaction,
    keyed by the upstream's name, bounded by the connection's lock_timeout (decision 49)."""
    if connection.dialect.name == "postgresql":
        key = int(sha256_hex(f"tool_pins:{upstream}")[:15], 16)
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def _rows(connection: Connection, upstream: str) -> dict[str, RowMapping]:
    query = select(db.tool_pins).where(db.tool_pins.c.upstream == upstream)
    return {row["tool"]: row for row in connection.execute(query).mappings()}


def _check_room(upstream: str, rows: Mapping[str, RowMapping], listed: Collection[str]) -> None:
    new = sum(1 for name in listed if name not in rows)
    if len(rows) + new > MAX_STORED_TOOLS:
        raise ListingRefusedError(
            f"upstream {upstream} would have {len(rows) + new} pinned tools, more than {MAX_STORED_TOOLS}: "
            "its server keeps listing new names"
        )


def _at(upstream: str, tool: str) -> Any:
    return update(db.tool_pins).where(db.tool_pins.c.upstream == upstream, db.tool_pins.c.tool == tool)


def _first_sight(upstream: str, name: str, seen: _Seen, now: float) -> dict[str, Any]:
    """The row of a tool seen for the first time: pinned, or refused when its definition cannot be pinned."""
    stored = None if seen.refused is not None else canonical_json(seen.definition)
    return {
        "upstream": upstream,
        "tool": name,
        "state": (PinState.PINNED if stored is not None else PinState.REFUSED).value,
        "pinned": stored,
        "pinned_sha256": seen.digest if stored is not None else None,
        "seen_sha256": None if stored is not None else seen.digest,
        "reason": seen.refused,
        "first_seen_at": now,
        "pinned_at": now if stored is not None else None,
    }


def _apply(
    connection: Connection, upstream: str, name: str, seen: _Seen, *, row: RowMapping, now: float
) -> EventDraft | None:
    """Bring a known tool's row up to what the server listed; the event to write, if this was a change."""
    stored = None if seen.refused is not None else canonical_json(seen.definition)
    pinned_sha256 = row["pinned_sha256"]
    if seen.digest == pinned_sha256:
        if row["state"] != PinState.PINNED:  # back to what was accepted: offered as pinned again
            connection.execute(
                _at(upstream, name).values(
                    state=PinState.PINNED.value, seen=None, seen_sha256=None, reason=None, changed_at=None
                )
            )
        return None
    if pinned_sha256 is None:
        if stored is None:  # refused before, refused now
            connection.execute(_at(upstream, name).values(seen_sha256=seen.digest, reason=seen.refused))
        else:  # the first definition that can be pinned: first sight
            connection.execute(
                _at(upstream, name).values(
                    state=PinState.PINNED.value,
                    pinned=stored,
                    pinned_sha256=seen.digest,
                    seen_sha256=None,
                    reason=None,
                    pinned_at=now,
                )
            )
        return None
    if row["seen_sha256"] == seen.digest:
        return None  # recorded already: by this gateway or another
    state = PinState.CHANGED if stored is not None else PinState.REFUSED
    connection.execute(
        _at(upstream, name).values(
            state=state.value, seen=stored, seen_sha256=seen.digest, reason=seen.refused, changed_at=now
        )
    )
    detail: dict[str, Any] = {
        "upstream": upstream,
        "tool": name,
        "pinned_sha256": pinned_sha256,
        "seen_sha256": seen.digest,
    }
    if seen.refused is not None:
        detail["refused"] = seen.refused
    return EventDraft(EventType.TOOL_DEFINITION_CHANGED, tool_name=_event_tool_name(upstream, name), detail=detail)


_EVENT_TOOL_CHARS = 128
"""audit_events.tool_name's width: a longer offered name is left to the detail, which has both parts."""


def _event_tool_name(upstream: str, tool: str) -> str | None:
    """The tool as the gateway offers it (`<upstream>__<tool>`), as the audit log's tool_name."""
    offered = f"{upstream}__{tool}"
    return offered if len(offered) <= _EVENT_TOOL_CHARS else None


def _accepted_event(previous: ToolPin, by: Actor) -> EventDraft:
    return EventDraft(
        EventType.TOOL_DEFINITION_ACCEPTED,
        tool_name=_event_tool_name(previous.upstream, previous.tool),
        detail={
            "upstream": previous.upstream,
            "tool": previous.tool,
            "previous_sha256": previous.pinned_sha256,
            "accepted_sha256": previous.seen_sha256,
            "accepted_by": by.name,
            "channel": str(by.channel),
        },
    )


def _pin_of(row: RowMapping) -> ToolPin:
    return ToolPin(
        upstream=row["upstream"],
        tool=row["tool"],
        state=PinState(row["state"]),
        pinned=_loaded(row["pinned"]),
        pinned_sha256=row["pinned_sha256"],
        seen=_loaded(row["seen"]),
        seen_sha256=row["seen_sha256"],
        pinned_at=row["pinned_at"],
        accepted_by=row["accepted_by"],
        reason=row["reason"],
        changed_at=row["changed_at"],
    )


def _loaded(stored: str | None) -> Mapping[str, Any] | None:
    if stored is None:
        return None
    value = json.loads(stored)
    return value if isinstance(value, dict) else None
