"""Stage 3 of the pipeline (docs/architecture.md): a role's permissions must include the tool's."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from gateway.errors import PermissionDeniedError, Reason


class Permission(StrEnum):
    ARTIFACT_READ = "ARTIFACT_READ"
    ORCHESTRATION_RUN = "ORCHESTRATION_RUN"
    CONSENT_DECIDE = "CONSENT_DECIDE"
    """Answer other people's consent questions and revoke stored decisions in the web console (gateway/console/)."""


ADMIN_ROLE = "ADMIN"
"""The one role that reads every workspace's runs (decision 6)."""


def has_permission(roles: Mapping[str, frozenset[Permission]], role: str, permission: Permission) -> bool:
    return permission in roles.get(role, frozenset())


def require_permission(roles: Mapping[str, frozenset[Permission]], role: str, permission: Permission) -> None:
    if role not in roles:
        raise PermissionDeniedError(Reason.ROLE_UNKNOWN, f"role {role!r} is not defined in the policy")
    if not has_permission(roles, role, permission):
        raise PermissionDeniedError(Reason.MISSING_PERMISSION, f"role {role} lacks {permission}")
