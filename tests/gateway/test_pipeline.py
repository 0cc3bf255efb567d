"""Stage 7's decision: a write tool needs the sandbox on and every layer available."""

from __future__ import annotations

import pytest

from gateway.errors import SandboxViolationError
from gateway.pipeline import check_sandbox_ready


@pytest.mark.parametrize(
    ("enabled", "missing", "reason"),
    [
        (True, [], None),
        (False, [], "sandbox_disabled"),
        (False, ["landlock"], "sandbox_disabled"),
        (True, ["landlock"], "sandbox_layer_missing"),
        (True, ["uid_drop", "seccomp"], "sandbox_layer_missing"),
    ],
)
def test_check_sandbox_ready(enabled: bool, missing: list[str], reason: str | None) -> None:
    if reason is None:
        check_sandbox_ready(enabled, missing)
        return
    with pytest.raises(SandboxViolationError) as caught:
        check_sandbox_ready(enabled, missing)
    assert caught.value.reason == reason
    assert caught.value.code == -32006
    for layer in missing if reason == "sandbox_layer_missing" else []:
        assert layer in caught.value.public_message()
