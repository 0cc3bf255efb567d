"""The JSON Schema pieces the tool catalogue is written with, and what a value that fails a pattern is told.

Every `pattern` is written `^...$` for the whole value: the gateway checks it with full-match
semantics (`gateway.scope.matches_pattern`), as ECMA-262 clients read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

NO_CONTROL = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
NOT_AN_OPTION = rf"^[^-@{NO_CONTROL}][^{NO_CONTROL}]*$"
"""A value pytest could never read as an option ('-') or a file of options ('@'), without control characters."""
RUN_ID = "^[0-9a-f]{32}$"
ARTIFACT_NAME = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
WORKSPACE_NAME = "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"  # as policy.yaml names them

PATTERN_HINTS: Mapping[str, str] = MappingProxyType(
    {
        NOT_AN_OPTION: (
            "must not start with '-' or '@' (pytest would read it as an option or a file of options) "
            "and must not hold control characters"
        ),
        RUN_ID: "must be a run id: 32 lowercase hexadecimal digits",
        ARTIFACT_NAME: "must be a plain file name of the run (letters, digits, '_', '.', '-')",
        WORKSPACE_NAME: "must be a workspace name from the policy (letters, digits, '_', '.', '-')",
    }
)
"""What a value that does not match a pattern must look like, said to the caller."""


def object_schema(properties: dict[str, Any], required: list[str]) -> Mapping[str, Any]:
    return MappingProxyType(
        {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    )


WORKSPACE = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "pattern": WORKSPACE_NAME,
    "description": "Workspace name from the policy",
}
