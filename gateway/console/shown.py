"""What the console shows of text an agent, a run or a caller supplied: every string through `visible`
(gateway/visible.py), the one escaping of every channel a person reads (docs/console.md, "Security").

HTML escaping (`html.el`, the script's `textContent`) keeps text from becoming markup; this keeps it
from hiding or reordering itself: bidi controls, zero widths, controls and blank glyphs are written
`\\uXXXX`. The pages call `shown`/`shown_lines` on every field they print; the JSON the page's script
renders (`/api/calls`, `/api/stream`) is escaped here too (`shown_card`), so the script shows it as
it comes. Only base64 image data that is base64 passes as it is (it is never shown as text).
"""

from __future__ import annotations

import re
from typing import Any

from gateway.calls import Card
from gateway.visible import visible

_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_OPAQUE = frozenset({"data", "blob"})
"""Content-block keys whose base64 value the script checks and uses as an image, never as text."""


def shown(text: object) -> str:
    """One line as a person sees it; None is the empty string."""
    return "" if text is None else visible(str(text))


def shown_lines(text: str) -> str:
    """Many lines as a person sees them: each line escaped, the newlines kept."""
    return visible(text, lines=True)


def shown_json(value: Any) -> Any:
    """A JSON value with every string (and key) escaped; two keys that escape alike both stay."""
    if isinstance(value, str):
        return shown_lines(value)
    if isinstance(value, list):
        return [shown_json(item) for item in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = shown(key)
            while name in out:  # an escape typed literally and the character it names: keep both
                name += "\u2032"
            is_opaque = key in _OPAQUE and isinstance(item, str) and _BASE64.fullmatch(item)
            out[name] = item if is_opaque else shown_json(item)
        return out
    return value


def shown_card(card: Card) -> dict[str, Any]:
    """The card as the console's script gets it: every text escaped, numbers and ids as they are."""
    whole = card.to_json()
    texts = ("user", "workspace", "server_id", "tool_name", "status", "reason", "message", "kind", "run_id")
    for name in texts:
        if whole[name] is not None:
            whole[name] = shown(whole[name])
    whole["arguments"] = shown_json(card.arguments)
    whole["result"] = None if card.result is None else shown_json(card.result)
    whole["connections"] = shown_json(list(card.connections))  # a host is the run's text: escaped as any
    return whole
