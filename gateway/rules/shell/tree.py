"""The deny side's first reader (decision 41): bash's grammar, through tree-sitter-bash.

Every `command` node anywhere in the tree is a simple command the shell may run: inside
substitutions, subshells, groups, compound commands, function bodies, here-documents,
assignments and test expressions alike. Words are read as bash reads them (quotes removed,
backslashes and `$'...'` decoded); a word holding an expansion is "not known".
"""

from __future__ import annotations

import itertools
import math
import re
import time

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from gateway.rules.shell.lexer import substitution
from gateway.rules.shell.words import SimpleCommand, Word, WordBuilder, decode_ansi_c, literal_word, unquoted_words

_BASH = Language(tree_sitter_bash.language())
_NOT_WORDS = frozenset({"variable_assignment", "variable_assignments", "file_redirect", "heredoc_redirect",
                        "herestring_redirect", "comment"})  # fmt: skip
_COMMANDS = frozenset({"command", "declaration_command", "unset_command"})
_CHUNK = 65536
_PLAIN = re.compile(r"[^\\$`]+")
"""A run of a word's characters that holds no escape or substitution."""


class ParseTooSlow(Exception):
    """tree-sitter was still parsing at the deadline (its error recovery is superlinear on some input)."""


def parse(text: str, deadline: float = math.inf) -> tuple[list[SimpleCommand], bool]:
    """The simple commands in `text`, and whether tree-sitter read all of it without an error;
    ParseTooSlow if the parse is still running at `deadline`, in this thread's CPU time (time.thread_time():
    a busy machine slows the parse's wall time, not the work it may do)."""
    source = text.encode("utf-8", "surrogatepass")
    try:
        tree = Parser(_BASH).parse(
            lambda offset, _point: source[offset : offset + _CHUNK],
            progress_callback=lambda _offset, _has_error: time.thread_time() > deadline,
        )
    except ValueError:  # the callback cancelled the parse
        raise ParseTooSlow from None
    found: dict[int, SimpleCommand] = {}
    statements: list[Node] = []
    pipelines: list[Node] = []
    stack: list[Node] = [tree.root_node]
    while stack:  # one walk over the tree (each step through the bindings costs)
        node = stack.pop()
        stack.extend(reversed(node.children))
        kind = node.type
        if kind in _COMMANDS:
            found[node.id] = _command(node, source)
        elif kind == "redirected_statement":
            statements.append(node)
        elif kind == "pipeline":
            pipelines.append(node)
    for node in statements:
        body = node.child_by_field_name("body")
        if body is not None and body.id in found:
            found[body.id].stdin.extend(_heredocs(node, source))
        elif body is not None:  # a group, a subshell, a loop: its input reaches every command inside it
            texts = _heredocs(node, source)
            for inner in _inside(body, found) if texts else ():
                inner.stdin.extend(texts)
    for node in pipelines:
        for before, after in itertools.pairwise(node.named_children):
            writer, reader = _command_id(before), _command_id(after)
            if writer in found and reader in found:
                found[reader].piped_from = found[writer]
            else:
                _pipe_compound(before, after, found)
    return list(found.values()), not tree.root_node.has_error


def _inside(node: Node, found: dict[int, SimpleCommand]) -> list[SimpleCommand]:
    """The simple commands within `node`, itself included."""
    inner: list[SimpleCommand] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.id in found:
            inner.append(found[current.id])
        stack.extend(current.children)
    return inner


def _pipe_compound(before: Node, after: Node, found: dict[int, SimpleCommand]) -> None:
    """A pipe into or out of a compound stage (`{ cat; } <<< 'rm x' | sh`, `echo rm x | ( sh )`): what any
    command of `before` may write reaches every command of `after` that reads its input. Read on the safe side:
    each command's arguments and input stand for what it may write, as a bare `cat` of its input would."""
    writers = _inside(before, found)
    if not writers:
        return
    written = SimpleCommand([literal_word("cat")])
    for writer in writers:
        written.stdin.extend(writer.stdin)
        written.stdin.append(" ".join(w.text for w in writer.words[1:]))
        if writer.piped_from is not None:
            written.stdin.extend(writer.piped_from.stdin)
    for reader in _inside(after, found):
        if reader.piped_from is None:
            reader.piped_from = written


def _command_id(node: Node) -> int:
    if node.type == "redirected_statement":
        body = node.child_by_field_name("body")
        return body.id if body is not None else node.id
    return node.id


def _command(node: Node, source: bytes) -> SimpleCommand:
    command = SimpleCommand([])
    if node.type != "command":  # export, declare, local, readonly, typeset, unset: the keyword is a word
        command.words.append(literal_word(_text(node.children[0], source)))
    for child in node.children if node.type == "command" else node.children[1:]:
        if child.type == "herestring_redirect":
            command.stdin.extend(w.text for c in child.named_children for w in _words(c, source))
        elif child.is_named and child.type not in _NOT_WORDS:
            command.words.extend(_words(child, source))
    return command


def _heredocs(statement: Node, source: bytes) -> list[str]:
    bodies: list[str] = []
    for redirect in statement.children:
        if redirect.type == "herestring_redirect":
            bodies.extend(w.text for c in redirect.named_children for w in _words(c, source))
        for child in redirect.children if redirect.type == "heredoc_redirect" else ():
            if child.type == "heredoc_body":
                bodies.append(_text(child, source))
    return bodies


def _words(node: Node, source: bytes) -> list[Word]:
    if node.type == "word":
        text = _text(node, source)
        if _PLAIN.fullmatch(text):  # most arguments: no builder to feed character runs
            return unquoted_words(text)
    builder = WordBuilder()
    _feed(node, builder, source)
    return builder.take()


def _feed(node: Node, word: WordBuilder, source: bytes) -> None:
    kind = node.type
    if kind in ("command_name", "concatenation"):
        for child in node.children:
            _feed(child, word, source)
    elif kind == "translated_string":  # $"...": `$` then a string
        for child in node.named_children:
            _feed(child, word, source)
    elif kind in ("word", "number"):
        _unquoted(_text(node, source), word)
    elif kind == "raw_string":
        word.add(_text(node, source)[1:-1], quoted=True)
    elif kind == "ansi_c_string":
        word.add(decode_ansi_c(_text(node, source)[2:-1]), quoted=True)
    elif kind == "string":
        word.add("", quoted=True)
        for child in node.named_children:
            if child.type == "string_content":
                word.add(_double_quoted(_text(child, source)), quoted=True)
            else:
                word.add_unknown()
    else:  # every expansion, substitution, arithmetic, brace sequence, unknown node: not known
        word.add_unknown()


def _unquoted(text: str, word: WordBuilder) -> None:
    i = 0
    while i < len(text):
        plain = _PLAIN.match(text, i)
        if plain is not None:  # added as one run, not character by character
            word.add(plain.group(), quoted=False)
            i = plain.end()
        elif text[i] == "\\":
            if text.startswith("\\\n", i):
                i += 2
                continue
            word.add(text[i + 1 : i + 2], quoted=True)
            i += 2
        elif text.startswith(("$(", "${", "$[", "`"), i):  # tree-sitter sometimes leaves one in a word
            i = substitution(text, i, [])
            word.add_unknown()
        else:
            word.add(text[i], quoted=False)
            i += 1


def _double_quoted(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in '$`"\\\n':
            out.append("" if text[i + 1] == "\n" else text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _text(node: Node, source: bytes) -> str:
    """The node's text, sliced from the source: `node.text` of a tree parsed through a callback calls it
    again, a copy of up to _CHUNK bytes per node (quadratic in a long command: 3,000 words, 40 ms)."""
    return source[node.start_byte : node.end_byte].decode("utf-8", "surrogatepass")
