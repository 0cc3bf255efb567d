"""Stages 4 and 5 of the pipeline (spec section 4): the call against the policy, then the schema.

`check_call` decides which workspace a call acts in and whether its arguments stay inside
the policy (allowlist, workspace, paths, timeout); `check_arguments` validates them
against the tool's inputSchema. Both are pure but for the path resolution handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from gateway.errors import InvalidParamsError, PolicyBlockedError
from gateway.policy import Policy, check_relative_path
from gateway.tools.registry import TOOLS, ToolSpec


@dataclass(frozen=True, slots=True)
class Caller:
    """What stage 4 needs to know of the authenticated user."""

    workspaces: tuple[str, ...]
    token_workspace: str | None
    is_admin: bool


@dataclass(frozen=True, slots=True)
class CallScope:
    workspace: str | None
    """The workspace the call acts in (None for tools addressed by run_id)."""
    root: Path | None
    visible_workspaces: tuple[str, ...] | None
    """Whose runs this caller may read; None means every workspace (ADMIN)."""
    timeout_s: int


def visible_workspaces(caller: Caller) -> tuple[str, ...] | None:
    if caller.token_workspace is not None:
        return (caller.token_workspace,)
    return None if caller.is_admin else caller.workspaces


def check_call(
    policy: Policy,
    spec: ToolSpec,
    arguments: Mapping[str, Any],
    caller: Caller,
    resolve: Callable[[Path], Path] = Path.resolve,
) -> CallScope:
    if not policy.allowlist:
        raise PolicyBlockedError("allowlist_empty", "the policy's tools.allowlist is empty")
    if spec.name not in policy.allowlist:
        raise PolicyBlockedError("tool_not_allowlisted", f"{spec.name} is not in the policy's allowlist")
    timeout_s = policy.sandbox.timeout_s
    requested_timeout = arguments.get("timeout_s")
    if isinstance(requested_timeout, int) and requested_timeout > timeout_s:
        raise PolicyBlockedError("timeout_over_policy", f"timeout_s is at most {timeout_s}")
    if isinstance(requested_timeout, int) and not isinstance(requested_timeout, bool) and requested_timeout > 0:
        timeout_s = requested_timeout
    if "workspace" not in spec.input_schema["properties"]:
        return CallScope(None, None, visible_workspaces(caller), timeout_s)
    requested = arguments.get("workspace")
    if requested is not None and not isinstance(requested, str):
        return CallScope(None, None, visible_workspaces(caller), timeout_s)  # stage 5 rejects the type
    if requested is None and not spec.sandboxed:
        # A read across workspaces (list_artifacts): everything the caller may see, ADMIN all.
        return CallScope(None, None, visible_workspaces(caller), timeout_s)
    workspace = choose_workspace(policy, requested, caller)
    root = policy.workspaces[workspace]
    for name in spec.path_arguments:
        value = arguments.get(name)
        if isinstance(value, str):
            check_relative_path(root, value, name, resolve)
    return CallScope(workspace, root, (workspace,), timeout_s)


def choose_workspace(policy: Policy, requested: str | None, caller: Caller) -> str:
    if caller.token_workspace is not None and requested not in (None, caller.token_workspace):
        raise PolicyBlockedError("workspace_not_allowed", "the token is limited to another workspace")
    name = requested or caller.token_workspace or (caller.workspaces[0] if caller.workspaces else None)
    # Unknown and not-yours read the same, so a caller cannot probe other tenants' names.
    if name is None or name not in policy.workspaces or not (caller.is_admin or name in caller.workspaces):
        raise PolicyBlockedError("workspace_not_allowed", "no such workspace for this user")
    return name


@cache
def _validator(tool_name: str) -> Draft202012Validator:
    return Draft202012Validator(dict(TOOLS[tool_name].input_schema))


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> None:
    error = next(iter(_validator(spec.name).iter_errors(dict(arguments))), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        message = error.message if len(error.message) <= 200 else error.message[:200] + "…"
        raise InvalidParamsError("invalid_arguments", f"{where}: {message}")
