"""A change review's diff view in the console's permission block (docs/console.md, "Approvals";
decision 81): the changed files with their actions, sizes and modes, the refused entries with why,
and the patch, each line a `span` whose class marks it (`add`, `del`, `hunk`, `file`, `note`;
the console's CSP allows no inline style), cut past `MAX_LINES` with a link to the whole patch.

Every text comes from the run's artifacts (gateway/consent/changes_view.py), escaped there by
`visible` and here by `html.el`: neither markup nor a character that hides or reorders text can
pass. A set that cannot be read is said so, and the block then offers Deny once only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gateway.approvals import offered_for
from gateway.consent.changes_view import (
    MAX_WHOLE_BYTES,
    ChangeSetView,
    Review,
    UnreadableError,
    counts_line,
    load_patch,
)
from gateway.consent.stage import Decision
from gateway.consent.store import PendingRequest
from gateway.console.html import Safe, el

MAX_LINES = 2000
"""Lines of the patch shown in the block; the rest through the link (`/approvals/<id>/changes.patch`)."""
MAX_PATCH_BYTES = 1 << 20
"""What the block reads of changes.patch at most."""

_MARKS = (("+++ ", "file"), ("--- ", "file"), ("+", "add"), ("-", "del"), ("@@", "hunk"), ("#", "note"), ("\\", "note"))


def line_class(line: str) -> str:
    """How a patch line is marked: `file` for a ---/+++ header, `add`, `del`, `hunk`, `note` for what a
    diff cannot show (binary, modes, sizes, refused entries), `ctx` for context."""
    return next((mark for start, mark in _MARKS if line.startswith(start)), "ctx")


def offered_in_block(q: PendingRequest, review: Review | None) -> tuple[str, ...] | None:
    """What a block offers: the question's choices (`approvals.offered_for`); Deny once alone for a change
    review whose set cannot be read."""
    if review is not None and review.why is not None:
        return (Decision.DENY_ONCE.value,)
    return offered_for(q)


def whole_patch(run_dir: Path | None) -> tuple[int, str]:
    """The status and text/plain body of the route that shows a change review's whole patch, escaped;
    past MAX_WHOLE_BYTES, a line says the rest is not shown."""
    try:
        if run_dir is None:
            raise UnreadableError("the question names no run")
        patch = load_patch(run_dir, MAX_WHOLE_BYTES)
    except UnreadableError as exc:
        return 404, f"changes.patch cannot be shown: {exc.why}\n"
    if patch.complete:
        return 200, patch.text
    return 200, f"{patch.text}\n[\u2702 CUT: past {MAX_WHOLE_BYTES:,} bytes; {patch.size:,} bytes in all]\n"


def patch_url(question_id: str) -> str:
    return f"/approvals/{question_id}/changes.patch"


def review_block(words: Mapping[str, str], question_id: str, review: Review) -> Safe:
    """The diff view: a warning first when anything is left out (deny unless seen whole), else the set."""
    if review.view is None or review.patch is None:
        return el(
            "div",
            {"class": "changes"},
            el("p", {"class": "warn"}, words["changes_unreadable"].format(why=review.why or "")),
        )
    view, patch = review.view, review.patch
    lines = patch.text.removesuffix("\n").split("\n") if patch.text else []
    cut = not patch.complete or len(lines) > MAX_LINES
    link = el("a", {"href": patch_url(question_id)}, words["changes_whole"])
    notice = words["changes_cut"] if cut else words["changes_size"]
    unshown = sum(1 for c in view.changes if c.not_shown is not None)
    return el(
        "div",
        {"class": "changes"},
        el("p", {"class": "warn"}, words["changes_unshown"].format(files=unshown)) if unshown else None,
        el(
            "p",
            {"class": "warn" if cut else "note"},
            notice.format(size=f"{patch.size:,}", digest=patch.digest),
            " ",
            link,
        ),
        el("p", None, counts_line(view)),
        _files(words, view),
        _refused(words, view),
        el(
            "pre",
            {"class": "diff", "tabindex": "0", "aria_label": words["changes_patch"]},
            [el("span", {"class": line_class(line)}, line + "\n") for line in lines[:MAX_LINES]],
        ),
        el("p", {"class": "warn"}, words["changes_more"].format(lines=len(lines) - MAX_LINES), " ", link)
        if cut
        else None,
    )


def _files(words: Mapping[str, str], view: ChangeSetView) -> Safe | None:
    if not view.changes:
        return None
    head = el(
        "tr",
        None,
        [
            el("th", {"scope": "col"}, words[key])
            for key in ("changes_action", "changes_path", "changes_sizes", "changes_modes")
        ],
    )
    rows = [
        el(
            "tr",
            {"class": f"action-{c.action}"},
            el("td", None, f"{c.action} {c.kind}"),
            el("td", None, el("code", None, c.path), f" \u26a0 {c.not_shown}" if c.not_shown else None),
            el("td", None, f"{_number(c.size_before)} \u2192 {_number(c.size_after)}"),
            el("td", None, f"{_mode(c.mode_before)} \u2192 {_mode(c.mode_after)}"),
        )
        for c in view.changes
    ]
    return el(
        "table",
        {"class": "changed"},
        el("caption", None, words["changes_files"]),
        el("thead", None, head),
        el("tbody", None, rows),
    )


def _refused(words: Mapping[str, str], view: ChangeSetView) -> Safe | None:
    if not view.refused:
        return None
    items = [el("li", None, el("code", None, r.path), f" ({r.why})") for r in view.refused]
    return el("div", {"class": "refused"}, el("p", None, words["changes_refused"]), el("ul", None, items))


def _number(value: int | None) -> str:
    return "\u2014" if value is None else f"{value:,}"


def _mode(value: int | None) -> str:
    return "\u2014" if value is None else f"{value:04o}"
