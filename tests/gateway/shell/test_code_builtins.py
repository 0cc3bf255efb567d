"""The inventory of builtins, options and variables that run code (gateway/rules/shell/code_builtins.py), proven
against the real shells.

Each entry of CODE_BUILTINS and CODE_VARIABLES has at least one proof below: a command that makes
real bash or dash (in a temporary folder) create the file `m`, so the entry is a fact about the
shells, not a guess. The same command, as an agent would send it, is then denied by a deny rule on
`touch` beside `allow: [Bash]` wherever the gateway can read the code (a file's content it cannot:
`source FILE`, `enable -f`, `BASH_ENV`), and no allow rule ever allows it.
"""

from __future__ import annotations

import gzip
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.rules.permissions import RuleSet, judge
from gateway.rules.shell.code_builtins import CODE_BUILTINS, CODE_VARIABLES
from tests.deadlines import scaled

DENY_TOUCH = RuleSet.parse(["Bash(touch:*)"], [], ["Bash"])
ALLOW_ALL = RuleSet.parse([], [], ["Bash"])
LIBRARY = '#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void m(void) { close(open("m", O_CREAT | O_WRONLY, 0600)); }\n'  # fmt: skip


@dataclass(frozen=True, slots=True)
class Proof:
    entry: str
    """The CODE_BUILTINS or CODE_VARIABLES key it proves."""
    shell: str
    command: str
    """`shell -c command` in the folder; with `keys`, lines typed into an interactive shell on a pty."""
    keys: str | None = None
    readable: bool = True
    """Whether the code is in the command itself (else in a file the gateway does not read)."""


PROOFS = [
    Proof("eval", "bash", "eval 'touch m'"),
    Proof("eval", "bash", "eval -- 'touch m'"),
    Proof("eval", "dash", "eval 'touch m'"),
    Proof("source", "bash", "source /dev/stdin <<< 'touch m'"),
    Proof("source", "bash", "echo 'touch m' > f; source ./f", readable=False),
    Proof(".", "bash", ". /dev/stdin <<< 'touch m'"),
    Proof(".", "dash", ". /dev/stdin <<EOF\ntouch m\nEOF"),
    Proof("trap", "bash", "trap 'touch m' EXIT"),
    Proof("trap", "bash", "trap -- 'touch m' EXIT"),
    Proof("trap", "bash", "shopt -s extdebug; trap 'touch m' DEBUG; :"),
    Proof("trap", "dash", "trap 'touch m' EXIT"),
    Proof("mapfile", "bash", "echo v | mapfile -t -c 1 -C 'touch m;:'"),
    Proof("mapfile", "bash", "echo v | mapfile -tc1 -C'touch m;:'"),
    Proof("readarray", "bash", "echo v | readarray -t -c 1 -C 'touch m;:'"),
    Proof("compgen", "bash", "compgen -C 'touch m' x"),
    Proof("compgen", "bash", "f() { touch m; }; compgen -F f x"),
    Proof("compgen", "bash", "compgen -W '$(touch m)' x"),
    Proof("complete", "bash", "complete -C 'touch m' x", keys="x \t\t"),
    Proof("complete", "bash", "f() { touch m; }\ncomplete -F f x", keys="x \t\t"),
    Proof("fc", "bash", "history -s 'echo x'; fc -e 'touch m;:'"),
    Proof("history", "bash", "history -s 'touch m'; fc -s touch"),
    Proof("bind", "bash", "bind -x '\"\\C-t\":touch m'", keys="\x14"),
    Proof("jobs", "bash", "jobs -x touch m"),
    Proof("hash", "bash", "hash -p /usr/bin/touch ls; ls m"),
    Proof("alias", "bash", "shopt -s expand_aliases; alias x='touch m'\nx"),
    Proof("alias", "dash", "alias x='touch m'\nx"),
    Proof("enable", "bash", "enable -f ./lib.so nothing", readable=False),
    Proof("PROMPT_COMMAND", "bash", "PROMPT_COMMAND='touch m' bash --norc -i <<< :"),
    Proof("PS0", "bash", "PS0='$(touch m)'\ntrue", keys=""),
    Proof("PS1", "bash", "PS1='$(touch m)' bash --norc -i <<< :"),
    Proof("PS1", "dash", "echo : | PS1='$(touch m)' dash -i"),
    Proof("PS4", "bash", "PS4='$(touch m)'; set -x; :"),
    Proof("BASH_ENV", "bash", "echo 'touch m' > f; BASH_ENV=./f bash -c :", readable=False),
    Proof("ENV", "dash", "echo 'touch m' > f; ENV=./f dash -i -c :", readable=False),
    Proof("BASH_FUNC_", "bash", "env 'BASH_FUNC_ls%%=() { touch m; }' bash -c ls"),
    Proof("SHELLOPTS", "bash", "env SHELLOPTS=xtrace bash -c \"PS4='\\$(touch m)'; :\""),
    # array subscripts in a name run their `$(...)`, whichever builtin is given the name
    Proof("subscript", "bash", "printf -v 'a[$(touch m)]' x"),
    Proof("subscript", "bash", "printf -v 'a[`touch m`]' x"),
    Proof("subscript", "bash", "read 'a[$(touch m)]' <<< x"),
    Proof("subscript", "bash", "declare 'a[$(touch m)]=1'"),
    Proof("subscript", "bash", "typeset 'a[$(touch m)]=1'"),
    Proof("subscript", "bash", "f() { local 'a[$(touch m)]=1'; }; f"),
    Proof("subscript", "bash", "let 'a[$(touch m)]=1'"),
    Proof("subscript", "bash", "test -v 'a[$(touch m)]'"),
    Proof("subscript", "bash", "[ -v 'a[$(touch m)]' ]"),
    Proof("subscript", "bash", "declare -n r='a[$(touch m)]'; r=1"),
    Proof("subscript", "bash", "declare -i n; n='a[$(touch m)]'"),
    # through the builtins that run a builtin
    Proof("eval", "bash", "command eval 'touch m'"),
    Proof("eval", "bash", "builtin eval 'touch m'"),
    Proof("eval", "dash", "command eval 'touch m'"),
    Proof("mapfile", "bash", "echo v | builtin mapfile -t -c 1 -C 'touch m;:'"),
]


def _ran(folder: Path, proof: Proof) -> bool:
    folder.mkdir()
    if proof.entry == "enable":
        if shutil.which("cc") is None:
            pytest.skip("no C compiler to build a loadable builtin")
        (folder / "lib.c").write_text(LIBRARY)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", "lib.so", "lib.c"], cwd=folder, check=True, timeout=60)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8", "TERM": "dumb"}
    if proof.keys is None:
        subprocess.run([f"/bin/{proof.shell}", "-c", proof.command], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30, check=False)  # fmt: skip
    else:
        _interactive(folder, env, proof.command.split("\n"), proof.keys)
    return (folder / "m").exists()


def _interactive(folder: Path, env: dict[str, str], lines: list[str], keys: str) -> None:
    """Types `lines` then `keys` into `bash -i` on a pty (readline: completion, key bindings, PS0), then kills it."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: never returns
        os.chdir(folder)
        os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], env)  # noqa: S606  (a fixed argv, no shell)
    try:
        _prompted(fd)
        for line in lines:
            os.write(fd, line.encode() + b"\n")
            _prompted(fd)  # the line was read and run: bash prompts for the next
        os.write(fd, keys.encode())
        deadline = time.monotonic() + 10
        while not (folder / "m").exists() and time.monotonic() < deadline:
            _drain(fd, 0.1)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


PROMPT = re.compile(rb"bash-[0-9.]+[$#] $")
"""bash's own prompt without a startup file (`\\s-\\v\\$ `), last in what it wrote: it waits for a line."""


def _prompted(fd: int) -> None:
    """Read what bash writes until it ends with its prompt, within a deadline that only bounds a failure (then the
    test goes on as it did after a fixed wait, and the check that the code ran decides)."""
    written = b""
    deadline = time.monotonic() + scaled(10)
    while not PROMPT.search(written) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                written += os.read(fd, 4096)
            except OSError:
                return


def _drain(fd: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                os.read(fd, 4096)
            except OSError:
                return


@pytest.mark.parametrize("proof", PROOFS, ids=[f"{p.shell}:{p.command[:40]}" for p in PROOFS])
def test_each_entry_runs_code_in_the_real_shell_and_the_gateway_knows_it(tmp_path: Path, proof: Proof) -> None:
    assert _ran(tmp_path / "run", proof), f"{proof.shell} did not run the code of {proof.command!r}"

    command = proof.command.replace("./lib.so", "lib.so")
    assert judge(ALLOW_ALL, "Bash", {"command": command}).verdict != "allow", "never allow-eligible"
    verdict = judge(DENY_TOUCH, "Bash", {"command": command}).verdict
    assert verdict == ("deny" if proof.readable else "ask"), verdict


def test_every_inventory_entry_has_a_proof() -> None:
    proven = {p.entry for p in PROOFS}
    assert set(CODE_BUILTINS) | set(CODE_VARIABLES) <= proven
    assert {p.shell for p in PROOFS if p.entry in CODE_BUILTINS} == {"bash", "dash"}
    for name, builtin in CODE_BUILTINS.items():
        assert {p.shell for p in PROOFS if p.entry == name} <= set(builtin.shells), name


def test_the_inventory_is_every_code_builtin_bash_documents() -> None:
    """`help` lists bash's builtins: each is in the inventory, known as a wrapper or assignment builtin,
    or named here as running no code of its own (reviewed against `help NAME`)."""
    listed = subprocess.run(["/bin/bash", "-c", "compgen -b"], capture_output=True, text=True, timeout=30, check=True)
    builtins = set(listed.stdout.split())
    wrappers = {"command", "builtin", "exec", "time"}
    subscripts = {"printf", "read", "declare", "typeset", "local", "let", "test", "["}
    no_code = {
        ":", "true", "false", "echo", "cd", "pwd", "pushd", "popd", "dirs", "exit", "logout", "return", "break",
        "continue", "shift", "export", "readonly", "unset", "set", "shopt", "umask", "ulimit", "times", "type",
        "help", "kill", "wait", "disown", "suspend", "fg", "bg", "getopts", "caller", "compopt", "unalias",
    }  # fmt: skip
    assert builtins - set(CODE_BUILTINS) - wrappers - subscripts - no_code == set()


def test_the_inventory_is_every_code_builtin_dash_documents() -> None:
    """dash(1)'s Builtins section, each name dash itself calls a builtin: in the inventory for dash,
    a wrapper, or named here as running no code of its own. (`fc -e` is documented but this dash is
    built without line editing; bash's `fc` entry reads it all the same.)"""
    manual = Path("/usr/share/man/man1/dash.1.gz")
    if not manual.exists():
        pytest.skip("dash(1) is not installed")
    text = gzip.decompress(manual.read_bytes()).decode("utf-8", "replace")
    section = text.split(".Ss Builtins", 1)[1].split(".Ss Command Line Editing", 1)[0]
    named = set(re.findall(r"^\.It (?:Xo )?(?:\\&)?([a-z.\[:]+)", section, re.MULTILINE))
    kinds = subprocess.run(["/bin/dash", "-c", 'for n in "$@"; do command -V "$n"; done', "-", *sorted(named)],
                           capture_output=True, text=True, timeout=30, check=False).stdout  # fmt: skip
    builtins = {line.split(" is ")[0] for line in kinds.splitlines() if "builtin" in line}
    assert {"eval", "trap", "alias", ".", "command", "exec"} <= builtins
    dash_code = {name for name, builtin in CODE_BUILTINS.items() if "dash" in builtin.shells}
    wrappers = {"command", "exec"}
    no_code = {
        ":", "true", "false", "echo", "printf", "cd", "chdir", "pwd", "exit", "return", "break", "continue", "shift",
        "export", "readonly", "unset", "set", "umask", "ulimit", "times", "type", "kill", "wait", "fg", "bg", "jobs",
        "getopts", "read", "test", "[", "hash", "unalias", "local",
    }  # fmt: skip
    assert builtins - dash_code - wrappers - no_code == set()
