"""The console's upstream page (docs/console.md, "Upstreams"; decision 85): each upstream, its tools and
their pin state, a changed definition as a diff with Accept for an ADMIN.

Every name and line is the server's: through `shown` (gateway/console/shown.py) and `html.el`. The diff
is `definition_diff` of the pinned and the seen definition, each line a `span` marked as the change
review's (`changes.line_class`). The form carries the digest of the definition shown, so an accept
takes that one or none (`PinStore.accept`'s `expected`). At most `MAX_DIFFS` diffs are on the page:
each is up to twice 64 KiB; the rest are named, and come up as the first are accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from gateway.clock import iso_utc
from gateway.console.changes import line_class
from gateway.console.html import Safe, el
from gateway.console.shown import shown, shown_lines
from gateway.console.views import Viewer
from gateway.rbac import ADMIN_ROLE
from gateway.upstreams.pins import PinState, ToolLine, definition_diff, shown_name

MAX_DIFFS = 20
"""Changed definitions shown as a diff on one page."""
NOTICES = ("accepted", "not_accepted")
"""What a redirect after an accept may ask the page to say (one of ours, never text from the query)."""
_SHORT = 16
"""Hex digits of a digest in the table (the diff's header has the whole)."""


def may_accept(who: Viewer) -> bool:
    """Only an ADMIN accepts a changed definition."""
    return who.role == ADMIN_ROLE


def tool_field(tool: str) -> str:
    """A tool's name as the accept form carries it: a JSON string in ASCII, so that no character of the
    server's (a CR a browser would normalise, a control) changes on its way back."""
    return json.dumps(tool, ensure_ascii=True)


def tool_of_field(value: str | None) -> str | None:
    """The name `tool_field` wrote; None for anything else."""
    if value is None or len(value) > 16 * 128:
        return None
    try:
        name = json.loads(value)
    except ValueError:
        return None
    return name if isinstance(name, str) else None


def accept_url(upstream: str) -> str:
    return f"/upstreams/{quote(upstream, safe='')}/accept"


def upstreams_body(
    words: Mapping[str, str], who: Viewer, lines: Mapping[str, Sequence[ToolLine]], in_policy: frozenset[str]
) -> list[Safe]:
    """One section per upstream: its table of tools, then its changed definitions' diffs."""
    if not lines:
        return [el("p", None, words["no_upstreams"])]
    budget = [MAX_DIFFS]
    return [
        _section(words, who, name, tools, in_policy=name in in_policy, budget=budget) for name, tools in lines.items()
    ]


def _section(
    words: Mapping[str, str],
    who: Viewer,
    upstream: str,
    tools: Sequence[ToolLine],
    *,
    in_policy: bool,
    budget: list[int],
) -> Safe:
    heading = f"up-{quote(upstream, safe='')}"
    head = el(
        "tr",
        None,
        [
            el("th", {"scope": "col"}, words[key])
            for key in ("tool", "state", "pin_offered", "pin_pinned", "pin_seen", "pin_accepted_by")
        ],
    )
    rows = [_row(words, line) for line in tools]
    blocks: list[Safe] = []
    left_out = 0
    for line in tools:
        pin = line.pin
        if pin is None or pin.state is not PinState.CHANGED:
            continue
        if budget[0] <= 0:
            left_out += 1
            continue
        budget[0] -= 1
        blocks.append(_change(words, who, line))
    more = el("p", {"class": "warn"}, words["pin_more"].format(count=left_out)) if left_out else None
    return el(
        "section",
        {"class": "upstream", "aria_labelledby": heading, "data_upstream": shown_name(upstream)},
        el(
            "h2",
            {"id": heading},
            el("code", None, shown_name(upstream)),
            " ",
            el("span", {"class": "chip"}, words["pin_in_policy" if in_policy else "pin_not_in_policy"]),
        ),
        el("table", {"class": "pins"}, el("thead", None, head), el("tbody", None, rows)),
        blocks,
        more,
    )


def _row(words: Mapping[str, str], line: ToolLine) -> Safe:
    pin = line.pin
    state = line.state
    reason = el("p", {"class": "warn"}, shown(pin.reason)) if pin is not None and pin.reason else None
    return el(
        "tr",
        {"data_tool": shown_name(line.tool), "data_state": state},
        el("td", None, el("code", None, shown_name(line.tool))),
        el("td", {"class": f"pin-{state.replace(' ', '-')}"}, words.get(f"pin_state_{state}", state), reason),
        el("td", None, words["yes" if line.offered else "no"]),
        el("td", None, _digest(pin.pinned_sha256 if pin else None)),
        el("td", None, _digest(pin.seen_sha256 if pin else None)),
        el("td", None, shown(pin.accepted_by) if pin and pin.accepted_by else ""),
    )


def _digest(value: str | None) -> Safe | str:
    if value is None:
        return ""
    return el("code", {"title": value}, value[:_SHORT] + "\u2026")


def _change(words: Mapping[str, str], who: Viewer, line: ToolLine) -> Safe:
    pin = line.pin
    if pin is None or pin.pinned is None or pin.seen is None or pin.seen_sha256 is None:
        return el("p", {"class": "warn"}, words["pin_unreadable"])
    diff = shown_lines(definition_diff(pin.pinned, pin.seen)).removesuffix("\n").split("\n")
    heading = f"change-{quote(line.upstream, safe='')}-{quote(line.tool, safe='')}"
    if may_accept(who):
        form: Safe = el(
            "form",
            {"method": "post", "action": accept_url(line.upstream), "class": "choices"},
            el("input", {"type": "hidden", "name": "csrf", "value": who.csrf}),
            el("input", {"type": "hidden", "name": "tool", "value": tool_field(line.tool)}),
            el("input", {"type": "hidden", "name": "seen", "value": pin.seen_sha256}),
            el("button", {"type": "submit", "class": "accept"}, words["pin_accept"]),
        )
    else:
        form = el("p", {"class": "note"}, words["pin_cannot_accept"])
    since = iso_utc(pin.changed_at) if pin.changed_at is not None else "?"
    return el(
        "article",
        {"class": "question pin-change", "aria_labelledby": heading, "data_tool": shown_name(line.tool)},
        el("h3", {"id": heading}, words["pin_changed_title"], " ", el("code", None, shown_name(line.tool))),
        el("p", {"class": "note"}, words["pin_changed_note"].format(since=since)),
        el(
            "pre",
            {"class": "diff", "tabindex": "0", "aria_label": words["pin_diff"]},
            [el("span", {"class": line_class(text)}, text + "\n") for text in diff],
        ),
        form,
    )
