"""The rootless arena: `mcp-gateway serve` started by an ordinary user, every run in a user namespace (decision 57).

The tests run as root (CI does) and start `serve` under `setpriv` as `USER_UID`, a uid with no
account. Its state folder, workspace and policy are that user's, as `mcp-gateway init` run by
the user leaves them: the run has the same kernel uid, so DAC lets it at every one of them and
only the sandbox stands in the way. The policy is the shipped default's `sandbox.require`
(every guarantee but memory_total, which no cgroup here keeps for an ordinary user).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.conftest import (
    Arena,
    open_arena,
    tcp_listener,  # noqa: F401  (a fixture of the root arena's suites, used here too)
    udp_listener,  # noqa: F401  (the same)
)
from tests.harness import enterable_by_everyone

USER_UID = 64123
"""An ordinary uid with no account (CI machines are fresh): not root, not 1000, not a pool uid (61000-61999)."""


def user_folder(prefix: str) -> Path:
    """A new folder under the temp dir, the user's, which the user can reach.

    Not under pytest's own temp folder: pytest makes /tmp/pytest-of-root 0700 again whenever a
    session starts, which would lock the user's gateway out of its state folder mid-session."""
    if os.geteuid() != 0:
        pytest.fail("these tests start the gateway as an ordinary uid with setpriv: run them as root (CI does)")
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    enterable_by_everyone(folder)
    os.chown(folder, USER_UID, USER_UID)
    return folder


@pytest.fixture(scope="session")
def rootless_arena() -> Iterator[Arena]:
    """One gateway of USER_UID, one session, shared by the rootless hostile suites."""
    root = user_folder("mcp-rootless-")
    try:
        with open_arena(root, {"sandbox": {"backend": "native"}}, run_as=USER_UID) as arena:
            yield arena
    finally:
        shutil.rmtree(root, ignore_errors=True)
