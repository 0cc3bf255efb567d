"""The deny side's second reader (decision 41): a wide lexer of our own over the same text.

It does not build a tree; it cuts the text at every operator, parenthesis and newline (so the
bodies of subshells, groups, `if`/`while`/`for`/`case` and functions all come out as commands),
reads quoting as bash does (`'...'`, `"..."`, `$'...'`, `$"..."`, backslashes, line
continuations), keeps here-documents and here-strings as the command's standard input, and
hands back the text of every substitution (`$(...)`, backticks, `<(...)`, `${...}`, `$[...]`,
`$((...))`) to be read as commands in turn. Where it is unsure it reads more, not less: it
exists so that a mistake of tree-sitter's fails toward deny or ask.
"""

from __future__ import annotations

import re

from gateway.rules.shell.words import SimpleCommand, Word, WordBuilder, decode_ansi_c

_METACHARACTERS = " \t\n;&|()<>"
_REDIRECTIONS = ("&>>", "<<<", "<<-", "&>", ">>", ">|", ">&", "<&", "<>", "<<", "<", ">")
_SPECIAL_PARAMETERS = "@*#?$!-0123456789"
_CLOSERS = frozenset({"}", "done", "fi", "esac"})
"""Words that end a compound command: a redirection after one is the compound's."""
_PLAIN = re.compile(r"[^\\'\"$`<>&;|() \t\n#]+")
"""A run of characters that are plain word characters wherever they stand (`#` only after a word's start:
left to the loop)."""
_PLAIN_QUOTED = re.compile(r"[^\\\"$`]+")
"""A run of characters that are plain in double quotes."""


def lex(text: str) -> tuple[list[SimpleCommand], list[str]]:
    """The simple commands in `text`, and the bodies of its substitutions (to read as commands)."""
    lexer = _Lexer(text)
    lexer.run()
    lexer.share_compound_input()
    return lexer.commands, lexer.nested


class _Lexer:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.commands: list[SimpleCommand] = []
        self.nested: list[str] = []
        self.word = WordBuilder()
        self.current = SimpleCommand([])
        self.redirect: str | None = None
        """The operator whose target is the next word (not an argument)."""
        self.heredocs: list[tuple[str, bool, bool, SimpleCommand]] = []
        """Here-documents whose body starts at the next newline: delimiter, quoted, `<<-`, owner."""
        self.piped_from: SimpleCommand | None = None
        self.closed = False
        """The last separator was `)`: what follows, up to the next one, redirects the subshell."""

    def run(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            plain = _PLAIN.match(s, self.i)
            if plain is not None:  # most of a command: added as one run, not character by character
                self.word.add(plain.group(), quoted=False)
                self.i = plain.end()
            elif c in " \t":  # the next most common: asked before the rarer cases
                self.end_word()
                self.i += 1
            elif c == "\\":
                if s.startswith("\\\n", self.i):
                    self.i += 2
                else:
                    self.word.add(s[self.i + 1 : self.i + 2], quoted=True)
                    self.i += 2
            elif c == "'":
                close = s.find("'", self.i + 1)
                close = n if close < 0 else close
                self.word.add(s[self.i + 1 : close], quoted=True)
                self.i = close + 1
            elif s.startswith("$'", self.i):
                self.ansi_c()
            elif c == '"' or s.startswith('$"', self.i):
                self.i = self.double(self.i + (1 if c == '"' else 2), self.word, '"')
            elif c == "`" or s.startswith(("$(", "<(", ">(", "${", "$["), self.i):
                self.i = substitution(s, self.i, self.nested)
                self.word.add_unknown()
            elif c == "$" and _parameter_end(s, self.i) > self.i + 1:
                self.i = _parameter_end(s, self.i)
                self.word.add_unknown()
            elif c == "\n":
                self.end_command()
                self.i += 1
                self.read_heredocs()
            elif c == "#" and not self.word.started:
                newline = s.find("\n", self.i)
                self.i = n if newline < 0 else newline
            elif c in "<>" or s.startswith("&>", self.i):
                self.start_redirect()
            elif c in ";&|()":
                piped = c == "|" and not s.startswith("||", self.i)
                self.end_command()
                self.i += 2 if s.startswith(("||", "&&", ";;", "|&", ";&"), self.i) else 1
                self.piped_from = self.commands[-1] if piped and self.commands else None
                self.closed = c == ")"
            else:
                self.word.add(c, quoted=False)
                self.i += 1
        self.end_command()  # a here-document with no newline before the end has no body

    def share_compound_input(self) -> None:
        """A compound's input may reach any command before its end (the lexer does not know where it began):
        read on the safe side, each of them may read it."""
        inputs = [(index, text) for index, c in enumerate(self.commands) if c.ends_compound for text in c.stdin]
        if inputs:  # one text for all (a shell would run each line): linear however many compounds there are
            text = "\n".join(text for _, text in inputs)
            for earlier in self.commands[: inputs[-1][0]]:
                earlier.stdin.append(text)

    def ansi_c(self) -> None:
        s, j = self.s, self.i + 2
        while j < len(s) and s[j] != "'":
            j += 2 if s[j] == "\\" else 1
        self.word.add(decode_ansi_c(s[self.i + 2 : j]), quoted=True)
        self.i = j + 1

    def double(self, i: int, word: WordBuilder, closing: str | None) -> int:
        """Reads double-quoted text from `i` to `closing` (None: to the end); returns the index after it."""
        s, n = self.s, len(self.s)
        word.add("", quoted=True)
        while i < n:
            c = s[i]
            if closing is not None and c == closing:
                return i + 1
            plain = _PLAIN_QUOTED.match(s, i)
            if plain is not None:
                word.add(plain.group(), quoted=True)
                i = plain.end()
            elif c == "\\" and i + 1 < n:
                nxt = s[i + 1]
                if nxt == "\n":
                    pass
                elif nxt in '$`"\\':
                    word.add(nxt, quoted=True)
                else:
                    word.add("\\" + nxt, quoted=True)
                i += 2
            elif c == "`" or s.startswith(("$(", "${", "$["), i):
                i = substitution(s, i, self.nested)
                word.add_unknown()
            elif c == "$" and _parameter_end(s, i) > i + 1:
                i = _parameter_end(s, i)
                word.add_unknown()
            else:
                word.add(c, quoted=True)
                i += 1
        return n

    def start_redirect(self) -> None:
        s = self.s
        pending = self.word.take()
        # `2>`, `{fd}>`: the number or name belongs to the redirection, not to the command.
        if pending and not (pending[-1].text.isdigit() or pending[-1].text.startswith("{")):
            self.add_words(pending)
        operator = next(op for op in _REDIRECTIONS if s.startswith(op, self.i))
        self.i += len(operator)
        if operator in ("<<", "<<-"):
            self.heredocs.append((*self.delimiter(), operator == "<<-", self.current))
        else:
            self.redirect = operator

    def delimiter(self) -> tuple[str, bool]:
        delimiter, quoted, self.i = heredoc_delimiter(self.s, self.i)
        return delimiter, quoted

    def read_heredocs(self) -> None:
        for delimiter, quoted, strip_tabs, owner in self.heredocs:
            body, self.i = heredoc_body(self.s, self.i, delimiter, strip_tabs)
            owner.stdin.append(body)
            if not quoted:  # an unquoted here-document is expanded: its substitutions run
                self.double_text(body)
        self.heredocs.clear()

    def double_text(self, text: str) -> None:
        inner = _Lexer(text)
        inner.double(0, WordBuilder(), None)
        self.nested.extend(inner.nested)

    def end_word(self) -> None:
        self.add_words(self.word.take())

    def add_words(self, words: list[Word]) -> None:
        for word in words:
            if self.redirect == "<<<":
                self.current.stdin.append(word.text)
            elif self.redirect is None:
                self.current.words.append(word)
            self.redirect = None

    def end_command(self) -> None:
        self.end_word()
        self.redirect = None
        current = self.current
        current.ends_compound = self.closed or bool(current.words and current.words[0].text in _CLOSERS)
        self.closed = False
        owns_heredoc = current.ends_compound and any(owner is current for *_, owner in self.heredocs)
        if current.words or current.stdin or owns_heredoc:
            current.piped_from = self.piped_from
            self.commands.append(current)
        self.piped_from = None
        self.current = SimpleCommand([])


def heredoc_delimiter(s: str, i: int) -> tuple[str, bool, int]:
    """The here-document delimiter word at `i` (after `<<` or `<<-`): its text, whether any of it
    was quoted (then the body is not expanded), and the index after it."""
    while i < len(s) and s[i] in " \t":
        i += 1
    start = i
    while i < len(s) and s[i] not in _METACHARACTERS:
        i += 1
    raw = s[start:i]
    quoted = any(q in raw for q in "'\"\\")
    return raw.replace("'", "").replace('"', "").replace("\\", ""), quoted, i


def heredoc_body(s: str, i: int, delimiter: str, strip_tabs: bool) -> tuple[str, int]:
    """The here-document body starting at `i` (a line's start), and the index after its delimiter line."""
    lines = []
    while i < len(s):
        end = s.find("\n", i)
        end = len(s) if end < 0 else end
        line = s[i:end]
        i = end + 1
        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
            break
        lines.append(line)
    return "\n".join(lines), min(i, len(s))


def substitution(s: str, i: int, nested: list[str]) -> int:
    """Records the body of the substitution starting at `i` in `nested`; returns the index after it."""
    if s[i] == "`":
        j = i + 1
        while j < len(s) and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        nested.append(s[i + 1 : j].replace("\\`", "`").replace("\\\\", "\\"))
        return j + 1
    opening = s[i + 1]
    closing = {"(": ")", "{": "}", "[": "]"}[opening]
    j = _closing(s, i + 2, opening, closing)
    nested.append(s[i + 2 : j])
    return j + 1


def _closing(s: str, i: int, opening: str, closing: str) -> int:
    """The index of the bracket closing one opened before `i` (quotes, escapes and here-document
    bodies skipped); or len(s)."""
    depth = 1
    heredocs: list[tuple[str, bool]] = []
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if s.startswith("<<", i) and not s.startswith("<<<", i):
            strip_tabs = s.startswith("<<-", i)
            delimiter, _, i = heredoc_delimiter(s, i + (3 if strip_tabs else 2))
            heredocs.append((delimiter, strip_tabs))
            continue
        if c == "\n" and heredocs:
            i += 1
            for delimiter, strip_tabs in heredocs:
                i = heredoc_body(s, i, delimiter, strip_tabs)[1]
            heredocs.clear()
            continue
        if c == "'":
            end = s.find("'", i + 1)
            i = len(s) if end < 0 else end + 1
            continue
        if c == '"':
            j = i + 1
            while j < len(s) and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            i = j + 1
            continue
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(s)


def _parameter_end(s: str, i: int) -> int:
    """The index after the parameter expansion `$name`, `$1` or `$?` at `i` (i + 1: none there)."""
    j = i + 1
    if j < len(s) and s[j] in _SPECIAL_PARAMETERS:
        return j + 1
    while j < len(s) and (s[j] == "_" or (s[j].isascii() and s[j].isalnum())):
        j += 1
    return j
