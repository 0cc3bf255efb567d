"""The allow side's whitelist lexer (gateway/rules/shell/literal.py), character by character."""

from __future__ import annotations

import string

import pytest

from gateway.rules.shell.literal import BARE, DEFINING_BUILTINS, RESERVED_WORDS, literal_commands


def argvs(command: str) -> list[tuple[str, ...]] | None:
    parts = literal_commands(command)
    return None if parts is None else [p.argv for p in parts]


@pytest.mark.parametrize("char", sorted(BARE - {"="}))
def test_every_whitelisted_character_is_literal_anywhere_in_a_word(char: str) -> None:
    assert argvs(f"prog a{char}b {char}") == [("prog", f"a{char}b", char)]


@pytest.mark.parametrize(
    "char",
    [chr(c) for c in range(0x80) if chr(c) not in BARE | set(string.ascii_letters + string.digits + " \t\n;|&'\"")],
)
def test_every_other_ascii_character_outside_quotes_makes_the_command_ineligible(char: str) -> None:
    assert literal_commands(f"prog a{char}b") is None


@pytest.mark.parametrize("char", ["\u00e9", "\u2018", "\u00a0", "\u3164", "\uff1b", "\u037e"])
def test_non_ascii_outside_quotes_is_ineligible(char: str) -> None:
    assert literal_commands(f"prog a{char}b") is None


@pytest.mark.parametrize(
    ("command", "wanted"),
    [
        ("prog 'a $x \\z * ~ ! # ; && ( ) { } \"'", [("prog", 'a $x \\z * ~ ! # ; && ( ) { } "')]),
        ('prog "a \' * ~ # ; ( ) { } < >"', [("prog", "a ' * ~ # ; ( ) { } < >")]),
        ("prog a'b'\"c\"d", [("prog", "abcd")]),
        ("prog '' \"\"", [("prog", "", "")]),
        ("prog 'é ✓ \u3164'", [("prog", "é ✓ \u3164")]),  # printable: literal to every shell (shown escaped elsewhere)
        ("a;b&&c||d|e\nf", [("a",), ("b",), ("c",), ("d",), ("e",), ("f",)]),
        ("a ; ; b", [("a",), ("b",)]),  # an empty part runs nothing
        ("a -x=1 k=v", [("a", "-x=1", "k=v")]),  # `=` after the command word is literal
    ],
)
def test_eligible_commands_and_their_words(command: str, wanted: list[tuple[str, ...]]) -> None:
    assert argvs(command) == wanted


@pytest.mark.parametrize(
    "command",
    [
        'prog "$x"', 'prog "`x`"', 'prog "\\x"', 'prog "!x"', 'prog "a',  # specials in double quotes
        "prog 'a\tb'", "prog 'a\nb'", "prog 'a\rb'", "prog 'a\x00b'", "prog 'a\u202eb'", "prog 'a\u2028b'",
        "prog 'a", "FOO=1 prog", "'A=1' prog", "prog =x", "prog &", "prog |& x", "", " ; ",
    ],
)  # fmt: skip
def test_ineligible_quoting_assignments_and_operators(command: str) -> None:
    assert literal_commands(command) is None


@pytest.mark.parametrize("word", sorted(RESERVED_WORDS | DEFINING_BUILTINS))
def test_reserved_words_and_defining_builtins_are_never_a_plain_command(word: str) -> None:
    assert literal_commands(f"{word} x") is None
    assert literal_commands(f"prog; '{word}' x") is None
    if set(word) <= BARE:
        assert argvs(f"prog {word}") == [("prog", word)]  # as an argument it is a plain word
