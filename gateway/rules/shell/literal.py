"""The allow side of Bash rules (decision 41): commands made only of plain commands of literal words.

An allow rule may allow a part only if the shell runs it exactly as written: a command word
followed by literal words, nothing expanded, redirected, defined or grouped. This module
decides that with a whitelist, so that soundness is easy to check by reading it:

- outside quotes, only ASCII letters and digits and `-_./:,+@%=`. None of these starts an
  expansion, a redirection, a pattern or a group in bash, sh/dash or zsh (`=` is the exception
  in two places, both refused below: before the command word it makes an assignment, and at
  the start of a word zsh expands `=cmd` to a path);
- single-quoted text, `'...'`, of printable characters: literal in every shell (no escapes at
  all inside; history expansion never looks inside single quotes);
- double-quoted text, `"..."`, of printable characters other than `$`, backtick, `\\`, `"` and
  `!`: with those gone nothing inside is special in any of the shells;
- words separated by spaces or tabs; parts by `;`, `&&`, `||`, `|` and newlines.

Everything else makes the whole command ineligible: `$` (every expansion, `$'...'` and `$"..."`
quoting included), backticks, `(`, `)`, `{`, `}`, `<`, `>`, `&` alone, `*`, `?`, `[`, `]`, `~`,
`!`, `#`, `\\`, `^`, carriage returns, NUL and every other control character, and every
non-ASCII character outside quotes (look-alike quotes and blanks among them). So are a
command word holding `=` (an assignment), a reserved word in command position (`if`, `then`,
`time`, `coproc`, `function`, ...), a builtin that changes how later words are read or which
program a name runs (`alias`, `export`, `set`, `source`, `eval`, ...) or that runs code
(gateway/rules/shell/code_builtins.py: `mapfile -C`, `compgen -C`, `jobs -x`, ...), also behind a wrapper
(`command eval`), a word holding `$(` or a backtick even quoted (an array subscript runs it:
`printf -v 'a[$(rm x)]'`), an assignment to a variable the shell runs (`PS4=`, `PROMPT_COMMAND=`,
`BASH_ENV=`), and a command with no part at all.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from gateway.rules.shell.code_builtins import CODE_BUILTINS, assigns_code_variable
from gateway.rules.shell.wrappers import SHELLS, WRAPPERS

BARE = frozenset(string.ascii_letters + string.digits + "-_./:,+@%=")
"""What a word may hold outside quotes."""
_NOT_IN_DOUBLE_QUOTES = frozenset('$`\\"!')
_BLANKS = " \t"
_TOKENS = re.compile(r"[\s;&|()`]+")

RESERVED_WORDS = frozenset(
    ("!", "[[", "]]", "{", "}", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for",
     "function", "if", "in", "select", "then", "time", "until", "while", "repeat", "foreach", "end",
     "nocorrect", "noglob")
)  # fmt: skip
"""Reserved words of bash, ksh and zsh (and zsh's precommand modifiers): in command position they
change what the words after them mean."""
DEFINING_BUILTINS = frozenset(
    ("alias", "unalias", "hash", "enable", "shopt", "set", "setopt", "unsetopt", "emulate", "export",
     "declare", "typeset", "local", "readonly", "integer", "float", "unset", "source", ".", "eval",
     "trap", "bind", "fc", "autoload", "zmodload")
)  # fmt: skip
"""Builtins that define aliases, functions, variables or options, or run words as code: what the
next part means would depend on them."""


@dataclass(frozen=True, slots=True)
class LiteralCommand:
    """One part of an allow-eligible command: its words as written (quotes kept)."""

    words: tuple[str, ...]

    @property
    def text(self) -> str:
        """The words joined by one space: what allow rules are matched against."""
        return " ".join(self.words)

    @property
    def argv(self) -> tuple[str, ...]:
        """The words as the program receives them: each quoted span stands for its content."""
        return tuple(_unquoted(w) for w in self.words)


def literal_commands(command: str) -> tuple[LiteralCommand, ...] | None:
    """The parts of `command` if every one is a plain command of literal words, else None."""
    parts: list[LiteralCommand] = []
    words: list[str] = []
    word: list[str] = []
    i, n = 0, len(command)

    def end_word() -> None:
        if word:
            words.append("".join(word))
            word.clear()

    def end_part() -> bool:
        end_word()
        if words:
            if not _is_plain(words):
                return False
            parts.append(LiteralCommand(tuple(words)))
            words.clear()
        return True

    while i < n:
        c = command[i]
        if c in _BLANKS:
            end_word()
            i += 1
        elif c in ";\n" or command.startswith(("&&", "||"), i):
            # An empty part (`; ;`, a blank line) is a syntax error or nothing: either way it
            # cannot make the shell run a word that is not in some part.
            if not end_part():
                return None
            i += 2 if c in "&|" else 1
        elif c == "|":
            if not end_part():
                return None
            i += 1
        elif c in "'\"":
            close = command.find(c, i + 1)
            if close < 0 or not _quotable(command[i + 1 : close], double=c == '"'):
                return None
            word.append(command[i : close + 1])
            i = close + 1
        elif c in BARE:
            word.append(c)
            i += 1
        else:
            return None
    if not end_part() or not parts:
        return None
    return tuple(parts)


def _quotable(text: str, *, double: bool) -> bool:
    if not text.isprintable():  # no control, format or line-separator character, no NUL
        return False
    return not (double and any(ch in _NOT_IN_DOUBLE_QUOTES for ch in text))


def _is_plain(words: list[str]) -> bool:
    first = words[0]
    if "=" in first or _unquoted(first) in RESERVED_WORDS | DEFINING_BUILTINS | CODE_BUILTINS.keys():
        return False
    if any(w.startswith("=") for w in words):
        return False
    values = [_unquoted(w) for w in words]
    if any("$(" in v or "`" in v or assigns_code_variable(v) for v in values):
        return False  # `printf -v 'a[$(rm x)]'`, `env PS4='...'`: code, whichever program is given it
    # `command eval ...`, `sudo -u x source f`, `bash -c 'mapfile -C ...'`: a wrapper or a shell runs
    # the builtin it names, also inside a string it is given
    if values[0] not in WRAPPERS and values[0] not in SHELLS:
        return True
    return not any(t in DEFINING_BUILTINS or t in CODE_BUILTINS for v in values[1:] for t in _TOKENS.split(v))


def _unquoted(word: str) -> str:
    """The word's value: each quoted span stands for its content (no escapes exist in an eligible word)."""
    return re.sub(r"'([^']*)'|\"([^\"]*)\"", lambda m: m.group(1) or m.group(2) or "", word)
