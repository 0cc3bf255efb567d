"""A tool declared in policy.yaml (docs/declared-tools.md, decision 77): its ToolSpec, its argv, its run.

`declared_tool` makes the catalogue entry of a `Declaration` (gateway/declarations.py): the
inputSchema from its arguments, its annotations, a `_meta` digest of the whole declaration (the
consent fingerprint covers it), and its behaviour. `render_argv` turns a call's arguments into
the argv, no shell anywhere: each `{name}` is one whole element, a path follows `./`, a value
never starts with '-' or '@' wherever it stands, a flag is the author's literal. The run is the
sandbox's (gateway/tools/confined.py), like run_pytest's, with the declaration's own limits; a
`write` or `review` tool's run works on a copy of the workspace and leaves a change set that the
pipeline applies or puts to a person (decision 80).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gateway.consent.stage import DECLARATION_META_KEY
from gateway.declarations import (
    WORKSPACE_PLACEHOLDER,
    Argument,
    ArgumentType,
    Declaration,
    WorkspaceMode,
    placeholder_of,
    value_problem,
)
from gateway.errors import GatewayError, InvalidParamsError, Reason
from gateway.policy import SandboxPolicy
from gateway.programs import check_program_unchanged
from gateway.runs import RunStatus
from gateway.tools.base import ExecutionRequest, ToolSpec
from gateway.tools.confined import ConfinedRun, confinement, run_confined, shown
from gateway.tools.outcome import ResourceLink, ToolOutcome
from gateway.tools.run_pytest import artifact_uri
from gateway.tools.schemas import NOT_AN_OPTION, WORKSPACE, object_schema
from sandbox.change_set import ChangeRules

ARTIFACTS = {"stdout.txt": "text/plain", "stderr.txt": "text/plain", "evidence.json": "application/json"}
STDOUT_CHARS = 4000
STDERR_CHARS = 2000
_TAIL_BYTES = 64 * 1024
FINISHED = ("exit_code", "duration_ms")


def declared_tool(declaration: Declaration) -> ToolSpec:
    """The catalogue entry of a declared tool."""
    tool = DeclaredTool(declaration)
    return ToolSpec(
        name=declaration.name,
        title=str(declaration.annotations.get("title", declaration.description)),
        description=declaration.description,
        permission=declaration.permission,
        input_schema=input_schema(declaration),
        annotations=declaration.annotations,
        path_arguments=tuple(a.name for a in declaration.arguments if a.type is ArgumentType.PATH),
        meta=MappingProxyType({DECLARATION_META_KEY: declaration.digest()}),
        execute=tool.execute,
        max_timeout_s=declaration.timeout_s,
        check_ready=tool.check_ready,
        programs=tuple(p.real for p in (declaration.program, declaration.program.interpreter) if p is not None),
        preview=tool.preview,
    )


def input_schema(declaration: Declaration) -> Mapping[str, Any]:
    properties: dict[str, Any] = {a.name: _property(a) for a in declaration.arguments}
    properties["workspace"] = WORKSPACE
    properties["timeout_s"] = {"type": "integer", "minimum": 1, "maximum": declaration.timeout_s}
    return object_schema(properties, [a.name for a in declaration.arguments if a.required])


def _property(argument: Argument) -> dict[str, Any]:
    kind = argument.type
    prop: dict[str, Any]
    if kind is ArgumentType.BOOLEAN:
        prop = {"type": "boolean"}
    elif kind is ArgumentType.INTEGER:
        prop = {"type": "integer", "minimum": argument.minimum, "maximum": argument.maximum}
    elif kind is ArgumentType.ENUM:
        prop = {"type": "string", "enum": list(argument.values)}
    elif kind is ArgumentType.STRING:
        prop = {
            "type": "string",
            "minLength": 1,
            "maxLength": argument.max_length,
            "pattern": f"^(?:{argument.pattern})$",
            "allOf": [{"pattern": NOT_AN_OPTION}],
        }
    else:
        prop = {
            "type": "string",
            "minLength": 1,
            "maxLength": 1024,
            "pattern": NOT_AN_OPTION,
            "description": "File or folder relative to the workspace root",
        }
    if argument.description is not None:
        prop["description"] = argument.description
    if argument.default is not None:
        prop["default"] = argument.default
    return prop


def render_argv(declaration: Declaration, arguments: Mapping[str, Any], root: Path) -> list[str]:
    """The argv of one call: the pinned program, then the template with each placeholder filled.

    A flagged argument with no placeholder of its own goes before the template's first `--`
    (after it, it would be an operand), else at the end. Raises InvalidParamsError on a value
    that is not one of its argument's, whatever stage 5 let through (defence in depth)."""
    template = declaration.command[1:]
    placed = {placeholder_of(word) for word in template}
    floating = [a for a in declaration.arguments if a.name not in placed]
    at = template.index("--") if "--" in template else len(template)
    argv = [str(declaration.program.path)]
    for index, word in enumerate((*template, None)):
        if index == at:
            for argument in floating:
                argv += _expand(argument, arguments)
        if word is None:
            break
        name = placeholder_of(word)
        if name == WORKSPACE_PLACEHOLDER:
            argv.append(str(root))
        elif name is not None:
            argv += _expand(_argument(declaration, name), arguments)
        else:
            argv.append(word)
    return argv


def _argument(declaration: Declaration, name: str) -> Argument:
    argument = declaration.argument(name)
    if argument is None:  # the policy loader refuses such a template
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, f"{{{name}}} has no argument")
    return argument


def _expand(argument: Argument, arguments: Mapping[str, Any]) -> list[str]:
    value = arguments.get(argument.name, argument.default)
    if argument.type is ArgumentType.INTEGER and isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's "integer" admits 3.0; the argv gets "3"
    if value is None:
        if argument.required:
            raise InvalidParamsError(Reason.INVALID_ARGUMENTS, f"{argument.name}: a required argument is missing")
        return []
    problem = value_problem(argument, value)
    if problem is not None:
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, f"{argument.name}: {problem}")
    if argument.type is ArgumentType.BOOLEAN:
        return [argument.flag] if value is True and argument.flag else []
    text = f"./{value}" if argument.type is ArgumentType.PATH else str(value)
    return [argument.flag, text] if argument.flag else [text]


def change_rules(declaration: Declaration, policy: SandboxPolicy) -> ChangeRules | None:
    """A writing run's rules (decision 80): the policy's protected paths and caps; None for `read_only`."""
    if declaration.workspace is WorkspaceMode.READ_ONLY:
        return None
    return ChangeRules(
        protected=policy.protected_paths, max_files=policy.max_change_files, max_bytes=policy.max_change_bytes
    )


def after_run(declaration: Declaration) -> str:
    """What `policy explain` says happens to a writing run's changes (decision 80); empty for `read_only`."""
    caps = "sandbox.max_change_files and sandbox.max_change_bytes"
    if declaration.workspace is WorkspaceMode.REVIEW:
        return (
            f"; on a copy of the workspace, then its change set (over {caps}: refused, nobody asked) is shown to a"
            " person, allow once or deny once, and applied beneath the workspace only on allow"
            " (sandbox.protected_paths never)"
        )
    if declaration.workspace is WorkspaceMode.WRITE:
        return (
            f"; on a copy of the workspace, then its change set (over {caps}: refused) is applied beneath the"
            " workspace at once, nobody asked (sandbox.protected_paths never)"
        )
    return ""


@dataclass(frozen=True, slots=True)
class DeclaredTool:
    declaration: Declaration

    def check_ready(self) -> None:
        check_program_unchanged(self.declaration.program, self.declaration.name)

    def preview(self, arguments: Mapping[str, Any], root: Path) -> str:
        try:
            argv = render_argv(self.declaration, arguments, root)
        except GatewayError as exc:
            return f"would refuse: {exc.public_message()}"
        return f"would run (workspace: {self.declaration.workspace}): {shlex.join(argv)}{after_run(self.declaration)}"

    async def execute(self, request: ExecutionRequest) -> DeclaredRun:
        declaration = self.declaration
        argv = render_argv(declaration, request.arguments, request.root.path)
        self.check_ready()  # the last look before the sandbox spawns it (decision 77 says what is left)
        policy = replace(
            request.policy, memory_limit_mb=declaration.memory_limit_mb, max_processes=declaration.max_processes
        )
        run = await run_confined(
            replace(confinement(request), policy=policy),
            lambda _scratch: argv,
            describe=lambda: f"Running {declaration.name}",
            writes=change_rules(declaration, request.policy),
            review=declaration.workspace is WorkspaceMode.REVIEW,
        )
        return DeclaredRun.of(run)


@dataclass(frozen=True, slots=True)
class DeclaredRun(ConfinedRun):
    """One finished run of a declared tool: a ToolRun (gateway/tools/base.py). Exit code 0 is success."""

    def status(self) -> RunStatus:
        return RunStatus.OK if self.result.exit_code == 0 else RunStatus.ERROR

    def read_outcome(self) -> ToolOutcome:
        """The last STDOUT_CHARS of stdout.txt, then the last STDERR_CHARS of stderr.txt, escaped. Never raises."""
        code = self.result.exit_code
        text = read_tail(self.run_dir / "stdout.txt", STDOUT_CHARS) or "(no output)"
        errors = read_tail(self.run_dir / "stderr.txt", STDERR_CHARS)
        if errors:
            text += f"\nstderr:\n{errors}"
        text += f"\n(run {self.run_id}; exit code {code})"
        structured = {"exit_code": code, "duration_ms": self.result.duration_ms, "run_id": self.run_id}
        links = tuple(
            ResourceLink(artifact_uri(self.run_id, name), name, mime, f"{name} of run {self.run_id}")
            for name, mime in ARTIFACTS.items()
        )
        return ToolOutcome(text, structured, links, is_error=code != 0)

    def finished_detail(self, outcome: ToolOutcome) -> Mapping[str, Any]:
        structured = outcome.structured or {}
        return {key: structured[key] for key in FINISHED if key in structured}


def read_tail(path: Path, chars: int) -> str:
    """The last `chars` characters of the run's file (any bytes: decoded with replacement), each line
    escaped (`shown`), '…' first when cut. Never raises."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - _TAIL_BYTES))
            data = handle.read(_TAIL_BYTES)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    cut = size > _TAIL_BYTES or len(text) > chars
    text = text[-chars:]
    lines = "\n".join(shown(line) for line in text.split("\n"))
    return ("…" + lines) if cut else lines
