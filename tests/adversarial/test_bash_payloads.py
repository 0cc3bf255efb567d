"""The allow-side cases of tests/bash_cases.py are real: run in bash and sh, the hidden payload runs.

Each command starts with `pytest`, which `allow: Bash(pytest:*)` used to allow, and hides a
payload. Here the payload is harmless (`touch MARKER`, or a redirection to `~/.bashrc` with
HOME set to the test's own folder), `pytest` is a stub that exits 0, and every command runs in
a temp folder the test made, with a PATH and HOME of its own. The test shows that the payload
ran in the shells listed (which is what makes refusing the command worth it), and that the
gateway's rules do not allow the command.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

from gateway.rules.permissions import RuleSet, judge
from gateway.rules.shell.literal import BARE, literal_commands

SHIPPED_LIKE = RuleSet.parse(["Bash(rm:*)", "Bash(curl:*)", "Bash(wget:*)"], [], ["Bash(pytest:*)"])
BOTH = ("bash", "sh")


@pytest.mark.parametrize(
    ("command", "shells", "proof"),
    [
        # the three an outside review found, with the payload made harmless
        ("pytest () ( touch MARKER ) && pytest -q", BOTH, "MARKER"),
        ("pytest ${x:=$'a[\\x24(touch MARKER)]'} $[x]", ("bash",), "MARKER"),
        ("pytest -q > ~/.bashrc", BOTH, ".bashrc"),
        # variants of each class
        ("pytest $(touch MARKER)", BOTH, "MARKER"),
        ("pytest `touch MARKER`", BOTH, "MARKER"),
        ("pytest \u2018$(touch MARKER)\u2019", BOTH, "MARKER"),  # look-alike quotes are no quotes
        ("x='$(touch MARKER)'; pytest ${x@P}", ("bash",), "MARKER"),
        ("pytest $((x[$(touch MARKER)]))", BOTH, "MARKER"),
        ("pytest <<< $(touch MARKER)", ("bash",), "MARKER"),
        ("pytest &> MARKER", BOTH, "MARKER"),  # sh reads it as `pytest &` then `> MARKER`
        ("pytest >| MARKER", BOTH, "MARKER"),
        ("function pytest { touch MARKER; }; pytest", ("bash",), "MARKER"),
        ('alias pytest="touch MARKER; true"\npytest -q', ("sh",), "MARKER"),  # dash expands aliases in -c
        ('shopt -s expand_aliases\nalias pytest="touch MARKER; true"\npytest -q', BOTH, "MARKER"),
        ("pytest -q \\\n&& touch MARKER", BOTH, "MARKER"),
        ("eval '$(touch MARKER)'", BOTH, "MARKER"),
    ],
)
def test_the_hidden_payload_runs_and_no_rule_allows_the_command(
    tmp_path: Path, command: str, shells: tuple[str, ...], proof: str
) -> None:
    assert judge(SHIPPED_LIKE, "Bash", {"command": command}).verdict != "allow"
    assert judge(RuleSet.parse([], [], ["Bash(pytest:*)", "Bash(eval:*)", "Bash(x:*)"]), "Bash",
                 {"command": command}).verdict != "allow"  # fmt: skip
    ran = [shell for shell in ("bash", "sh") if _payload_ran(tmp_path / shell, shell, command, proof)]
    assert ran == list(shells), f"the payload ran in {ran}"


def _payload_ran(folder: Path, shell: str, command: str, proof: str) -> bool:
    """Runs `command` with `shell -c` in a fresh `folder` (also its HOME), `pytest` a stub; whether `proof` appeared."""
    stubs = folder / "bin"
    stubs.mkdir(parents=True)
    stub = stubs / "pytest"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    env = {"PATH": f"{stubs}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(folder), "LANG": "C.UTF-8"}
    subprocess.run([f"/bin/{shell}", "-c", command], cwd=folder, env=env, capture_output=True, timeout=30, check=False)
    return (folder / proof).exists()


def test_the_allow_side_reads_literal_words_exactly_as_bash_and_sh_do(tmp_path: Path) -> None:
    """Soundness of gateway/rules/shell/literal.py, measured: for allow-eligible commands built at random
    from its whitelist (bare characters, single quotes holding any printable character, double
    quotes holding what it allows there, blanks and separators), the program receives in bash
    and in sh exactly the words the gateway matched rules against."""
    rng = random.Random(11)  # noqa: S311  (a fixed seed: the same commands every run, no secret)
    stub = tmp_path / "bin" / "argv"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done; printf "\\n"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    for _ in range(150):
        blank = rng.choice([" ", "\t", "  "])
        parts = [
            blank.join(["argv", *(_random_word(rng) for _ in range(rng.randint(0, 5)))])
            for _ in range(rng.randint(1, 3))
        ]
        command = rng.choice([" ; ", "&&", "\n", f"{blank}|{blank}cat;"]).join(parts)
        literal = literal_commands(command)
        assert literal is not None, repr(command)
        wanted = [part.argv[1:] for part in literal if part.argv[0] == "argv"]
        for shell in ("bash", "sh"):
            out = subprocess.run([f"/bin/{shell}", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                                 timeout=30, check=True).stdout.decode()  # fmt: skip
            got = [tuple(line.split("\0")[:-1]) for line in out.split("\n")[:-1]]
            assert got == wanted, (shell, command)


def _random_word(rng: random.Random) -> str:
    printable = [chr(c) for c in range(0x20, 0x7F)] + ["é", "✓", "\u3164", "\u2800"]
    pieces = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["bare", "single", "double"])
        if kind == "bare":
            pieces.append("".join(rng.choice(sorted(BARE)) for _ in range(rng.randint(1, 6))))
        elif kind == "single":
            # no backtick and no `$(`: those make a word code even quoted (an array subscript runs them)
            text = "".join(rng.choice([c for c in printable if c not in "'`"]) for _ in range(rng.randint(0, 8)))
            pieces.append("'" + text.replace("$(", "$.(") + "'")
        else:
            allowed = [c for c in printable if c not in '$`\\"!']
            pieces.append('"' + "".join(rng.choice(allowed) for _ in range(rng.randint(0, 8))) + '"')
    word = "".join(pieces)
    return "x" + word if word.startswith("=") else word
