"""The stdio MCP server (docs/architecture.md, "How a request flows"): SDK wiring, and the one place errors become MCPError.

Every refusal leaves a handler through `to_mcp_error`, with `data.run_id` and
`data.reason`; anything unexpected is logged (never with arguments or tokens) and
answered as -32603.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway import __version__
from gateway.auth import TOKEN_ENV, EnvToken, Principal, env_token
from gateway.consent.stage import (
    OUT_OF_BAND,
    ConsentChannel,
    Decision,
    Dialog,
    InputRequired,
    NoAnswer,
    RoundTrip,
    decision_from_form,
    decision_schema,
)
from gateway.db.file_guard import FileGuard, guard_of
from gateway.db.threads import in_db_thread, set_start_wait, start_wait_from
from gateway.errors import GatewayError, InternalError, InvalidParamsError, Reason
from gateway.permission_prompt import SPEC as CHECK_PERMISSION
from gateway.permission_prompt import CallToken, PermissionPrompt
from gateway.pipeline import CallRequest, Pipeline
from gateway.progress import NO_PROGRESS, CallProgress, Notifier, progress_token
from gateway.rbac import has_permission
from gateway.recovery import keep_sweeping
from gateway.services import Services
from gateway.tick_failures import FailureStreak
from gateway.tools.base import Relay, ToolSpec
from gateway.tools.outcome import ToolOutcome
from gateway.tools.run_pytest import ARTIFACT_MIME_TYPES, parse_artifact_uri
from gateway.transport import CLIENT_GONE, DEFAULT_MAX_MESSAGE_BYTES, ClientGoneError, stdio_transport
from gateway.upstreams.servers import Catalogue
from sandbox.task_groups import task_group

log = logging.getLogger("gateway.server")


def to_mcp_error(exc: GatewayError, run_id: str | None = None) -> MCPError:
    data: dict[str, Any] = {"run_id": exc.data.get("run_id", run_id), "reason": exc.reason}
    data.update({k: v for k, v in exc.data.items() if k not in data})
    return MCPError(code=exc.code, message=exc.public_message(), data=data)


@contextmanager
def answered_as_mcp_errors(what: str, new_run_id: Callable[[], str], *, traceback: bool = True) -> Iterator[None]:
    """Every way a handler fails, as the MCPError the client gets (the one place that maps them).

    A refusal keeps its code and reason, the database failing included (StorageUnavailableError,
    logged with its cause by the store: gateway/db/errors.py); anything else is -32603
    `internal_error`, logged with its traceback unless `traceback` is False (for a handler whose
    locals hold a token). Never the SDK's `{"code": 0}` with Python's text.
    """
    try:
        yield
    except GatewayError as exc:
        raise to_mcp_error(exc, new_run_id()) from None
    except Exception as exc:
        if traceback:
            log.exception("%s failed unexpectedly", what)
        else:
            log.error("%s failed unexpectedly (%s)", what, type(exc).__name__)  # noqa: TRY400
        raise to_mcp_error(InternalError(Reason.INTERNAL_ERROR, "the gateway failed"), new_run_id()) from None


def tool_definition(spec: ToolSpec) -> types.Tool:
    annotations = {k: v for k, v in spec.annotations.items() if k != "title"}
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=dict(spec.input_schema),
        annotations=types.ToolAnnotations(title=spec.annotations.get("title"), **_snake(annotations)),
        _meta=dict(spec.meta) or None,
    )


def _snake(hints: Mapping[str, Any]) -> dict[str, Any]:
    names = {
        "readOnlyHint": "read_only_hint",
        "destructiveHint": "destructive_hint",
        "idempotentHint": "idempotent_hint",
        "openWorldHint": "open_world_hint",
    }
    return {names[k]: v for k, v in hints.items()}


RUN_ID_META = "mcp-write-gateway/run_id"
"""`_meta` key of every successful result: the call's run_id, as in error data."""


def to_call_result(outcome: ToolOutcome, run_id: str) -> types.CallToolResult:
    if outcome.content is not None:  # an upstream server's result, passed on as it gave it (docs/upstreams.md)
        return types.CallToolResult.model_validate(
            {
                "content": list(outcome.content),
                "structuredContent": None if outcome.structured is None else dict(outcome.structured),
                "isError": outcome.is_error,
                "_meta": {RUN_ID_META: run_id},
            },
            by_alias=True,
        )
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=outcome.text)]
    for link in outcome.links:
        content.append(
            types.ResourceLink(
                type="resource_link",
                uri=link.uri,
                name=link.name,
                mime_type=link.mime_type,
                description=link.description,
            )
        )
    structured = dict(outcome.structured) if outcome.structured is not None else None
    return types.CallToolResult(
        content=content, structured_content=structured, is_error=outcome.is_error, _meta={RUN_ID_META: run_id}
    )


def _token_of(params: Mapping[str, Any] | None, services: Services) -> object:
    """`params.auth.token` whenever the request carries `params.auth` (a bad one is refused, never
    replaced); without it, under the policy's `auth.env_token`, the server's MCP_GATEWAY_TOKEN."""
    params = params or {}
    if "auth" in params or not services.policy.auth.env_token:
        auth = params.get("auth")
        return auth.get("token") if isinstance(auth, Mapping) else None
    return env_token(services.environ)


def _is_missing(token: object) -> bool:
    return token is None or token == EnvToken(None)


_CONNECTION_CLOSED = -32000
"""mcp_types.CONNECTION_CLOSED: the SDK's error for a request still waiting when the connection closed."""


class ElicitationAsker:
    """Asks the person behind the client through `elicitation/create` (form mode)."""

    def __init__(self, ctx: ServerRequestContext[Any, Any]) -> None:
        self._ctx = ctx

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | NoAnswer | None:
        try:
            result = await self._ctx.session.elicit_form(
                message, decision_schema(choices), related_request_id=self._ctx.request_id
            )
        except MCPError as exc:
            # The connection closed (stdin at EOF), or the client answered the question with an error:
            # deny once, at once, audited as nobody's answer (origin no_answer), not as a person's.
            return NoAnswer("client_gone" if exc.code == _CONNECTION_CLOSED else "client_error")
        except ValueError:  # pydantic.ValidationError
            # An answer that is not an elicitation result (a field of the wrong type, a result that
            # is not an object): no decision either, so deny once, at once.
            return NoAnswer("invalid_answer")
        return decision_from_form(result.action, result.content, choices)


def asker_for(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams | None = None) -> ConsentChannel:
    """How to ask the person behind this client: in band where it declared form elicitation, else
    `OUT_OF_BAND` (the question then waits for `mcp-gateway approvals` or the console). 2025-era sessions
    get `elicitation/create`; 2026-07-28 sessions, which have no server-to-client requests, an
    `input_required` round trip."""
    if not _can_elicit_form(ctx):
        return OUT_OF_BAND
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answer = (params.input_responses or {}).get("consent") if params is not None else None
        if isinstance(answer, types.ElicitResult):
            return RoundTrip(answer.action, answer.content, params.request_state if params else None)
        return RoundTrip(state=params.request_state if params else None)
    return Dialog(ElicitationAsker(ctx))


def progress_of(ctx: ServerRequestContext[Any, Any]) -> CallProgress:
    """Progress notifications for this call when its client sent `_meta.progressToken` (gateway/progress.py)."""
    token = progress_token(ctx.params)
    if token is None:
        return NO_PROGRESS

    async def send(progress: float, message: str) -> None:
        await ctx.session.report_progress(progress, None, message)  # to the request's progressToken

    return Notifier(send)


def relay_of(ctx: ServerRequestContext[Any, Any]) -> Relay | None:
    """This call's client, for an upstream server's form elicitation (docs/upstreams.md): a 2025-era session
    that declared form elicitation; None otherwise (the server's request is then refused)."""
    if not _can_elicit_form(ctx) or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None

    async def relay(params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        if not isinstance(params, types.ElicitRequestFormParams):
            return types.ErrorData(code=types.INVALID_REQUEST, message="only form elicitation is relayed")
        try:
            return await ctx.session.elicit_form(
                params.message, params.requested_schema, related_request_id=ctx.request_id
            )
        except MCPError:
            return types.ErrorData(code=types.INVALID_REQUEST, message="the client gave no answer")
        except ValueError:  # pydantic.ValidationError: an answer that is no elicitation result
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="the client's answer was not an elicitation result"
            )

    return relay


def _can_elicit_form(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Form mode declared: a bare `elicitation: {}` counts as form, url-only does not (spec 2025-11-25)."""
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _listed_for(services: Services, tools: Catalogue, principal: Principal | None) -> list[str]:
    """The allowlisted tools whose upstream servers a tools/list starts: for a caller, only those of the
    upstreams whose `permission` the caller's role has (docs/upstreams.md); without a token, every one."""
    if principal is None:
        return list(services.policy.allowlist)
    roles = services.policy.roles
    return [
        name
        for name in services.policy.allowlist
        if (upstream := tools.servers.upstream_of(name)) is not None
        and has_permission(roles, principal.role, upstream.permission)
    ]


def build_server(services: Services) -> Server[Any]:
    pipeline = Pipeline(services)
    # Claude Code's permission prompt tool (docs/claude-code.md): offered only when the policy enables it,
    # whatever params.auth says; it authenticates with params.auth when present (never replaced), else
    # with the server's MCP_GATEWAY_TOKEN.
    prompt = PermissionPrompt(services) if services.policy.permission_prompt.enabled else None
    extra = [tool_definition(CHECK_PERMISSION)] if prompt is not None else []

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        token = _token_of(ctx.params, services)
        principal = None
        if not _is_missing(token):
            with answered_as_mcp_errors("tools/list", services.new_run_id, traceback=False):  # no token in the log
                principal = await in_db_thread(services.authenticator.authenticate, token)
        if isinstance(services.tools, Catalogue):  # upstreams' tools are listed once their servers are asked
            await services.tools.servers.prepare_listing(_listed_for(services, services.tools, principal))
        allowlisted = [services.tools[name] for name in services.policy.allowlist if name in services.tools]
        if principal is None:
            return types.ListToolsResult(tools=[tool_definition(s) for s in allowlisted] + extra)
        roles = services.policy.roles
        mine = [s for s in allowlisted if has_permission(roles, principal.role, s.permission)]
        return types.ListToolsResult(tools=[tool_definition(s) for s in mine] + extra)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if prompt is not None and params.name == CHECK_PERMISSION.name:
            given = CallToken(_token_of(ctx.params, services)) if "auth" in (ctx.params or {}) else None
            run_id, answer = await prompt.check(params.arguments or {}, progress_of(ctx), given)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=answer)], _meta={RUN_ID_META: run_id}
            )
        request = CallRequest(
            params.name, params.arguments or {}, _token_of(ctx.params, services), progress_of(ctx), relay_of(ctx)
        )
        with answered_as_mcp_errors("tools/call", services.new_run_id):
            try:
                run_id, outcome = await pipeline.call(request, asker_for(ctx, params))
            except InputRequired as needed:
                question = types.ElicitRequestFormParams(message=needed.message, requested_schema=dict(needed.schema))
                return types.InputRequiredResult(
                    input_requests={"consent": types.ElicitRequest(params=question)}, request_state=needed.state
                )
        return to_call_result(outcome, run_id)

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        """A run's artifact by URI: the same call, checks and audit as get_artifact_content."""
        target = parse_artifact_uri(params.uri)
        if target is None:
            raise to_mcp_error(InvalidParamsError(Reason.UNKNOWN_RESOURCE, "unknown resource"), services.new_run_id())
        run_id, name = target
        arguments = {"run_id": run_id, "name": name}
        request = CallRequest("get_artifact_content", arguments, _token_of(ctx.params, services))
        with answered_as_mcp_errors("resources/read", services.new_run_id):
            _call_id, outcome = await pipeline.call(request)
        mime = ARTIFACT_MIME_TYPES.get(name, "text/plain")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type=mime, text=outcome.text)]
        )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        # Runs are found with list_artifacts (which needs a token); no resource is public.
        return types.ListResourcesResult(resources=[])

    return Server(
        "mcp-write-gateway",
        version=__version__,
        instructions=_instructions(services.policy.auth.env_token),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


def _instructions(env_token_on: bool) -> str:
    needs = (
        "Every tools/call needs a per-call JWT in params.auth.token, or, without params.auth, uses the token "
        "this server was started with (auth.env_token)."
        if env_token_on
        else "Every tools/call needs a per-call JWT in params.auth.token."
    )
    return needs + (
        " Write tools (run_pytest) also pass RBAC, the policy allowlist, a budget and a person's consent,"
        " and run as a supervised subprocess."
    )


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


async def serve(services: Services, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> int | None:
    """Serve until stdin closes, a stop signal comes, the client stops reading or the database turns unwritable.

    Whatever stops it, every call in flight is cancelled first. A call cancelled here ends as any
    cancelled call does: its run killed whole and a terminal audit event written (where the
    database still takes it). Without the handler, SIGTERM would end the process at once and
    leave the runs it started running. Returns None when stdin closed, else the exit status: 0
    after a stop signal, 1 after a fault (its one line is logged).
    """
    server = build_server(services)
    if services.policy.permission_prompt.enabled:
        found = "set" if services.environ.get(TOKEN_ENV, "").strip() else "NOT set: every answer will be deny"
        log.warning("check_permission is offered (permission_prompt.enabled); %s is %s", TOKEN_ENV, found)
    _log_env_token(services)
    # A fatal signal the guard below could not prevent (a -shm made immutable in the microseconds
    # between its check and SQLite's write: SIGBUS) at least names itself on stderr.
    faulthandler.enable()
    set_start_wait(start_wait_from(services.environ))  # database work not started in time is refused
    stopped = _Stopped()
    client_gone = False
    try:
        async with task_group() as group:  # a failure leaves it as itself (sandbox/task_groups.py)
            group.start_soon(_stop_on_signal, group.cancel_scope, stopped)
            group.start_soon(keep_sweeping, services)  # lease, overdue runs, orphaned questions
            guard = guard_of(services.engine)
            if guard is not None:
                group.start_soon(_stop_on_unwritable_files, group.cancel_scope, guard, stopped)
            async with upstreams_running(services), stdio_transport(max_message_bytes) as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
            group.cancel_scope.cancel()  # stdin closed: the watchers have nothing left to guard
    except* ClientGoneError:
        client_gone = True
    if client_gone:
        log.error("%s: stopped; calls in flight were cancelled and their runs killed", CLIENT_GONE)
        return 1
    return stopped.status


def upstreams_running(services: Services) -> contextlib.AbstractAsyncContextManager[None]:
    """The upstreams' servers start at first use while serving, and are all stopped when it ends (docs/upstreams.md)."""
    if isinstance(services.tools, Catalogue):
        return services.tools.servers.running()
    return contextlib.nullcontext()


def _log_env_token(services: Services) -> None:
    """One line: whether calls without params.auth act as the server's MCP_GATEWAY_TOKEN (never its value)."""
    is_set = bool(services.environ.get(TOKEN_ENV, "").strip())
    if services.policy.auth.env_token:
        found = "set" if is_set else "NOT set: every call without params.auth is refused (-32001 token_missing)"
        log.warning("auth.env_token is on: calls without params.auth use %s, which is %s", TOKEN_ENV, found)
    elif is_set and not services.policy.permission_prompt.enabled:
        log.info("%s is set but auth.env_token is off: calls without params.auth are refused", TOKEN_ENV)


@dataclass(slots=True)
class _Stopped:
    status: int | None = None
    """The exit status, once something other than the end of stdin stopped serving."""


WATCHER_RETRY_S = 1.0


async def _stop_on_unwritable_files(scope: anyio.CancelScope, guard: FileGuard, stopped: _Stopped) -> None:
    # The guard finds an unwritable file on whichever database thread checked it, and refuses that
    # transaction: one more would risk SIGBUS, so serving ends too. A pipe carries the news to
    # the loop from any thread; it stays open, as a database thread may still hold the hook.
    # Its own failure (no descriptor left for the pipe) is never the gateway's end (decision 68):
    # logged once and retried, while the guard goes on refusing each transaction on an unwritable file.
    trouble = FailureStreak("the database file guard's watcher", WATCHER_RETRY_S, log=log)
    while True:
        try:
            wake_read, wake_write = os.pipe()
            os.set_blocking(wake_write, False)
            guard.on_unwritable = partial(_wake, wake_write)
            await anyio.wait_readable(wake_read)
            break
        except Exception as exc:  # cancellation is a BaseException: it passes
            trouble.failed(exc)
        await anyio.sleep(WATCHER_RETRY_S)
    stopped.status = 1  # the guard logged the line saying which file and what to do
    scope.cancel()


def _wake(fd: int) -> None:
    with contextlib.suppress(OSError):  # a full pipe has woken the loop already
        os.write(fd, b"!")


async def _stop_on_signal(scope: anyio.CancelScope, stopped: _Stopped) -> None:
    with anyio.open_signal_receiver(*STOP_SIGNALS) as received:
        async for signum in received:
            name = signal.Signals(signum).name
            log.warning("%s received: stopping; calls in flight are cancelled and their runs killed", name)
            stopped.status = 0
            scope.cancel()
            return


def run_stdio(services: Services) -> None:
    status = anyio.run(serve, services)
    if status is not None:
        # Everything is done (calls cancelled, runs killed, events committed), but a stdin
        # reader thread (stdin a terminal or a file, not a pipe) may be blocked in read(2), and the
        # interpreter would wait for it at exit for as long as the client keeps stdin open: leave
        # without joining it.
        logging.shutdown()
        os._exit(status)
