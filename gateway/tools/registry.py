"""The tool catalogue (spec section 5): names, permissions, schemas and annotations.

Every `pattern` is written `^...$` for the whole value: the gateway checks it with full-match
semantics (`gateway.scope.matches_pattern`), as ECMA-262 clients read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gateway.rbac import Permission

_NO_CONTROL = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
_NOT_AN_OPTION = rf"^[^-@{_NO_CONTROL}][^{_NO_CONTROL}]*$"
"""A value pytest could never read as an option ('-') or a file of options ('@'), without control characters."""
_RUN_ID = "^[0-9a-f]{32}$"
_ARTIFACT_NAME = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
_WORKSPACE_NAME = "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"  # as policy.yaml names them

PATTERN_HINTS: Mapping[str, str] = MappingProxyType(
    {
        _NOT_AN_OPTION: (
            "must not start with '-' or '@' (pytest would read it as an option or a file of options) "
            "and must not hold control characters"
        ),
        _RUN_ID: "must be a run id: 32 lowercase hexadecimal digits",
        _ARTIFACT_NAME: "must be a plain file name of the run (letters, digits, '_', '.', '-')",
        _WORKSPACE_NAME: "must be a workspace name from the policy (letters, digits, '_', '.', '-')",
    }
)
"""What a value that does not match a pattern must look like, said to the caller."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    permission: Permission
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any]
    sandboxed: bool
    """A write tool: it runs in the sandbox, needs consent and is charged to the budget."""
    path_arguments: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The tool's `_meta` in tools/list (a declared risk tier: consent.RISK_META_KEY)."""


def _schema(properties: dict[str, Any], required: list[str]) -> Mapping[str, Any]:
    return MappingProxyType(
        {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    )


_WORKSPACE = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "pattern": _WORKSPACE_NAME,
    "description": "Workspace name from the policy",
}

TOOLS: Mapping[str, ToolSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            ToolSpec(
                name="run_pytest",
                title="Run pytest",
                description=(
                    "Run the workspace's pytest suite (or part of it) as a supervised subprocess and return "
                    "the summary, the counts and links to the run's artifacts."
                ),
                permission=Permission.ORCHESTRATION_RUN,
                input_schema=_schema(
                    {
                        "test_path": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 1024,
                            "pattern": _NOT_AN_OPTION,
                            "description": "File or folder relative to the workspace root, e.g. tests/",
                        },
                        "workspace": _WORKSPACE,
                        "keyword": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 512,
                            "pattern": _NOT_AN_OPTION,
                        },
                        "markers": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 512,
                            "pattern": _NOT_AN_OPTION,
                        },
                        "max_failures": {"type": "integer", "minimum": 1, "maximum": 100000},
                        "timeout_s": {"type": "integer", "minimum": 1, "maximum": 86400},
                    },
                    ["test_path"],
                ),
                annotations=MappingProxyType(
                    {
                        "title": "Run pytest",
                        "readOnlyHint": False,
                        "destructiveHint": False,
                        "idempotentHint": True,
                        "openWorldHint": False,
                    }
                ),
                sandboxed=True,
                path_arguments=("test_path",),
            ),
            ToolSpec(
                name="list_artifacts",
                title="List runs",
                description="List recent runs of your workspaces, newest first, with their artifact files.",
                permission=Permission.ARTIFACT_READ,
                input_schema=_schema(
                    {"workspace": _WORKSPACE, "limit": {"type": "integer", "minimum": 1, "maximum": 200}}, []
                ),
                annotations=MappingProxyType({"title": "List runs", "readOnlyHint": True}),
                sandboxed=False,
            ),
            ToolSpec(
                name="get_evidence",
                title="Get a run's evidence",
                description="Return evidence.json of a run: governance counters and how the sandbox ended.",
                permission=Permission.ARTIFACT_READ,
                input_schema=_schema({"run_id": {"type": "string", "pattern": _RUN_ID}}, ["run_id"]),
                annotations=MappingProxyType({"title": "Get a run's evidence", "readOnlyHint": True}),
                sandboxed=False,
            ),
            ToolSpec(
                name="get_artifact_content",
                title="Read a run's artifact",
                description="Return the text of one artifact of a run (stdout.txt, stderr.txt, junit.xml, ...).",
                permission=Permission.ARTIFACT_READ,
                input_schema=_schema(
                    {
                        "run_id": {"type": "string", "pattern": _RUN_ID},
                        "name": {"type": "string", "pattern": _ARTIFACT_NAME},
                        "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576},
                    },
                    ["run_id", "name"],
                ),
                annotations=MappingProxyType({"title": "Read a run's artifact", "readOnlyHint": True}),
                sandboxed=False,
            ),
        )
    }
)

TOOL_NAMES = frozenset(TOOLS)
