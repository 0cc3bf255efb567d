"""What a person is shown of a request, on every channel (decision 40): every character
visibly printing, and every cut explicit.

`visible` is the one escaping of the elicitation message, the terminal approver, the questions
stored for it, `consent list`, `policy explain` and every page of the web console
(gateway/console/shown.py). A character is shown as itself only when it
prints a glyph of its own: a letter, mark, number, punctuation or symbol (Unicode categories L,
M, N, P, S) that is not drawn blank (`BLANK`). Everything else is written `\\uXXXX` (or
`\\UXXXXXXXX` past the BMP): controls (C0, C1, DEL), format characters (bidi overrides, zero
widths, tags), surrogates, private use, unassigned code points, and every space but U+0020
(tabs, no-break and wide spaces, line and paragraph separators). A run of spaces is written
`\u2420\u00d7N` (the symbol for space, a multiplication sign, the count), except a line's indentation (at most `INDENT_MAX`, at its start or after a one-character
diff or prompt marker), so that no gap can push a payload out of sight. At most `MAX_MARKS`
combining marks in a row are kept (more can draw over the lines around them).

`visible` is idempotent: what it returns it returns unchanged, so text escaped when it is stored
is escaped again, harmlessly, when it is shown. The price: an escape the agent typed literally
(`\\u202e`, `\u2420\u00d79`) looks like one the gateway wrote. That can only make a request look stranger,
never hide a character (decision 40).

`storable` is narrower: it escapes, the same way, only what no database text column can hold
(NUL, lone surrogates), for every text the consent path stores whatever escaped it before.

`excerpt` cuts what is too long to show at once, loudly: each cut line says how much of it is
hidden, the end says how many lines are, and the `Excerpt` carries the whole's length and
sha256 for the channel's notice and its way to see all of it.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.canonical import sha256_hex

MAX_LINES = 200
MAX_LINE_CHARS = 2000
"""Long enough for any `run_pytest` argument whole (test_path: at most 1024 characters)."""
INDENT_MAX = 32
MAX_MARKS = 4
DIGEST_CHARS = 16
SPACE_RUN = "\u2420\u00d7{n}"

_PRINTING = frozenset("LMNPS")
_BLANK_RANGES: tuple[tuple[int, int], ...] = (
    # Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) outside the categories escaped anyway:
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),  # khmer inherent vowels
    (0x180B, 0x180F),  # mongolian free variation selectors (and the vowel separator)
    (0x3164, 0x3164),  # hangul filler
    (0xFE00, 0xFE0F),  # variation selectors 1-16
    (0xFFA0, 0xFFA0),  # halfwidth hangul filler
    (0xE0000, 0xE0FFF),  # tags, variation selectors 17-256
    # Printing by category, drawn as nothing:
    (0x2800, 0x2800),  # braille pattern blank
    (0x16FE4, 0x16FE4),  # khitan small script filler
    (0x1D159, 0x1D159),  # musical symbol null notehead
)
"""Characters of a printing category that draw nothing: escaped like any invisible character."""

_SPACES = re.compile(" {2,}")
_TOKEN = re.compile(r"\\u[0-9a-f]{4}|\\U[0-9a-f]{8}|\u2420\u00d7\d+")
_MARKERS = frozenset("+-$>")
"""Characters a line of a preview starts with before its indentation (a diff's, a command's)."""


def is_blank(code_point: int) -> bool:
    return any(low <= code_point <= high for low, high in _BLANK_RANGES)


def prints(ch: str) -> bool:
    """Whether `ch` is shown as itself: a glyph of a printing category that is not drawn blank."""
    return unicodedata.category(ch)[0] in _PRINTING and not is_blank(ord(ch))


def escape(ch: str) -> str:
    code_point = ord(ch)
    return f"\\u{code_point:04x}" if code_point <= 0xFFFF else f"\\U{code_point:08x}"


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""What no text column holds: NUL (PostgreSQL refuses it) and lone surrogates (not UTF-8)."""


def storable(text: str) -> str:
    """`text` with what a database text column cannot hold (NUL, lone surrogates) escaped as `visible`
    escapes it, and nothing else changed: the last guard of every text the consent path stores."""
    return _UNSTORABLE.sub(lambda match: escape(match.group()), text)


def visible(text: str, *, lines: bool = False) -> str:
    """`text` with every character that does not visibly print escaped; newlines kept only with `lines`."""
    if not lines:
        return _line(text)
    return "\n".join(_line(line) for line in text.split("\n"))


def _line(line: str) -> str:
    parts: list[str] = []
    pos = 0
    for run in _SPACES.finditer(line):
        parts.append(_glyphs(line[pos : run.start()]))
        width = run.end() - run.start()
        indent = run.start() == 0 or (run.start() == 1 and line[0] in _MARKERS)
        parts.append(run.group() if indent and width <= INDENT_MAX else SPACE_RUN.format(n=width))
        pos = run.end()
    parts.append(_glyphs(line[pos:]))
    return "".join(parts)


def _glyphs(text: str) -> str:
    if text.isascii() and text.isprintable():  # U+0020-U+007E all print as themselves: the common case, fast
        return text
    return _hidden().sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    run = match.group("marks")
    if run is None:
        hidden = match.group()
        return escape(hidden) if len(hidden) == 1 else _escape_all(hidden)  # one: the codec's set-up costs more
    kept = "".join(ch if prints(ch) else escape(ch) for ch in run[:MAX_MARKS])
    return kept + "".join(escape(ch) for ch in run[MAX_MARKS:])


_CODEC_SPELLINGS = (("\\x", "\\u00"), ("\\t", "\\u0009"), ("\\n", "\\u000a"), ("\\r", "\\u000d"))
"""How Python's unicode_escape codec writes a character below U+0100, and how `escape` does."""


def _escape_all(run: str) -> str:
    """Each character of `run`, a run of characters that do not print, written as `escape` writes it.

    Python's unicode_escape codec does it in C, ten times faster than one `escape` call each (a
    hostile text may be a megabyte of them). It writes `escape`'s own spelling for every character
    from U+0100, and since `run` holds neither U+0020-U+007E nor the backslash (they print), every
    backslash it writes starts an escape: only the shorter spellings below U+0100 are rewritten (decision 110)."""
    escaped = run.encode("unicode_escape").decode("ascii")
    for theirs, ours in _CODEC_SPELLINGS:
        escaped = escaped.replace(theirs, ours)
    return escaped


_ASSIGNED_PLANES = ((0x0, 0x3FFFF), (0xE0000, 0xEFFFF))
"""Planes 0-3 and 14: every character that prints is in them."""
_UNASSIGNED_PLANES = [(0x40000, 0xDFFFF), (0xF0000, 0x10FFFF)]
"""Planes 4-13 (unassigned) and 15-16 (private use): nothing in them prints, so all of them is
escaped (tests/gateway/test_visible.py checks every code point against `prints`)."""


@functools.cache
def _hidden() -> re.Pattern[str]:
    """One pattern for what `_glyphs` escapes: a run of more than `MAX_MARKS` combining marks (the
    marks past the limit), one combining mark that does not print (`prints`), or a run of other
    characters that do not print, U+0020 aside (escaped at once by `_escape_all`).

    The marks' branch starts with one mark, then asks for `MAX_MARKS` more or for that mark to be
    one that does not print (a lookbehind): a character that is not a mark is tested against two
    classes, not three. Built from `unicodedata` once, on first use (about 0.1 s), so that escaping
    is a scan in C: 256 KiB of non-ASCII text is escaped in milliseconds, not a second."""
    blank = frozenset(cp for low, high in _BLANK_RANGES for cp in range(low, high + 1))
    hidden: list[tuple[int, int]] = []
    hidden_marks: list[tuple[int, int]] = []
    marks: list[tuple[int, int]] = []
    category = unicodedata.category
    for low, high in _ASSIGNED_PLANES:
        for code_point in range(low, high + 1):
            kind = category(chr(code_point))[0]
            if kind == "M":
                _extend(marks, code_point)
            if (kind not in _PRINTING or code_point in blank) and code_point != 0x20:
                _extend(hidden_marks if kind == "M" else hidden, code_point)
    hidden[:0] = _UNASSIGNED_PLANES  # first: `re` tries a class's astral ranges in order, and these are most of them
    mark = _char_class(marks)
    more_marks = f"(?:{mark}{{{MAX_MARKS},}}|(?<={_char_class(hidden_marks)}))"
    return re.compile(f"(?P<marks>{mark}{more_marks})|(?:{_char_class(hidden, each='+')})+")


def _extend(ranges: list[tuple[int, int]], code_point: int) -> None:
    if ranges and ranges[-1][1] == code_point - 1:
        ranges[-1] = (ranges[-1][0], code_point)
    else:
        ranges.append((code_point, code_point))


def _char_class(ranges: list[tuple[int, int]], each: str = "") -> str:
    """A class matching `ranges`: its BMP part alone (which `re` compiles to a bitmap), and the rest
    only after a one-range test, so that a BMP character is never checked against a list of ranges.
    `each` repeats each part (a run of one class is a loop in C, not a group's repetition)."""
    bmp = [(low, min(high, 0xFFFF)) for low, high in ranges if low <= 0xFFFF]
    astral = [(max(low, 0x10000), high) for low, high in ranges if high > 0xFFFF]

    def members(part: list[tuple[int, int]]) -> str:
        return "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in part)

    return f"(?:[{members(bmp)}]{each}|(?=[\\U00010000-\\U0010ffff])[{members(astral)}]{each})"


# --- cutting -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Excerpt:
    """What is shown of a text, and what a notice needs to say about the rest."""

    text: str
    cut: bool
    chars: int
    """The whole text's length, in characters."""
    lines: int
    sha256: str
    """Of the whole text (UTF-8): the same whatever shows it, and where it is shown in full."""

    @property
    def digest(self) -> str:
        return self.sha256[:DIGEST_CHARS]


def excerpt(
    whole: str, copy: Mapping[str, str], max_lines: int = MAX_LINES, max_line_chars: int = MAX_LINE_CHARS
) -> Excerpt:
    """At most `max_lines` lines of at most `max_line_chars` characters of `whole`, each cut marked
    with `copy["cut_line"]` (`{hidden}`, `{total}`) and lines left out with `copy["cut_lines"]`
    (`{hidden}`, `{total}`). `whole` is shown text already (`visible`): an escape is never split."""
    lines = whole.split("\n")
    kept: list[str] = []
    cut = len(lines) > max_lines
    for line in lines[:max_lines]:
        if len(line) <= max_line_chars:
            kept.append(line)
            continue
        cut = True
        at = _boundary(line, max_line_chars)
        kept.append(line[:at] + " " + copy["cut_line"].format(hidden=len(line) - at, total=len(line)))
    if len(lines) > max_lines:
        kept.append(copy["cut_lines"].format(hidden=len(lines) - max_lines, total=len(lines)))
    return Excerpt("\n".join(kept), cut, len(whole), len(lines), sha256_hex(whole))


def _boundary(line: str, at: int) -> int:
    """`at`, moved back to the start of an escape or space run it would split."""
    for token in _TOKEN.finditer(line, max(0, at - 16), at + 16):
        if token.start() < at < token.end():
            return token.start()
    return at
