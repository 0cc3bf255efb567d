"""The gateway's I/O, built once from Settings and handed to the pipeline, the server and the CLI.

The composition root: nothing else in `gateway/` makes an engine, a store, a key ring or probes the
host. `open_stores` connects the database only (what `audit`, `consent list` and `approvals` need,
and what works before a policy or keys exist); `open_services` adds the policy, the keys, the host
probe and what the pipeline builds on them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine

from gateway.audit import AuditLog
from gateway.auth import Authenticator, KeyRing, TokenStore, load_keyring
from gateway.budget import BudgetLedger
from gateway.clock import Clock, IdFactory, SystemClock, new_run_id
from gateway.consent.stage import ConsentStage
from gateway.consent.store import ConsentStore
from gateway.db import make_engine
from gateway.liveness import SessionStore
from gateway.policy import Policy
from gateway.policy_trust import policy_for
from gateway.runs import RunStore
from gateway.settings import Settings
from gateway.tools.base import ToolSpec
from gateway.tools.registry import TOOL_NAMES, TOOLS, catalogue
from gateway.upstreams.pins import PinStore
from gateway.upstreams.servers import Catalogue, UpstreamServers
from gateway.users import UserStore
from sandbox import probe_host
from sandbox.confine import LayerReport


@dataclass(frozen=True)
class Stores:
    """The database and the stores on it; no policy, no keys."""

    engine: Engine
    clock: Clock
    audit: AuditLog
    users: UserStore
    tokens: TokenStore
    budget: BudgetLedger
    runs: RunStore
    consent_store: ConsentStore
    sessions: SessionStore
    pins: PinStore
    """Upstream tools' pinned definitions (gateway/upstreams/pins.py)."""


@dataclass(frozen=True)
class Services(Stores):
    """The stores, and what a call needs on top of them."""

    settings: Settings
    policy: Policy
    new_run_id: IdFactory
    keys: KeyRing
    host: LayerReport
    """The layers this host can enforce, probed once (stage 7 and the run read this, never a probe)."""
    authenticator: Authenticator
    consent: ConsentStage
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    server_id: str = "mcp-write-gateway"
    tools: Mapping[str, ToolSpec] = field(default_factory=lambda: TOOLS)
    """The tool catalogue (gateway/tools/registry.py `catalogue`: the built-ins and the policy's declared tools)."""


def open_stores(settings: Settings, clock: Clock | None = None, *, engine: Engine | None = None) -> Stores:
    """Connect the stores (no connection is made until one is used). Raises ConfigError on a bad database URL."""
    clock = clock or SystemClock()
    engine = engine or make_engine(settings.db_url)
    audit = AuditLog(engine, clock)
    return Stores(
        engine=engine,
        clock=clock,
        audit=audit,
        users=UserStore(engine, clock),
        tokens=TokenStore(engine),
        budget=BudgetLedger(engine, clock),
        runs=RunStore(engine, settings.artifacts_dir),
        consent_store=ConsentStore(engine),
        sessions=SessionStore(engine),
        pins=PinStore(engine, audit, clock),
    )


def open_services(
    settings: Settings,
    *,
    policy: Policy | None = None,
    clock: Clock | None = None,
    new_id: IdFactory = new_run_id,
    engine: Engine | None = None,
    host: LayerReport | None = None,
    keys: KeyRing | None = None,
) -> Services:
    """Load the policy and keys, probe the host and connect the stores. Raises ConfigError on bad configuration,
    or on a policy file someone other than the gateway's user could have written (gateway/policy_trust.py).

    Without `host`, the host is probed here (once per process): its probes fork, so this runs
    before the server starts any thread (decision 48)."""
    policy = policy or policy_for(settings, TOOL_NAMES)
    host = host or probe_host()
    stores = open_stores(settings, clock, engine=engine)
    keys = keys or load_keyring(settings.home)
    return Services(
        engine=stores.engine,
        clock=stores.clock,
        audit=stores.audit,
        users=stores.users,
        tokens=stores.tokens,
        budget=stores.budget,
        runs=stores.runs,
        consent_store=stores.consent_store,
        sessions=stores.sessions,
        pins=stores.pins,
        settings=settings,
        policy=policy,
        new_run_id=new_id,
        keys=keys,
        host=host,
        authenticator=Authenticator(
            stores.engine, keys, policy.auth, tokens=stores.tokens, users=stores.users, clock=stores.clock
        ),
        consent=ConsentStage(policy.consent, stores.audit, stores.consent_store, stores.clock, new_id),
        tools=_catalogue(policy, stores, settings, host),
    )


def _catalogue(policy: Policy, stores: Stores, settings: Settings, host: LayerReport) -> Mapping[str, ToolSpec]:
    """The gateway's own tools, and with `upstreams` in the policy those their servers offer (docs/upstreams.md)."""
    own = catalogue(policy)
    if not policy.upstreams:
        return own
    servers = UpstreamServers(policy, stores.pins.observe, environ=dict(os.environ), host=host, hidden=(settings.home,))
    return Catalogue(own, servers)
