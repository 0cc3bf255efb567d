"""The deny and ask side of Bash rules (decision 41): every program a command runs that can be read.

A command is read twice, by tree-sitter-bash (`tree`) and by our own lexer (`lexer`), both
with and without its line continuations; every simple command either finds is then seen
through: assignments and reserved words before it dropped, its command word cut to the
program's file name (`/bin/rm`, `./rm` are `rm`), wrappers unwrapped (`env`, `sudo`, `nice`,
`timeout`, `xargs`, `find -exec`, `busybox`, ...), and the text that shells, `eval`, `trap`,
`su -c`, `watch`, here-documents and pipes into a shell will run read as commands in turn, to
a bounded depth. A literal word holding `$(` or a backtick is read too: arithmetic, `eval` or
indirection can run it (`${x:=$'a[\\x24(rm)]'} $[x]`).

A deny or ask rule applies if it matches any invocation, so what one reader misses the other
may still catch. `Reading.complete` is False when tree-sitter found an error: such a command is
never allowed by a rule. Reading is bounded (the MAX_ values below): past a bound it stops, and
`Reading.exceeded` says which bound, for the command to be denied with that reason.
"""

from __future__ import annotations

import fnmatch
import operator
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.rules.shell import lexer, tree
from gateway.rules.shell.code_builtins import assigned_code
from gateway.rules.shell.words import SimpleCommand, Unreadable, Word, decode_ansi_c
from gateway.rules.shell.wrappers import SHELLS, inner_commands, is_assignment, shell_command

MAX_COMMAND_CHARS = 65_536
"""The longest command read, in characters: a longer one is denied unread."""
MAX_WORDS = 8_192
"""The most words a command may have (runs of characters between blanks and operators)."""
MAX_DEPTH = 8
"""How deep texts inside texts are read (`bash -c "eval '...'"`)."""
MAX_WRAPPERS = 32
"""How many wrappers one command may go through (`env nice sudo xargs ... rm`)."""
MAX_TEXTS = 256
"""How many texts (the command, its substitutions, shell strings, ...) are read."""
MAX_INVOCATIONS = 2048
"""How many programs a command may be read to run."""
TREE_SITTER_S = 0.5
"""tree-sitter's CPU time for one command, all its texts together (its error recovery is superlinear on
some input, `{|{{||{...`): past it the rest is read by the lexer alone, and the reading is incomplete
(never allowed by a rule). Honest commands of 64 KiB parse in about 30 ms. CPU time of the reading
thread, not wall time: on a busy machine an honest command must not turn incomplete (and be denied)
because its thread waited for a CPU."""
MAX_WORK = 131_072
"""Characters parsed plus words looked at, over the whole reading: with the bounds above, this keeps
the reading of any command under a second or so (each reader is linear in what it is handed)."""
_SEPARATORS = re.compile(r"&&|\|\||;|\||&|\n")  # no `\s*` around: it backtracks over long blanks
_SKIPPED = frozenset({"{", "}", "(", ")", "!", "then", "do", "else", "elif", "if", "while", "until", "fi", "done",
                      "esac", "nocorrect", "noglob"})  # fmt: skip
_NOT_COMMANDS = frozenset({"for", "select", "case", "in", "[[", "]]", "((", "))"})
_SUBSTITUTION = re.compile(r"\$\(|`|<\(|>\(")


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
    exceeded: str | None = None
    """Which bound the reading reached, in words for the person whose command is denied; None: none."""


_Exceeded = Unreadable
"""A bound was reached: the reading stops; the message names the bound."""
_TOKENS = re.compile(r"[^\s;&|()<>]+")


def read_invocations(command: str) -> Reading:
    """Every program `command` runs that the gateway can read (see the module's docstring)."""
    reader = _Reader()
    try:
        _check_size(command)
        reader.read(command, 0)
    except _Exceeded as exc:
        return Reading((), (), complete=False, exceeded=str(exc))
    parts = tuple(p.strip() for p in _SEPARATORS.split(command) if p.strip())
    return Reading(tuple(reader.found.values()), parts, reader.complete)


def _check_size(command: str) -> None:
    if len(command) > MAX_COMMAND_CHARS:
        raise _Exceeded(
            f"the command is {len(command)} characters long, over the {MAX_COMMAND_CHARS} the gateway reads"
        )
    if len(_TOKENS.findall(command)) > MAX_WORDS:  # at most 32,768 within the length bound
        raise _Exceeded(f"the command has more than {MAX_WORDS} words")


class _Reader:
    def __init__(self) -> None:
        self.found: dict[tuple[object, ...], Invocation] = {}
        self.complete = True
        self.texts = 0
        self.seen: dict[tuple[str, bool], int] = {}
        self.work = 0
        self.deadline = time.thread_time() + TREE_SITTER_S

    def charge(self, units: int) -> None:
        self.work += units
        if self.work > MAX_WORK:
            raise _Exceeded(
                f"reading it takes more than {MAX_WORK} steps (texts inside texts, wrappers, substitutions)"
            )

    def read(self, text: str, depth: int, *, lexer_only: bool = False) -> None:
        """Read `text` as commands. `lexer_only`: a substitution's body, which tree-sitter already read
        inside the text around it (parsing it again at each level would make nesting quadratic)."""
        if self.seen.get((text, lexer_only), depth + 1) <= depth:
            return  # both readers hand over the same texts: read each once
        if depth > MAX_DEPTH:
            raise _Exceeded(f"it nests commands inside commands more than {MAX_DEPTH} deep")
        if self.texts >= MAX_TEXTS:
            raise _Exceeded(f"it holds more than {MAX_TEXTS} texts to read as commands")
        self.seen[text, lexer_only] = depth
        self.texts += 1
        commands: list[SimpleCommand] = []
        for variant in dict.fromkeys((text, text.replace("\\\n", ""))):
            self.charge(len(variant))
            found, nested, clean = self.parse(variant, lexer_only=lexer_only)
            self.complete = self.complete and clean
            commands += found
            for body in nested:
                self.read(body, depth + 1, lexer_only=True)
        for found_command in commands:
            self.command(found_command, depth)

    def parse(self, text: str, *, lexer_only: bool) -> tuple[list[SimpleCommand], list[str], bool]:
        """Both readers over `text` (the lexer alone if `lexer_only`): the simple commands, substitution
        bodies still to read, and whether tree-sitter read it without an error."""
        try:
            parsed, clean = ([], True) if lexer_only else tree.parse(text, self.deadline)
        except Unreadable:
            raise
        except (
            Exception
        ):  # tree.ParseTooSlow among them  # a reader's failure must not become an allow: the reading is incomplete
            parsed, clean = [], False
        lexed, nested = lexer.lex(text)
        return parsed + lexed, nested, clean

    def command(self, found: SimpleCommand, depth: int) -> None:
        self.charge(len(found.words))
        for word in found.words:  # assignments too: `PS4='$(rm x)'`, `declare -i n; n='a[$(rm x)]'`
            if word.known and _SUBSTITUTION.search(word.text):
                self.read(word.text, depth + 1)
            for text in assigned_code(word):  # `PROMPT_COMMAND='rm x'`, `env 'BASH_FUNC_ls%%=() { rm x; }'`
                self.read(text, depth + 1)
        work = [(words, 0) for words in _stripped(found.words)]
        visited: set[tuple[int, int]] = set()
        while work:
            words, wrapped = work.pop()
            if (id(words[0]), len(words)) in visited:
                continue  # the same words reached again (an unknown option read both ways): read once
            visited.add((id(words[0]), len(words)))
            if wrapped > MAX_WRAPPERS:
                raise _Exceeded(f"it runs a command through more than {MAX_WRAPPERS} wrappers (env, sudo, xargs, ...)")
            if len(self.found) >= MAX_INVOCATIONS:
                raise _Exceeded(f"it runs more than {MAX_INVOCATIONS} programs")
            self.charge(len(words))
            name = words[0].basename()
            invocation = Invocation((name, *words[1:]), words[0])
            self.found.setdefault(_key(invocation), invocation)
            if not name.known:
                continue
            inner, texts = inner_commands(name.text, words[1:])
            work += [(w, wrapped + 1) for c in inner for w in _stripped(c)]
            reads_stdin = name.text in SHELLS and shell_command(words[1:]) is None
            reads_stdin = reads_stdin or (
                name.text in ("source", ".") and [w.text for w in words[1:2]] == ["/dev/stdin"]
            )
            if reads_stdin:
                texts += found.stdin + (_output(found.piped_from) if found.piped_from else [])
            for text in texts:
                self.read(text, depth + 1)


def _stripped(words: Sequence[Word]) -> list[Sequence[Word]]:
    """The words from the command word on: assignments and reserved words before it dropped
    (`coproc NAME cmd` is read both with and without NAME)."""
    out: list[Sequence[Word]] = []
    pending = [0]
    while pending:
        i = pending.pop()
        while i < len(words):
            head = words[i].text if words[i].known else None
            if is_assignment(words[i]) or head in _SKIPPED:
                i += 1
            elif head == "function":
                i += 2
            elif head == "coproc":
                pending.append(i + 2)
                i += 1
            elif head in _NOT_COMMANDS:
                i = len(words)
            else:
                break
        if i < len(words):
            out.append(words[i:])
    return out


def _output(command: SimpleCommand) -> list[str]:
    """What `echo`, `printf`, a bare `cat` (of its here-document) or a compound (of its input: `{ cat; } <<< x`)
    piped into a shell write."""
    if command.ends_compound:
        return list(command.stdin)
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
    """What rules can tell of its words: their text, whether each is known, and the values each may take
    (`"*"*` and `*"*"` are both `**`, but only the first may be `*a`). Three tuples, not one per word: a
    reading makes a key per wrapper of a long chain."""
    words = invocation.words
    return (
        invocation.path.text,
        tuple(map(_TEXT, words)),
        tuple(map(_KNOWN, words)),
        tuple(map(_PATTERN, words)),
    )


_TEXT, _KNOWN, _PATTERN = operator.attrgetter("text"), operator.attrgetter("known"), operator.attrgetter("pattern")
