"""Programs that run another command (docs/claude-code.md, "Rules"): which words of theirs are that command.

`sudo -u root env FOO=1 nice -n 5 rm -rf ~` runs `rm`. For each wrapper the table says which
options take a value, how many operands come before the command, and which options hold a
shell command. An option it does not know is read both ways (with and without a value), so an
unknown option makes the deny side read more, never less.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.rules.shell.code_builtins import CODE_BUILTINS, code_of
from gateway.rules.shell.words import EXPANSION, Word

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "rbash", "lksh", "pdksh"})
"""Programs that read shell commands from `-c STRING`, a here-document or a pipe."""
_SHELL_VALUED = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=", re.DOTALL)
_MAX_BRANCHES = 32


@dataclass(frozen=True, slots=True)
class Wrapper:
    valued: frozenset[str] = frozenset()
    """Options whose value is the next word (or glued: `-n5`, `--user=x`)."""
    flags: frozenset[str] = frozenset()
    """Options known to take no value."""
    operands: int = 0
    """Words between the options and the command (timeout's duration, chroot's folder)."""
    command_options: frozenset[str] = frozenset()
    """Options whose value is a shell command (`su -c`, `flock -c`, `env -S`)."""
    assignments: bool = False
    """`NAME=value` words may come before the command (env)."""
    joined: bool = False
    """The command's words are joined with spaces and run by a shell (watch)."""


def _w(valued: str = "", flags: str = "", **kw: object) -> Wrapper:
    return Wrapper(frozenset(valued.split()), frozenset(flags.split()), **kw)  # type: ignore[arg-type]


WRAPPERS: dict[str, Wrapper] = {
    "command": _w(flags="-p -v -V"),
    "builtin": _w(),
    "exec": _w("-a", "-c -l"),
    "noglob": _w(),
    "nocorrect": _w(),
    "time": _w("-f --format -o --output", "-p -a -v -q --append --verbose --quiet --portability"),
    "env": _w("-u --unset -C --chdir", "-i -0 -v --ignore-environment --null --debug", command_options=frozenset({"-S", "--split-string"}), assignments=True),
    "nice": _w("-n --adjustment"),
    "ionice": _w("-c --class -n --classdata -p --pid -P --pgid -u --uid", "-t --ignore"),
    "nohup": _w(),
    "setsid": _w(flags="-c -f -w --ctty --fork --wait"),
    "timeout": _w("-s --signal -k --kill-after", "-v --verbose --preserve-status --foreground", operands=1),
    "stdbuf": _w("-i -o -e --input --output --error"),
    "sudo": _w("-u --user -g --group -p --prompt -C --close-from -D --chdir -r --role -t --type -T --command-timeout -U --other-user -R --chroot -h --host",
               "-A -b -E -e -H -i -K -k -l -n -P -S -s -V -v --askpass --background --preserve-env --edit --set-home --login --remove-timestamp --reset-timestamp --list --non-interactive --preserve-groups --stdin --shell"),
    "doas": _w("-u -C", "-n -s"),
    "su": _w("-s --shell -g --group -G --supp-group -w --whitelist-environment", "-l --login -m -p --preserve-environment -P --pty -f", command_options=frozenset({"-c", "--command", "--session-command"})),
    "runuser": _w("-u --user -s --shell -g --group -G --supp-group -w", "-l --login -m -p --preserve-environment", command_options=frozenset({"-c", "--command", "--session-command"})),
    "xargs": _w("-a --arg-file -d --delimiter -E -I -L -n --max-args -P --max-procs -s --max-chars --process-slot-var -e --eof --replace -l --max-lines",
                "-0 --null -o --open-tty -p --interactive -r --no-run-if-empty -t --verbose -x --exit -i"),
    "busybox": _w(),
    "toybox": _w(),
    "chroot": _w("--userspec --groups", "--skip-chdir", operands=1),
    "flock": _w("-w --timeout -E --conflict-exit-code", "-s --shared -x -e --exclusive -u --unlock -n --nb --nonblock -o --close -F --no-fork", command_options=frozenset({"-c", "--command"}), operands=1),
    "watch": _w("-n --interval -d --differences -q --equexit", "-b --beep -c --color -e --errexit -g --chgexit -p --precise -t --no-title -x --exec", joined=True),
    "script": _w("-E --echo -I --log-in -O --log-out -B --log-io -T --log-timing -m --logging-format", "-a --append -e --return -f --flush -q --quiet", command_options=frozenset({"-c", "--command"})),
    "unbuffer": _w(),
    "taskset": _w(flags="-a --all-tasks -c --cpu-list", operands=1),
    "chrt": _w(flags="-a -b -d -f -i -o -r -R -m -v", operands=1),
    "strace": _w("-e -o -p -s -u -E -a -b -I -O -P -S -X"),
    "ltrace": _w("-e -o -p -s -u -a -l -n -A -D -F -L -x"),
    "catchsegv": _w(),
    "fakeroot": _w("-l --lib --faked -s -i -b"),
    "setpriv": _w("--reuid --regid --groups --securebits --pdeathsig --selinux-label --apparmor-profile --inh-caps --ambient-caps --bounding-set"),
    "systemd-run": _w("-p --property -u --unit -E --setenv -M --machine --uid --gid --nice --working-directory --slice --description -H --host"),
}  # fmt: skip


def inner_commands(name: str, args: Sequence[Word]) -> tuple[list[list[Word]], list[str]]:
    """For a wrapper `name` with these arguments: the commands it may run, and shell texts it runs."""
    if name == "find":
        return _find_exec(args), []
    if name in SHELLS:
        return [], shell_command(args) or []
    if name in CODE_BUILTINS:
        return code_of(name, args)
    wrapper = WRAPPERS.get(name)
    if wrapper is None:
        return [], []
    commands: list[list[Word]] = []
    texts: list[str] = []
    for start, shell_texts in _starts(wrapper, args):
        texts.extend(shell_texts)
        if name == "command" and any(w.text in ("-v", "-V") for w in args[:start]):
            continue  # `command -v rm` only says where rm is
        if start < len(args):
            commands.append(list(args[start:]))
            if wrapper.joined or (
                name == "sudo" and any(w.text in ("-s", "-i", "--shell", "--login") for w in args[:start])
            ):
                texts.append(" ".join(w.text for w in args[start:]))
    return commands, texts


def shell_command(args: Sequence[Word]) -> list[str] | None:
    """The text a shell with these arguments runs from `-c`: [] if it runs a script file; None if
    it reads its commands from its standard input."""
    i, takes_string = 0, False
    while i < len(args):
        word = args[i].text
        if word in ("--", "-"):
            i += 1
            break
        if word in _SHELL_VALUED:
            i += 2
            continue
        if len(word) > 1 and word[0] in "-+" and not word.startswith("--"):
            takes_string = takes_string or "c" in word[1:]
            stdin = "s" in word[1:]
            i += 1
            if stdin and not takes_string:
                return None
            continue
        if word.startswith("--"):
            i += 1
            continue
        break
    if takes_string:
        return [args[i].text] if i < len(args) else []
    return None if i >= len(args) else []


def is_assignment(word: Word) -> bool:
    """`NAME=value`, `NAME+=value`, `NAME[i]=value`: an assignment, not a command word (the value
    may hold an expansion: `A=$(x) rm`)."""
    known = word.chars[: word.chars.index(EXPANSION)] if EXPANSION in word.chars else word.chars
    return _ASSIGNMENT.match("".join(ch for ch, _ in known) if word.chars else word.text) is not None


def _starts(wrapper: Wrapper, args: Sequence[Word]) -> list[tuple[int, list[str]]]:
    """Where the wrapped command may start in `args` (several when an option is not known)."""
    done: list[tuple[int, list[str]]] = []
    pending: list[tuple[int, list[str]]] = [(0, [])]
    while pending and len(done) < _MAX_BRANCHES:
        i, texts = pending.pop()
        while i < len(args):
            word = args[i].text
            if wrapper.assignments and is_assignment(args[i]):
                i += 1
                continue
            if word == "--":
                i += 1
                break
            if not (args[i].known and len(word) > 1 and word.startswith("-")):
                break
            name, glued = (word.split("=", 1)[0], "=" in word) if word.startswith("--") else (word[:2], len(word) > 2)
            if name in wrapper.command_options:
                value = word.split("=", 1)[1] if word.startswith("--") and glued else word[2:] if glued else None
                if value is None and i + 1 < len(args):
                    value = args[i + 1].text
                texts = [*texts, value] if value is not None else texts
                i += 1 if glued else 2
            elif name in wrapper.valued:
                i += 1 if glued else 2
            elif word in wrapper.flags or (
                not word.startswith("--") and all(f"-{c}" in wrapper.flags for c in word[1:])
            ):
                i += 1
            else:  # not known: with a value, and without
                pending.append((i + 2, texts))
                i += 1
        done.append((i + wrapper.operands, texts))
    return done


def _find_exec(args: Sequence[Word]) -> list[list[Word]]:
    commands, i = [], 0
    while i < len(args):
        if args[i].text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((j for j in range(i + 1, len(args)) if args[j].text in (";", "+")), len(args))
            if end > i + 1:
                commands.append(list(args[i + 1 : end]))
            i = end
        i += 1
    return commands
