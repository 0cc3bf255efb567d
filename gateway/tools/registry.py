"""The tool catalogue (docs/architecture.md, "Where a new tool plugs in"): each tool's name, permission, schema, annotations and behaviour.

A read tool carries its `read`, a write tool its `execute` (gateway/tools/base.py says what each
must do); the pipeline calls them and never names a tool. A new tool is one more entry here; a
policy adds its declared tools (`catalogue`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.policy import Policy
from gateway.rbac import Permission
from gateway.tools import artifacts, run_pytest
from gateway.tools.base import ToolSpec
from gateway.tools.declared import declared_tool
from gateway.tools.schemas import ARTIFACT_NAME, NOT_AN_OPTION, RUN_ID, WORKSPACE, object_schema

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
                input_schema=object_schema(
                    {
                        "test_path": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 1024,
                            "pattern": NOT_AN_OPTION,
                            "description": "File or folder relative to the workspace root, e.g. tests/",
                        },
                        "workspace": WORKSPACE,
                        "keyword": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 512,
                            "pattern": NOT_AN_OPTION,
                        },
                        "markers": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 512,
                            "pattern": NOT_AN_OPTION,
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
                execute=run_pytest.execute,
                path_arguments=("test_path",),
            ),
            ToolSpec(
                name="list_artifacts",
                title="List runs",
                description="List recent runs of your workspaces, newest first, with their artifact files.",
                permission=Permission.ARTIFACT_READ,
                input_schema=object_schema(
                    {"workspace": WORKSPACE, "limit": {"type": "integer", "minimum": 1, "maximum": 200}}, []
                ),
                annotations=MappingProxyType({"title": "List runs", "readOnlyHint": True, "openWorldHint": False}),
                read=artifacts.list_artifacts,
            ),
            ToolSpec(
                name="get_evidence",
                title="Get a run's evidence",
                description="Return evidence.json of a run: governance counters and how the sandbox ended.",
                permission=Permission.ARTIFACT_READ,
                input_schema=object_schema({"run_id": {"type": "string", "pattern": RUN_ID}}, ["run_id"]),
                annotations=MappingProxyType(
                    {"title": "Get a run's evidence", "readOnlyHint": True, "openWorldHint": False}
                ),
                read=artifacts.get_evidence,
            ),
            ToolSpec(
                name="get_artifact_content",
                title="Read a run's artifact",
                description="Return the text of one artifact of a run (stdout.txt, stderr.txt, junit.xml, ...).",
                permission=Permission.ARTIFACT_READ,
                input_schema=object_schema(
                    {
                        "run_id": {"type": "string", "pattern": RUN_ID},
                        "name": {"type": "string", "pattern": ARTIFACT_NAME},
                        "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576},
                    },
                    ["run_id", "name"],
                ),
                annotations=MappingProxyType(
                    {"title": "Read a run's artifact", "readOnlyHint": True, "openWorldHint": False}
                ),
                read=artifacts.get_artifact_content,
            ),
        )
    }
)

TOOL_NAMES = frozenset(TOOLS)
"""The built-in tools' names: what a policy's allowlist may name besides its own declared tools."""


def catalogue(policy: Policy) -> Mapping[str, ToolSpec]:
    """The tools of a gateway with this policy: the built-ins, then the policy's declared tools
    (docs/declared-tools.md; the loader refused a declared name that is a built-in's)."""
    return MappingProxyType({**TOOLS, **{name: declared_tool(d) for name, d in policy.declared.items()}})
