"""@modelcontextprotocol/server-filesystem behind a user's own gateway (decision 57; docs/upstreams/filesystem.md).

Here the server has the user's kernel uid (in its user namespace): DAC lets it at the user's state folder and at
a 0777 folder outside the workspace, so only the sandbox stands in the way. The server is the one made to ignore
the roots it is given, started with `/`: it believes the whole disk is its own.
"""

from __future__ import annotations

import os
import shutil

from tests.adversarial.conftest import open_arena
from tests.e2e.test_upstream_filesystem import (
    KEPT,
    REFUSED_BY_THE_KERNEL,
    check_kept_in_the_workspace,
    filesystem_policy,
)
from tests.rootless.conftest import USER_UID, user_folder
from tests.upstreams.npm_servers import FILESYSTEM, require_installed

pytestmark = require_installed(FILESYSTEM)


def test_a_users_filesystem_server_writes_nothing_outside_the_workspace_and_reads_none_of_the_state() -> None:
    root = user_folder("mcp-rootless-fs-")
    try:
        with open_arena(root, filesystem_policy("write", ignore_roots=True), run_as=USER_UID) as arena:
            kept = arena.outside / "kept.txt"
            kept.write_text(KEPT)
            os.chown(kept, USER_UID, USER_UID)  # the user's own file: the server's uid may write it, by DAC
            home = arena.gateway.home
            state = (home / "gateway.db", home / "signing.key", arena.gateway.policy_path)
            assert {path.stat().st_uid for path in state} == {USER_UID}  # the user's: DAC would let the server read
            check_kept_in_the_workspace(
                arena.session, arena.token, arena.gateway, arena.outside, REFUSED_BY_THE_KERNEL, *state
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
