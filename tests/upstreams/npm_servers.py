"""The npm MCP servers `make upstream-servers` installs (examples/upstream-servers, pinned by its package-lock.json).

A test of one of them skips only when they are not installed (a dev machine that has not run the target);
`make test` runs the target first, so in CI they are there and the tests run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NPM_FOLDER = Path(__file__).resolve().parents[2] / "examples" / "upstream-servers"
MODULES = NPM_FOLDER / "node_modules"
FILESYSTEM = MODULES / ".bin" / "mcp-server-filesystem"
EVERYTHING = MODULES / ".bin" / "mcp-server-everything"


def require_installed(server: Path) -> pytest.MarkDecorator:
    """Skip unless `server` (its `#!/usr/bin/env node` entry script) and Node.js are there."""
    missing = shutil.which("node") is None or not server.is_file()
    return pytest.mark.skipif(missing, reason=f"needs Node.js and {server.name}: make nodejs upstream-servers")


NODE_READS = ("/etc/ssl/openssl.cnf",)
"""What Node.js reads at start beyond a run's grants: OpenSSL's configuration (without it node exits at once,
"OpenSSL configuration error")."""
NODE_MEMORY_MB = 2048
"""memory_limit_mb is also each process's address space (RLIMIT_AS): V8 reserves more than it uses, and both
servers end at start with 1,024 MiB in the sandbox (measured: 1,280 starts them; 2,048 leaves room)."""
NODE = shutil.which("node") or "/usr/bin/node"
"""Node.js (Debian's: `make nodejs`), named where a test starts a server with node's own flags."""
