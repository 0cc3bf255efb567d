"""Where the gateway keeps its state (docs/operations.md, "The state folder"): flag > environment variable > default.

The policy's default is `<home>/policy.yaml`, never the working folder: an MCP client starts
`serve` in whatever folder it likes (Claude Code: the agent's project), so a `./policy.yaml`
there may be the agent's own (decision 42). A relative `--policy`/`MCP_GATEWAY_POLICY`
still names a file under the working folder, because a person typed it; `serve` refuses one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "MCP_GATEWAY_HOME"
DB_ENV = "MCP_GATEWAY_DB"
POLICY_ENV = "MCP_GATEWAY_POLICY"
POLICY_FILE = "policy.yaml"


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    db_url: str
    policy_path: Path
    policy_given: str | None = None
    """The policy as given by `--policy` or `MCP_GATEWAY_POLICY`, unresolved; None: the default, `<home>/policy.yaml`."""

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    @property
    def home_policy_path(self) -> Path:
        """The policy `init` writes and every command reads unless told otherwise."""
        return self.home / POLICY_FILE


def resolve_settings(
    *,
    home: str | None = None,
    db: str | None = None,
    policy: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    env = os.environ if environ is None else environ
    here = cwd or Path.cwd()
    home_path = Path(home or env.get(HOME_ENV) or "~/.mcp-gateway").expanduser()
    if not home_path.is_absolute():
        home_path = here / home_path
    db_url = db or env.get(DB_ENV) or f"sqlite:///{home_path / 'gateway.db'}"
    policy_text = policy or env.get(POLICY_ENV) or None
    policy_path = home_path / POLICY_FILE
    if policy_text:
        policy_path = Path(policy_text).expanduser()
        if not policy_path.is_absolute():
            policy_path = here / policy_path
    return Settings(home=home_path, db_url=db_url, policy_path=policy_path, policy_given=policy_text)
