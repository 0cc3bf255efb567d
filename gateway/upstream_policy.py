"""`upstreams` of policy.yaml (docs/upstreams.md, decision 84): existing MCP servers put behind the pipeline, read into frozen values.

An upstream is a command (its program found and pinned at load, as a declared tool's: gateway/programs.py;
`{workspace}` the only placeholder, a whole element), the server's view of the workspace, its network, its
environment (literals, and `${VAR}` taken from the gateway's environment when the server starts, never
here), how far it is trusted, the tools it may offer, the permission they need, and its limits (each at most
the sandbox's). Every mistake is a `file:line: message`; gateway/upstreams/ runs the servers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

import yaml

from gateway.declarations import (
    RESERVED_TOOL_NAMES,
    WORKSPACE_PLACEHOLDER,
    Ceilings,
    placeholder_of,
    read_limit,
    read_program,
)
from gateway.egress_policy import Network, read_network
from gateway.programs import Program
from gateway.rbac import Permission
from gateway.rules.egress import EgressRules

if TYPE_CHECKING:
    from gateway.policy_nodes import NodeReader

SEPARATOR = "__"
"""Between an upstream's name and its tool's in the name the gateway offers: `git__git_commit`."""
TRUST_LEVELS = ("trusted", "untrusted")
"""gateway/tools/base.py `Trust`, spelled as the policy spells it (this band cannot import the tools)."""

_UPSTREAM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,31}(?:_[A-Za-z0-9-]+)*$")
"""A letter, then letters, digits, '-' and single '_' (never two in a row: `__` separates the tool)."""
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]{0,127})\}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NEVER_PASSED = ("MCP_GATEWAY",)
"""The gateway's own variables (its token among them) never reach an upstream, by name or by reference."""
_MAX_COMMAND = 64
_MAX_ENV = 64
_MAX_TOOLS = 256
_MAX_VALUE = 4096
_KEYS = (
    "command", "workspace", "network", "env", "trust", "tools", "permission", "timeout_s",
    "memory_limit_mb", "max_processes", "relay_elicitation", "max_output_bytes",
)  # fmt: skip


class UpstreamWorkspace(StrEnum):
    """The server's view of the workspace: read it, or also write it (but never `sandbox.protected_paths`)."""

    READ_ONLY = "read_only"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class EnvValue:
    """One variable of the server's environment: a literal, or a reference to the gateway's own (`${VAR}`)."""

    literal: str | None = None
    reference: str | None = None
    """The gateway's variable whose value the server gets, read when the server starts."""


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    command: tuple[str, ...]
    """As written: command[0] the program, `{workspace}` a whole element."""
    program: Program
    workspace: UpstreamWorkspace
    network: bool
    """`network: true`: the host's whole network."""
    egress: EgressRules | None
    """`network` as a mapping: the server reaches only what these rules let through the gateway's proxy."""
    env: Mapping[str, EnvValue]
    trust: str
    """`trusted` or `untrusted` (TRUST_LEVELS)."""
    tools: tuple[str, ...]
    """The server's tools the gateway offers (by their own names); none when empty."""
    permission: Permission
    timeout_s: int
    """Per call."""
    memory_limit_mb: int
    """For the whole server, as max_processes."""
    max_processes: int
    relay_elicitation: bool
    max_output_bytes: int

    def offered_name(self, tool: str) -> str:
        return f"{self.name}{SEPARATOR}{tool}"


def resolve_env(upstream: Upstream, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's own variables, each `${VAR}` read from `environ` now. Raises KeyError naming the first
    variable `environ` lacks (the name only: never a value)."""
    out: dict[str, str] = {}
    for name, value in upstream.env.items():
        if value.reference is not None:
            if value.reference not in environ:
                raise KeyError(value.reference)
            out[name] = environ[value.reference]
        else:
            out[name] = str(value.literal)
    return out


def read_upstreams(
    r: NodeReader, node: yaml.Node, ceilings: Ceilings, max_output_bytes: int, taken: Collection[str]
) -> Mapping[str, Upstream]:
    """`upstreams`: name -> Upstream. `taken`: the names of the gateway's own tools (built-in and declared)."""
    out: dict[str, Upstream] = {}
    path = os.environ.get("PATH", os.defpath)
    for name, value in r.mapping(node, "upstreams", None).items():
        if SEPARATOR in name or not _UPSTREAM_NAME.fullmatch(name):
            raise r.fail(
                value,
                f"upstream name {name!r} must be a letter, then letters, digits, '-' or single '_'"
                f" (never {SEPARATOR!r}: it separates the upstream from its tool in the names offered)",
            )
        if name in taken or name in RESERVED_TOOL_NAMES:
            raise r.fail(value, f"upstream {name!r} has the name of a tool: choose another name")
        upstream = _upstream(r, name, value, ceilings, max_output_bytes=max_output_bytes, search_path=path)
        clash = next((t for t in upstream.tools if upstream.offered_name(t) in taken), None)
        if clash is not None:
            raise r.fail(value, f"upstreams.{name}: {upstream.offered_name(clash)!r} is already a tool's name")
        out[name] = upstream
    return MappingProxyType(out)


def _upstream(
    r: NodeReader, name: str, node: yaml.Node, ceilings: Ceilings, *, max_output_bytes: int, search_path: str
) -> Upstream:
    what = f"upstreams.{name}"
    d = r.mapping(node, what, _KEYS)
    if "command" not in d:
        raise r.fail(node, f"{what} needs 'command' (the server's program, then its arguments)")
    command, nodes = _command(r, d["command"], what)
    program = read_program(r, command[0], nodes[0], ceilings, search_path)
    workspace = UpstreamWorkspace.READ_ONLY
    if "workspace" in d:
        workspace = UpstreamWorkspace(r.choice(d["workspace"], f"{what}.workspace", tuple(UpstreamWorkspace)))
    permission = Permission.ORCHESTRATION_RUN
    if "permission" in d:
        permission = Permission(r.choice(d["permission"], f"{what}.permission", tuple(Permission)))
    trust = r.choice(d["trust"], f"{what}.trust", TRUST_LEVELS) if "trust" in d else "untrusted"
    tools = tuple(tool for tool, _ in _tools(r, d["tools"], what)) if "tools" in d else ()
    network = read_network(r, d["network"], f"{what}.network") if "network" in d else Network()

    def limit(key: str, ceiling: int) -> int:
        return read_limit(r, d, f"{what}.{key}", ceiling)

    return Upstream(
        name=name,
        command=command,
        program=program,
        workspace=workspace,
        network=network.open,
        egress=network.rules,
        env=_env(r, d["env"], what) if "env" in d else MappingProxyType({}),
        trust=trust,
        tools=tools,
        permission=permission,
        timeout_s=limit("timeout_s", ceilings.timeout_s),
        memory_limit_mb=limit("memory_limit_mb", ceilings.memory_limit_mb),
        max_processes=limit("max_processes", ceilings.max_processes),
        relay_elicitation=(
            r.boolean(d["relay_elicitation"], f"{what}.relay_elicitation") if "relay_elicitation" in d else False
        ),
        max_output_bytes=limit("max_output_bytes", max_output_bytes),
    )


def _command(r: NodeReader, node: yaml.Node, what: str) -> tuple[tuple[str, ...], tuple[yaml.Node, ...]]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.fail(node, f"{what}.command must be a non-empty list (the program, then its arguments)")
    if len(node.value) > _MAX_COMMAND:
        raise r.fail(node, f"{what}.command has more than {_MAX_COMMAND} elements")
    words: list[str] = []
    for item in node.value:
        word = r.string(item, f"an element of {what}.command")
        if _CONTROL.search(word):
            raise r.fail(item, f"{what}.command element {word!r} holds a control character")
        placeholder = placeholder_of(word)
        if placeholder is not None and placeholder != WORKSPACE_PLACEHOLDER:
            raise r.fail(item, f"{what}.command: {word!r} is not a placeholder an upstream has (only {{workspace}})")
        if placeholder is None and "{workspace}" in word:
            raise r.fail(
                item, f'{what}.command element {word!r}: {{workspace}} must be a whole element, e.g. "{{workspace}}"'
            )
        words.append(word)
    if placeholder_of(words[0]) is not None:
        raise r.fail(node.value[0], f"{what}.command must start with the program, not a placeholder")
    return tuple(words), tuple(node.value)


def _tools(r: NodeReader, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node]]:
    items = r.strings(node, f"{what}.tools")
    if len(items) > _MAX_TOOLS:
        raise r.fail(node, f"{what}.tools lists more than {_MAX_TOOLS} tools")
    for tool, item in items:
        if not _TOOL_NAME.fullmatch(tool):
            raise r.fail(item, f"{what}.tools: {tool!r} is not a tool name (letters, digits, '_', '.', '-')")
    return items


def _env(r: NodeReader, node: yaml.Node, what: str) -> Mapping[str, EnvValue]:
    items = r.mapping(node, f"{what}.env", None)
    if len(items) > _MAX_ENV:
        raise r.fail(node, f"{what}.env has more than {_MAX_ENV} variables")
    out: dict[str, EnvValue] = {}
    for name, value_node in items.items():
        where = f"{what}.env.{name}"
        if not _ENV_NAME.fullmatch(name):
            raise r.fail(value_node, f"{where}: {name!r} is not a variable name (letters, digits, '_')")
        if name.startswith(_NEVER_PASSED):
            raise r.fail(value_node, f"{where}: the gateway's own variables (MCP_GATEWAY_*) never reach an upstream")
        value = r.scalar(value_node, where)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise r.fail(value_node, f"{where} must be a string (a literal, or ${{VAR}} for the gateway's variable)")
        text = str(value)
        reference = _REFERENCE.fullmatch(text)
        if reference is not None:
            if reference.group(1).startswith(_NEVER_PASSED):
                raise r.fail(
                    value_node, f"{where}: the gateway's own variables (MCP_GATEWAY_*) never reach an upstream"
                )
            out[name] = EnvValue(reference=reference.group(1))
            continue
        if "${" in text:
            raise r.fail(value_node, f'{where}: a reference must be the whole value, e.g. "${{{name}}}"')
        if "\x00" in text or len(text) > _MAX_VALUE:
            raise r.fail(value_node, f"{where}: a value holds no NUL and at most {_MAX_VALUE} characters")
        out[name] = EnvValue(literal=text)
    return MappingProxyType(out)


def served_workspace(workspaces: Mapping[str, object]) -> str | None:
    """The workspace every upstream's server serves: the policy's first (decision 84); None without one."""
    return next(iter(workspaces), None)
