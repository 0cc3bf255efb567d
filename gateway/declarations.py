"""`tools.declared` of policy.yaml (docs/declared-tools.md, decision 77): tools a policy's author declares, read into frozen values.

A declaration is an argv template, typed arguments, a permission, annotations, a workspace mode
and limits at most the sandbox's. Every mistake is a `file:line: message`. The program is found
and pinned here (gateway/programs.py); gateway/tools/declared.py makes the tool of it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from gateway.canonical import canonical_json
from gateway.programs import Program, ProgramError, find_program, pin_program
from gateway.rbac import Permission

if TYPE_CHECKING:
    from gateway.policy_nodes import NodeReader

RESERVED_TOOL_NAMES = frozenset({"check_permission"})
"""Offered by the gateway itself when permission_prompt.enabled (docs/claude-code.md)."""
RESERVED_ARGUMENTS = frozenset({"workspace", "timeout_s"})
"""Every declared tool's own inputSchema properties (the workspace to run in, a shorter time limit)."""
WORKSPACE_PLACEHOLDER = "workspace"

_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_ARGUMENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MAX_TEMPLATE = 64
_MAX_ARGUMENTS = 32
_MAX_LENGTH = 4096
_KEYS = (
    "description", "command", "arguments", "permission", "annotations", "workspace",
    "timeout_s", "memory_limit_mb", "max_processes",
)  # fmt: skip
_ANNOTATIONS = ("title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


class WorkspaceMode(StrEnum):
    READ_ONLY = "read_only"
    REVIEW = "review"
    WRITE = "write"


class ArgumentType(StrEnum):
    PATH = "path"
    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    ENUM = "enum"


_TYPE_KEYS: Mapping[ArgumentType, tuple[str, ...]] = MappingProxyType(
    {
        ArgumentType.PATH: ("type", "description", "default", "flag"),
        ArgumentType.STRING: ("type", "description", "default", "flag", "pattern", "max_length"),
        ArgumentType.INTEGER: ("type", "description", "default", "flag", "min", "max"),
        ArgumentType.BOOLEAN: ("type", "description", "flag"),
        ArgumentType.ENUM: ("type", "description", "default", "flag", "values"),
    }
)

Value = str | int | bool


@dataclass(frozen=True, slots=True)
class Argument:
    name: str
    type: ArgumentType
    description: str | None = None
    flag: str | None = None
    default: Value | None = None
    """None: no default (then, without a flag, the argument is required)."""
    pattern: str | None = None
    """A string's regex, matched against the whole value."""
    max_length: int = 1024
    minimum: int = 0
    maximum: int = 2**31 - 1
    values: tuple[str, ...] = ()

    @property
    def required(self) -> bool:
        return self.default is None and self.flag is None


@dataclass(frozen=True, slots=True)
class Declaration:
    name: str
    description: str
    command: tuple[str, ...]
    """argv template: command[0] is the program as written, each `{name}` a whole element."""
    arguments: tuple[Argument, ...]
    permission: Permission
    annotations: Mapping[str, Any]
    workspace: WorkspaceMode
    timeout_s: int
    memory_limit_mb: int
    max_processes: int
    program: Program

    def argument(self, name: str) -> Argument | None:
        return next((a for a in self.arguments if a.name == name), None)

    def document(self) -> dict[str, Any]:
        """All of the declaration, the program's identity included: what its consent fingerprint covers."""
        return {
            "description": self.description,
            "command": list(self.command),
            "arguments": [
                {key: (list(v) if isinstance(v, tuple) else v) for key, v in _fields(a).items()} for a in self.arguments
            ],
            "permission": str(self.permission),
            "annotations": dict(self.annotations),
            "workspace": str(self.workspace),
            "limits": [self.timeout_s, self.memory_limit_mb, self.max_processes],
            "program": self.program.identity(),
        }

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.document()).encode()).hexdigest()


def _fields(argument: Argument) -> dict[str, Any]:
    return {name: getattr(argument, name) for name in Argument.__slots__}


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The sandbox's limits, which a declared tool's own may only lower; and what the run may read."""

    timeout_s: int
    memory_limit_mb: int
    max_processes: int
    readable: tuple[Path, ...]
    """Folders the run can read: the runtime's (the interpreter's prefixes, /usr, /lib) and sandbox.allowed_paths."""
    workspaces: tuple[Path, ...]


def placeholder_of(word: str) -> str | None:
    """The name of the placeholder `word` is (`{path}` -> `path`), or None for a literal (`{}` is one)."""
    match = _PLACEHOLDER.fullmatch(word)
    return None if match is None else match.group(1)


def read_declared(
    r: NodeReader, node: yaml.Node, ceilings: Ceilings, taken: Collection[str], search_path: str | None = None
) -> Mapping[str, Declaration]:
    """`tools.declared`: name -> Declaration. `taken`: the built-in tools' names."""
    out: dict[str, Declaration] = {}
    path = os.environ.get("PATH", os.defpath) if search_path is None else search_path
    for name, value in r.mapping(node, "tools.declared", None).items():
        if not _TOOL_NAME.fullmatch(name):
            raise r.fail(value, f"declared tool name {name!r} must be a letter, then letters, digits, '_' or '-'")
        if name in taken or name in RESERVED_TOOL_NAMES:
            raise r.fail(value, f"declared tool {name!r} has the name of a built-in tool: choose another name")
        out[name] = _declaration(r, name, value, ceilings, path)
    return MappingProxyType(out)


def _declaration(r: NodeReader, name: str, node: yaml.Node, ceilings: Ceilings, search_path: str) -> Declaration:
    what = f"tools.declared.{name}"
    d = r.mapping(node, what, _KEYS)
    for key in ("description", "command"):
        if key not in d:
            raise r.fail(node, f"{what} needs {key!r}")
    description = r.string(d["description"], f"{what}.description")
    argument_nodes = r.mapping(d["arguments"], f"{what}.arguments", None) if "arguments" in d else {}
    arguments = _arguments(r, d.get("arguments"), what)
    command, command_nodes = _command(r, d["command"], what)
    _check_placeholders(r, command, command_nodes, arguments, argument_nodes=argument_nodes, what=what)
    mode = (
        WorkspaceMode(r.choice(d["workspace"], f"{what}.workspace", tuple(WorkspaceMode)))
        if "workspace" in d
        else WorkspaceMode.READ_ONLY
    )
    permission = Permission.ORCHESTRATION_RUN
    if "permission" in d:
        permission = Permission(r.choice(d["permission"], f"{what}.permission", tuple(Permission)))
    annotations = _annotations(r, d.get("annotations"), what, description, mode)
    program = read_program(r, command[0], command_nodes[0], ceilings, search_path)

    def limit(key: str, ceiling: int) -> int:
        return read_limit(r, d, f"{what}.{key}", ceiling)

    return Declaration(
        name=name,
        description=description,
        command=command,
        arguments=arguments,
        permission=permission,
        annotations=annotations,
        workspace=mode,
        timeout_s=limit("timeout_s", ceilings.timeout_s),
        memory_limit_mb=limit("memory_limit_mb", ceilings.memory_limit_mb),
        max_processes=limit("max_processes", ceilings.max_processes),
        program=program,
    )


def read_limit(r: NodeReader, d: Mapping[str, yaml.Node], what: str, ceiling: int) -> int:
    """The limit `what` (`section.name.key`) as set, at most the sandbox's `ceiling`; the ceiling when unset."""
    key = what.rpartition(".")[2]
    if key not in d:
        return ceiling
    value = r.integer(d[key], what)
    if value > ceiling:
        raise r.fail(d[key], f"{what} is {value}, over sandbox.{key} ({ceiling}): lower it or raise the sandbox's")
    return value


def _command(r: NodeReader, node: yaml.Node, what: str) -> tuple[tuple[str, ...], tuple[yaml.Node, ...]]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.fail(node, f"{what}.command must be a non-empty list (the program, then its arguments)")
    if len(node.value) > _MAX_TEMPLATE:
        raise r.fail(node, f"{what}.command has more than {_MAX_TEMPLATE} elements")
    words: list[str] = []
    for item in node.value:
        word = r.string(item, f"an element of {what}.command")
        if _CONTROL.search(word):
            raise r.fail(item, f"{what}.command element {word!r} holds a control character")
        if _PLACEHOLDER.search(word) and not _PLACEHOLDER.fullmatch(word):
            raise r.fail(
                item, f'{what}.command element {word!r}: a placeholder must be a whole element, e.g. "{{path}}"'
            )
        words.append(word)
    if _PLACEHOLDER.fullmatch(words[0]):
        raise r.fail(node.value[0], f"{what}.command must start with the program, not a placeholder")
    return tuple(words), tuple(node.value)


def _check_placeholders(
    r: NodeReader,
    command: tuple[str, ...],
    nodes: tuple[yaml.Node, ...],
    arguments: tuple[Argument, ...],
    *,
    argument_nodes: Mapping[str, yaml.Node],
    what: str,
) -> None:
    names = {a.name for a in arguments}
    used: set[str] = set()
    for word, item in zip(command, nodes, strict=True):
        match = _PLACEHOLDER.fullmatch(word)
        if match is None:
            continue
        placeholder = match.group(1)
        if placeholder in used:
            raise r.fail(item, f"{what}.command uses {{{placeholder}}} twice")
        if placeholder != WORKSPACE_PLACEHOLDER and placeholder not in names:
            raise r.fail(item, f"{what}.command: placeholder {{{placeholder}}} has no argument in {what}.arguments")
        used.add(placeholder)
    for argument in arguments:
        if argument.name not in used and argument.flag is None:
            raise r.fail(
                argument_nodes[argument.name],
                f'{what}.arguments.{argument.name} is never used: put "{{{argument.name}}}" in the command or give it a flag',
            )


def _arguments(r: NodeReader, node: yaml.Node | None, what: str) -> tuple[Argument, ...]:
    if node is None:
        return ()
    items = r.mapping(node, f"{what}.arguments", None)
    if len(items) > _MAX_ARGUMENTS:
        raise r.fail(node, f"{what}.arguments has more than {_MAX_ARGUMENTS} arguments")
    out = []
    for name, value in items.items():
        if not _ARGUMENT_NAME.fullmatch(name):
            raise r.fail(value, f"argument name {name!r} in {what}.arguments must be letters, digits or '_'")
        if name in RESERVED_ARGUMENTS:
            raise r.fail(value, f"argument name {name!r} in {what}.arguments is reserved: every declared tool has it")
        out.append(_argument(r, name, value, f"{what}.arguments.{name}"))
    return tuple(out)


def _argument(r: NodeReader, name: str, node: yaml.Node, what: str) -> Argument:
    raw = r.mapping(node, what, None)
    if "type" not in raw:
        raise r.fail(node, f"{what} needs a type ({', '.join(ArgumentType)})")
    kind = ArgumentType(r.choice(raw["type"], f"{what}.type", tuple(ArgumentType)))
    d = r.mapping(node, what, _TYPE_KEYS[kind])
    flag = None
    if "flag" in d:
        flag = r.string(d["flag"], f"{what}.flag")
        if not _FLAG.fullmatch(flag):
            raise r.fail(d["flag"], f"{what}.flag must be an option such as -x or --name (no '=' or value)")
    if kind is ArgumentType.BOOLEAN and flag is None:
        raise r.fail(node, f"{what}: a boolean needs a flag (given alone when true)")
    description = r.string(d["description"], f"{what}.description") if "description" in d else None
    argument = Argument(name, kind, description, flag)
    if kind is ArgumentType.STRING:
        argument = _string(r, d, what, argument)
    elif kind is ArgumentType.INTEGER:
        argument = _integer(r, d, what, argument)
    elif kind is ArgumentType.ENUM:
        argument = _enum(r, d, what, argument)
    if "default" in d:
        argument = _with_default(r, d["default"], what, argument)
    return argument


def _string(r: NodeReader, d: dict[str, yaml.Node], what: str, argument: Argument) -> Argument:
    if "pattern" not in d:
        raise r.fail(d["type"], f"{what}: a string needs a pattern (a regex the whole value must match)")
    pattern = r.string(d["pattern"], f"{what}.pattern")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise r.fail(d["pattern"], f"{what}.pattern is not a valid regex ({exc.msg})") from None
    max_length = r.integer(d["max_length"], f"{what}.max_length") if "max_length" in d else argument.max_length
    if max_length > _MAX_LENGTH:
        raise r.fail(d["max_length"], f"{what}.max_length is at most {_MAX_LENGTH}")
    return Argument(
        argument.name, argument.type, argument.description, argument.flag, pattern=pattern, max_length=max_length
    )


def _integer(r: NodeReader, d: dict[str, yaml.Node], what: str, argument: Argument) -> Argument:
    low = (
        r.count(d["min"], f"{what}.min") if "min" in d else argument.minimum
    )  # never negative: '-5' reads as an option
    high = r.count(d["max"], f"{what}.max") if "max" in d else argument.maximum
    if high < low:
        raise r.fail(d["max"], f"{what}.max ({high}) is below {what}.min ({low})")
    return Argument(argument.name, argument.type, argument.description, argument.flag, minimum=low, maximum=high)


def _enum(r: NodeReader, d: dict[str, yaml.Node], what: str, argument: Argument) -> Argument:
    if "values" not in d:
        raise r.fail(d["type"], f"{what}: an enum needs values")
    items = r.strings(d["values"], f"{what}.values")
    if not items:
        raise r.fail(d["values"], f"{what}.values must list at least one value")
    for value, item in items:
        if value.startswith(("-", "@")) or _CONTROL.search(value):
            raise r.fail(
                item, f"{what}.values: {value!r} would read as an option (or holds a control character): use flag"
            )
    values = tuple(value for value, _ in items)
    return Argument(argument.name, argument.type, argument.description, argument.flag, values=values)


def _with_default(r: NodeReader, node: yaml.Node, what: str, argument: Argument) -> Argument:
    value = r.scalar(node, f"{what}.default")
    problem = value_problem(argument, value)
    if problem is not None:
        raise r.fail(node, f"{what}.default {value!r}: {problem}")
    return Argument(
        argument.name, argument.type, argument.description, argument.flag, value,
        argument.pattern, argument.max_length, argument.minimum, argument.maximum, argument.values,
    )  # fmt: skip


def value_problem(argument: Argument, value: object) -> str | None:
    """Why `value` is not a value of `argument` (None: it is). The path's place in the workspace is stage 4's."""
    kind = argument.type
    if kind is ArgumentType.BOOLEAN:
        return None if isinstance(value, bool) else "must be true or false"
    if kind is ArgumentType.INTEGER:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be an integer"
        return (
            None if argument.minimum <= value <= argument.maximum else f"must be {argument.minimum}..{argument.maximum}"
        )
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if value.startswith(("-", "@")) or _CONTROL.search(value):
        return "must not start with '-' or '@' (it would read as an option or a file of options) nor hold control characters"
    if kind is ArgumentType.ENUM:
        return None if value in argument.values else f"must be one of {', '.join(argument.values)}"
    if kind is ArgumentType.STRING:
        if len(value) > argument.max_length:
            return f"is longer than {argument.max_length} characters"
        return None if re.fullmatch(argument.pattern or "", value) else f"must match {argument.pattern!r}"
    if os.path.isabs(value):
        return "must be relative to the workspace"
    return None


def _annotations(
    r: NodeReader, node: yaml.Node | None, what: str, description: str, mode: WorkspaceMode
) -> Mapping[str, Any]:
    annotations: dict[str, Any] = {"title": description, "readOnlyHint": False}
    if node is not None:
        for key, value in r.mapping(node, f"{what}.annotations", _ANNOTATIONS).items():
            annotations[key] = (
                r.string(value, f"{what}.annotations.{key}")
                if key == "title"
                else r.boolean(value, f"{what}.annotations.{key}")
            )
        if annotations["readOnlyHint"] and mode is not WorkspaceMode.READ_ONLY:
            raise r.fail(
                node,
                f"{what}.annotations.readOnlyHint: a tool with workspace: {mode} changes files, it is not read-only",
            )
    return MappingProxyType(annotations)


def read_program(r: NodeReader, word: str, node: yaml.Node, ceilings: Ceilings, search_path: str) -> Program:
    """The program `word` names, found and pinned (gateway/programs.py), outside every workspace and inside what a run
    may read; a declared tool's, and an upstream's (gateway/upstream_policy.py)."""
    try:
        program = pin_program(find_program(word, Path(r.source).parent.resolve(), search_path))
    except ProgramError as exc:
        raise r.fail(node, str(exc)) from None
    for pinned in (program, program.interpreter):
        if pinned is None:
            continue
        inside = next((w for w in ceilings.workspaces if _is_within(pinned.real, w)), None)
        if inside is not None:
            raise r.fail(
                node, f"program {str(pinned.real)!r} is inside workspace {str(inside)!r}: the agent could change it"
            )
        if not any(_is_within(pinned.real, folder) for folder in ceilings.readable):
            raise r.fail(
                node,
                f"program {str(pinned.real)!r} is outside what a run may read: add its folder to sandbox.allowed_paths",
            )
    return program


def _is_within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents
