"""Which shell parser reads an outside review's commands right (decision 41): tree-sitter-bash or bashlex.

Each case is a command and the programs bash runs when it runs it. Every parser's simple
commands go through the same normaliser (gateway/rules/shell/invocations.py: assignments and reserved
words dropped, file names, wrappers, `bash -c`/`eval` strings, pipes into a shell), and a case is
read right when every expected program is found. Columns: tree-sitter-bash alone, bashlex alone
(if installed: `pip install bashlex`; it is not a dependency), our lexer alone, and the gateway
(tree-sitter and the lexer together, as `check_permission` reads). Run:

    .venv/bin/python bench/shell_parsers.py [--verbose]
"""

from __future__ import annotations

import sys
from typing import Any

from gateway.rules.shell import invocations, lexer, tree
from gateway.rules.shell.words import SimpleCommand, Word, WordBuilder

CASES: list[tuple[str, set[str]]] = [
    # the review's allow side: what hides behind an allowed `pytest`
    ("pytest () ( rm -rf ~ ) && pytest -q", {"pytest", "rm"}),
    ("pytest ${x:=$'a[\\x24(touch P)]'} $[x]", {"pytest", "touch"}),
    ("pytest -q > ~/.bashrc", {"pytest"}),
    # the review's deny side
    ("FOO=1 rm -rf ~", {"rm"}),
    ("command rm x", {"rm"}),
    ("\\rm x", {"rm"}),
    ("rm\t-rf x", {"rm"}),
    ("/bin/rm x", {"rm"}),
    ("pytest; then rm x", {"pytest", "rm"}),
    ("ls | xargs rm -rf", {"ls", "rm"}),
    ("env rm x", {"rm"}),
    ("nice rm x", {"rm"}),
    # variants: quoting, paths, wrappers
    ("'rm' x", {"rm"}),
    ('"r"m x', {"rm"}),
    ("$'\\x72m' x", {"rm"}),
    ('$"rm" x', {"rm"}),
    ("./rm x", {"rm"}),
    ("sudo -u root env -i A=1 nice -n 5 rm x", {"rm"}),
    ("timeout -s KILL 5 rm x", {"rm"}),
    ("find . -name '*.o' -exec rm {} \\;", {"find", "rm"}),
    ("busybox rm x", {"rm"}),
    ("time -p rm x", {"rm"}),
    ("rm$IFS-rf x", {"rm"}),
    ("/bin/r? x", {"rm"}),
    ("{rm,x}", {"rm"}),
    ("r\\\nm x", {"rm"}),
    # strings run by a shell
    ("bash -c 'rm x'", {"bash", "rm"}),
    ("sh -c \"eval 'rm x'\"", {"sh", "rm"}),
    ("bash -c \"bash -c 'rm x'\"", {"rm"}),
    ("env -S 'rm x'", {"rm"}),
    ("su -c 'rm x'", {"rm"}),
    ("watch rm x", {"rm"}),
    ("trap 'rm x' EXIT", {"rm"}),
    ("bash <<EOF\nrm x\nEOF", {"bash", "rm"}),
    ("bash <<< 'rm x'", {"rm"}),
    ("echo rm x | sh", {"echo", "rm"}),
    # substitutions and compound commands
    ('echo "$(rm x)"', {"echo", "rm"}),
    ("echo `rm x`", {"echo", "rm"}),
    ("diff <(rm a) b", {"diff", "rm"}),
    ("x=$(rm y)", {"rm"}),
    ("export x=$(rm y)", {"rm"}),
    ("a[$(rm x)]=1", {"rm"}),
    ("[[ $(rm x) ]]", {"rm"}),
    ("echo ${x:-$(rm y)}", {"rm"}),
    ("echo $((1 + $(rm x)))", {"rm"}),
    ("echo $[$(rm x)]", {"rm"}),
    ("cat <<EOF\n$(rm x)\nEOF", {"cat", "rm"}),
    ("(rm x)", {"rm"}),
    ("{ rm x; }", {"rm"}),
    ("if true; then rm x; fi", {"rm"}),
    ("while :; do rm x; done", {"rm"}),
    ("for f in a; do rm $f; done", {"rm"}),
    ("case a in a) rm x;; esac", {"rm"}),
    ("f() { rm x; }", {"rm"}),
    ("function f { rm x; }", {"rm"}),
    ("! rm x", {"rm"}),
    ("coproc rm x", {"rm"}),
    ("coproc N { rm x; }", {"rm"}),
    ("pytest |& rm x", {"pytest", "rm"}),
    ("pytest & rm x", {"pytest", "rm"}),
    # not parseable by bash: deny rules must still see what they can
    ('rm x "unterminated', {"rm"}),
    ("rm x; fi", {"rm"}),
    (") rm x", {"rm"}),
]


class _Only(invocations._Reader):
    """The gateway's normaliser over one parser's simple commands."""

    def __init__(self, parser: str) -> None:
        super().__init__()
        self.parser = parser

    def parse(self, text: str) -> tuple[list[SimpleCommand], list[str], bool]:
        if self.parser == "tree-sitter":
            found, clean = tree.parse(text)
            return found, [], clean
        if self.parser == "lexer":
            found, nested = lexer.lex(text)
            return found, nested, True
        return _bashlex(text), [], True


def _bashlex(text: str) -> list[SimpleCommand]:
    import bashlex  # type: ignore[import-not-found]  # noqa: PLC0415  (optional, for this measurement)

    out: list[SimpleCommand] = []

    def visit(node: Any) -> None:
        if getattr(node, "kind", None) == "command":
            words: list[Word] = []
            for part in node.parts:
                if part.kind == "word":
                    builder = WordBuilder()
                    if any(p.kind in ("parameter", "commandsubstitution", "processsubstitution") for p in part.parts):
                        builder.add_unknown()
                    builder.add(part.word, quoted=True)
                    words += builder.take()
            out.append(SimpleCommand(words))
        for value in vars(node).values():
            for child in value if isinstance(value, list) else [value]:
                if hasattr(child, "kind"):
                    visit(child)

    for root in bashlex.parse(text):
        visit(root)
    return out


def _found(reader: invocations._Reader, command: str, program: str) -> bool:
    reader.read(command, 0)
    return any(i.words[0].may_name(program) or i.path.may_name(program) for i in reader.found.values())


def main() -> int:
    verbose = "--verbose" in sys.argv
    columns = ["tree-sitter", "bashlex", "lexer", "gateway"]
    right = dict.fromkeys(columns, 0)
    errors = dict.fromkeys(columns, 0)
    print(f"{'command':44} " + " ".join(f"{c:>11}" for c in columns))
    for command, expected in CASES:
        cells = []
        for column in columns:
            try:
                ok = all(
                    _found(invocations._Reader() if column == "gateway" else _Only(column), command, p)
                    for p in expected
                )
                cell = "right" if ok else "MISSED"
                right[column] += ok
            except Exception as exc:  # bashlex raises on what it does not implement
                errors[column] += 1
                cell = "error" if not verbose else type(exc).__name__[:11]
            cells.append(cell)
        print(f"{command!r:44.44} " + " ".join(f"{c:>11}" for c in cells))
    print(f"{'read right, of ' + str(len(CASES)):44} " + " ".join(f"{right[c]:>11}" for c in columns))
    print(f"{'parser errors':44} " + " ".join(f"{errors[c]:>11}" for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
