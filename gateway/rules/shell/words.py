"""Words as the deny side reads them (decision 41): a literal, a pattern, or not known before it runs.

A reader feeds a `WordBuilder` the pieces of one shell word (characters and whether they were
quoted, and "an expansion here"); the builder applies brace expansion and marks unquoted glob
characters, so that `{rm,-rf,x}` is three words and `/bin/r?` may be `/bin/rm`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter

Char = tuple[str, bool]
"""A character of a word and whether it was quoted (quoted characters are never special).
`EXPANSION`, an empty character, stands where an expansion sits: its value is not known."""
EXPANSION: Char = ("", False)

_MAX_BRACE_WORDS = 64
MAX_BRACE_CHARS = 4096
"""The longest word brace expansion is applied to (each of its words costs the word's length)."""
_OCTAL = re.compile(r"[0-7]{0,2}")
_HEX = {
    "x": re.compile(r"[0-9A-Fa-f]{1,2}"),
    "u": re.compile(r"[0-9A-Fa-f]{1,4}"),
    "U": re.compile(r"[0-9A-Fa-f]{1,8}"),
}
_ESCAPES = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
            "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip


class Unreadable(Exception):
    """A bound of the reading was reached (its message names it): the command is denied unread."""


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a command: `text` is its value as far as it is known (expansions left out)."""

    text: str
    chars: tuple[Char, ...] = ()
    pattern: Glob | None = field(default=None, compare=False)
    """Set when the word holds unquoted glob characters: the values it can take."""
    known: bool = field(init=False, compare=False)
    """False when the word holds an expansion (`$x`, `$(...)`, ...): its value is decided when it runs.
    Set once here: each reading asks it of every word at each wrapper."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "known", EXPANSION not in self.chars)

    def may_be(self, literal: str) -> bool:
        """Whether this word can be `literal` when the command runs (any value, if it holds an expansion)."""
        if not self.known:
            return True
        if self.pattern is not None:
            return self.pattern.fullmatch(literal)
        return self.text == literal

    def may_name(self, program: str) -> bool:
        """Whether this command word can run `program`: a word starting with an expansion names
        no program we can tell; `rm$IFS-rf` may well be `rm`."""
        if self.known:
            return self.may_be(program)
        prefix = "".join(ch for ch, _ in self.chars[: self.chars.index(EXPANSION)])
        return bool(prefix) and program.startswith(prefix)

    def basename(self) -> Word:
        """The word after its last `/`: a command word names its program by its file name."""
        cut = max((i for i, (ch, _) in enumerate(self.chars) if ch == "/"), default=-1)
        if cut < 0 or cut == len(self.chars) - 1:
            return self
        return word_of(self.chars[cut + 1 :])


def literal_word(text: str) -> Word:
    """A word whose every character is quoted: exactly `text`."""
    return word_of(tuple((ch, True) for ch in text))


def word_of(chars: tuple[Char, ...]) -> Word:
    text = "".join(map(itemgetter(0), chars))
    globbing = (
        ("*" in text or "?" in text or "[" in text)  # most words hold none: skip the per-character look
        and EXPANSION not in chars
        and any(ch in "*?[" and not q for ch, q in chars)
    )
    return Word(text, chars, _glob(chars) if globbing else None)


@dataclass(slots=True)
class WordBuilder:
    """Collects one word's pieces in the order a reader meets them."""

    chars: list[Char] = field(default_factory=list)
    started: bool = False

    def add(self, text: str, *, quoted: bool) -> None:
        self.chars.extend(_chars(text, quoted=quoted))
        self.started = True

    def add_unknown(self) -> None:
        self.chars.append(EXPANSION)
        self.started = True

    def take(self) -> list[Word]:
        """The finished word (several after brace expansion; none if nothing was added); resets."""
        if not self.started:
            return []
        chars = tuple(self.chars)
        self.chars, self.started = [], False
        return [word_of(c) for c in expand_braces(chars)]


def unquoted_words(text: str) -> list[Word]:
    """The words a WordBuilder fed only `text`, unquoted, takes: one, or its brace expansion."""
    return [word_of(c) for c in expand_braces(tuple(_chars(text, quoted=False)))]


def _chars(text: str, *, quoted: bool) -> Iterator[Char]:
    """Each character of `text` with `quoted`; an ASCII one as a shared pair (a long command's characters are
    not each a new object for the collector to walk)."""
    if text.isascii():
        return map(_ASCII_CHARS[quoted].__getitem__, text)
    return zip(text, itertools.repeat(quoted))


_ASCII_CHARS = {quoted: {chr(i): (chr(i), quoted) for i in range(128)} for quoted in (False, True)}


def expand_braces(chars: tuple[Char, ...]) -> list[tuple[Char, ...]]:
    """Bash's `a{b,c}d` -> `abd acd` on unquoted braces holding a comma (bounded); else the word as is."""
    out: list[tuple[Char, ...]] = []
    if len(chars) > MAX_BRACE_CHARS and any(c == ("{", False) for c in chars):
        raise Unreadable(f"a word of more than {MAX_BRACE_CHARS} characters holds braces to expand")
    if ("{", False) not in chars or (",", False) not in chars:
        return [chars]  # nothing to expand (the usual word): skip the one-pass look below
    pending = [chars]
    while pending and len(out) + len(pending) <= _MAX_BRACE_WORDS:
        word = pending.pop(0)
        split = _brace_split(word)
        if split is None:
            out.append(word)
        else:
            pending[:0] = split
    return out + pending[: max(0, _MAX_BRACE_WORDS - len(out))]


def _brace_split(word: tuple[Char, ...]) -> list[tuple[Char, ...]] | None:
    """The word's leftmost brace expression holding a comma at its own level, expanded; None if none.
    One pass: each `{` is matched to its `}` on a stack, commas counted at its level."""
    opened: list[tuple[int, list[int]]] = []
    best: tuple[int, list[int], int] | None = None
    for j, (c, quoted) in enumerate(word):
        if quoted:
            continue
        if c == "{":
            opened.append((j, []))
        elif c == "," and opened:
            opened[-1][1].append(j)
        elif c == "}" and opened:
            start, commas = opened.pop()
            if commas and (best is None or start < best[0]):
                best = (start, commas, j)
    if best is None:
        return None
    start, commas, end = best
    bounds = [start, *commas, end]
    head, tail = word[:start], word[end + 1 :]
    return [head + word[a + 1 : b] + tail for a, b in itertools.pairwise(bounds)]


def _glob(chars: tuple[Char, ...]) -> Glob:
    """The values an unquoted pattern may take; a bracket expression is any one character."""
    tokens: list[str | None] = []  # a character, ANY_ONE (`?`, `[...]`), or None (`*`)
    i = 0
    while i < len(chars):
        ch, quoted = chars[i]
        if quoted or ch not in "*?[":
            tokens.append(ch)
        elif ch == "*":
            if not tokens or tokens[-1] is not None:  # `**` is `*`
                tokens.append(None)
        elif ch == "?":
            tokens.append(_ANY_ONE)
        else:
            close = next((j for j in range(i + 2, len(chars)) if chars[j] == ("]", False)), None)
            if close is None:
                tokens.append(ch)
            else:
                tokens.append(_ANY_ONE)
                i = close
        i += 1
    return Glob(tuple(tokens))


_ANY_ONE = "\x00any"
"""A token standing for any one character (never a character itself: it is longer than one)."""


@dataclass(frozen=True, slots=True)
class Glob:
    """A shell pattern, matched without backtracking blow-up (a regex of `.*a.*a...` would be
    exponential in the pattern's stars): the classic two-pointer match, O(len(pattern) * len(text))."""

    tokens: tuple[str | None, ...]

    def fullmatch(self, text: str) -> bool:
        tokens, t, p = self.tokens, 0, 0
        star, mark = -1, 0
        while t < len(text):
            if p < len(tokens) and tokens[p] is not None and (tokens[p] == _ANY_ONE or tokens[p] == text[t]):
                t, p = t + 1, p + 1
            elif p < len(tokens) and tokens[p] is None:
                star, mark, p = p, t, p + 1
            elif star >= 0:
                mark += 1
                t, p = mark, star + 1
            else:
                return False
        while p < len(tokens) and tokens[p] is None:
            p += 1
        return p == len(tokens)


def decode_ansi_c(body: str) -> str:
    """The value of bash's `$'body'`: backslash escapes, octal, hex, unicode and control characters."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        i += 2
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
        elif nxt in "01234567":
            digits = _OCTAL.match(body, i)
            value = nxt + (digits.group() if digits else "")
            out.append(chr(int(value, 8) & 0xFF))
            i += len(value) - 1
        elif nxt in "xuU":
            digits = _HEX[nxt].match(body, i)
            if digits is None:
                out.append("\\" + nxt)
            else:
                out.append(chr(min(int(digits.group(), 16), 0x10FFFF)))
                i += len(digits.group())
        elif nxt == "c" and i < len(body):
            out.append(chr(ord(body[i]) & 0x1F))
            i += 1
        else:
            out.append("\\" + nxt)
    return "".join(out)


@dataclass(slots=True)
class SimpleCommand:
    """A simple command as a reader found it: its words (assignments and redirections left out),
    the text that reaches its standard input where that is written in the command (a here-document,
    a here-string), and the command piped into it, if any."""

    words: list[Word]
    stdin: list[str] = field(default_factory=list)
    piped_from: SimpleCommand | None = None
    ends_compound: bool = False
    """The end of a group, subshell, loop or `if` as the lexer reads it (`} <<< x`, `) <<< x`, `done < <(...)`):
    its input is the compound's, which the commands inside may read and write on."""
