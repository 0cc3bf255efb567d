"""Programs that run code or files their arguments name (docs/claude-code.md): what an allow rule on them lets through.

`policy check` warns on a program-wide allow rule (`Bash(prog:*)`, `Bash(prog*)`, `Bash(prog *)`)
for one of these: Claude Code runs an allowed command in its own shell, unsandboxed, so such a
rule allows whatever the program can be told to do. The table says what that is, in a few words.
"""

from __future__ import annotations

import re

_ANY_CODE = "any code it is given (-c, -e, -m or a script)"
_ANY_COMMAND = "any command named in its arguments"
_PACKAGES = "installs packages, which run their own build and install code, and runs any package or script"

CODE_RUNNERS: dict[str, str] = {
    "pytest": ("the project's tests and conftest.py, any module (-p NAME imports it), any config "
               "(-c FILE, --rootdir, --override-ini, --confcutdir), and deletes --basetemp=DIR"),
    "py.test": "the same as pytest",
    "python": _ANY_CODE, "python3": _ANY_CODE, "pypy3": _ANY_CODE, "node": _ANY_CODE, "deno": _ANY_CODE,
    "bun": _ANY_CODE, "perl": _ANY_CODE, "ruby": _ANY_CODE, "php": _ANY_CODE, "lua": _ANY_CODE,
    "Rscript": _ANY_CODE, "osascript": _ANY_CODE,
    "sh": _ANY_CODE, "bash": _ANY_CODE, "zsh": _ANY_CODE, "dash": _ANY_CODE, "ksh": _ANY_CODE, "fish": _ANY_CODE,
    "npm": _PACKAGES, "npx": _PACKAGES, "pnpm": _PACKAGES, "yarn": _PACKAGES, "pip": _PACKAGES,
    "pip3": _PACKAGES, "pipx": _PACKAGES, "uv": _PACKAGES, "uvx": _PACKAGES, "poetry": _PACKAGES,
    "gem": _PACKAGES, "bundle": _PACKAGES, "composer": _PACKAGES,
    "make": "any recipe of any makefile (-f FILE), with variables set on its command line",
    "cargo": "build scripts, any binary (cargo run) and any --config",
    "go": "any program (go run, go generate, -exec, -toolexec)",
    "git": ("hooks, aliases (-c alias.x=!cmd), config that runs commands (core.fsmonitor, core.sshCommand, "
            "diff and merge drivers), and writes anywhere (--output, -C DIR)"),
    "docker": "containers with any mount, the host's root included", "podman": "containers with any mount",
    "kubectl": "commands in any pod it can reach (exec, run)",
    "awk": "shell commands through system()", "gawk": "shell commands through system()",
    "sed": "shell commands (GNU sed's e) and writes any file (w, -i)",
    "tar": "commands (--to-command, --checkpoint-action=exec) and writes anywhere",
    "rsync": "commands (-e, --rsync-path) and writes anywhere", "ssh": "commands here and elsewhere (ProxyCommand)",
    "vim": "shell commands (:!, -c)", "nvim": "shell commands (:!, -c)",
    "env": _ANY_COMMAND, "xargs": _ANY_COMMAND, "find": f"{_ANY_COMMAND} (-exec) and deletes (-delete)",
    "nice": _ANY_COMMAND, "nohup": _ANY_COMMAND, "timeout": _ANY_COMMAND, "time": _ANY_COMMAND,
    "sudo": _ANY_COMMAND, "doas": _ANY_COMMAND, "exec": _ANY_COMMAND, "command": _ANY_COMMAND,
    "builtin": _ANY_COMMAND, "eval": _ANY_COMMAND, "watch": _ANY_COMMAND, "busybox": _ANY_COMMAND,
    "stdbuf": _ANY_COMMAND, "setsid": _ANY_COMMAND, "flock": _ANY_COMMAND, "script": _ANY_COMMAND,
    "su": _ANY_COMMAND, "chroot": _ANY_COMMAND, "ionice": _ANY_COMMAND, "strace": _ANY_COMMAND,
}  # fmt: skip
"""Program -> what a program-wide allow rule on it lets through, unsandboxed."""

_VERSIONED = re.compile(r"(python|pypy|pip|ruby|perl|php|lua|node)[0-9.]+")
_PROGRAM_WIDE = re.compile(r"(?P<program>[^\s*:]+)(?::\*| ?\*)")


def program_wide_code_runner(spec: str | None) -> tuple[str, str] | None:
    """For a Bash rule's specifier that allows every argument of a program that runs code
    (`pytest:*`, `python*`, `make *`): the program and what the rule lets through; else None."""
    match = _PROGRAM_WIDE.fullmatch(spec.strip()) if spec else None
    if match is None:
        return None
    program = match.group("program").rstrip("/").rsplit("/", 1)[-1]
    named = _VERSIONED.sub(lambda m: m.group(1) + ("3" if m.group(1) in ("python", "pip") else ""), program)
    for name in (program, named, named.removesuffix("3")):
        if name in CODE_RUNNERS:
            return program, CODE_RUNNERS[name]
    return None
