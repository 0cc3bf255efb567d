"""A writing run's change set after the run (docs/declared-tools.md, decision 80): its artifacts, its refusals, its answer.

`check_writable(written, policy)` turns what the run left (sandbox/change_set.py) into the change
set to act on, or the -32006 refusal when there is none to act on (the copy could not be read,
or the set is over a cap): decided before any person is asked. `write_artifacts` writes
`changes.patch` (sandbox/patch.py) and `changes.json` (`changes_document`, the one writer of its
shape) into the run's folder. `apply_beneath` applies the set beneath the pinned workspace
(blocking: a worker thread). `changes_detail` is WORKSPACE_CHANGES's detail; `with_changes` adds
`changes` and `applied` to the tool's answer, with links to both artifacts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.errors import PolicyBlockedError, Reason, SandboxViolationError
from gateway.policy import SandboxPolicy
from gateway.tools.base import Written
from gateway.tools.outcome import ResourceLink, ToolOutcome
from gateway.tools.run_pytest import artifact_uri
from sandbox.apply import ApplyResult, apply_changes
from sandbox.change_set import ChangeSet, TooLarge
from sandbox.patch import not_shown, shown, write_patch
from sandbox.pinned import Pinned

CHANGE_ARTIFACTS = {"changes.patch": "text/x-diff", "changes.json": "application/json"}
REVIEW_PROMPT_CHARS = 8000
"""The change review question's text at most (gateway/consent/changes_view.py cuts it loudly past this)."""
MAX_LISTED = 50
"""Changed paths named in the answer's text (all of them are in `structuredContent` and changes.json)."""

_CAP_KEYS = {TooLarge.FILES: "sandbox.max_change_files", TooLarge.BYTES: "sandbox.max_change_bytes"}
_ERRORS = {
    "workspace_view_busy": (
        Reason.WORKSPACE_VIEW_BUSY,
        "something still held the run's copy of the workspace open for writing after the run, so its changes"
        " could not be read whole; nothing was applied. Call again",
    ),
    "changes_unreadable": (
        Reason.CHANGES_UNREADABLE,
        "the run's copy of the workspace could not be read back; nothing was applied. Call again, or run"
        " `mcp-gateway doctor`",
    ),
}


def check_writable(written: Written, policy: SandboxPolicy) -> ChangeSet:
    """The change set to apply or ask about; SandboxViolationError (-32006) when there is none, before anyone is asked."""
    if written.changes is None:
        reason, sentence = _ERRORS.get(
            str(written.error), (Reason.CHANGES_UNREADABLE, "the run left no change set; nothing was applied")
        )
        raise SandboxViolationError(reason, sentence)
    changes = written.changes
    if changes.too_large is not None:
        cap = policy.max_change_files if changes.too_large is TooLarge.FILES else policy.max_change_bytes
        unit = "changed files" if changes.too_large is TooLarge.FILES else "bytes of changed content"
        raise SandboxViolationError(
            Reason.CHANGES_TOO_LARGE,
            f"the run changed more than {cap:,} {unit} ({changes.too_large}); nothing was applied and nobody"
            f" was asked. Raise {_CAP_KEYS[changes.too_large]} in policy.yaml, or narrow the call",
            cap=str(changes.too_large),
        )
    return changes


def changes_document(changes: ChangeSet) -> dict[str, Any]:
    """changes.json (docs/declared-tools.md, "What a person is shown"): every entry with its paths shown escaped."""
    return {
        "changes": [
            {
                "path": shown(c.path),
                "action": str(c.action),
                "kind": str(c.kind),
                "size_before": c.size_before,
                "size_after": c.size_after,
                "mode_before": c.mode_before,
                "mode_after": c.mode_after,
                "sha256_before": c.sha256_before,
                "sha256_after": c.sha256_after,
                "not_shown": None if (why := not_shown(c)) is None else str(why),
            }
            for c in changes.changes
        ],
        "refused": [{"path": shown(r.path), "why": str(r.why)} for r in changes.refused],
        "too_large": None if changes.too_large is None else str(changes.too_large),
        "content_bytes": changes.content_bytes,
    }


def write_artifacts(changes: ChangeSet, run_dir: Path) -> None:
    """changes.patch and changes.json in the run's folder (made by the run, mode 0700), before anyone is asked."""
    write_patch(changes, run_dir)
    target = run_dir / "changes.json"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(changes_document(changes), handle, indent=2, sort_keys=True)
        handle.write("\n")


def apply_beneath(root: Pinned, changes: ChangeSet, protected: tuple[str, ...]) -> ApplyResult:
    """Apply the set beneath the workspace pinned at policy load (sandbox/apply.py). Blocking: a worker thread."""
    return apply_changes(root.fd, changes, protected=protected)


def check_applied(result: ApplyResult) -> None:
    """Raise the refusal for a set that was not applied: -32004 `changes_conflict` naming the paths, or -32006."""
    if result.applied:
        return
    named = ", ".join(shown(p) for p in result.conflicts[:MAX_LISTED])
    if result.reason == "changes_conflict":
        raise PolicyBlockedError(
            Reason.CHANGES_CONFLICT,
            f"the workspace changed since the run began at {named}; nothing was applied (the patch stays in the"
            " run's artifacts as changes.patch). Call again to run on what the workspace holds now",
            paths=[shown(p) for p in result.conflicts[:MAX_LISTED]],
        )
    if result.reason == "changes_apply_failed":
        done = ", ".join(shown(p) for p in result.written[:MAX_LISTED]) or "none"
        raise SandboxViolationError(
            Reason.CHANGES_APPLY_FAILED,
            f"a write beneath the workspace failed midway; written before it: {done}. Check the workspace's"
            " free space and permissions; changes.patch holds the whole set",
        )
    raise SandboxViolationError(Reason.CHANGES_TOO_LARGE, f"nothing was applied ({result.reason}: {named})")


def changes_detail(changes: ChangeSet, applied: bool, decided_by: str, reason: str | None = None) -> Mapping[str, Any]:
    """WORKSPACE_CHANGES's detail (docs/audit.md): hashes and why, never content."""
    detail: dict[str, Any] = {
        "files": [
            {
                "path": shown(c.path),
                "action": str(c.action),
                "kind": str(c.kind),
                "sha256_before": c.sha256_before,
                "sha256_after": c.sha256_after,
            }
            for c in changes.changes
        ],
        "refused": [{"path": shown(r.path), "why": str(r.why)} for r in changes.refused],
        "applied": applied,
        "decided_by": decided_by,
    }
    if reason is not None:
        detail["reason"] = reason
    return detail


def with_changes(outcome: ToolOutcome, changes: ChangeSet, applied: bool, run_id: str) -> ToolOutcome:
    """The answer with `changes` and `applied`, a line saying what was applied, and links to both artifacts."""
    items = [
        {
            "path": shown(c.path),
            "action": str(c.action),
            "sha256_before": c.sha256_before,
            "sha256_after": c.sha256_after,
        }
        for c in changes.changes
    ]
    if not changes.changes:
        said = "No changes to the workspace: nothing to apply (applied: false)."
    else:
        names = "; ".join(f"{c.action} {shown(c.path)}" for c in changes.changes[:MAX_LISTED])
        more = len(changes.changes) - MAX_LISTED
        names += f"; and {more} more" if more > 0 else ""
        said = f"Applied to the workspace: {names}." if applied else f"Not applied: {names}."
    if changes.refused:
        said += (
            " Refused, never applied: "
            + "; ".join(f"{shown(r.path)} ({r.why})" for r in changes.refused[:MAX_LISTED])
            + "."
        )
    links = tuple(
        ResourceLink(artifact_uri(run_id, name), name, mime, f"{name} of run {run_id}")
        for name, mime in CHANGE_ARTIFACTS.items()
    )
    structured = {**(outcome.structured or {}), "changes": items, "applied": applied}
    return dataclasses.replace(
        outcome, text=f"{outcome.text}\n{said}", structured=structured, links=(*outcome.links, *links)
    )
