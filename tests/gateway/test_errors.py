"""gateway/errors.py: every `Reason` is documented in docs/error-codes.md, and every documented reason is one."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.errors import Reason

DOC = Path(__file__).resolve().parents[2] / "docs" / "error-codes.md"
_SLUG = re.compile(r"`([a-z][a-z0-9_]*)`")


def _documented_reasons(text: str) -> set[str]:
    """The slugs in the first column of every `| reason | when |` table (one row may name several)."""
    reasons: set[str] = set()
    in_table = False
    for line in text.splitlines():
        if line.startswith("| reason |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            reasons.update(_SLUG.findall(line.split("|")[1]))
    return reasons


def test_every_reason_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [r.value for r in Reason if f"`{r.value}`" not in text]
    assert missing == []


def test_every_reason_in_the_tables_is_a_reason() -> None:
    documented = _documented_reasons(DOC.read_text(encoding="utf-8"))
    assert len(documented) > 40, "the tables were found"
    assert documented - {r.value for r in Reason} == set()


def test_the_guards_documented_outside_the_tables_are_reasons_too() -> None:
    # Never expected to be seen, so documented in a sentence rather than a table row.
    outside = {r.value for r in Reason} - _documented_reasons(DOC.read_text(encoding="utf-8"))
    assert outside == {"tool_not_implemented", "workspace_missing"}


def test_a_reason_is_its_slug_on_the_wire() -> None:
    assert f"{Reason.TOKEN_EXPIRED}" == "token_expired"
    assert Reason("consent_denied") is Reason.CONSENT_DENIED
