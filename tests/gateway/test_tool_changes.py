"""A writing run's change set after the run (gateway/tools/changes.py, decision 80): refusals, changes.json, the answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.errors import PolicyBlockedError, Reason, SandboxViolationError
from gateway.policy import SandboxPolicy
from gateway.tools.base import Written
from gateway.tools.changes import (
    changes_detail,
    changes_document,
    check_applied,
    check_writable,
    with_changes,
    write_artifacts,
)
from gateway.tools.outcome import ToolOutcome
from sandbox.apply import ApplyResult
from sandbox.change_set import Action, Change, ChangeSet, Refusal, RefusedEntry, TooLarge
from sandbox.workspace_copy import Kind

MODIFIED = Change("a.py", Action.MODIFIED, Kind.FILE, "b" * 64, "c" * 64, 4, 5, 0o644, 0o644, b"new\n", b"old\n")
ADDED = Change("new\nline.txt", Action.ADDED, Kind.FILE, None, "d" * 64, None, 1, None, 0o600, b"x")
FOLDER = Change("pkg", Action.ADDED, Kind.FOLDER, None, None, None, None, None, 0o755)
SET = ChangeSet((MODIFIED, ADDED, FOLDER), (RefusedEntry(".git/hooks/pre-commit", Refusal.PROTECTED),))


def test_changes_json_has_every_field_with_paths_shown_escaped(tmp_path: Path) -> None:
    write_artifacts(SET, tmp_path)
    document = json.loads((tmp_path / "changes.json").read_text())
    assert document == changes_document(SET)
    assert document["changes"][1] == {
        "path": "new\\nline.txt",
        "action": "added",
        "kind": "file",
        "size_before": None,
        "size_after": 1,
        "mode_before": None,
        "mode_after": 0o600,
        "sha256_before": None,
        "sha256_after": "d" * 64,
        "not_shown": None,
    }
    assert document["changes"][2]["kind"] == "folder"
    assert document["refused"] == [{"path": ".git/hooks/pre-commit", "why": "protected_path"}]
    assert (document["too_large"], document["content_bytes"]) == (None, 6)
    assert "+new" in (tmp_path / "changes.patch").read_text()
    assert (tmp_path / "changes.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("too_large", "key"), [(TooLarge.FILES, "sandbox.max_change_files"), (TooLarge.BYTES, "sandbox.max_change_bytes")]
)
def test_a_set_over_a_cap_is_refused_naming_the_key(too_large: TooLarge, key: str) -> None:
    with pytest.raises(SandboxViolationError) as caught:
        check_writable(Written(True, ChangeSet((MODIFIED,), (), too_large), None), SandboxPolicy())
    assert caught.value.reason is Reason.CHANGES_TOO_LARGE
    assert key in caught.value.public_message()
    assert caught.value.data == {"cap": str(too_large)}


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("workspace_view_busy", Reason.WORKSPACE_VIEW_BUSY),
        ("changes_unreadable", Reason.CHANGES_UNREADABLE),
        (None, Reason.CHANGES_UNREADABLE),
        ("anything else", Reason.CHANGES_UNREADABLE),
    ],
)
def test_no_change_set_is_refused(error: str | None, reason: Reason) -> None:
    with pytest.raises(SandboxViolationError) as caught:
        check_writable(Written(False, None, error), SandboxPolicy())
    assert caught.value.reason is reason
    assert "nothing was applied" in caught.value.public_message()


def test_a_set_within_the_caps_is_the_one_acted_on() -> None:
    assert check_writable(Written(True, SET, None), SandboxPolicy()) is SET


def test_a_conflict_names_the_paths_and_says_nothing_was_applied() -> None:
    with pytest.raises(PolicyBlockedError) as caught:
        check_applied(ApplyResult(False, "changes_conflict", ("a.py", "new\nline.txt")))
    assert caught.value.reason is Reason.CHANGES_CONFLICT
    message = caught.value.public_message()
    assert "a.py, new\\nline.txt" in message and "nothing was applied" in message
    assert caught.value.data == {"paths": ["a.py", "new\\nline.txt"]}
    with pytest.raises(SandboxViolationError) as failed:
        check_applied(ApplyResult(False, "changes_apply_failed", written=("a.py",)))
    assert failed.value.reason is Reason.CHANGES_APPLY_FAILED
    check_applied(ApplyResult(True, written=("a.py",)))


def test_the_answer_adds_changes_applied_and_both_artifacts() -> None:
    outcome = ToolOutcome("ran", {"exit_code": 0, "run_id": "r1"})
    answered = with_changes(outcome, SET, True, "r1")
    assert answered.structured is not None
    assert answered.structured["applied"] is True
    assert answered.structured["changes"][0] == {
        "path": "a.py", "action": "modified", "sha256_before": "b" * 64, "sha256_after": "c" * 64,
    }  # fmt: skip
    assert answered.structured["exit_code"] == 0
    assert "Applied to the workspace: modified a.py; added new\\nline.txt; added pkg." in answered.text
    assert "Refused, never applied: .git/hooks/pre-commit (protected_path)." in answered.text
    assert [link.name for link in answered.links] == ["changes.patch", "changes.json"]
    empty = with_changes(outcome, ChangeSet((), ()), False, "r1")
    assert "nothing to apply (applied: false)" in empty.text


def test_workspace_changes_detail_holds_hashes_never_content() -> None:
    detail = changes_detail(SET, False, "elicitation:user_prompt", "changes_denied")
    assert detail["files"][0] == {
        "path": "a.py", "action": "modified", "kind": "file", "sha256_before": "b" * 64, "sha256_after": "c" * 64,
    }  # fmt: skip
    assert (detail["applied"], detail["decided_by"], detail["reason"]) == (
        False,
        "elicitation:user_prompt",
        "changes_denied",
    )
    assert "new" not in json.dumps(detail["files"][0])
