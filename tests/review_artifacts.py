"""A change review's artifacts written for a test, as the gateway writes them (docs/consent.md, "The
change review"): changes.patch by sandbox.patch.write_patch and changes.json in its documented form."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from sqlalchemy import Engine

from gateway.consent.store import ConsentStore, PendingRequest
from sandbox.change_set import Action, Change, ChangeSet, Refusal, RefusedEntry
from sandbox.patch import not_shown, shown, write_patch
from sandbox.workspace_copy import Kind


def document_of(changes: ChangeSet) -> dict[str, object]:
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


def write_review(changes: ChangeSet, run_dir: Path) -> Path:
    """changes.patch and changes.json in `run_dir` (made if missing); returns `run_dir`."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_patch(changes, run_dir)
    (run_dir / "changes.json").write_text(json.dumps(document_of(changes), indent=2, sort_keys=True) + "\n")
    return run_dir


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def modified(path: str, before: bytes, after: bytes, mode_before: int = 0o644, mode_after: int = 0o644) -> Change:
    return Change(
        path, Action.MODIFIED, Kind.FILE, _sha(before), _sha(after), len(before), len(after),
        mode_before, mode_after, after, before,
    )  # fmt: skip


def added(path: str, after: bytes, mode: int = 0o644) -> Change:
    return Change(path, Action.ADDED, Kind.FILE, None, _sha(after), None, len(after), None, mode, after, None)


def deleted(path: str, before: bytes) -> Change:
    return Change(path, Action.DELETED, Kind.FILE, _sha(before), None, len(before), None, 0o644, None, None, before)


def refused(path: str, why: Refusal) -> RefusedEntry:
    return RefusedEntry(path, why)


class ReviewQuestion(PendingRequest):
    """A question row read back as a change review (`kind: change_review`, `run_id`): the schema of this
    branch has neither column yet (decision 80 adds them), so the test sets both on what it read."""


def as_review(question: PendingRequest, run_id: str) -> PendingRequest:
    review = ReviewQuestion(**{f.name: getattr(question, f.name) for f in dataclasses.fields(question)})
    object.__setattr__(review, "kind", "change_review")  # frozen: set as the row would have it
    object.__setattr__(review, "run_id", run_id)
    return review


class ReviewStore(ConsentStore):
    """The real store, its questions with the ids in `reviews` read back as change reviews of those runs."""

    def __init__(self, engine: Engine, reviews: dict[str, str]) -> None:
        super().__init__(engine)
        self.reviews = reviews

    def _as_read(self, question: PendingRequest) -> PendingRequest:
        run_id = self.reviews.get(question.id)
        return question if run_id is None else as_review(question, run_id)

    def fetch_request(self, request_id: str) -> PendingRequest | None:
        question = super().fetch_request(request_id)
        return None if question is None else self._as_read(question)

    def fetch_pending(self, now: float) -> list[PendingRequest]:
        return [self._as_read(q) for q in super().fetch_pending(now)]
