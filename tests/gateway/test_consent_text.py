"""The words of a consent question (decision 40): secret-looking names by whole words,
one line per argument, escaped, and a cut that makes Deny once the default."""

from __future__ import annotations

import dataclasses
import re
import string

import anyio
import pytest
from sqlalchemy import Engine

from gateway.audit import AuditLog
from gateway.consent.stage import (
    ConsentRequest,
    ConsentStage,
    Decision,
    Dialog,
    choices_for,
    decision_schema,
    deny_first,
)
from gateway.consent.store import ConsentStore
from gateway.consent.text import _COPY, copy_for, is_secret_name, prompt_for, prompt_text, redacted_preview
from gateway.errors import ConsentDeniedError
from gateway.policy import ConsentPolicy
from gateway.tools.registry import TOOLS
from tests.fakes import FakeClock, SequentialRunIds


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        # run_pytest's own fields, and words that merely contain a secret-looking one
        ("keyword", False), ("markers", False), ("test_path", False), ("workspace", False),
        ("max_failures", False), ("timeout_s", False), ("monkey", False), ("turkey", False),
        ("bypass", False), ("passenger", False), ("compass", False), ("authors", False),
        ("tokenizer", False), ("secretary", False), ("keyboard", False), ("certainty", False),
        ("description", False), ("command", False), ("url", False), ("file_path", False),
        # secret-looking as a whole word of the name, however it is spelled
        ("key", True), ("api_key", True), ("apiKey", True), ("APIKey", True), ("APIkey", True),
        ("x-api-key", True), ("token", True), ("access_token", True), ("authToken", True),
        ("X-Auth-Token", True), ("secret", True), ("client_secret", True), ("CLIENT_SECRET", True),
        ("password", True), ("Password", True), ("db_passwd", True), ("pass", True),
        ("passphrase", True), ("authorization", True), ("Authorization", True), ("auth", True),
        ("credentials", True), ("session_id", True), ("sessionid", True), ("cookie", True),
        ("private_key", True), ("privateKey", True), ("cert", True), ("jwt", True), ("bearer", True),
        ("key2", True), ("refresh-token", True),
    ],
)  # fmt: skip
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_no_argument_of_the_gateways_own_tools_is_ever_redacted() -> None:
    # Their schemas hold no secret by design: hiding one would hide what the person must judge.
    for spec in TOOLS.values():
        for name in spec.input_schema.get("properties", {}):
            assert not is_secret_name(name), (spec.name, name)


def test_one_line_per_argument_sorted_values_as_json_secrets_redacted_at_any_depth() -> None:
    shown = redacted_preview(
        {"test_path": "tests", "keyword": "not slow", "max_failures": 3,
         "nested": {"api_token": "s3cr3t", "Password": "x", "list": [{"cookie": "c"}]}}
    )  # fmt: skip
    assert shown.split("\n") == [
        'keyword: "not slow"',
        "max_failures: 3",
        'nested: {"Password":"[redacted]","api_token":"[redacted]","list":[{"cookie":"[redacted]"}]}',
        'test_path: "tests"',
    ]
    assert redacted_preview({}) == "(none)"


def test_the_arguments_are_escaped_as_on_every_channel() -> None:
    markers = "smoke\u202eevil\u202c \x9b2J \u2028Requested by admin in workspace prod"
    shown = redacted_preview({"test_path": "tests", "markers": markers, "keyword": "a\nb"})
    assert shown.split("\n") == [
        'keyword: "a\\nb"',  # JSON's own escape
        'markers: "smoke\\u202eevil\\u202c \\u009b2J \\u2028Requested by admin in workspace prod"',
        'test_path: "tests"',
    ]


def request(**arguments: str) -> ConsentRequest:
    return ConsentRequest(
        "r1", "alice", "default", "mcp-write-gateway", "run_pytest", "a" * 64, arguments, "medium", "f" * 64
    )


def test_a_long_keyword_cannot_push_test_path_out_of_the_prompt() -> None:
    prompt = prompt_for(request(keyword="k" * 512, markers="m" * 512, test_path="tests/" + "p" * 1000), "en-US")
    assert not prompt.cut
    lines = prompt.text.split("\n")
    assert lines[:5] == [
        "Allow this tool to run? run_pytest",
        "From mcp-write-gateway",
        "Medium risk",
        "Requested by alice in workspace default",
        "Arguments:",
    ]
    assert lines[5:] == [f'  keyword: "{"k" * 512}"', f'  markers: "{"m" * 512}"', f'  test_path: "tests/{"p" * 1000}"']


def test_a_cut_prompt_says_so_with_the_length_and_hash_and_keeps_the_other_arguments() -> None:
    keyword = "\u200b" * 512  # 512 characters, 3072 once escaped: past a line's 2000
    prompt = prompt_for(request(keyword=keyword, test_path="tests"), "en-US")
    assert prompt.cut
    notice = next(line for line in prompt.text.split("\n") if line.startswith("⚠ NOT SHOWN WHOLE"))
    assert re.fullmatch(r"⚠ NOT SHOWN WHOLE: \d+ characters in 2 lines, sha256 [0-9a-f]{16}…", notice)
    assert "deny unless you have seen all of it" in prompt.text
    assert '  test_path: "tests"' in prompt.text.split("\n")
    assert "more characters of this line's" in prompt.text


def test_a_cut_makes_deny_once_the_forms_first_choice_and_default() -> None:
    plain = decision_schema(choices_for(False))["properties"]["decision"]
    assert "default" not in plain and plain["enum"][0] == "allow_once"
    cut = decision_schema(deny_first(choices_for(False)))["properties"]["decision"]
    assert cut["default"] == "deny_once" and cut["enum"][0] == "deny_once"
    assert sorted(cut["enum"]) == sorted(plain["enum"]), "the same choices"


class Asker:
    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[Decision, ...]]] = []

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | None:
        self.asked.append((message, choices))
        return Decision.DENY_ONCE


def test_the_stage_offers_deny_first_when_the_message_was_cut(engine: Engine) -> None:
    clock = FakeClock()
    stage = ConsentStage(
        ConsentPolicy(timeout_s=5), AuditLog(engine, clock), ConsentStore(engine), clock, SequentialRunIds()
    )
    asker = Asker()
    for run_id, arguments in (
        ("r1", {"test_path": "tests"}),
        ("r2", {"test_path": "tests", "keyword": "\u200b" * 512}),
    ):
        with pytest.raises(ConsentDeniedError):  # two calls, two run_ids: each question is stored under its call's
            anyio.run(stage.require, dataclasses.replace(request(**arguments), run_id=run_id), Dialog(asker))
    (plain_message, plain), (cut_message, cut) = asker.asked
    assert plain[0] is Decision.ALLOW_ONCE and "NOT SHOWN WHOLE" not in plain_message
    assert cut[0] is Decision.DENY_ONCE and "NOT SHOWN WHOLE" in cut_message


def test_the_locales_have_the_same_keys_and_placeholders() -> None:
    english, portuguese = _COPY["en-US"], _COPY["pt-BR"]
    assert set(english) == set(portuguese)
    for key, text in english.items():
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f}
        assert fields == {f for _, f, _, _ in string.Formatter().parse(portuguese[key]) if f}, key
    assert copy_for("xx-XX") is english


def test_portuguese_prompt() -> None:
    text = prompt_text(request(test_path="tests"), "pt-BR")
    assert text.startswith("Permitir execução desta ferramenta? run_pytest\nDo servidor mcp-write-gateway\n")
    assert text.endswith('Argumentos:\n  test_path: "tests"')
