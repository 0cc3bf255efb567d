"""Hostile text on every console page, in a real Chromium against a real console: an agent's arguments,
a run's stdout and stderr, a tool's result, names, reasons, grants, questions and audit details carrying
bidi controls, isolates, zero widths, a BOM and C0/C1 controls reach no page, no input's value and no
JSON the pages read raw: each is written `\\uXXXX` (gateway/visible.py, through gateway/console/shown.py).

One real `run_pytest` (through `serve`, a test that prints the payload and fails) gives a real card and
a real run; the rest is written through the stores as the gateways write it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.calls import CardStatus, Opened
from gateway.clock import SystemClock
from gateway.consent.store import ConsentStore, Grant, GrantDecision, PendingRequest
from gateway.runs import RunRecord, RunStore
from tests.e2e.console_server import CHROMIUM, signed_in_browser
from tests.harness import GatewayHome, StdioSession

HOSTILE = (
    "\u202e\u2066\u2067\u2068\u2069\u200b\ufeff\x01\x07\x1b\x7f\x85\x9b"
    "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u2028\u2029\u00ad\u3164\u2800\ufe0f\U000e0041"
)
"""RLO, the four isolates (LRI RLI FSI PDI), a zero width space, a BOM, C0 (SOH BEL ESC), DEL, C1 (NEL
CSI); then variants: LRM, RLM, the Arabic letter mark, LRE RLE PDF LRO, the line and paragraph
separators, a soft hyphen, the Hangul filler, the blank braille pattern, a variation selector, a tag."""
PAYLOAD = f"evil{HOSTILE}txt.exe"
NAME_PART = "\u202e\u2066\u200b"
"""What a file name in the workspace carries (what pytest prints back as the test's id)."""
PASSWORD = "ada-console-pw-1"
CARD = "hostile-card"
RUN = "hostile-run"
QUESTION = "hostile-question"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: make chromium")


def raw_in(text: str) -> list[str]:
    return sorted({f"U+{ord(ch):04X}" for ch in text if ch in HOSTILE})


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> GatewayHome:
    gateway = GatewayHome(tmp_path_factory.mktemp("console-hostile"))
    gateway.users.add("ada", "ADMIN", ("default",), PASSWORD)
    test_file = gateway.workspace / "tests" / f"test_hostile{NAME_PART}.py"
    test_file.write_text(
        "import sys\n\n\n"
        f"def test_prints_hostile_text() -> None:\n"
        f"    print({PAYLOAD!r})\n"
        f"    print({PAYLOAD!r}, file=sys.stderr)\n"
        f"    assert {PAYLOAD!r} == ''\n"
    )
    test_file.chmod(0o644)
    return gateway


@pytest.fixture(scope="module")
def real_run(gw: GatewayHome) -> str:
    """A real run_pytest whose argument, test id, stdout and stderr carry the payload; its run id."""
    granted = gw.cli("consent", "grant", "ada", "run_pytest", "--always")
    assert granted.returncode == 0, granted.stderr
    session = StdioSession(gw)
    try:
        assert "result" in session.initialize()
        ran = session.call_tool("run_pytest", {"test_path": f"tests/test_hostile{NAME_PART}.py"}, gw.token("ada"))
    finally:
        session.close()
    assert "result" in ran, ran
    run_id = str(ran["result"]["_meta"]["mcp-write-gateway/run_id"])
    stdout = (gw.home / "artifacts" / run_id / "stdout.txt").read_text()
    assert HOSTILE in stdout  # the run really printed it: what the console must not show raw
    return run_id


@pytest.fixture(scope="module")
def written(gw: GatewayHome) -> None:
    """Hostile text in every other field a page shows, written through the stores."""
    now = SystemClock().now()
    result: list[dict[str, Any]] = [
        {"type": "text", "text": f"first {PAYLOAD}\nsecond {PAYLOAD}"},
        {"type": "resource_link", "uri": f"mcp-gateway://runs/{RUN}/stdout.txt", "name": f"n-{PAYLOAD}",
         "description": f"d-{PAYLOAD}"},
        {"type": "image", "mimeType": f"image/png{HOSTILE}", "data": "AAAA"},
        {"type": "resource", "resource": {"uri": f"file:///{PAYLOAD}", "mimeType": "text/plain", "text": PAYLOAD}},
    ]  # fmt: skip
    card = Opened(CARD, "ada", "default", f"srv-{PAYLOAD}", f"tool-{PAYLOAD}",
                  {f"key-{PAYLOAD}": f"value-{PAYLOAD}", "list": [PAYLOAD], "n": 3}, CardStatus.ERROR, now,
                  code=-32602, reason=f"reason-{PAYLOAD}", message=f"message-{PAYLOAD}", result=result)  # fmt: skip
    log = AuditLog(gw.engine, SystemClock())
    log.append(EventDraft(EventType.MCP_TOOL_CALL, run_id=CARD, user="ada", workspace="default"), along=[card])
    log.append(
        EventDraft(
            EventType.TOKEN_ISSUED, user=f"eve-{PAYLOAD}", workspace="default", tool_name=f"t-{PAYLOAD}",
            detail={f"k-{PAYLOAD}": f"v-{PAYLOAD}"},
        )
    )  # fmt: skip
    runs = RunStore(gw.engine, gw.home / "artifacts")
    runs.insert(RunRecord(RUN, f"u-{PAYLOAD}", "default", f"tool-{PAYLOAD}", now, f"status-{PAYLOAD}", 1))
    folder = runs.folder(RUN)
    folder.mkdir()
    for name in ("stdout.txt", "stderr.txt", "junit.xml"):
        (folder / name).write_text(f"{name}: {PAYLOAD}\n\tindented {PAYLOAD}\n")
    (folder / "evidence.json").write_text(json.dumps({"governance": {f"g-{PAYLOAD}": PAYLOAD}}, ensure_ascii=False))
    store = ConsentStore(gw.engine)
    store.insert_grant(Grant(0, f"eve-{PAYLOAD}", "default", f"srv-{PAYLOAD}", f"tool-{PAYLOAD}", None,
                             GrantDecision.ALLOW, "f" * 64, now, now + 86400, f"by-{PAYLOAD}"))  # fmt: skip
    store.insert_request(
        PendingRequest(QUESTION, now, now + 3600, "s", f"eve-{PAYLOAD}", "default", f"srv-{PAYLOAD}",
                       f"tool-{PAYLOAD}", "a" * 64, f'test_path: "{PAYLOAD}"', "medium", False)
    )  # fmt: skip


@pytest.fixture(scope="module")
def ada(gw: GatewayHome, real_run: str, written: None) -> Iterator[BrowserContext]:
    with signed_in_browser(gw, "ada", PASSWORD) as context:
        yield context


SEEN = """() => [
  document.documentElement.outerHTML,
  document.body.innerText,
  document.title,
  ...Array.from(document.querySelectorAll('input, textarea, select')).map((e) => e.value),
  ...Array.from(document.querySelectorAll('*')).flatMap((e) => Array.from(e.attributes).map((a) => a.value)),
].join('\\n')"""


def seen(page: Page) -> str:
    """Everything of the page a person could see or a screen reader read: markup, text, values, attributes."""
    return str(page.evaluate(SEEN))


def open_everything(page: Page) -> None:
    page.evaluate("() => document.querySelectorAll('details').forEach((d) => { d.open = true; })")
    for button in page.get_by_role("button", name="Form view").all():
        button.click()


@pytest.mark.parametrize(
    ("path", "wait_for"),
    [
        ("/calls", f"article.card[data-run='{CARD}'] details.result"),
        (f"/calls/{CARD}", f"article.card[data-run='{CARD}'] details.result"),
        ("/calls/{real}", "article.card details.result"),
        ("/approvals", f"article.question[data-id='{QUESTION}']"),
        ("/grants", "tbody tr"),
        ("/audit", "tbody tr"),
        ("/runs", "tbody tr"),
        ("/runs/{real}", "pre"),
        (f"/runs/{RUN}", "dl.governance"),
    ],
)
def test_no_page_shows_hostile_text_raw(ada: BrowserContext, real_run: str, path: str, wait_for: str) -> None:
    page = ada.new_page()
    try:
        page.goto(path.format(real=real_run))
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector(wait_for.format(real=real_run), state="attached", timeout=30000)
        open_everything(page)
        text = seen(page)
        assert raw_in(text) == [], (path, raw_in(text))
        assert "\\u202e" in text, path  # the payload was shown, escaped
    finally:
        page.close()


def test_the_run_files_and_the_json_the_pages_read_are_escaped(ada: BrowserContext, real_run: str) -> None:
    for path in (
        f"/runs/{real_run}/files/stdout.txt",
        f"/runs/{RUN}/files/stderr.txt",
        f"/runs/{RUN}/files/junit.xml",
        f"/runs/{RUN}/files/evidence.json",
        "/api/calls",
        f"/api/calls/{CARD}",
        f"/api/calls/{real_run}",
    ):
        body = ada.request.get(path).text()
        assert raw_in(body) == [], (path, raw_in(body))
        assert "\\u202e" in body, path
    cards = ada.request.get("/api/calls").json()["cards"]
    (card,) = [c for c in cards if c["run_id"] == CARD]
    # Escaped, the text still says what it was: each character named, the rest as it came.
    named = "".join(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}" for ch in HOSTILE)
    assert card["tool_name"] == f"tool-evil{named}txt.exe"
    assert card["arguments"]["n"] == 3 and card["result"][2]["data"] == "AAAA"


def test_the_audit_export_is_data_escaped_as_json(ada: BrowserContext) -> None:
    body = ada.request.get("/audit/export.jsonl?event_type=TOKEN_ISSUED").text()
    assert raw_in(body) == []  # JSON's own \\u escapes: nothing live in a terminal or an editor
    (event,) = [json.loads(line) for line in body.splitlines()]
    assert event["user"] == f"eve-{PAYLOAD}"  # the data itself, unchanged


def test_a_live_card_is_escaped_too(gw: GatewayHome, ada: BrowserContext) -> None:
    page = ada.new_page()
    try:
        page.goto("/calls")
        page.wait_for_selector("body[data-ready='1']")
        card = Opened("hostile-live", "ada", "default", "mcp-write-gateway", f"live-{PAYLOAD}",
                      {"a": PAYLOAD}, CardStatus.DONE, time.time(), result=[{"type": "text", "text": PAYLOAD}])  # fmt: skip
        AuditLog(gw.engine, SystemClock()).append(
            EventDraft(EventType.TOOL_FINISHED, run_id="hostile-live"), along=[card]
        )
        page.wait_for_selector("article.card[data-run='hostile-live'] details.result", state="attached", timeout=30000)
        open_everything(page)
        assert raw_in(seen(page)) == []
    finally:
        page.close()
