"""The change review's text (gateway/consent/changes_view.py; decision 81): table-driven over the
sets a run can leave, hostile names and lines, a 16 MiB patch, and artifacts that are missing,
malformed or links. Real files in a real run folder; the patch written by sandbox.patch."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.consent.changes_view import (
    MAX_DOCUMENT_BYTES,
    is_change_review,
    load_patch,
    review_dir,
    review_text,
)
from gateway.consent.store import PendingRequest, QuestionKind
from sandbox.change_set import Action, Change, ChangeSet, Refusal
from sandbox.workspace_copy import Kind
from tests.review_artifacts import added, deleted, modified, refused, write_review

LIMIT = 8000
HIDDEN = ("\x1b", "\u202e", "\u2066", "\x00", "\x07", "\u200b")
"""Characters that must never reach a person raw."""


@dataclass(frozen=True)
class Case:
    changes: ChangeSet
    shows: tuple[str, ...]
    cut: bool = False


FOLDER = Change("pkg", Action.ADDED, Kind.FOLDER, None, None, None, None, None, 0o755)
CASES = {
    "empty": Case(ChangeSet((), ()), ("0 added, 0 modified, 0 deleted; 0 refused; 0 bytes to write",)),
    "one file": Case(
        ChangeSet((modified("src/a.py", b"x = 1\n", b"x = 2\n"),), ()),
        ("1 modified", "modified file src/a.py (6 bytes -> 6 bytes)", "  -x = 1", "  +x = 2"),
    ),
    "binary": Case(
        ChangeSet((modified("logo.png", b"\x89PNG\0\0", b"\x89PNG\0\0\1"),), ()),
        (
            "modified file logo.png (6 bytes -> 7 bytes; \u26a0 NOT SHOWN: binary)",
            "# binary file, 6 bytes -> 7 bytes",
            "part of the content of 1 changed file(s) is shown nowhere (binary: 1;",
        ),
        cut=True,
    ),
    "mode change": Case(
        ChangeSet((modified("run.sh", b"echo\n", b"echo\n", 0o644, 0o755),), ()),
        ("mode 0644 -> 0755", "# modified file run.sh (mode 0644 -> 0755)"),
    ),
    "added folder, deleted file": Case(
        ChangeSet((FOLDER, deleted("old.txt", b"gone\n")), ()),
        ("added folder pkg (mode 0755)", "deleted file old.txt (5 bytes)", "  -gone"),
    ),
    "refused entries": Case(
        ChangeSet(
            (added("ok.txt", b"ok\n"),),
            (refused(".git/hooks/pre-commit", Refusal.PROTECTED), refused("link", Refusal.SYMLINK)),
        ),
        (
            "2 refused",
            "refused .git/hooks/pre-commit (protected_path): never applied",
            "refused link (symlink): never applied",
        ),
    ),
    "hostile names": Case(
        ChangeSet(
            (
                added("a\nmodified file b.py", b"x\n"),
                added("evil\u202egnp.exe", b"x\n"),
                added("esc\x1b[2Jname", b"x\n"),
                added(os.fsdecode(b"bad\xffutf8"), b"x\n"),
                added("zero\u200bwidth", b"x\n"),
            ),
            (),
        ),
        (
            "added file a\\nmodified file b.py",
            "evil\\u202egnp.exe",
            "esc\\x1b[2Jname",
            "bad\\xffutf8",
            "zero\\u200bwidth",
        ),
    ),
    "hostile lines": Case(
        ChangeSet((modified("code.py", b"ok = 1\n", b"ok = 1 \xe2\x80\xae# admin\x1b[8m hidden\x07\n"),), ()),
        ("# this file holds control or bidi characters", "\\u202e# admin\\x1b[8m hidden\\x07"),
    ),
    "many names": Case(
        ChangeSet(tuple(added(f"f{n:03}.txt", b"x\n") for n in range(80)), ()),
        ("80 added", "added file f049.txt", "[\u2702 CUT: 30 more entries of 80; all are in changes.json]"),
        cut=True,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_the_question_names_what_is_asked_the_counts_the_names_and_the_patch(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    text = review_text(write_review(case.changes, tmp_path / "run"), "ruff_fix", LIMIT)
    assert text.text.startswith("Apply these changes of ruff_fix to the workspace?\n")
    assert "Deny once applies nothing" in text.text
    for part in case.shows:
        assert part in text.text
    assert text.cut is case.cut
    assert ("NOT SHOWN WHOLE" in text.text.split("\n")[1]) is case.cut
    assert not any(ch in text.text for ch in HIDDEN)
    assert len(text.text) <= LIMIT


def test_a_long_patch_is_cut_loudly_at_the_top_and_recommends_deny(tmp_path: Path) -> None:
    lines = b"".join(b"line %d\n" % n for n in range(5000))
    run = write_review(ChangeSet((added("big.txt", lines),), ()), tmp_path / "run")
    text = review_text(run, "ruff_fix", 2000)
    first = text.text.split("\n")
    assert text.cut and len(text.text) <= 2000
    assert first[1].startswith("\u26a0 NOT SHOWN WHOLE") and "sha256 " in first[1]
    assert first[2].startswith("\u26a0 Deny unless you have read the whole patch elsewhere")
    assert "[v]" in first[2] and "console" in first[2] and "changes.patch" in first[2]
    assert first[-1].startswith("[\u2702 CUT: ") and "bytes in all" in first[-1]
    assert "  +line 0" in text.text and "+line 4999" not in text.text


def test_a_16_mib_patch_is_cut_in_bounded_time_and_memory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "changes.json").write_text(json.dumps({"changes": [], "refused": [], "too_large": None, "content_bytes": 0}))
    line = ("+" + "\u202e\x1b" * 64 + "x" * 900 + "\n").encode()
    with (run / "changes.patch").open("wb") as handle:
        for _ in range((16 << 20) // len(line) + 1):
            handle.write(line)
    started = time.thread_time()  # CPU, not wall, so that a busy machine does not fail it
    text = review_text(run, "t", LIMIT)
    assert time.thread_time() - started < 5.0  # about 40 ms here
    assert text.cut and len(text.text) <= LIMIT
    assert not any(ch in text.text for ch in HIDDEN)
    assert "\\u202e" in text.text


def test_one_endless_line_is_cut_inside_and_says_so(tmp_path: Path) -> None:
    run = write_review(ChangeSet((added("min.js", b"a" * 300_000),), ()), tmp_path / "run")
    text = review_text(run, "t", LIMIT)
    assert text.cut and len(text.text) <= LIMIT
    assert "more characters of this line's" in text.text or "[\u2702 CUT: " in text.text


def _missing_patch(run: Path) -> None:
    (run / "changes.patch").unlink()


def _missing_document(run: Path) -> None:
    (run / "changes.json").unlink()


def _not_json(run: Path) -> None:
    (run / "changes.json").write_text("{not json")


def _wrong_types(run: Path) -> None:
    (run / "changes.json").write_text(
        json.dumps({"changes": [{"path": 1, "action": "added", "kind": "file"}], "refused": [], "too_large": None,
                    "content_bytes": 0})
    )  # fmt: skip


def _unknown_action(run: Path) -> None:
    (run / "changes.json").write_text(
        json.dumps({"changes": [{"path": "a", "action": "chmod", "kind": "file"}], "refused": [], "too_large": None,
                    "content_bytes": 0})
    )  # fmt: skip


def _bool_size(run: Path) -> None:
    (run / "changes.json").write_text(
        json.dumps({"changes": [{"path": "a", "action": "added", "kind": "file", "size_after": True}], "refused": [],
                    "too_large": None, "content_bytes": 0})
    )  # fmt: skip


def _huge_document(run: Path) -> None:
    (run / "changes.json").write_bytes(b" " * (MAX_DOCUMENT_BYTES + 1) + b"{}")


def _patch_is_symlink(run: Path) -> None:
    outside = run.parent / "outside.patch"
    outside.write_text("+secret from elsewhere\n")
    (run / "changes.patch").unlink()
    (run / "changes.patch").symlink_to(outside)


def _document_is_symlink(run: Path) -> None:
    outside = run.parent / "outside.json"
    outside.write_text((run / "changes.json").read_text())
    (run / "changes.json").unlink()
    (run / "changes.json").symlink_to(outside)


def _patch_is_fifo(run: Path) -> None:
    (run / "changes.patch").unlink()
    os.mkfifo(run / "changes.patch")


def _patch_is_folder(run: Path) -> None:
    (run / "changes.patch").unlink()
    (run / "changes.patch").mkdir()


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "patch missing": (_missing_patch, "changes.patch cannot be opened"),
    "document missing": (_missing_document, "changes.json cannot be opened"),
    "not JSON": (_not_json, "changes.json is not valid JSON"),
    "wrong types": (_wrong_types, "an entry's path is not a string"),
    "unknown action": (_unknown_action, "action or kind is not one of its values"),
    "a size that is a boolean": (_bool_size, "size_after is not a count"),
    "document over its bound": (_huge_document, "more than"),
    "patch is a symlink": (_patch_is_symlink, "changes.patch cannot be opened"),
    "document is a symlink": (_document_is_symlink, "changes.json cannot be opened"),
    "patch is a FIFO": (_patch_is_fifo, "changes.patch is not a regular file"),
    "patch is a folder": (_patch_is_folder, "changes.patch is not a regular file"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_a_change_set_that_cannot_be_read_says_so_and_recommends_deny(tmp_path: Path, name: str) -> None:
    run = write_review(ChangeSet((added("a.txt", b"a\n"),), ()), tmp_path / "run")
    breaks, why = BROKEN[name]
    breaks(run)
    started = time.monotonic()
    text = review_text(run, "ruff_fix", LIMIT)
    assert time.monotonic() - started < 5.0  # a FIFO is never waited on
    assert text.cut
    lines = text.text.split("\n")
    assert lines[1].startswith("\u26a0 The change set cannot be shown: ") and why in lines[1]
    assert lines[2].startswith("\u26a0 Deny")
    assert "secret from elsewhere" not in text.text and "a.txt" not in text.text


def test_the_run_folder_itself_is_not_followed_if_it_is_a_link(tmp_path: Path) -> None:
    real = write_review(ChangeSet((added("a.txt", b"a\n"),), ()), tmp_path / "real")
    (tmp_path / "run").symlink_to(real)
    text = review_text(tmp_path / "run", "t", LIMIT)
    assert "the run's folder cannot be opened" in text.text


def test_a_tiny_limit_is_kept_and_still_warns(tmp_path: Path) -> None:
    run = write_review(ChangeSet((added("a.txt", b"a\n" * 100),), ()), tmp_path / "run")
    for limit in (0, 10, 80, 300):
        text = review_text(run, "t", limit)
        assert len(text.text) <= limit and text.cut


def test_a_cut_inside_a_character_never_invents_one(tmp_path: Path) -> None:
    run = write_review(ChangeSet((added("u.txt", "é".encode() * 10_000),), ()), tmp_path / "run")
    patch = load_patch(run, 1001)
    assert not patch.complete and "\ufffd" not in patch.text


def question(kind: str = QuestionKind.CHANGE_REVIEW, run_id: str | None = "0123abcd") -> PendingRequest:
    return PendingRequest(
        id="q1", created_at=0.0, expires_at=60.0, session_id="s", user="alice", workspace="default",
        server_id="gateway", tool_name="ruff_fix", args_hash="0" * 64, args_preview="{}", risk_tier="low",
        destructive=False, kind=kind, run_id=run_id,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("row", "review"),
    [
        (question(), True),
        (question(kind=QuestionKind.CALL), False),
        (question(run_id=None), False),
        (question(run_id="../other"), False),
        (question(run_id=".."), False),
        (question(run_id="a\nb"), False),
    ],
)
def test_only_a_change_review_with_a_plain_run_id_is_one(tmp_path: Path, row: PendingRequest, review: bool) -> None:
    assert is_change_review(row) is review
    assert (review_dir(tmp_path, row) == tmp_path / "0123abcd") is review


def test_content_shown_nowhere_is_said_at_the_top_and_recommends_deny(tmp_path: Path) -> None:
    """A file whose earlier content was not read (review 2026-11-27: it was applied with its payload in no
    view): its new content is in the patch, and the question says part of the set is shown nowhere."""
    unread = Change("setup.py", Action.MODIFIED, Kind.FILE, "a" * 64, "b" * 64, 45, 6, 0o644, 0o644, b"evil\n")
    run = write_review(ChangeSet((unread,), ()), tmp_path / "run")
    text = review_text(run, "ruff_fix", LIMIT)
    lines = text.text.split("\n")
    assert text.cut
    assert lines[1].startswith("\u26a0 NOT SHOWN WHOLE: part of the content of 1 changed file(s) is shown nowhere")
    assert "earlier content not read: 1" in lines[1] and lines[2].startswith("\u26a0 Deny unless")
    assert "modified file setup.py (45 bytes -> 6 bytes; \u26a0 NOT SHOWN: earlier content not read)" in text.text
    assert "  +evil" in text.text


def test_an_unknown_not_shown_value_makes_the_set_unreadable(tmp_path: Path) -> None:
    run = write_review(ChangeSet((added("a.txt", b"a\n"),), ()), tmp_path / "run")
    document = json.loads((run / "changes.json").read_text())
    document["changes"][0]["not_shown"] = "shown"
    (run / "changes.json").write_text(json.dumps(document))
    text = review_text(run, "t", LIMIT)
    assert text.unreadable and "not_shown is not one of its values" in text.text
