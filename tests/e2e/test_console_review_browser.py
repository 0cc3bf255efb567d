"""A change review in a real Chromium against a real console (decision 81): the diff view's lines are
marked by the console's stylesheet (no inline style, which the CSP would refuse), hostile names and
lines (bidi controls, isolates, C0/C1 controls, markup) reach neither the permission block nor the
whole patch raw, nothing the run wrote runs as script, and the block's link opens the whole patch.
Needs the `kind` column of consent_requests (decision 80) and Debian's chromium."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import BrowserContext

from gateway.consent.store import ConsentStore, PendingRequest
from sandbox.change_set import ChangeSet, Refusal
from tests.e2e.console_server import CHROMIUM, signed_in_browser
from tests.e2e.test_console_hostile import HOSTILE, PASSWORD, raw_in, seen
from tests.harness import GatewayHome
from tests.review_artifacts import added, modified, refused, write_review

RUN_ID = "0badc0de0badc0de0badc0de0badc0de"
QUESTION = "review-question"
HAS_KIND = "kind" in {f.name for f in dataclasses.fields(PendingRequest)}
MARKUP = "</pre></span><img src=x onerror=window.__ran=1><script>window.__ran=1</script>"

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: make chromium"),
    pytest.mark.skipif(not HAS_KIND, reason="consent_requests has no kind column yet (decision 80 adds it)"),
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> GatewayHome:
    gateway = GatewayHome(tmp_path_factory.mktemp("console-review"))
    gateway.users.add("ada", "ADMIN", ("default",), PASSWORD)
    changes = ChangeSet(
        (
            modified(f"src/{HOSTILE}{MARKUP}.py", b"a = 1\n", f"a = 2 {HOSTILE}{MARKUP}\n".encode()),
            added(f"new{HOSTILE}\n.txt", b"\x00binary"),
        ),
        (refused(f".git/hooks/{HOSTILE}", Refusal.PROTECTED),),
    )
    run_dir = write_review(changes, gateway.settings.artifacts_dir / RUN_ID)
    with (run_dir / "changes.patch").open("a", encoding="utf-8") as patch:
        patch.write(f"+raw {HOSTILE}{MARKUP}\n")  # what the gateway never writes raw: escaped all the same
    now = time.time()
    columns: dict[str, Any] = {"kind": "change_review", "run_id": RUN_ID}
    ConsentStore(gateway.engine).insert_request(
        PendingRequest(
            QUESTION, now, now + 3600, "s", "ada", "default", "mcp-write-gateway", "ruff_fix", "a" * 64,
            "path: src", "high", False, preview="Apply these changes of ruff_fix?",
            choices=("ALLOW_ONCE", "DENY_ONCE"), **columns,
        )
    )  # fmt: skip
    return gateway


@pytest.fixture(scope="module")
def ada(gw: GatewayHome) -> Iterator[BrowserContext]:
    with signed_in_browser(gw, "ada", PASSWORD) as context:
        yield context


def test_the_diff_view_is_styled_escaped_and_runs_nothing(ada: BrowserContext) -> None:
    page = ada.new_page()
    refused_by_csp: list[str] = []
    page.on(
        "console", lambda message: refused_by_csp.append(message.text) if "Content Security" in message.text else None
    )
    try:
        page.goto("/approvals")
        page.wait_for_selector(f"article.question[data-id='{QUESTION}'] pre.diff span.add", timeout=30000)
        text = seen(page)
        assert raw_in(text) == [] and "\\u202e" in text
        assert page.evaluate("() => window.__ran") is None  # no markup of the run's became an element
        added_line = page.locator("pre.diff span.add").first
        assert added_line.evaluate("(e) => getComputedStyle(e).backgroundColor") == "rgb(230, 246, 235)"
        assert page.locator("pre.diff span.del").first.evaluate("(e) => getComputedStyle(e).backgroundColor") == (
            "rgb(251, 233, 231)"
        )
        assert [b.get_attribute("value") for b in page.locator("form.choices button").all()] == [
            "ALLOW_ONCE",
            "DENY_ONCE",
        ]
        assert refused_by_csp == []
        page.click("a[href$='/changes.patch']")
        page.wait_for_load_state()
        whole = str(page.evaluate("() => document.body.innerText"))
        assert raw_in(whole) == [] and "+raw \\u202e" in whole and MARKUP in whole  # text/plain: markup inert
        assert page.evaluate("() => window.__ran") is None
    finally:
        page.close()
