"""`consent list|grant|revoke` and `approvals` (docs/consent.md, "Reviewing and pre-approving")."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping

from gateway.approvals import approver_name, run_approvals
from gateway.canonical import args_hash
from gateway.cli.values import json_object_arg, lifetime_arg
from gateway.clock import iso_utc
from gateway.consent.actions import Actor, revoke_grant
from gateway.consent.grant_scope import normal_grant_arguments
from gateway.consent.stage import (
    UNKNOWN_CHANNEL,
    Answer,
    ConsentProfile,
    ConsentRequest,
    Decision,
    Origin,
    consent_profile,
    decision_event,
    grant_decision,
    grant_expiry,
    lasting_allow_channels,
)
from gateway.consent.store import Channel, Grant, GrantDecision
from gateway.errors import CommandError
from gateway.permission_prompt import AGENT_SERVER_ID, AGENT_TOOL_NAME, agent_path_arguments, agent_tool_consent
from gateway.policy_trust import policy_for
from gateway.services import Services, open_services, open_stores
from gateway.settings import Settings
from gateway.tools.base import ToolSpec
from gateway.tools.registry import TOOL_NAMES, catalogue
from gateway.visible import visible


def cmd_consent_list(settings: Settings, args: argparse.Namespace) -> int:
    """One line per stored decision; an Allow whose channel may no longer make one is `ignored`."""
    policy = policy_for(settings, TOOL_NAMES)
    counted = lasting_allow_channels(policy.consent.channels)
    tools = catalogue(policy)
    stores = open_stores(settings)
    if args.user is not None and stores.users.fetch(args.user) is None:
        raise CommandError(f"no user named {visible(args.user)!r} (see `mcp-gateway user list`)")
    now = stores.clock.now()
    rows: list[dict[str, object]] = []
    if args.format == "text":
        print("\t".join(LIST_COLUMNS), file=sys.stderr)  # the header for a person; stdout stays rows only
    for g in stores.consent_store.list_grants(args.user, include_revoked=args.all):
        state = (
            "revoked"
            if g.revoked_at
            else "expired"
            if g.expires_at is not None and g.expires_at <= now
            else "ignored"
            if g.decision == GrantDecision.ALLOW and (g.channel or UNKNOWN_CHANNEL) not in counted
            else "active"
        )
        expires = iso_utc(g.expires_at) if g.expires_at is not None else "never"
        channel = g.channel or "unknown"
        fields = (
            g.id,
            g.user,
            g.workspace,
            g.tool_name,
            g.decision,
            _scope(g, tools),
            expires,
            state,
            g.granted_by,
            channel,
        )
        if args.format == "json":
            rows.append(dict(zip(LIST_COLUMNS, (g.id, *(str(f) for f in fields[1:])), strict=True)))
        else:
            print("\t".join(visible(str(field)) for field in fields))  # escaped as on every channel: no fake column
    if args.format == "json":
        print(json.dumps({"decisions": rows}, indent=2, ensure_ascii=False))
    return 0


LIST_COLUMNS = ("id", "user", "workspace", "tool", "decision", "scope", "expires", "state", "granted_by", "channel")
"""`consent list`'s columns: the text header line, and the JSON keys."""


def _scope(grant: Grant, tools: Mapping[str, ToolSpec]) -> str:
    """`any-args`, `args:<hash>` (those very arguments), or for a Deny on paths `path:NAME=PATH,...` (and under)."""
    if grant.args_hash is None:
        return "any-args"
    paths = [f"{k}={v}" for k, v in (grant.arguments or {}).items() if k in _path_names(grant, tools)]
    return "path:" + ",".join(paths) if paths else f"args:{grant.args_hash[:12]}"


def _path_names(grant: Grant, tools: Mapping[str, ToolSpec]) -> tuple[str, ...]:
    if grant.server_id == AGENT_SERVER_ID:
        return agent_path_arguments(grant.tool_name)
    spec = tools.get(grant.tool_name)
    return spec.path_arguments if spec is not None else ()


def cmd_consent_grant(settings: Settings, args: argparse.Namespace) -> int:
    s = open_services(settings)
    server_id, (tier, destructive, fingerprint) = _grant_target(s, args.tool, args.agent)
    record = s.users.fetch(args.user)
    if record is None:
        raise CommandError(f"unknown user {args.user!r}")
    workspace = args.workspace or (record.workspaces[0] if record.workspaces else None)
    if workspace is None or workspace not in record.workspaces:
        raise CommandError(f"{args.user} has no workspace {workspace!r} (theirs: {', '.join(record.workspaces)})")
    if args.always and destructive:
        raise CommandError(f"{args.tool} is destructive: Allow always is refused for it (allow once at the prompt)")
    now = s.clock.now()
    lifetime = lifetime_arg(args.expires_in) if args.expires_in else None
    arguments = json_object_arg(args.args) if args.args else None
    expires_at = now + lifetime if lifetime else grant_expiry(tier, s.policy.consent, now) if args.always else None
    hashed = args_hash(arguments) if arguments is not None else None
    covered = None
    if arguments is not None and args.deny:
        # A Deny covers its arguments by meaning (every spelling of its paths, and under them): store them.
        agent_root = str(s.policy.workspaces[workspace]) if args.agent else None
        names = agent_path_arguments(args.tool) if args.agent else s.tools[args.tool].path_arguments
        try:
            covered = normal_grant_arguments(arguments, names, agent_root)
        except ValueError as exc:
            raise CommandError(f"--args: {exc}") from exc  # a path outside the workspace: refused, not misused
    decision = Decision.ALLOW_ALWAYS if args.always else Decision.DENY_ALWAYS
    grant = Grant(
        id=0,
        user=record.name,
        workspace=workspace,
        server_id=server_id,
        tool_name=args.tool,
        args_hash=hashed,
        decision=grant_decision(decision),
        fingerprint=fingerprint,
        granted_at=now,
        expires_at=expires_at,
        granted_by=f"cli:{approver_name().removeprefix('approvals:')}",
        channel=Channel.CLI,
        arguments=covered,
    )
    grant_id = s.consent_store.insert_grant(grant)
    # Made at the terminal, the decision answers no call: its event has no run_id, and an args_hash only
    # when it is for particular arguments.
    about = ConsentRequest(
        run_id="", user=record.name, workspace=workspace, server_id=server_id, tool_name=args.tool,
        args_hash="", arguments={}, risk=tier,
    )  # fmt: skip
    answer = Answer(decision, Origin.POLICY, Channel.CLI, decided_by=grant.granted_by)
    event = decision_event(about, answer, extra={"grant_id": grant_id, "expires_at": expires_at})
    s.audit.append(dataclasses.replace(event, run_id=None, args_hash=hashed))
    until = iso_utc(expires_at) if expires_at is not None else "revoked"
    print(f"stored {decision} for {record.name} / {workspace} / {args.tool} until {until}", file=sys.stderr)
    print(grant_id)
    return 0


def _grant_target(s: Services, tool: str, agent: bool) -> tuple[str, ConsentProfile]:
    """The server_id and the consent profile of the tool a grant is for."""
    if agent:
        if not AGENT_TOOL_NAME.fullmatch(tool):
            raise CommandError(f"{tool!r} is not a tool name")
        return AGENT_SERVER_ID, agent_tool_consent(tool)
    spec = s.tools.get(tool)
    if spec is None:
        raise CommandError(f"unknown tool {tool!r} (known: {', '.join(sorted(s.tools))}; Claude Code's: --agent)")
    return s.server_id, consent_profile(spec)


def cmd_consent_revoke(settings: Settings, args: argparse.Namespace) -> int:
    s = open_services(settings)
    revoked = revoke_grant(s, args.grant_id, Actor(approver_name(), Channel.CLI))
    if revoked is None:
        raise CommandError(f"no stored decision {args.grant_id} (or it is revoked already)")
    print(f"revoked {revoked.id} ({revoked.decision} for {revoked.user} / {revoked.tool_name})", file=sys.stderr)
    return 0


def cmd_approvals(settings: Settings, _args: argparse.Namespace) -> int:
    locale = policy_for(settings, TOOL_NAMES).consent.locale
    stores = open_stores(settings)
    return run_approvals(stores, locale, sessions=stores.sessions, artifacts=settings.artifacts_dir)
