"""Shell builtins, options and variables that run code (docs/claude-code.md): the deny side reads it, the allow side never allows it.

The inventory comes from bash's own documentation (`help`, `help NAME` for each builtin, the
PARAMETERS and SHELL BUILTIN COMMANDS sections of bash(1)) and dash(1)'s builtin list, and each
entry is shown to run code in the real shells by tests/gateway/shell/test_code_builtins.py.
A builtin here either evaluates a string (`eval`, `mapfile -C`, `compgen -C`, `fc -e`), sources or
loads a file (`source`, `.`, `enable -f`), runs a command it names (`jobs -x`), or registers code
for later (`trap`, `alias`, `complete -C/-F`, `bind -x`, `hash -p`, `history -s`). Array subscripts
in a name (`printf -v 'a[$(rm x)]'`, `read`, `declare`, `typeset`, `local`, `let`, `test -v`,
`[ -v`) run their `$(...)`: the deny side reads every word holding `$(` or a backtick, and the
allow side refuses such a word, whichever builtin it is given to.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.rules.shell.words import Word, literal_word, word_of


@dataclass(frozen=True, slots=True)
class CodeBuiltin:
    """How a builtin takes code: which options' values are shell text, and what its operands are."""

    how: str
    shells: tuple[str, ...]
    valued: str = ""
    """Single-letter options that take a value (`-C cmd`, `-Ccmd`, `-tC cmd`)."""
    code: str = ""
    """Those of `valued` whose value is shell text (or a function's name: read as a command too)."""
    operands: str = "none"
    """What its operands are: `text` (joined, run: eval), `texts` (each run: trap, history -s),
    `alias` (`name=value`: the value runs), `command` (a command to run: jobs -x), `path` (hash -p)."""
    operands_when: str = ""
    """An option that makes the operands code (`history -s`, `jobs -x`, `hash -p`); empty: always."""


CODE_BUILTINS: dict[str, CodeBuiltin] = {
    "eval": CodeBuiltin("evaluates", ("bash", "dash"), operands="text"),
    "source": CodeBuiltin("sources", ("bash",)),
    ".": CodeBuiltin("sources", ("bash", "dash")),
    "trap": CodeBuiltin("registers", ("bash", "dash"), operands="texts"),
    "mapfile": CodeBuiltin("evaluates", ("bash",), valued="dnOsuCc", code="C"),
    "readarray": CodeBuiltin("evaluates", ("bash",), valued="dnOsuCc", code="C"),
    "compgen": CodeBuiltin("evaluates", ("bash",), valued="oAGWFCXPSV", code="CF"),
    "complete": CodeBuiltin("registers", ("bash",), valued="oAGWFCXPS", code="CF"),
    "fc": CodeBuiltin("evaluates", ("bash",), valued="e", code="e"),
    "history": CodeBuiltin("registers", ("bash",), valued="d", operands="texts", operands_when="s"),
    "bind": CodeBuiltin("registers", ("bash",), valued="mqurfx", code="x"),
    "jobs": CodeBuiltin("runs", ("bash",), operands="command", operands_when="x"),
    "hash": CodeBuiltin("registers", ("bash",), valued="p", operands="path", operands_when="p"),
    "alias": CodeBuiltin("registers", ("bash", "dash"), operands="alias"),
    "enable": CodeBuiltin("loads", ("bash",), valued="f"),
}
"""Builtin -> how it takes code. `command`, `builtin` and `exec` run the builtin or program they name
(gateway/rules/shell/wrappers.py), so `command eval ...` is `eval ...`."""

CODE_VARIABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "PROMPT_COMMAND": ("evaluates its value before each prompt", ("bash",)),
    "PS0": ("expands its value after a command is read", ("bash",)),
    "PS1": ("expands its value at each prompt", ("bash", "dash")),
    "PS4": ("expands its value before each traced command (set -x)", ("bash",)),
    "BASH_ENV": ("sources the file it names in a non-interactive bash", ("bash",)),
    "ENV": ("sources the file it names in an interactive shell", ("bash", "dash")),
    "BASH_FUNC_": ("imports a function from the environment (BASH_FUNC_name%%=() {...})", ("bash",)),
    "SHELLOPTS": ("turns options on in the bash it starts (xtrace runs PS4)", ("bash",)),
}
"""Variables whose value the shell runs or sources, or that make it do so: an assignment to one is
never allow-eligible, and a value that is code is read by the deny side."""
_CODE_ASSIGNMENT = re.compile(r"(?:PROMPT_COMMAND(?:\[[^]]*\])?\+?=|BASH_FUNC_[^=]*=)(?P<value>.*)", re.DOTALL)


def names_code_builtin(word: str) -> bool:
    return word in CODE_BUILTINS


def assigns_code_variable(word: str) -> bool:
    """`PS4=...`, `BASH_FUNC_f%%=...`, `PROMPT_COMMAND+=...`: an assignment to a variable of CODE_VARIABLES."""
    name = re.match(r"[^=+\[]*", word)
    head = name.group() if name else ""
    return ("=" in word and head in CODE_VARIABLES) or word.startswith("BASH_FUNC_")


def assigned_code(word: Word) -> list[str]:
    """The shell text an assignment word makes the shell run: PROMPT_COMMAND's value, an imported
    function's body (read as `f` + the value, `f() { ... }`). PS0-PS4's `$(...)` are read with every
    word holding one."""
    match = _CODE_ASSIGNMENT.fullmatch(word.text) if word.known else None
    if match is None:
        return []
    value = match.group("value")
    return [value, "f" + value] if word.text.startswith("BASH_FUNC_") else [value]


def code_of(name: str, args: Sequence[Word]) -> tuple[list[list[Word]], list[str]]:
    """For a builtin of CODE_BUILTINS with these arguments: the commands it runs, and the shell texts
    it evaluates or registers (to be read as commands)."""
    builtin = CODE_BUILTINS.get(name)
    if builtin is None:
        return [], []
    if builtin.operands == "text":  # every word, and the words after `--` (`eval -- 'rm x'`)
        texts = [" ".join(w.text for w in args)] if args else []
        return [], texts + ([" ".join(w.text for w in args[1:])] if args and args[0].text == "--" else [])
    if builtin.operands == "texts" and not builtin.operands_when:
        return [], [w.text for w in args]
    texts, given, start = _options(builtin, args)
    operands = args[start:]
    if builtin.operands_when and builtin.operands_when not in given:
        return [], texts
    if builtin.operands == "texts":
        return [], texts + [w.text for w in operands]
    if builtin.operands == "alias":
        return [], texts + [w.text.split("=", 1)[1] for w in operands if "=" in w.text]
    if builtin.operands == "command" and operands:
        return [list(operands)], texts
    if builtin.operands == "path" and given.get("p"):
        return [[given["p"]]], texts
    return [], texts


def _options(builtin: CodeBuiltin, args: Sequence[Word]) -> tuple[list[str], dict[str, Word], int]:
    """Reads `-abc`, `-Cvalue`, `-C value` options as bash's getopt does: the code options' values
    (with `bind -x`, also each text after a colon), the options given (the last value of each) and
    where the operands start."""
    texts: list[str] = []
    given: dict[str, Word] = {}
    i = 0
    while i < len(args):
        word = args[i].text
        if word == "--":
            i += 1
            break
        if not (args[i].known and len(word) > 1 and word[0] in "-+"):
            break
        i += 1
        for j, letter in enumerate(word[1:], start=1):
            if letter not in builtin.valued:
                given[letter] = args[i - 1]
                continue
            glued = args[i - 1].chars[j + 1 :]
            value = word_of(glued) if glued else args[i] if i < len(args) else literal_word("")
            i += 0 if glued else 1
            given[letter] = value
            if letter in builtin.code:
                texts.append(value.text)
                if letter == "x":  # `bind -x 'keyseq:command'`: what follows a colon
                    texts += [value.text[k + 1 :] for k, ch in enumerate(value.text) if ch == ":"]
            break
    return texts, given, i
