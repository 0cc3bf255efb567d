"""Stages 4 and 5 of the pipeline (docs/architecture.md): the call against the policy, then the schema.

`check_call` decides which workspace a call acts in and whether its arguments stay inside
the policy (allowlist, workspace, paths, timeout); `check_arguments` validates them
against the tool's inputSchema. Both are pure but for the path resolution handed in, and
for checking that the folders a sandboxed tool would read are still those pinned at policy
load (`check_pins_intact` checks it again right before the run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidParamsError, PolicyBlockedError, Reason
from gateway.policy import Policy
from gateway.tools.base import ToolSpec
from gateway.tools.schemas import PATTERN_HINTS
from gateway.upstream_policy import served_workspace
from sandbox.pinned import Pinned, is_intact

if TYPE_CHECKING:
    from jsonschema import ValidationError


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
    # Handles (compared by identity, so left out of equality): what the sandbox uses, not the paths.
    pinned_root: Pinned | None = field(default=None, compare=False)
    """The workspace root as pinned at policy load and found intact (tools that read the workspace)."""
    pinned_paths: tuple[Pinned, ...] = field(default=(), compare=False)
    """`sandbox.allowed_paths`, pinned and found intact likewise (sandboxed tools)."""


def visible_workspaces(caller: Caller) -> tuple[str, ...] | None:
    """Whose runs the caller may read today; None means every workspace (ADMIN).

    A token's `ws` claim only narrows: it names the one workspace the token may read, and only
    while the user may still read it (role and workspaces are read from the database at each
    call); a user demoted, or who lost that workspace, sees nothing through that token.
    """
    if caller.token_workspace is not None:
        may_see = caller.is_admin or caller.token_workspace in caller.workspaces
        return (caller.token_workspace,) if may_see else ()
    return None if caller.is_admin else caller.workspaces


def check_call(
    policy: Policy,
    spec: ToolSpec,
    arguments: Mapping[str, Any],
    caller: Caller,
    resolve: Callable[[Path], Path] = Path.resolve,
) -> CallScope:
    check_allowlisted(policy, spec.name)
    if spec.origin is not None:
        return upstream_scope(policy, spec, caller)
    timeout_s = spec.max_timeout_s or policy.sandbox.timeout_s
    requested_timeout = arguments.get("timeout_s")
    if isinstance(requested_timeout, int) and requested_timeout > timeout_s:
        raise PolicyBlockedError(Reason.TIMEOUT_OVER_POLICY, f"timeout_s is at most {timeout_s}")
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
    if not (spec.sandboxed or spec.path_arguments):
        return CallScope(workspace, root, (workspace,), timeout_s)
    pinned_root = check_workspace_pinned(workspace, root, policy.pins.get(root))
    pinned_paths: tuple[Pinned, ...] = ()
    if spec.sandboxed:
        pinned_paths = tuple(check_allowed_path_pinned(p, policy.pins.get(p)) for p in policy.sandbox.allowed_paths)
    for name in spec.path_arguments:
        value = arguments.get(name, spec.input_schema["properties"].get(name, {}).get("default"))
        if isinstance(value, str):  # a default too: it is rendered like a value given
            check_relative_path(root, value, name, resolve)
    if spec.check_ready is not None:
        spec.check_ready()
    return CallScope(workspace, root, (workspace,), timeout_s, pinned_root, pinned_paths)


def check_allowlisted(policy: Policy, name: str) -> None:
    if not policy.allowlist:
        raise PolicyBlockedError(Reason.ALLOWLIST_EMPTY, "the policy's tools.allowlist is empty")
    if name not in policy.allowlist:
        raise PolicyBlockedError(Reason.TOOL_NOT_ALLOWLISTED, f"{name} is not in the policy's allowlist")


def check_upstream_admissible(policy: Policy, name: str, caller: Caller) -> None:
    """Stage 4 of an upstream's tool `name` as far as the policy alone decides it (the allowlist, the served
    workspace), before its server is started (docs/upstreams.md); `check_call` decides it whole once it is."""
    check_allowlisted(policy, name)
    choose_workspace(policy, served_workspace(policy.workspaces), caller)


def upstream_scope(policy: Policy, spec: ToolSpec, caller: Caller) -> CallScope:
    """Stage 4 for an upstream's tool (docs/upstreams.md): its server serves one workspace (decision 84), which the
    caller must be allowed to act in; its arguments are the server's own (a `workspace` or `timeout_s` among them
    means nothing to the gateway); its time limit is the upstream's."""
    served = served_workspace(policy.workspaces)
    workspace = choose_workspace(policy, served, caller)
    root = policy.workspaces[workspace]
    pinned_root = check_workspace_pinned(workspace, root, policy.pins.get(root))
    pinned_paths = tuple(check_allowed_path_pinned(p, policy.pins.get(p)) for p in policy.sandbox.allowed_paths)
    if spec.check_ready is not None:
        spec.check_ready()
    timeout_s = spec.max_timeout_s or policy.sandbox.timeout_s
    return CallScope(workspace, root, (workspace,), timeout_s, pinned_root, pinned_paths)


def check_pins_intact(scope: CallScope) -> None:
    """Stage 4's pin checks again, just before the run: consent may have waited minutes, and a
    folder swapped meanwhile is refused with the same -32004 (the run would use the pinned fd anyway)."""
    if scope.pinned_root is not None and scope.workspace is not None:
        check_workspace_pinned(scope.workspace, scope.pinned_root.path, scope.pinned_root)
    for pinned in scope.pinned_paths:
        check_allowed_path_pinned(pinned.path, pinned)


def choose_workspace(policy: Policy, requested: str | None, caller: Caller) -> str:
    if caller.token_workspace is not None and requested not in (None, caller.token_workspace):
        raise PolicyBlockedError(Reason.WORKSPACE_NOT_ALLOWED, "the token is limited to another workspace")
    name = requested or caller.token_workspace or (caller.workspaces[0] if caller.workspaces else None)
    # Unknown and not-yours read the same, so a caller cannot probe other tenants' names.
    if name is None or name not in policy.workspaces or not (caller.is_admin or name in caller.workspaces):
        raise PolicyBlockedError(Reason.WORKSPACE_NOT_ALLOWED, "no such workspace for this user")
    return name


# --- arguments and folders that must stay inside the policy ----------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_workspace_pinned(name: str, root: Path, pinned: Pinned | None) -> Pinned:
    """The workspace's pin, when its root still leads (no link in any component) to the folder pinned at load.

    Raises PolicyBlockedError: `workspace_not_found` when it was not a folder at load,
    `workspace_changed` when the path now leads elsewhere or nowhere (renamed, replaced, a link).
    """
    if pinned is None or not pinned.is_dir or pinned.path != root:
        raise PolicyBlockedError(
            Reason.WORKSPACE_NOT_FOUND,
            f"workspace {name!r} was not a folder when the gateway loaded its policy;"
            " create it, then restart the gateway",
        )
    if not is_intact(pinned):
        raise PolicyBlockedError(
            Reason.WORKSPACE_CHANGED,
            f"workspace {name!r} is no longer the folder the policy named when the gateway loaded it"
            " (moved, replaced or reached through a symlink); restore that folder at its path,"
            " or restart the gateway to load the policy again",
        )
    return pinned


def check_allowed_path_pinned(path: Path, pinned: Pinned | None) -> Pinned:
    """The pin of a `sandbox.allowed_paths` entry, checked like a workspace's (`allowed_path_not_found`, `_changed`)."""
    if pinned is None or pinned.path != path:
        raise PolicyBlockedError(
            Reason.ALLOWED_PATH_NOT_FOUND,
            f"sandbox.allowed_paths entry {str(path)!r} did not exist when the gateway loaded its policy;"
            " create it, then restart the gateway",
        )
    if not is_intact(pinned):
        raise PolicyBlockedError(
            Reason.ALLOWED_PATH_CHANGED,
            f"sandbox.allowed_paths entry {str(path)!r} is no longer what the policy named when the gateway"
            " loaded it (moved, replaced or reached through a symlink); restore it, or restart the gateway",
        )
    return pinned


def check_relative_path(root: Path, value: str, argument: str, resolve: Callable[[Path], Path] = Path.resolve) -> Path:
    """Return the resolved path of `value` under `root`, or raise PolicyBlockedError.

    Rejects absolute paths, option-looking values ('-', and '@', which pytest's argparse reads
    as a file of options), control characters (NUL, newline, ...), and anything whose resolved
    location (after `..` and symlinks) is outside the workspace root.
    """
    if "\x00" in value:
        raise PolicyBlockedError(Reason.PATH_INVALID, f"{argument} contains a NUL byte")
    if _CONTROL.search(value):
        raise PolicyBlockedError(Reason.PATH_INVALID, f"{argument} contains a control character (newline, CR, ...)")
    if value.startswith(("-", "@")):
        raise PolicyBlockedError(
            Reason.PATH_LOOKS_LIKE_OPTION,
            f"{argument} must not start with '-' or '@' (pytest would read it as an option or a file of options)",
        )
    if Path(value).is_absolute():
        raise PolicyBlockedError(Reason.PATH_OUTSIDE_WORKSPACE, f"{argument} must be relative to the workspace")
    real_root = resolve(root)
    target = resolve(root / value)
    if not is_within(target, real_root):
        raise PolicyBlockedError(Reason.PATH_OUTSIDE_WORKSPACE, f"{argument} resolves outside the workspace")
    return target


def is_within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def matches_pattern(pattern: str, value: str) -> bool:
    """JSON Schema `pattern` as ECMA-262 reads it: an anchored `^...$` must match the WHOLE value.

    Python's `re.search` lets `$` match before a final newline, so `^[0-9a-f]{32}$` would accept
    a run id followed by `\\n`; `re.fullmatch` does not. An unanchored pattern keeps search semantics.
    """
    if pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$"):
        return re.fullmatch(pattern, value) is not None
    return re.search(pattern, value) is not None


def _pattern(validator: Any, pattern: str, instance: object, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    from jsonschema import ValidationError  # noqa: PLC0415  (loaded by _full_match_validator already)

    if validator.is_type(instance, "string") and not matches_pattern(pattern, str(instance)):
        yield ValidationError(PATTERN_HINTS.get(pattern, f"{instance!r} does not match {pattern!r}"))


@cache
def _full_match_validator() -> Any:
    """Draft 2020-12 but for `pattern`; jsonschema loads at the first call checked, not at start-up."""
    from jsonschema import Draft202012Validator, validators  # noqa: PLC0415

    # jsonschema's `extend` has no annotations.
    return validators.extend(Draft202012Validator, {"pattern": _pattern})  # type: ignore[no-untyped-call]


_VALIDATORS: dict[str, tuple[Mapping[str, Any], Any]] = {}
"""A tool's validator, built at its first call: (the schema it was built from, the validator)."""


def _validator(spec: ToolSpec) -> Any:
    built = _VALIDATORS.get(spec.name)
    if built is None or built[0] is not spec.input_schema:
        built = (spec.input_schema, _full_match_validator()(dict(spec.input_schema)))
        _VALIDATORS[spec.name] = built
    return built[1]


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> None:
    error = next(iter(_validator(spec).iter_errors(dict(arguments))), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        message = error.message if len(error.message) <= 200 else error.message[:200] + "…"
        raise InvalidParamsError(Reason.INVALID_ARGUMENTS, f"{where}: {message}")
