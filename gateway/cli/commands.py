"""The commands of `mcp-gateway` (docs/operations.md); `gateway.cli` parses the arguments and calls `dispatch`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from gateway.audit import EventDraft, EventType
from gateway.auth import UNKNOWN_TOKEN, KeyRing, Principal, decode_token, ensure_keys, issue_token, jti_of
from gateway.cli.consent import (
    cmd_approvals,
    cmd_consent_grant,
    cmd_consent_list,
    cmd_consent_revoke,
)
from gateway.cli.upstreams import cmd_upstream_accept, cmd_upstream_list
from gateway.cli.values import check_db_url, check_home_folder, check_tls_pair, json_object_arg, since_arg
from gateway.clock import iso_utc, new_token_id
from gateway.db import make_engine, migrate, schema_is_current
from gateway.db.errors import cause_name
from gateway.db.file_guard import DatabaseFileUnwritableError
from gateway.default_policy import SHIPPED_POLICY, default_policy_text, write_new_policy
from gateway.egress_policy import Network, describe_network
from gateway.errors import AuthRequiredError, CommandError, ConfigError, Reason, StorageUnavailableError, UsageError
from gateway.permission_prompt import explain as explain_agent_tool
from gateway.pipeline import Pipeline, StageReport
from gateway.policy import Policy, PolicyErrors, SandboxPolicy, load_policy
from gateway.policy_trust import check_outside_workspaces, check_policy_location, policy_for
from gateway.policy_warnings import risky_settings
from gateway.preflight import unreachable_run_paths
from gateway.programs import Program
from gateway.rbac import ADMIN_ROLE
from gateway.recovery import close_abandoned_runs
from gateway.services import Services, open_services, open_stores
from gateway.settings import DB_ENV, HOME_ENV, Settings, resolve_settings
from gateway.state_access import check_state_access, describe, describe_os_error, policy_access_problem
from gateway.tools.registry import TOOL_NAMES
from gateway.users import UserError, check_user_name
from gateway.visible import visible
from sandbox import probe_host
from sandbox.confine import LayerReport
from sandbox.diagnose import host_facts, why_missing
from sandbox.guarantees import Guarantee
from sandbox.reachable import run_access

log = logging.getLogger("gateway")


EXPLAIN_REFUSED = 3
"""`policy explain`'s exit status when the call would be refused (0: it would run): a CI gate."""


def print_json(document: object) -> None:
    """One JSON document on stdout (`--format json`)."""
    print(json.dumps(document, indent=2, ensure_ascii=False))


def dispatch(args: argparse.Namespace) -> int:
    """Run the command `args` names; refusals and database errors become a message and exit 1."""
    settings = resolve_settings(home=args.home, db=args.db, policy=args.policy)
    words = (args.command, getattr(args, "action", None))
    handler = _HANDLERS[words]
    try:
        check_db_url(settings.db_url, "--db" if args.db else DB_ENV if os.environ.get(DB_ENV) else None)
        check_home_folder(
            settings.home, "--home" if args.home else HOME_ENV if os.environ.get(HOME_ENV) else "~/.mcp-gateway"
        )
        _check_access(settings, args, words)
        return handler(settings, args)
    except UsageError as exc:
        # As argparse words its own usage errors, in one line: the flag, the value, the form it takes.
        print(f"mcp-gateway {' '.join(w for w in words if w)}: error: {exc}", file=sys.stderr)
        return 2
    except (CommandError, ConfigError, UserError) as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return 1
    except (SQLAlchemyError, StorageUnavailableError) as exc:
        name = cause_name(exc) if isinstance(exc, StorageUnavailableError) else type(exc).__name__
        print(f"mcp-gateway: database error ({name}); is `mcp-gateway init` done?", file=sys.stderr)
        return 1
    except PermissionError as exc:  # a path changed after check_state_access looked at it
        print(f"mcp-gateway: {describe_os_error(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`audit export | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# --- commands ---------------------------------------------------------------------------------


def cmd_init(settings: Settings, args: argparse.Namespace) -> int:
    workspace = _init_workspace(settings, args.workspace)
    settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.home.chmod(0o700)
    (settings.artifacts_dir).mkdir(mode=0o700, exist_ok=True)
    _write_home_policy(settings, workspace, asked=args.workspace is not None)
    algorithms: tuple[str, ...] = ("HS256",)
    if os.path.lexists(settings.policy_path):
        algorithms = policy_for(settings, TOOL_NAMES).auth.algorithms
    created = ensure_keys(settings.home, algorithms)
    migrate(open_stores(settings).engine)
    for path in created:
        print(f"created {path}", file=sys.stderr)
    print(f"initialised {settings.home} (database schema current)", file=sys.stderr)
    return 0


def _init_workspace(settings: Settings, given: str | None) -> Path | None:
    """`init --workspace PATH`, absolute and real; refused unless it is a folder that holds no state folder."""
    if given is None:
        return None
    if settings.policy_given is not None:
        raise UsageError(
            "--workspace sets the workspace of the policy init writes, <home>/policy.yaml, but --policy or"
            " MCP_GATEWAY_POLICY names another policy: edit that one, or drop --policy"
        )
    folder = Path(os.path.realpath(Path(given).expanduser()))
    if not folder.is_dir():
        raise UsageError(f"--workspace {given}: not a folder; give an existing folder, the agent's project")
    home = Path(os.path.realpath(settings.home))
    if home == folder or folder in home.parents:
        raise CommandError(
            f"--workspace {folder} holds the state folder {home}, where the agent's tools would reach the"
            " keys, the database and the policy; choose another --home or workspace"
        )
    return folder


def _write_home_policy(settings: Settings, workspace: Path | None, *, asked: bool) -> None:
    """Write `<home>/policy.yaml` from the shipped default when no policy is named and none is there."""
    target = settings.home_policy_path
    if settings.policy_given is not None:
        return
    if os.path.lexists(target):
        if asked:
            print(f"kept {target}: it exists, and --workspace applies only to a policy init writes", file=sys.stderr)
        return
    if not SHIPPED_POLICY.is_file():
        if asked:
            raise CommandError(f"cannot write {target}: the shipped default {SHIPPED_POLICY} is not installed")
        print(
            f"wrote no policy: the shipped default {SHIPPED_POLICY} is not installed; write {target}", file=sys.stderr
        )
        return
    write_new_policy(target, default_policy_text(SHIPPED_POLICY, workspace))
    named = policy_for(settings, TOOL_NAMES).workspaces.get("default")
    print(
        f"wrote {target} (workspace 'default' = {named}); review it, then `mcp-gateway policy check`", file=sys.stderr
    )


def _services(settings: Settings) -> Services:
    return open_services(settings)


def _check_role(services: Services, role: str) -> None:
    if role not in services.policy.roles:
        known = ", ".join(services.policy.roles)
        raise CommandError(f"unknown role {role!r} (the policy defines: {known})")


def cmd_user_add(settings: Settings, args: argparse.Namespace) -> int:
    try:
        check_user_name(args.name)
    except UserError as exc:
        raise UsageError(f"NAME: {exc}") from exc
    s = _services(settings)
    _check_role(s, args.role)
    workspaces = tuple(dict.fromkeys(args.workspace)) or (("default",) if "default" in s.policy.workspaces else ())
    for workspace in workspaces:
        if workspace not in s.policy.workspaces:
            raise CommandError(
                f"unknown workspace {workspace!r} (the policy defines: {', '.join(s.policy.workspaces)})"
            )
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
    s.users.add(args.name, args.role, workspaces, password)
    s.audit.append(
        EventDraft(EventType.USER_ADDED, user=args.name, detail={"role": args.role, "workspaces": workspaces})
    )
    print(f"added user {args.name} ({args.role}; workspaces: {', '.join(workspaces) or 'none'})", file=sys.stderr)
    return 0


def cmd_user_passwd(settings: Settings, args: argparse.Namespace) -> int:
    stores = open_stores(settings)
    if stores.users.fetch(args.name) is None:
        raise CommandError(f"no user named {args.name!r}")
    if sys.stdin.isatty():
        import getpass  # noqa: PLC0415

        password = getpass.getpass(f"new console password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise CommandError("the two passwords differ; nothing changed")
    else:
        password = sys.stdin.readline().rstrip("\n")
    stores.users.set_password(args.name, password)
    stores.audit.append(EventDraft(EventType.USER_PASSWORD_SET, user=args.name))
    print(f"password set for user {args.name}", file=sys.stderr)
    return 0


def cmd_console(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.console.serve import run_console  # noqa: PLC0415  (Starlette and uvicorn load only here)

    check_tls_pair(args.tls_cert, args.tls_key)
    return run_console(settings, args.host, args.port, args.tls_cert, args.tls_key)


def cmd_user_list(settings: Settings, args: argparse.Namespace) -> int:
    rows = [
        {
            "name": r.name,
            "role": r.role,
            "state": "disabled" if r.disabled else "active",
            "workspaces": list(r.workspaces),
        }
        for r in _services(settings).users.list()
    ]
    if args.format == "json":
        print_json({"users": rows})
        return 0
    print("name\trole\tstate\tworkspaces", file=sys.stderr)  # the header for a person; stdout stays rows only
    for row in rows:
        print(f"{row['name']}\t{row['role']}\t{row['state']}\t{','.join(row['workspaces'])}")
    return 0


def cmd_user_disable(settings: Settings, args: argparse.Namespace) -> int:
    s = _services(settings)
    s.users.disable(args.name)
    s.audit.append(EventDraft(EventType.USER_DISABLED, user=args.name))
    print(f"disabled user {args.name}", file=sys.stderr)
    return 0


def cmd_user_set_role(settings: Settings, args: argparse.Namespace) -> int:
    s = _services(settings)
    _check_role(s, args.role)
    s.users.set_role(args.name, args.role)
    s.audit.append(EventDraft(EventType.USER_ROLE_CHANGED, user=args.name, detail={"role": args.role}))
    print(f"user {args.name} now has role {args.role}", file=sys.stderr)
    return 0


def cmd_token_issue(settings: Settings, args: argparse.Namespace) -> int:
    s = _services(settings)
    record = s.users.fetch(args.name)
    if record is None:
        raise CommandError(f"no user named {args.name!r}")
    if record.disabled:
        raise CommandError(f"user {args.name!r} is disabled")
    if args.workspace is not None and (
        args.workspace not in s.policy.workspaces
        or (args.workspace not in record.workspaces and record.role != ADMIN_ROLE)
    ):
        raise CommandError(f"user {args.name!r} has no workspace {args.workspace!r}")
    if not 1 <= args.ttl <= s.policy.auth.max_ttl_s:
        raise UsageError(f"--ttl {args.ttl}: give seconds from 1 to the policy's max_ttl_s ({s.policy.auth.max_ttl_s})")
    now, jti = s.clock.now(), new_token_id()
    token = issue_token(s.keys, s.policy.auth, args.name, now=now, ttl_s=args.ttl, jti=jti, workspace=args.workspace)
    s.tokens.record_issued(jti, args.name, now, now + args.ttl)
    s.audit.append(EventDraft(EventType.TOKEN_ISSUED, user=args.name, detail={"jti": jti, "ttl_s": args.ttl}))
    print(token)
    return 0


def cmd_token_revoke(settings: Settings, args: argparse.Namespace) -> int:
    """Revoke a token this gateway issued (by the token or its jti), or a token signed with its key.

    Anything else revokes nothing and exits 1: a mistyped jti must not read as success while the
    real token stays valid."""
    s = _services(settings)
    value: str = args.token_or_jti
    jti = value
    is_token = value.count(".") == 2
    if is_token:
        try:
            jti = jti_of(value)
        except ValueError as exc:
            raise UsageError(f"TOKEN_OR_JTI: {exc}; give the token as `token issue` printed it, or its jti") from exc
    revoked_at = s.tokens.fetch_revoked_at(jti)
    if revoked_at is UNKNOWN_TOKEN:
        if not is_token:
            raise CommandError(
                f"nothing revoked: no token with jti {visible(jti)!r} was issued here; give the whole token, or"
                " find its jti in the TOKEN_ISSUED events of `mcp-gateway audit export`"
            )
        try:
            decode_token(value, s.keys, s.policy.auth)  # minted elsewhere with this gateway's key: revocable
        except AuthRequiredError as exc:
            raise CommandError(
                f"nothing revoked: the token (jti {visible(jti)!r}) was not issued here and is not one this"
                f" gateway accepts ({exc.reason}); check --home and --db name the gateway that issued it"
            ) from exc
    elif revoked_at is not None:
        print(f"token {visible(jti)} was revoked already, at {iso_utc(revoked_at)}", file=sys.stderr)
        return 0
    s.tokens.revoke(jti, s.clock.now())
    s.audit.append(EventDraft(EventType.TOKEN_REVOKED, detail={"jti": jti}))
    print(f"revoked token {visible(jti)}", file=sys.stderr)
    return 0


def cmd_serve(settings: Settings, _args: argparse.Namespace) -> int:
    from gateway.server import run_stdio  # noqa: PLC0415  (the MCP SDK loads only for serve)

    given = settings.policy_given
    if given is not None and not Path(given).expanduser().is_absolute():
        raise CommandError(
            f"serve takes an absolute policy path, not {given!r}: a relative one is read from the working folder"
            f" ({Path.cwd()}), which an MCP client may set to the agent's project"
        )
    s = _services(settings)  # refuses a policy others could have written, or one inside a workspace
    try:
        if not schema_is_current(s.engine):
            raise CommandError("the database schema is not current; run `mcp-gateway init`")
        close_abandoned_runs(s)
    except DatabaseFileUnwritableError:
        return 1  # not served: SQLite could die of SIGBUS; the guard logged which file and what to do
    except SQLAlchemyError as exc:  # schema_is_current: no store translates it
        # Serve anyway: every call will fail closed with -32603 until the database is back.
        log.warning("database unreachable at start-up (%s); calls will fail with -32603", type(exc).__name__)
    except StorageUnavailableError as exc:
        if isinstance(exc.__cause__, DatabaseFileUnwritableError):
            return 1
        if exc.reason == Reason.AUDIT_UNAVAILABLE:
            log.warning("the audit log could not be written at start-up; calls will fail with -32603")
        else:
            log.warning("database unreachable at start-up (%s); calls will fail with -32603", cause_name(exc))
    for warning in risky_settings(s.policy, settings.home):
        log.warning("%s", warning)
    for finding in unreachable_run_paths(s.policy, run_access(s.host.uid_drop)):
        log.warning("%s: warning: %s; run_pytest will be refused (-32006)", settings.policy_path, finding.message())
    log.info("%s", describe_layers(s.host, s.policy.sandbox))
    log.info("serving on stdio (policy %s)", settings.policy_path)
    run_stdio(s)
    return 0


def cmd_policy_check(settings: Settings, args: argparse.Namespace) -> int:
    """FILE: that file, and where it lies is a warning (it may be a draft); no FILE: the policy every
    command would act on, so a place that `serve` would refuse is an error, as it is for `serve`."""
    path = Path(args.file) if args.file else settings.policy_path
    as_json = args.format == "json"
    try:
        policy = load_policy(path, TOOL_NAMES) if args.file else policy_for(settings, TOOL_NAMES)
    except ConfigError as exc:
        found = exc.errors if isinstance(exc, PolicyErrors) else [exc]
        if as_json:
            errors = [{"where": e.where, "message": e.bare_message} for e in found]
            print_json({"file": str(path), "valid": False, "errors": errors, "warnings": []})
        else:
            for error in found:
                print(str(error), file=sys.stderr)
        return 1
    warnings = [(w.where, w.message) for w in risky_settings(policy, settings.home)]
    if args.file:
        try:
            check_outside_workspaces(policy, check_policy_location(Path.cwd() / path))
        except ConfigError as exc:
            why = exc.bare_message.removeprefix("refusing this policy: ")
            warnings.append((str(path), f"serve would refuse this file: {why}"))
    report = probe_host()  # a draft needs no keys nor database: no Services here, only the host
    missing = report.missing(policy.sandbox.backend, policy.sandbox.required)
    if policy.sandbox.enabled and missing:
        causes = "; ".join(why_missing(g, report, policy.sandbox.backend) for g in missing)
        warnings.append((
            str(path),
            f"this host cannot keep the guarantees sandbox.require asks for ({causes});"
            " write tools will be refused (-32006); `mcp-gateway doctor` lists every guarantee",
        ))  # fmt: skip
    for finding in unreachable_run_paths(policy, run_access(report.uid_drop)):
        warnings.append((str(path), f"{finding.message()}; run_pytest will be refused (-32006)"))
    failed = args.strict and bool(warnings)
    if as_json:
        print_json({
            "file": str(path),
            "valid": not failed,
            "strict": args.strict,
            "errors": [],
            "warnings": [{"where": where, "message": message} for where, message in warnings],
            "sandbox": describe_layers(report, policy.sandbox),
            "guarantees_missing": [str(g) for g in missing],
            "declared": {name: d.program.identity() for name, d in policy.declared.items()},
            "upstreams": {name: u.program.identity() for name, u in policy.upstreams.items()},
            "network": {key: describe_network(network) for key, network in _networks(policy)},
        })  # fmt: skip
        return 1 if failed else 0
    for where, message in warnings:
        print(f"{where}: warning: {message}", file=sys.stderr)
    print(describe_layers(report, policy.sandbox), file=sys.stderr)
    for name, declared in policy.declared.items():
        print(f"{path}: declared tool {name}: {describe_program(declared.program)}")
    for name, upstream in policy.upstreams.items():
        print(f"{path}: upstream {name}: {describe_program(upstream.program)}")
    for key, network in _networks(policy):
        print(f"{path}: {key}: {describe_network(network)}")
    count = f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
    if failed:
        print(f"{path}: invalid under --strict ({count})")
        return 1
    print(f"{path}: valid ({count})")
    return 0


def _networks(policy: Policy) -> list[tuple[str, Network]]:
    """Each `network` key that is a mapping (the proxy's rules), with where it is in the policy."""
    found = [("sandbox.network", Network(rules=policy.sandbox.egress))] if policy.sandbox.egress else []
    found += [
        (f"upstreams.{name}.network", Network(rules=u.egress)) for name, u in policy.upstreams.items() if u.egress
    ]
    return found


def describe_program(program: Program) -> str:
    """A declared tool's program as pinned at load: what `policy check` prints."""
    text = f"program {program.path}"
    if program.real != program.path:
        text += f" (-> {program.real})"
    text += f", sha256 {program.sha256}"
    if program.interpreter is not None:
        text += f"; interpreter {describe_program(program.interpreter).removeprefix('program ')}"
    return text


def describe_layers(report: LayerReport, sandbox: SandboxPolicy) -> str:
    """One line: how runs are confined here, the guarantees kept (by which layers), those missing, required or not."""
    mode = "rootless (a user namespace per run)" if report.rootless else "root (a pool uid per run)"
    if not report.uid_drop and not report.user_namespace:
        mode = "none (not root, and no user namespace)"
    kept = report.guarantees(sandbox.backend)
    text = f"sandbox on this host: {mode}, backend {sandbox.backend}, Landlock ABI {report.landlock}; "
    text += "guarantees kept: " + (", ".join(f"{g} ({'+'.join(layers)})" for g, layers in kept.items()) or "none")
    missing = report.missing(sandbox.backend, sandbox.required)
    skipped = [g for g in Guarantee if g not in kept and g not in missing]
    if missing:
        text += f"; MISSING (required): {', '.join(missing)}"
    if skipped:
        text += f"; missing, not required (runs go without): {', '.join(skipped)}"
    return text


def cmd_policy_explain(settings: Settings, args: argparse.Namespace) -> int:
    arguments = json_object_arg(args.args)
    if args.role is not None:
        if args.agent:
            raise UsageError("--agent needs --user (check_permission reads the user's stored decisions)")
        services, given = _dry_services(settings, args.role, args.workspace)
        reports = Pipeline(services).explain(None, args.tool, arguments, given=given)
        return _print_explained(args, reports)
    if args.workspace is not None:
        raise UsageError("--workspace goes with --role (a user's workspaces come from the database)")
    # An unknown user or tool is what the call would be refused for (-32001, -32602): the dry run
    # shows that stage and exits 3, as for every other refusal (docs/operations.md, `policy explain`).
    services = _services(settings)
    if args.agent:
        steps = explain_agent_tool(services, args.user, args.tool, arguments)
        outcome = steps[-1][1].split()[0] if steps else "deny"
        if args.format == "json":
            print_json({"user": args.user, "tool": args.tool, "steps": [list(s) for s in steps], "result": outcome})
        else:
            for step, verdict in steps:
                print(f"{step:<13}{verdict}")
        return EXPLAIN_REFUSED if outcome == "deny" else 0
    return _print_explained(args, Pipeline(services).explain(args.user, args.tool, arguments))


def _dry_services(settings: Settings, role: str, workspace: str | None) -> tuple[Services, Principal]:
    """Services for `policy explain --role`: the policy and the host, an empty in-memory database, a throwaway key.

    No state folder is needed; the dry run with a given principal reads nothing from the database."""
    policy = policy_for(settings, TOOL_NAMES)
    if role not in policy.roles:
        raise CommandError(f"unknown role {role!r} (the policy defines: {', '.join(policy.roles)})")
    chosen = workspace or next(iter(policy.workspaces), None)
    if chosen is None or chosen not in policy.workspaces:
        raise CommandError(f"unknown workspace {chosen!r} (the policy defines: {', '.join(policy.workspaces)})")
    keys = KeyRing(secrets.token_bytes(32), {})
    services = open_services(settings, policy=policy, engine=make_engine("sqlite://"), keys=keys)
    return services, Principal(f"(role {role})", role, (chosen,), None, "explain")


def _print_explained(args: argparse.Namespace, reports: list[StageReport]) -> int:
    refused = next((r for r in reports if r.code is not None), None)
    if args.format == "json":
        stages = [
            {
                "stage": r.stage,
                "result": "pass" if r.code is None else "refused",
                "code": r.code,
                "reason": r.reason,
                "note": r.note,
            }
            for r in reports
        ]
        verdict_fields = {"would_run": refused is None, "code": None if refused is None else refused.code}
        print_json({"user": args.user, "tool": args.tool, "stages": stages, **verdict_fields})
    else:
        for report in reports:
            verdict_text = "pass" if report.code is None else f"{report.code} {report.reason or ''}".strip()
            print(f"{report.stage:<13}{verdict_text}{'  (' + report.note + ')' if report.note else ''}")
        print(f"result: {'would run' if refused is None else f'refused with {refused.code}'}")
    return 0 if refused is None else EXPLAIN_REFUSED


def cmd_audit_export(settings: Settings, args: argparse.Namespace) -> int:
    since = None
    if args.since:
        since = since_arg(args.since)
    out = sys.stdout
    for event in open_stores(settings).audit.events(since_ts=since):
        out.write(json.dumps(event.to_json(), sort_keys=True, ensure_ascii=False) + "\n")
    return 0


def cmd_audit_verify(settings: Settings, args: argparse.Namespace) -> int:
    report = open_stores(settings).audit.verify()
    if args.format == "json":
        print_json({
            "ok": report.ok, "checked": report.checked, "first_bad_id": report.first_bad_id, "problem": report.problem
        })  # fmt: skip
        return 0 if report.ok else 1
    if report.ok:
        print(f"ok: {report.checked} events, hash chain intact")
        return 0
    print(f"broken: first bad event id {report.first_bad_id} ({report.problem})")
    return 1


def cmd_demo(settings: Settings, _args: argparse.Namespace) -> int:
    from gateway.cli.demo import run_demo  # noqa: PLC0415  (the MCP SDK loads only for the demo)

    return run_demo(settings, os.environ)


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    """Probe this host as this user; judge it against the policy (the shipped default when there is none yet)."""
    from gateway.cli.doctor import as_json, as_text, run_doctor  # noqa: PLC0415

    blocked = policy_access_problem(settings)
    if blocked is not None:
        print(f"mcp-gateway: {describe(blocked)}; judging this host against the shipped default", file=sys.stderr)
        policy = load_policy(SHIPPED_POLICY, TOOL_NAMES)
    elif settings.policy_given is None and not os.path.lexists(settings.policy_path):
        print(
            f"mcp-gateway: no policy at {settings.policy_path}: judging this host against the shipped default",
            file=sys.stderr,
        )
        policy = load_policy(SHIPPED_POLICY, TOOL_NAMES)
    else:
        policy = policy_for(settings, TOOL_NAMES)
    diagnosis = run_doctor(policy, probe_host(), host_facts())
    print(as_json(diagnosis) if args.format == "json" else as_text(diagnosis))
    return 0 if diagnosis.ok else 1


def _check_access(settings: Settings, args: argparse.Namespace, words: tuple[str, str | None]) -> None:
    """What the command needs of the state folder, the database and the policy, or one line on what is out of reach.

    `doctor` probes the host (and says itself when the policy is out of reach); `demo` makes its
    own state; `policy check FILE` reads only FILE; `policy check` and `policy explain --role`
    read only the policy."""
    if words in (("doctor", None), ("demo", None)) or (words == ("policy", "check") and args.file):
        return
    if words == ("policy", "check") or (words == ("policy", "explain") and args.role is not None):
        blocked = policy_access_problem(settings)
        if blocked is not None:
            raise CommandError(describe(blocked))
        return
    check_state_access(settings, init=words == ("init", None))


_Handler = Callable[[Settings, argparse.Namespace], int]
_HANDLERS: dict[tuple[str, str | None], _Handler] = {
    ("init", None): cmd_init,
    ("user", "add"): cmd_user_add,
    ("user", "list"): cmd_user_list,
    ("user", "disable"): cmd_user_disable,
    ("user", "set-role"): cmd_user_set_role,
    ("user", "passwd"): cmd_user_passwd,
    ("console", None): cmd_console,
    ("token", "issue"): cmd_token_issue,
    ("token", "revoke"): cmd_token_revoke,
    ("serve", None): cmd_serve,
    ("policy", "check"): cmd_policy_check,
    ("policy", "explain"): cmd_policy_explain,
    ("audit", "export"): cmd_audit_export,
    ("audit", "verify"): cmd_audit_verify,
    ("consent", "list"): cmd_consent_list,
    ("consent", "grant"): cmd_consent_grant,
    ("consent", "revoke"): cmd_consent_revoke,
    ("approvals", None): cmd_approvals,
    ("upstream", "list"): cmd_upstream_list,
    ("upstream", "accept"): cmd_upstream_accept,
    ("demo", None): cmd_demo,
    ("doctor", None): cmd_doctor,
}
