"""The change review question as a person reads it (decision 80): a stand-in kept minimal until the display part lands.

`changes_prompt(run_dir, tool, limit_chars)` is the whole text of the question asked by elicitation,
a round trip or out of band: the summary of the run's change set, then the start of its
changes.patch, cut at `limit_chars` with a line saying so (the whole patch stays in the artifacts).
"""

from __future__ import annotations

import json
from pathlib import Path

_CUT = "\n[cut here: the change set is longer than this question may be; read changes.patch before allowing]"
_UNREADABLE = "the change set could not be read: deny"


def changes_prompt(run_dir: Path, tool: str, limit_chars: int) -> str:
    """The question for `tool`'s change set, from changes.json and changes.patch in `run_dir`; at most `limit_chars`."""
    try:
        document = json.loads((run_dir / "changes.json").read_text(encoding="utf-8"))
        patch = (run_dir / "changes.patch").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return f"Apply the changes of {tool}? {_UNREADABLE}"[:limit_chars]
    changes = document.get("changes", [])
    refused = document.get("refused", [])
    counts = ", ".join(
        f"{sum(1 for c in changes if c.get('action') == a)} {a}" for a in ("added", "modified", "deleted")
    )
    named = "; ".join(f"{c.get('action')} {c.get('path')}" for c in changes[:20])
    named += "; refused: " + "; ".join(f"{r.get('path')} ({r.get('why')})" for r in refused[:20]) if refused else ""
    head = (
        f"Apply the changes of {tool} to the workspace? {counts}; {len(refused)} refused;"
        f" {document.get('content_bytes', 0):,} bytes. {named}\nAllow once applies them; deny once applies nothing.\n\n"
    )
    text = head + patch
    if len(text) <= limit_chars:
        return text
    return text[: max(0, limit_chars - len(_CUT))] + _CUT
