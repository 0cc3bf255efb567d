"""The terminal approver on a change review (gateway/approvals.py; decision 81): the panel from the
run's artifacts, only Allow once and Deny once, Enter denies, `v` pages through the whole patch and
Allow once waits for its end when the panel was cut. Its loop in process on a real SQLite store
and real artifacts, the keys from a list (tests/fakes.py PressedKeys); and a real `mcp-gateway
approvals` in a pty, on a question row of kind `change_review` (once the schema has the column)."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from gateway.approvals import Approver, Pager
from gateway.consent.changes_view import load_patch
from gateway.consent.store import ConsentStore, PendingRequest
from sandbox.change_set import ChangeSet, Refusal
from tests.fakes import FakeClock, PressedKeys
from tests.harness import ConsentDesk, GatewayHome, as_approver
from tests.review_artifacts import ReviewStore, added, modified, refused, write_review

RUN_ID = "0123456789abcdef0123456789abcdef"
QUESTION = PendingRequest(
    id="r1",
    created_at=0.0,
    expires_at=0.0,
    session_id="s-1",
    user="ada",
    workspace="default",
    server_id="mcp-write-gateway",
    tool_name="ruff_fix",
    args_hash="ab" * 32,
    args_preview="path: src",
    risk_tier="high",
    destructive=False,
    preview="Apply these changes of ruff_fix to the workspace?",
    choices=("ALLOW_ONCE", "ALLOW_ALWAYS", "DENY_ONCE", "DENY_ALWAYS"),
)
SMALL = ChangeSet(
    (modified("src/a.py", b"x = 1\n", b"x = 2  \xe2\x80\xae# admin\x1b[8m\n"), added("evil\u202eexe.txt", b"hi\n")),
    (refused(".git/hooks/pre-commit", Refusal.PROTECTED),),
)
LONG = ChangeSet((added("big.txt", b"".join(b"line %d\n" % n for n in range(3000))),), ())
LONG_HOSTILE = ChangeSet((added("big.txt", b"".join(b"line %d \xe2\x80\xae\x1b[2J\n" % n for n in range(3000))),), ())


@pytest.fixture(autouse=True)
def rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINES", "24")  # the pager's page: 21 lines, whatever terminal runs the tests


@pytest.fixture
def home(tmp_path: Path) -> GatewayHome:
    gateway = GatewayHome(tmp_path)
    gateway.add_user("ada", "ADMIN")
    return gateway


def answer(home: GatewayHome, changes: ChangeSet | None, *keys: str) -> tuple[str, PendingRequest | None]:
    """Put the review to the approver's loop with `keys` pressed; what it printed and the row after."""
    clock = FakeClock(time.time())
    artifacts = home.root / "artifacts"
    if changes is not None:
        write_review(changes, artifacts / RUN_ID)
    store = ReviewStore(home.engine, {QUESTION.id: RUN_ID})
    store.insert_request(dataclasses.replace(QUESTION, created_at=clock.now(), expires_at=clock.now() + 60))
    desk = dataclasses.replace(ConsentDesk.on(home.engine, clock), consent_store=store)
    out = io.StringIO()
    approver = Approver(desk, PressedKeys(*keys), out, locale="en-US", who="approvals:ada@host", artifacts=artifacts)  # type: ignore[arg-type]  # a fake for approvals.Keys
    approver.run()
    return out.getvalue(), ConsentStore(home.engine).fetch_request(QUESTION.id)


def test_the_panel_shows_the_change_set_escaped_and_offers_only_allow_once_and_deny_once(home: GatewayHome) -> None:
    screen, row = answer(home, SMALL, "2", "4", "5")
    assert "--- consent request r1 --- a change review ---" in screen
    assert "1 added, 1 modified, 0 deleted; 1 refused" in screen
    assert "added file evil\\u202eexe.txt" in screen
    assert "refused .git/hooks/pre-commit (protected_path): never applied" in screen
    assert "+x = 2\u2420\u00d72\\u202e# admin\\x1b[8m" in screen
    assert "[1] Allow once  [3] Deny once" in screen and "Allow always" not in screen
    assert "[Enter] Deny once" in screen
    assert "\x1b" not in screen and "\u202e" not in screen
    assert row is not None and row.decision is None  # 2, 4 and 5 mean nothing here


def test_enter_denies_a_change_review(home: GatewayHome) -> None:
    _, row = answer(home, SMALL, "\r")
    assert row is not None and row.decision == "DENY_ONCE"


def test_allow_once_on_a_whole_panel_is_taken_at_once(home: GatewayHome) -> None:
    _, row = answer(home, SMALL, "1")
    assert row is not None and row.decision == "ALLOW_ONCE"


def test_a_cut_panel_needs_the_patch_paged_to_its_end_before_allow_once(home: GatewayHome) -> None:
    screen, row = answer(home, LONG_HOSTILE, "1", "v", " ", "q", "1", "v", "G", "q", "1")
    first, rest = screen.split("[v] pages through the whole patch; Allow once needs its end seen first.", 1)
    assert "NOT SHOWN WHOLE" in first
    assert rest.count("Allow once needs its end seen first") == 2  # before v, and after a v that stopped short
    assert "--- changes.patch: " in rest and "lines 1-21 of 3,005" in rest and "lines 22-42 of 3,005" in rest
    assert "-- end of the patch --" in rest and "+line 2999 \\u202e\\x1b[2J" in rest
    assert "\u202e" not in screen and "\x1b" not in screen  # every page escaped as it is shown
    assert row is not None and row.decision == "ALLOW_ONCE"


def test_a_patch_that_cannot_be_read_cannot_be_allowed(home: GatewayHome, tmp_path: Path) -> None:
    artifacts = home.root / "artifacts" / RUN_ID
    write_review(SMALL, artifacts)
    (artifacts / "changes.patch").unlink()
    (tmp_path / "elsewhere.patch").write_text("+from elsewhere\n")
    (artifacts / "changes.patch").symlink_to(tmp_path / "elsewhere.patch")
    screen, row = answer(home, None, "1", "v", "1", "3")
    assert "The change set cannot be shown: changes.patch cannot be opened" in screen
    assert "[3] Deny once\n" in screen and "[1] Allow once" not in screen
    assert "changes.patch cannot be shown" in screen and "from elsewhere" not in screen
    assert row is not None and row.decision == "DENY_ONCE"


def test_the_pager_turns_pages_within_the_patch(tmp_path: Path) -> None:
    write_review(LONG, tmp_path / "run")
    pager = Pager(load_patch(tmp_path / "run", 1 << 20), 10)
    assert "lines 1-10 of 3,004" in pager.page() and not pager.seen_end
    assert pager.move("b") and "lines 1-10 of" in pager.page()
    assert not pager.move("x")
    assert pager.move("G") and "end of the patch" in pager.page() and pager.seen_end
    assert pager.move(" ") and "end of the patch" in pager.page()
    assert pager.move("g") and "lines 1-10 of" in pager.page()


def test_a_patch_past_what_the_pager_shows_never_counts_as_seen(tmp_path: Path) -> None:
    write_review(LONG, tmp_path / "run")
    pager = Pager(load_patch(tmp_path / "run", 4096), 10)
    pager.move("G")
    page = pager.page()
    assert "is not shown here: read changes.patch" in page and not pager.seen_end


HAS_KIND = "kind" in {f.name for f in dataclasses.fields(PendingRequest)}


@pytest.mark.skipif(not HAS_KIND, reason="consent_requests has no kind column yet (decision 80 adds it)")
def test_v_in_a_real_approver_pages_the_whole_patch_escaped_then_allow_once(home: GatewayHome) -> None:
    write_review(LONG_HOSTILE, home.settings.artifacts_dir / RUN_ID)
    now = time.time()
    columns: dict[str, Any] = {"kind": "change_review", "run_id": RUN_ID}  # those decision 80 adds
    review = dataclasses.replace(QUESTION, created_at=now, expires_at=now + 120, **columns)
    ConsentStore(home.engine).insert_request(review)
    argv = home.cli_argv("approvals")
    approver = as_approver(pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=60, dimensions=(24, 200)))
    try:
        approver.expect(r"consent request r1 --- a change review ---")
        approver.expect(r"\[q\] quit")
        panel = approver.before
        assert "NOT SHOWN WHOLE" in panel and "[1] Allow once  [3] Deny once" in panel
        approver.send("1")
        approver.expect("Allow once needs its end seen first")
        approver.send("v")
        approver.expect(r"lines 1-21 of 3,00\d")
        approver.send("G")
        approver.expect("end of the patch")
        paged = approver.before
        assert "\\u202e" in paged and "\\x1b[2J" in paged
        assert "\u202e" not in paged and "\x1b[2J" not in paged  # escaped, never sent to the terminal raw
        approver.send("q")
        approver.expect(r"\[q\] quit")
        approver.send("1")
        approver.expect("ALLOW_ONCE")
    finally:
        approver.terminate(force=True)
    row = ConsentStore(home.engine).fetch_request("r1")
    assert row is not None and row.decision == "ALLOW_ONCE"


def test_the_pager_escapes_raw_characters_a_patch_should_not_hold(tmp_path: Path) -> None:
    write_review(SMALL, tmp_path / "run")
    (tmp_path / "run" / "changes.patch").write_bytes(b"+raw \x1b[2J\xe2\x80\xae\r\x07 and\xff\n" * 30)
    pager = Pager(load_patch(tmp_path / "run", 1 << 20, escaped=False), 10)
    pager.move("G")
    page = pager.page()
    assert "+raw \\u001b[2J\\u202e\\u000d\\u0007 and\ufffd" in page
    assert not any(ch in page for ch in "\x1b\u202e\r\x07")
