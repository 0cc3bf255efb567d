"""A change review in the console (gateway/console/changes.py; decision 81): the diff view in the
permission block (files, refused entries, the patch's lines marked by class), only Allow once and
Deny once (Deny once alone for a set that cannot be read), and the route that serves the whole
patch as escaped text/plain to those who may see the question. In process (Starlette's TestClient
on `build_app`), on a real database and real artifacts; hostile names and lines never raw in HTML."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from gateway.consent.store import ConsentStore, PendingRequest
from gateway.console.app import build_app
from gateway.console.changes import MAX_LINES, line_class
from gateway.console.serve import host_names, open_console
from sandbox.change_set import ChangeSet, Refusal
from tests.gateway.test_console_routes import BASE, PORT, session_csrf, signed_in, three_users
from tests.harness import GatewayHome
from tests.review_artifacts import ReviewStore, added, modified, refused, write_review

RUN_ID = "fedcba9876543210fedcba9876543210"
HOSTILE = ChangeSet(
    (
        modified(
            "src/<script>alert(1)</script>.py",
            b"a = 1\n",
            b"a = 2 \xe2\x80\xae</pre><img src=x onerror=alert(1)>\x1b[2J\n",
        ),
        added("evil\u202eexe.txt\n", b"\x00\x01binary"),
        modified("run.sh", b"echo\n", b"echo\n", 0o644, 0o755),
    ),
    (refused(".git/hooks/pre-commit", Refusal.PROTECTED), refused("<b>link</b>", Refusal.SYMLINK)),
)


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayHome], tmp_path: Path) -> GatewayHome:
    return three_users(make_gateway, tmp_path)


@pytest.fixture
def app(gw: GatewayHome) -> Iterator[ASGIApp]:
    """The console as `mcp-gateway console` builds it, its question with the id `r1` read back as a change review."""
    console = open_console(gw.settings, tls=False, hosts=host_names("127.0.0.1", PORT))
    console.stores = dataclasses.replace(
        console.stores, consent_store=ReviewStore(console.stores.engine, {"r1": RUN_ID})
    )
    yield build_app(console)
    console.chain.stop()
    console.stores.engine.dispose()


def ask(gw: GatewayHome, changes: ChangeSet | None) -> Path:
    """The change review `r1` of alice's run in `default`, its artifacts written from `changes`."""
    run_dir = gw.settings.artifacts_dir / RUN_ID
    if changes is not None:
        write_review(changes, run_dir)
    now = time.time()
    ConsentStore(gw.engine).insert_request(
        PendingRequest(
            id="r1", created_at=now, expires_at=now + 120, session_id="s-1", user="alice", workspace="default",
            server_id="mcp-write-gateway", tool_name="ruff_fix", args_hash="ab" * 32, args_preview="path: src",
            risk_tier="high", destructive=False, preview="Apply these changes of ruff_fix to the workspace?",
            choices=("ALLOW_ONCE", "ALLOW_ALWAYS", "DENY_ONCE", "DENY_ALWAYS", "ALLOW_SESSION"),
        )
    )  # fmt: skip
    return run_dir


def buttons(html: str) -> list[str]:
    return re.findall(r'name="decision" value="(\w+)"', html)


def test_the_block_is_a_diff_view_with_files_refusals_and_marked_lines(gw: GatewayHome, app: ASGIApp) -> None:
    ask(gw, HOSTILE)
    page = signed_in(app, "ada").get("/approvals")
    html = page.text
    assert "Apply these changes to the workspace?" in html
    assert '<table class="changed">' in html and '<tr class="action-modified">' in html
    assert "0644 \u2192 0755" in html  # the mode change named
    assert '<span class="note"># binary file, 0 bytes -&gt; 8 bytes\n</span>' in html
    assert '<span class="del">-a = 1\n</span>' in html
    assert '<span class="hunk">@@ ' in html and '<span class="file">+++ b/run.sh' not in html  # same content: no diff
    assert "<code>.git/hooks/pre-commit</code> (protected_path)" in html
    assert "shown whole below" in html and 'href="/approvals/r1/changes.patch"' in html
    assert buttons(html) == ["ALLOW_ONCE", "DENY_ONCE"]
    assert re.search(r'<button[^>]*value="DENY_ONCE"[^>]*data-default="1"', html)
    # Hostile text: escaped as markup and as characters, never raw.
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>link" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "\u202e" not in html and "\x1b" not in html and "\x00" not in html
    assert "evil\\u202eexe.txt\\n" in html
    assert "style=" not in html.split("<main", 1)[-1]  # classes only: the CSP allows no inline style
    assert "style-src 'self'" in page.headers["content-security-policy"]


def test_a_long_patch_is_cut_in_the_block_with_a_link_to_all_of_it(gw: GatewayHome, app: ASGIApp) -> None:
    ask(gw, ChangeSet((added("big.txt", b"".join(b"line %d\n" % n for n in range(MAX_LINES + 500))),), ()))
    html = signed_in(app, "ada").get("/approvals").text
    assert "Not shown whole" in html and "Deny unless you have read all of it" in html
    assert "+line 1990" in html and "+line 2100" not in html
    assert "[\u2702 CUT: 504 more lines" in html
    assert html.index("Not shown whole") < html.index('<pre class="diff"')


def test_the_whole_patch_route_is_escaped_text_for_those_who_see_the_question(gw: GatewayHome, app: ASGIApp) -> None:
    ask(gw, HOSTILE)
    ada, alice, bob = signed_in(app, "ada"), signed_in(app, "alice"), signed_in(app, "bob")
    whole = ada.get("/approvals/r1/changes.patch")
    assert whole.status_code == 200
    assert whole.headers["content-type"] == "text/plain; charset=utf-8"
    assert whole.headers["x-content-type-options"] == "nosniff"
    assert "</pre><img src=x onerror=alert(1)>" in whole.text  # text/plain, never sniffed: the markup is inert
    assert "\u202e" not in whole.text and "\x1b" not in whole.text and "\\u202e" in whole.text
    assert alice.get("/approvals/r1/changes.patch").status_code == 200  # she sees her workspace's questions
    assert bob.get("/approvals/r1/changes.patch").status_code == 404  # another workspace: as if none
    assert ada.get("/approvals/nope/changes.patch").status_code == 404
    assert TestClient(app, base_url=BASE).get("/approvals/r1/changes.patch", follow_redirects=False).status_code in (
        303,
        401,
    )


def test_a_set_that_cannot_be_read_offers_deny_once_only_and_refuses_an_allow(
    gw: GatewayHome, app: ASGIApp, tmp_path: Path
) -> None:
    run_dir = ask(gw, HOSTILE)
    (run_dir / "changes.json").unlink()
    (tmp_path / "elsewhere.json").write_text('{"changes": [], "refused": [], "too_large": null, "content_bytes": 0}')
    (run_dir / "changes.json").symlink_to(tmp_path / "elsewhere.json")
    ada = signed_in(app, "ada")
    html = ada.get("/approvals").text
    assert "The change set cannot be shown (changes.json cannot be opened" in html
    assert buttons(html) == ["DENY_ONCE"]
    allow = ada.post(
        "/approvals/r1", data={"decision": "ALLOW_ONCE", "csrf": session_csrf(ada)}, follow_redirects=False
    )
    assert allow.headers["location"] == "/approvals?m=not_offered"
    assert ada.get("/approvals/r1/changes.patch").status_code == 200  # the patch itself is still there to read


def test_a_review_refuses_what_is_not_allow_once_or_deny_once(gw: GatewayHome, app: ASGIApp) -> None:
    ask(gw, HOSTILE)
    ada = signed_in(app, "ada")
    csrf = session_csrf(ada)
    for decision in ("ALLOW_ALWAYS", "DENY_ALWAYS", "ALLOW_SESSION"):
        answer = ada.post("/approvals/r1", data={"decision": decision, "csrf": csrf}, follow_redirects=False)
        assert answer.headers["location"] == "/approvals?m=not_offered"
    allowed = ada.post("/approvals/r1", data={"decision": "ALLOW_ONCE", "csrf": csrf}, follow_redirects=False)
    assert allowed.headers["location"] == "/approvals?m=decided&d=ALLOW_ONCE"
    row = ConsentStore(gw.engine).fetch_request("r1")
    assert row is not None and row.decision == "ALLOW_ONCE" and row.decided_by == "console:ada"


@pytest.mark.parametrize(
    ("line", "mark"),
    [
        ("+++ b/a.py", "file"),
        ("--- a/a.py", "file"),
        ("+x", "add"),
        ("-x", "del"),
        ("@@ -1 +1 @@", "hunk"),
        ("# binary file, 1 bytes -> 2 bytes", "note"),
        ("\\ No newline at end of file", "note"),
        (" context", "ctx"),
        ("", "ctx"),
    ],
)
def test_each_patch_line_gets_its_mark(line: str, mark: str) -> None:
    assert line_class(line) == mark


def test_raw_control_and_bidi_bytes_in_the_patch_are_escaped_in_the_block_and_the_route(
    gw: GatewayHome, app: ASGIApp
) -> None:
    run_dir = ask(gw, HOSTILE)
    (run_dir / "changes.patch").write_bytes(b"+raw \x1b]0;title\x07 \xe2\x80\xae</span><script>x()</script>\x00\n" * 3)
    ada = signed_in(app, "ada")
    for text in (ada.get("/approvals").text, ada.get("/approvals/r1/changes.patch").text):
        assert not any(ch in text for ch in "\x1b\x07\u202e\x00")
        assert "\\u001b]0;title\\u0007 \\u202e" in text
    assert (
        '<span class="add">+raw \\u001b]0;title\\u0007 \\u202e&lt;/span&gt;&lt;script&gt;' in ada.get("/approvals").text
    )


def test_content_shown_nowhere_is_warned_above_the_table_and_marked_in_it(gw: GatewayHome, app: ASGIApp) -> None:
    """HOSTILE adds a binary file: its content is in no view, so the block says so first (decision 81, reviewed)."""
    ask(gw, HOSTILE)
    html = signed_in(app, "ada").get("/approvals").text
    warning = "\u26a0 Not shown whole: part of the content of 1 changed file(s) is shown nowhere"
    assert warning in html
    assert html.index(warning) < html.index('<table class="changed">')
    assert "\u26a0 binary</td>" in html
