"""The gateway's I/O, built once from Settings and handed to the pipeline, the server and the CLI."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine

from gateway.audit import AuditLog
from gateway.auth import Authenticator, KeyRing, TokenStore, load_keyring
from gateway.budget import BudgetLedger
from gateway.clock import Clock, IdFactory, SystemClock, new_run_id
from gateway.consent import ConsentStage
from gateway.consent_store import ConsentStore
from gateway.db import make_engine
from gateway.policy import Policy
from gateway.policy_trust import policy_for
from gateway.runs import RunStore
from gateway.settings import Settings
from gateway.tools.base import ToolSpec
from gateway.tools.registry import TOOL_NAMES, TOOLS
from gateway.users import UserStore


@dataclass(frozen=True)
class Services:
    settings: Settings
    policy: Policy
    engine: Engine
    clock: Clock
    new_run_id: IdFactory
    keys: KeyRing
    audit: AuditLog
    users: UserStore
    tokens: TokenStore
    budget: BudgetLedger
    runs: RunStore
    authenticator: Authenticator
    consent: ConsentStage
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    server_id: str = "mcp-write-gateway"
    tools: Mapping[str, ToolSpec] = field(default_factory=lambda: TOOLS)
    """The tool catalogue (gateway/tools/registry.py); a test may add one."""


def open_services(
    settings: Settings,
    *,
    policy: Policy | None = None,
    clock: Clock | None = None,
    new_id: IdFactory = new_run_id,
    engine: Engine | None = None,
) -> Services:
    """Load the policy and keys and connect the stores. Raises ConfigError on bad configuration, or on a
    policy file someone other than the gateway's user could have written (gateway/policy_trust.py)."""
    policy = policy or policy_for(settings, TOOL_NAMES)
    clock = clock or SystemClock()
    engine = engine or make_engine(settings.db_url)
    keys = load_keyring(settings.home)
    audit = AuditLog(engine, clock)
    users = UserStore(engine, clock)
    tokens = TokenStore(engine)
    return Services(
        settings=settings,
        policy=policy,
        engine=engine,
        clock=clock,
        new_run_id=new_id,
        keys=keys,
        audit=audit,
        users=users,
        tokens=tokens,
        budget=BudgetLedger(engine, clock),
        runs=RunStore(engine, settings.artifacts_dir),
        authenticator=Authenticator(engine, keys, policy.auth, tokens=tokens, users=users, clock=clock),
        consent=ConsentStage(policy.consent, audit, ConsentStore(engine), clock, new_id),
    )
