"""The deny and ask side of Bash rules (spec section 9): every program a command runs that can be read.

A command is read twice, by tree-sitter-bash (`tree`) and by our own lexer (`lexer`), both
with and without its line continuations; every simple command either finds is then seen
through: assignments and reserved words before it dropped, its command word cut to the
program's file name (`/bin/rm`, `./rm` are `rm`), wrappers unwrapped (`env`, `sudo`, `nice`,
`timeout`, `xargs`, `find -exec`, `busybox`, ...), and the text that shells, `eval`, `trap`,
`su -c`, `watch`, here-documents and pipes into a shell will run read as commands in turn, to
a bounded depth. A literal word holding `$(` or a backtick is read too: arithmetic, `eval` or
indirection can run it (`${x:=$'a[\\x24(rm)]'} $[x]`).

A deny or ask rule applies if it matches any invocation, so what one reader misses the other
may still catch. `Reading.complete` is False when a bound was hit or tree-sitter found an
error: such a command is never allowed by a rule.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.shell import lexer, tree
from gateway.shell.words import SimpleCommand, Word, decode_ansi_c
from gateway.shell.wrappers import SHELLS, inner_commands, is_assignment, shell_command

MAX_DEPTH = 8
"""How deep texts inside texts are read (`bash -c "eval '...'"`): past it the reading is incomplete."""
MAX_TEXTS = 256
MAX_INVOCATIONS = 2048
_SEPARATORS = re.compile(r"\s*(?:&&|\|\||;|\||&|\n)\s*")
_SKIPPED = frozenset({"{", "}", "(", ")", "!", "then", "do", "else", "elif", "if", "while", "until", "fi", "done",
                      "esac", "nocorrect", "noglob"})  # fmt: skip
_NOT_COMMANDS = frozenset({"for", "select", "case", "in", "[[", "]]", "((", "))"})
_SUBSTITUTIONS = ("$(", "`", "<(", ">(")


@dataclass(frozen=True, slots=True)
class Invocation:
    """A program the command runs: `words[0]` is its file name, `path` the command word as written."""

    words: tuple[Word, ...]
    path: Word

    @property
    def text(self) -> str:
        return " ".join(w.text if w.known else "?" for w in self.words)

    def starts_with(self, rule_words: Sequence[str]) -> bool:
        """Whether its words may begin with `rule_words` (`Bash(rm -rf:*)`)."""
        return self._matches(rule_words, whole=False)

    def equals(self, rule_words: Sequence[str]) -> bool:
        """Whether its words may be exactly `rule_words` (`Bash(git status)`)."""
        return self._matches(rule_words, whole=True)

    def fits(self, pattern: str) -> bool:
        """Whether its words, joined by one space, match the glob `pattern` (`Bash(npm run *)`)."""
        rest = [w.text if w.known else "?" for w in self.words[1:]]
        return any(fnmatch.fnmatchcase(" ".join((first.text, *rest)), pattern) for first in (self.words[0], self.path))

    def _matches(self, rule_words: Sequence[str], *, whole: bool) -> bool:
        if not rule_words or not (self.words[0].may_name(rule_words[0]) or self.path.may_name(rule_words[0])):
            return False
        for word, wanted in zip(self.words[1:], rule_words[1:], strict=False):
            if not word.known:
                return True  # it may expand to anything, several words included
            if not word.may_be(wanted):
                return False
        if len(self.words) < len(rule_words):
            return False
        return not whole or len(self.words) == len(rule_words)


@dataclass(frozen=True, slots=True)
class Reading:
    invocations: tuple[Invocation, ...]
    parts: tuple[str, ...]
    """The text cut at its separators, blanks kept: the old, plain reading, matched by deny and ask
    rules where the reading is incomplete."""
    complete: bool


def read_invocations(command: str) -> Reading:
    """Every program `command` runs that the gateway can read (see the module's docstring)."""
    reader = _Reader()
    reader.read(command, 0)
    parts = tuple(p.strip() for p in _SEPARATORS.split(command) if p.strip())
    return Reading(tuple(reader.found.values()), parts, reader.complete)


class _Reader:
    def __init__(self) -> None:
        self.found: dict[tuple[object, ...], Invocation] = {}
        self.complete = True
        self.texts = 0
        self.seen: dict[str, int] = {}

    def read(self, text: str, depth: int) -> None:
        if text in self.seen and self.seen[text] <= depth:
            return  # both readers hand over the same texts: read each once
        if depth > MAX_DEPTH or self.texts >= MAX_TEXTS:
            self.complete = False
            return
        self.seen[text] = depth
        self.texts += 1
        commands: list[SimpleCommand] = []
        for variant in dict.fromkeys((text, text.replace("\\\n", ""))):
            found, nested, clean = self.parse(variant)
            self.complete = self.complete and clean
            commands += found
            for body in nested:
                self.read(body, depth + 1)
        for found_command in commands:
            self.command(found_command, depth)

    def parse(self, text: str) -> tuple[list[SimpleCommand], list[str], bool]:
        """Both readers over `text`: the simple commands, substitution bodies still to read, and
        whether tree-sitter read it without an error."""
        try:
            parsed, clean = tree.parse(text)
        except Exception:  # a reader's failure must not become an allow: the reading is incomplete
            parsed, clean = [], False
        lexed, nested = lexer.lex(text)
        return parsed + lexed, nested, clean

    def command(self, found: SimpleCommand, depth: int) -> None:
        work = _stripped(found.words)
        while work:
            if len(self.found) >= MAX_INVOCATIONS:
                self.complete = False
                return
            words = work.pop()
            name = words[0].basename()
            invocation = Invocation((name, *words[1:]), words[0])
            self.found.setdefault(_key(invocation), invocation)
            for word in words:
                if word.known and any(s in word.text for s in _SUBSTITUTIONS):
                    self.read(word.text, depth + 1)
            if not name.known:
                continue
            inner, texts = inner_commands(name.text, words[1:])
            work += [w for c in inner for w in _stripped(c)]
            reads_stdin = name.text in SHELLS and shell_command(words[1:]) is None
            reads_stdin = reads_stdin or (
                name.text in ("source", ".") and [w.text for w in words[1:2]] == ["/dev/stdin"]
            )
            if reads_stdin:
                texts += found.stdin + (_output(found.piped_from) if found.piped_from else [])
            for text in texts:
                self.read(text, depth + 1)


def _stripped(words: Sequence[Word]) -> list[list[Word]]:
    """The words from the command word on: assignments and reserved words before it dropped
    (`coproc NAME cmd` is read both with and without NAME)."""
    out, pending = [], [list(words)]
    while pending:
        rest = pending.pop()
        while rest:
            head = rest[0].text if rest[0].known else None
            if is_assignment(rest[0]) or head in _SKIPPED:
                rest = rest[1:]
            elif head == "function":
                rest = rest[2:]
            elif head == "coproc":
                pending.append(rest[2:])
                rest = rest[1:]
            elif head in _NOT_COMMANDS:
                rest = []
            else:
                break
        if rest:
            out.append(rest)
    return out


def _output(command: SimpleCommand) -> list[str]:
    """What `echo`, `printf` or a bare `cat` (of its here-document) piped into a shell write."""
    if not command.words:
        return []
    program, args = command.words[0].basename().text, [w.text for w in command.words[1:]]
    if program == "echo":
        while args and args[0] in ("-n", "-e", "-E", "-ne", "-en"):
            args = args[1:]
        joined = " ".join(args)
        return [joined, decode_ansi_c(joined)]
    if program == "printf" and args:
        return [" ".join(args), decode_ansi_c(args[0])]
    if program == "cat" and not args:
        return list(command.stdin)
    return []


def _key(invocation: Invocation) -> tuple[object, ...]:
    return (invocation.path.text, *((w.text, w.known, w.pattern is not None) for w in invocation.words))
