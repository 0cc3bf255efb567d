"""Where the gateway keeps its state (spec section 2): flag > environment variable > default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "MCP_GATEWAY_HOME"
DB_ENV = "MCP_GATEWAY_DB"
POLICY_ENV = "MCP_GATEWAY_POLICY"


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    db_url: str
    policy_path: Path

    @property
    def signing_key_path(self) -> Path:
        return self.home / "signing.key"

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"


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
    policy_text = policy or env.get(POLICY_ENV)
    if policy_text:
        policy_path = Path(policy_text).expanduser()
        if not policy_path.is_absolute():
            policy_path = here / policy_path
    elif (home_path / "policy.yaml").exists():
        policy_path = home_path / "policy.yaml"
    else:
        policy_path = here / "policy.yaml"
    return Settings(home=home_path, db_url=db_url, policy_path=policy_path)
