"""The web console's pure parts (gateway/console/): markup escaped by construction, the language choice,
sessions and their expiry, the sign-in limit, the listening rules, and what a card stores."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from gateway.calls import STORED_CHARS, Card, CardStatus, outcome_content, stored_arguments
from gateway.console.copy import pick_locale, words_for
from gateway.console.html import Safe, el, join
from gateway.console.serve import check_listen, host_names, is_loopback
from gateway.console.sessions import (
    FAILURE_WINDOW_S,
    FAILURES_PER_ADDRESS,
    FAILURES_PER_NAME,
    IDLE_S,
    LIFETIME_S,
    Attempt,
    SessionBook,
    SignInLimit,
    address_key,
    tokens_match,
)
from gateway.console.shown import shown_card
from gateway.errors import CommandError
from gateway.tools.outcome import ResourceLink, ToolOutcome
from tests.fakes import FakeClock


def test_every_string_is_escaped_and_only_markup_el_made_passes() -> None:
    hostile = '<script>alert("x")</script>&'
    page = el("p", {"title": hostile, "data_x": "1", "hidden": True, "open": False, "id": None}, hostile, 3, None)
    assert page == (
        '<p title="&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" data-x="1" hidden>'
        '&lt;script&gt;alert("x")&lt;/script&gt;&amp;3</p>'
    )
    assert isinstance(page, Safe)
    assert el("div", None, [el("b", None, "<i>"), ["<u>"]], page) == f"<div><b>&lt;i&gt;</b>&lt;u&gt;{page}</div>"
    assert el("input", {"value": '"><x'}) == '<input value="&quot;&gt;&lt;x">'
    assert join("<a>", el("br")) == "&lt;a&gt;<br>"
    assert el("p", None, Safe("<b>ours</b>")) == "<p><b>ours</b></p>"


@pytest.mark.parametrize(
    ("chosen", "accept", "locale"),
    [
        (None, None, "en-US"),
        (None, "pt-BR,pt;q=0.9,en;q=0.8", "pt-BR"),
        (None, "pt", "pt-BR"),
        (None, "en-GB,pt-BR;q=0.5", "en-US"),
        (None, "fr-FR,pt-PT;q=0.7,en;q=0.3", "pt-BR"),
        (None, "en;q=0.2,pt;q=0.9", "pt-BR"),
        (None, "de", "en-US"),
        (None, "pt;q=abc,en", "en-US"),
        ("en-US", "pt-BR", "en-US"),
        ("pt-BR", "en-US", "pt-BR"),
        ("xx-YY", "pt-BR", "pt-BR"),
    ],
)
def test_the_language_is_the_switch_else_accept_language(chosen: str | None, accept: str | None, locale: str) -> None:
    assert pick_locale(chosen, accept) == locale


def test_both_languages_have_the_same_words_and_the_consent_copy() -> None:
    english, portuguese = words_for("en-US"), words_for("pt-BR")
    assert english.keys() == portuguese.keys()
    assert english["ALLOW_ONCE"] == "Allow once" and portuguese["ALLOW_ONCE"] == "Permitir uma vez"
    assert portuguese["title"] == "Permitir execução desta ferramenta?"
    assert words_for("xx") == english


def test_a_session_ends_when_idle_too_long_at_its_lifetime_and_at_sign_out() -> None:
    clock = FakeClock()
    book = SessionBook(clock)
    sid = book.open("ada")
    session = book.fetch(sid)
    assert session is not None and session.user == "ada" and len(sid) >= 43 and len(session.csrf) >= 43
    clock.advance(IDLE_S - 1)
    assert book.fetch(sid) is not None  # used: the idle time starts again
    clock.advance(IDLE_S - 1)
    assert book.fetch(sid) is not None
    clock.advance(IDLE_S)
    assert book.fetch(sid) is None
    busy = book.open("ada")
    for _ in range(int(LIFETIME_S // (IDLE_S / 2)) + 1):
        clock.advance(IDLE_S / 2)
        book.fetch(busy)
    assert book.fetch(busy) is None  # however busy, at most LIFETIME_S
    other = book.open("bob")
    book.close(other)
    assert book.fetch(other) is None
    assert book.fetch(None) is None and book.fetch("") is None and book.fetch("forged") is None
    a, b = book.open("carol"), book.open("carol")
    book.close_user("carol")
    assert book.fetch(a) is None and book.fetch(b) is None


def test_csrf_tokens() -> None:
    book = SessionBook(FakeClock())
    assert book.pre_token("n1") == book.pre_token("n1") != book.pre_token("n2")
    assert book.pre_token("n1") != SessionBook(FakeClock()).pre_token("n1")  # a key per process
    assert tokens_match("abc", "abc")
    assert not tokens_match(None, "abc") and not tokens_match("", "abc") and not tokens_match("abd", "abc")


def test_sign_in_attempts_are_limited_per_name_and_per_address() -> None:
    clock = FakeClock()
    limit = SignInLimit(clock)
    for _ in range(FAILURES_PER_NAME):
        assert isinstance(limit.reserve("alice", "10.0.0.1"), Attempt)  # a slot each, taken before the check
    wait = limit.reserve("alice", "10.0.0.9")  # the name is limited from any address
    assert isinstance(wait, int) and 0 < wait <= FAILURE_WINDOW_S + 1
    assert isinstance(limit.reserve("bob", "10.0.0.9"), Attempt)
    clock.advance(FAILURE_WINDOW_S)
    assert isinstance(limit.reserve("alice", "10.0.0.1"), Attempt)
    for i in range(FAILURES_PER_ADDRESS):
        assert isinstance(limit.reserve(f"name{i}", "10.0.0.2"), Attempt)
    assert isinstance(limit.reserve("somebody-new", "10.0.0.2"), int)  # one address trying many names


def test_a_refused_attempt_takes_no_slot_and_an_accepted_one_gives_its_back() -> None:
    limit = SignInLimit(FakeClock())
    attempts = [limit.reserve("carol", "10.0.0.3") for _ in range(FAILURES_PER_NAME)]
    assert all(isinstance(a, Attempt) for a in attempts)
    assert isinstance(limit.reserve("carol", "10.0.0.3"), int)
    accepted = attempts[-1]
    assert isinstance(accepted, Attempt)
    limit.succeeded(accepted)  # the right password: the name's failures are forgotten
    assert isinstance(limit.reserve("carol", "10.0.0.3"), Attempt)
    assert limit._failures["addr:10.0.0.3"].count(accepted.at) == FAILURES_PER_NAME  # 5 failed + 1 new - 1 back


def test_concurrent_attempts_never_take_more_than_the_limit() -> None:
    limit = SignInLimit(FakeClock())
    start = threading.Barrier(30)
    taken: list[object] = []

    def sign_in() -> None:
        start.wait(timeout=30)
        taken.append(limit.reserve("ada", "10.0.0.4"))

    threads = [threading.Thread(target=sign_in) for _ in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(taken) == 30
    assert sum(isinstance(t, Attempt) for t in taken) == FAILURES_PER_NAME


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("127.255.3.9", "loopback"),
        ("::1", "loopback"),
        ("[::1]", "loopback"),
        ("::ffff:127.0.0.7", "loopback"),
        ("10.0.0.1", "10.0.0.1"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("?", "?"),
    ],
)
def test_every_loopback_address_is_one_key(address: str, key: str) -> None:
    assert address_key(address) == key


def test_local_processes_share_the_address_limit() -> None:
    limit = SignInLimit(FakeClock())
    for i in range(FAILURES_PER_ADDRESS):
        assert isinstance(limit.reserve(f"name{i}", f"127.0.0.{i + 2}"), Attempt)
    assert isinstance(limit.reserve("another", "127.9.9.9"), int)
    assert isinstance(limit.reserve("another", "::1"), int)
    assert isinstance(limit.reserve("another", "10.0.0.1"), Attempt)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"])
def test_loopback_needs_no_tls(host: str) -> None:
    assert is_loopback(host)
    check_listen(host, None, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "console.example"])  # noqa: S104
def test_any_other_interface_needs_tls(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(CommandError, match="without TLS"):
        check_listen(host, None, None)
    check_listen(host, "/etc/c.pem", "/etc/k.pem")


def test_tls_is_a_pair() -> None:
    with pytest.raises(CommandError, match="go together"):
        check_listen("127.0.0.1", "/etc/c.pem", None)


def test_the_host_names_a_console_answers_to() -> None:
    assert host_names("127.0.0.1", 8765) == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert host_names("console.example", 443) == {"console.example", "console.example:443"}


def test_a_cards_arguments_are_redacted_and_a_huge_value_is_named_not_stored() -> None:
    stored = json.loads(stored_arguments({"test_path": "tests", "api_key": "s3cret", "nested": {"password": "p"}}))
    assert stored == {"api_key": "[redacted]", "nested": {"password": "[redacted]"}, "test_path": "tests"}
    huge = json.loads(stored_arguments({"x": "a" * (STORED_CHARS + 1)}))
    assert list(huge) == ["(not stored)"] and "sha256" in huge["(not stored)"]
    assert "\x00" not in stored_arguments({"x": "\x00nul"})  # PostgreSQL cannot hold a NUL


def test_a_cards_result_is_the_content_the_client_got_cut_loudly_past_the_limit() -> None:
    link = ResourceLink("mcp-gateway://runs/r1/stdout.txt", "stdout.txt", "text/plain", "stdout of run r1")
    blocks = outcome_content(ToolOutcome("ok", links=(link,)))
    assert blocks == [
        {"type": "text", "text": "ok"},
        {
            "type": "resource_link",
            "uri": "mcp-gateway://runs/r1/stdout.txt",
            "name": "stdout.txt",
            "mimeType": "text/plain",
            "description": "stdout of run r1",
        },
    ]
    (cut,) = outcome_content(ToolOutcome("b" * (STORED_CHARS + 10)))
    assert cut["text"].endswith("]") and "not stored: 10 more characters" in cut["text"]


def test_a_permission_block_shows_the_whole_preview_escaped_and_no_allow_always_for_a_destructive_tool() -> None:
    from gateway.consent.store import PendingRequest
    from gateway.console.pages import question_block
    from gateway.console.views import Viewer

    preview = "\n".join([f"$ rm -rf /tmp/x{i} <script>alert(1)</script>" for i in range(400)] + ["end\u202eline"])
    question = PendingRequest(
        "q-1", 100.0, 160.0, "s", "alice", "default", "mcp-write-gateway", "Bash", "a" * 64, "(none)", "high", True,
        preview=preview,
    )  # fmt: skip
    decider = Viewer("ada", "ADMIN", ("default",), sees_all=True, may_decide=True, csrf="tok")
    html = question_block(words_for("en-US"), decider, question, now=130.0)
    assert "<script>" not in html and html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 400
    assert "end\\u202eline" in html  # escaped as the terminal approver shows it (visible)
    assert "ALLOW_ALWAYS" not in html and ">Allow always<" not in html and "Allow always is not offered" in html
    assert html.count('name="decision"') == 4
    assert 'value="DENY_ONCE" class="default" data-default="1"' in html  # a destructive tool: Deny once first
    assert "Shown whole: " in html and "in 401 lines" in html and "Answer within 30 s" in html
    assert 'name="csrf" value="tok"' in html
    onlooker = Viewer("alice", "USER", ("default",), sees_all=False, may_decide=False, csrf="t2")
    shown = question_block(words_for("en-US"), onlooker, question, now=130.0)
    assert "<button" not in shown and "lacks CONSENT_DECIDE" in shown


def test_the_card_statuses_are_the_ones_the_page_draws_in_its_order() -> None:
    script = (Path(__file__).resolve().parents[2] / "gateway/console/static/console.js").read_text(encoding="utf-8")
    states = re.search(r"const STATES = (\[[^\]]*\]);", script)
    assert states is not None, "console.js names its states"
    assert json.loads(states.group(1)) == [status.value for status in CardStatus]
    assert json.dumps({"status": CardStatus.DONE}) == '{"status": "done"}', "stored and sent as its text"


def test_a_card_is_shown_with_every_text_escaped_and_nothing_lost() -> None:
    card = Card(
        run_id="r1",
        kind="tool",
        created_at=1.0,
        updated_at=2.0,
        user="ada\u202e",
        workspace="default",
        server_id="srv\u200b",
        tool_name="run\u2066pytest",
        arguments={"a\u202eb": "x\u0007", "a\\u202eb": "typed", "n": 3, "ok": True, "none": None, "list": ["\ufeff"]},
        status=CardStatus.DONE,
        code=None,
        reason=None,
        message="m\x85",
        result=[
            {"type": "text", "text": "line\u202e\nnext\x1b[2J"},
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
            {"type": "image", "mimeType": "image/png", "data": "not\u202ebase64"},
        ],
        last_event_id=7,
    )
    shown = shown_card(card)
    assert (shown["user"], shown["server_id"], shown["tool_name"]) == ("ada\\u202e", "srv\\u200b", "run\\u2066pytest")
    assert shown["message"] == "m\\u0085" and shown["reason"] is None and shown["last_event_id"] == 7
    # The agent's own "\u202e" and the character it names both stay: the second is marked, not dropped.
    assert shown["arguments"] == {
        "a\\u202eb": "x\\u0007",
        "a\\u202eb\u2032": "typed",
        "n": 3,
        "ok": True,
        "none": None,
        "list": ["\\ufeff"],
    }
    text, image, not_image = shown["result"]
    assert text["text"] == "line\\u202e\nnext\\u001b[2J"  # lines kept, each escaped
    assert image["data"] == "iVBORw0KGgo=" and not_image["data"] == "not\\u202ebase64"
    assert card.arguments["a\u202eb"] == "x\u0007"  # the card itself is not changed
