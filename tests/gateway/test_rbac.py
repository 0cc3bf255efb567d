"""gateway/rbac.py: a role's permissions must include the tool's (stage 3)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from gateway.errors import PermissionDeniedError
from gateway.rbac import Permission, has_permission, require_permission

READ, RUN = Permission.ARTIFACT_READ, Permission.ORCHESTRATION_RUN
ROLES = MappingProxyType(
    {
        "ADMIN": frozenset({READ, RUN}),
        "USER": frozenset({READ, RUN}),
        "VIEWER": frozenset({READ}),
        "RUNNER": frozenset({RUN}),
        "NOBODY": frozenset(),
    }
)

TABLE = [
    ("ADMIN", READ, None),
    ("ADMIN", RUN, None),
    ("USER", READ, None),
    ("USER", RUN, None),
    ("VIEWER", READ, None),
    ("VIEWER", RUN, "missing_permission"),
    ("RUNNER", RUN, None),
    ("RUNNER", READ, "missing_permission"),
    ("NOBODY", READ, "missing_permission"),
    ("NOBODY", RUN, "missing_permission"),
    ("ROOT", READ, "role_unknown"),
    ("admin", READ, "role_unknown"),
    ("", RUN, "role_unknown"),
]


@pytest.mark.parametrize(("role", "permission", "reason"), TABLE)
def test_require_permission(role: str, permission: Permission, reason: str | None) -> None:
    if reason is None:
        require_permission(ROLES, role, permission)
        return
    with pytest.raises(PermissionDeniedError) as caught:
        require_permission(ROLES, role, permission)
    assert caught.value.reason == reason
    assert caught.value.code == -32003


@pytest.mark.parametrize(("role", "permission", "reason"), TABLE)
def test_has_permission_agrees(role: str, permission: Permission, reason: str | None) -> None:
    assert has_permission(ROLES, role, permission) is (reason is None)


def test_permission_spellings_are_the_spec_names() -> None:
    assert [str(p) for p in Permission] == ["ARTIFACT_READ", "ORCHESTRATION_RUN", "CONSENT_DECIDE"]
