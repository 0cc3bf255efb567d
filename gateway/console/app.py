"""The console's routes (docs/console.md): sign-in, invocation cards (live), approvals, grants, audit, runs.

Every response carries a strict CSP (no inline script or style, nothing from another origin),
frame-ancestors 'none' and no-store. A request whose Host is not the console's own address is
refused (DNS rebinding), and so is a POST without the session's CSRF token (403) or from another
Origin. The database is the source of truth: the gateways are other processes.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.approvals import actions_for, deny_first
from gateway.audit import EventDraft, EventType
from gateway.calls import CallStore
from gateway.consent.actions import Actor, decide_question, revoke_grant
from gateway.consent.changes_view import (
    Review,
    is_change_review,
    load_review,
    review_dir,
    review_run_id,
)
from gateway.consent.stage import Decision
from gateway.consent.store import Channel
from gateway.console import pages
from gateway.console.changes import MAX_PATCH_BYTES, offered_in_block, whole_patch
from gateway.console.copy import pick_locale, words_for
from gateway.console.sessions import SessionBook, SignInLimit, StreamSlot, StreamSlots, tokens_match
from gateway.console.shown import shown_card, shown_lines
from gateway.console.upstreams import NOTICES as PIN_NOTICES
from gateway.console.upstreams import may_accept, tool_of_field
from gateway.console.views import (
    AuditFilter,
    ChainWatch,
    FilterError,
    Viewer,
    call_query_of,
    export_audit,
    fetch_audit_page,
    run_files,
    viewer_of,
)
from gateway.policy import Policy
from gateway.services import Stores
from gateway.tools.registry import catalogue
from gateway.upstreams.pins import offered_tools, tool_lines
from gateway.users import no_password_matches, password_matches

STATIC = Path(__file__).parent / "static"
SESSION_COOKIE = "gw_session"
PRE_COOKIE = "gw_pre"
LANG_COOKIE = "gw_lang"
POLL_S = 0.25
"""How often the live view reads the cards changed since its cursor (one indexed query)."""
RECHECK_POLLS = 20
"""Every this many polls (about 5 s idle) the stream checks its session and user again."""
REPLAY_MAX = 200
"""At most this many cards are sent to a stream that starts behind; further behind, it is told to reload."""

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


@dataclass
class Console:
    stores: Stores
    policy: Policy
    sessions: SessionBook
    limit: SignInLimit
    streams: StreamSlots
    calls: CallStore
    chain: ChainWatch
    tls: bool
    hosts: frozenset[str] | None
    """Host header values this console answers to; None: any (under TLS the certificate binds the name)."""


async def _run(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _locale_of(request: Request) -> str:
    return pick_locale(request.cookies.get(LANG_COOKIE), request.headers.get("accept-language"))


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status)


class Endpoints:
    """The routes' handlers; a page handler gets the signed-in Viewer and the words of their language."""

    def __init__(self, console: Console) -> None:
        self.c = console

    def viewer(self, request: Request) -> Viewer | None:
        session = self.c.sessions.fetch(request.cookies.get(SESSION_COOKIE))
        if session is None:
            return None
        record = self.c.stores.users.fetch(session.user)
        if record is None or record.disabled:
            self.c.sessions.close(request.cookies.get(SESSION_COOKIE))
            return None
        return viewer_of(record, self.c.policy, session.csrf)

    def not_found(self, request: Request, who: Viewer | None) -> HTMLResponse:
        words = words_for(_locale_of(request))
        return _html(pages.message_page(words, who, request.url.path, words["not_found"]), 404)

    def page(
        self,
        handler: Callable[[Request, Viewer, dict[str, str]], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            who = await _run(self.viewer, request)
            if who is None:
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": "sign in first"}, status_code=401)
                return RedirectResponse("/login", status_code=303)
            if request.method == "POST":
                form = await request.form()
                if not tokens_match(_field(form, "csrf"), who.csrf):
                    words = words_for(_locale_of(request))
                    return _html(pages.message_page(words, who, request.url.path, words["forbidden"]), 403)
            return await handler(request, who, words_for(_locale_of(request)))

        return endpoint

    # --- sign-in ---------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        words = words_for(_locale_of(request))
        nonce = secrets.token_urlsafe(24)
        response = _html(pages.login_page(words, self.c.sessions.pre_token(nonce)))
        _cookie(response, PRE_COOKIE, nonce, self.c.tls)
        return response

    async def login(self, request: Request) -> Response:
        form = await request.form()
        nonce = request.cookies.get(PRE_COOKIE, "")
        if not nonce or not tokens_match(_field(form, "csrf"), self.c.sessions.pre_token(nonce)):
            words = words_for(_locale_of(request))
            return _html(pages.message_page(words, None, "/login", words["forbidden"]), 403)
        name = (_field(form, "user") or "")[:64]
        password = (_field(form, "password") or "")[:1024]
        address = request.client.host if request.client else "?"
        attempt = self.c.limit.reserve(name, address)  # before the hash is read: at most the limit's checks
        if isinstance(attempt, int):
            await _run(_audit_sign_in, self.c, name, False, "rate_limited")
            words = words_for(_locale_of(request))
            body = pages.login_page(words, self.c.sessions.pre_token(nonce), words["too_many"].format(seconds=attempt))
            return Response(body, status_code=429, media_type="text/html", headers={"Retry-After": str(attempt)})
        ok = await _run(_check_password, self.c, name, password)
        if not ok:
            await _run(_audit_sign_in, self.c, name, False, "bad_credentials")
            words = words_for(_locale_of(request))
            body = pages.login_page(words, self.c.sessions.pre_token(nonce), words["bad_sign_in"])
            return _html(body, 401)
        self.c.limit.succeeded(attempt)
        await _run(_audit_sign_in, self.c, name, True, None)
        self.c.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/calls", status_code=303)
        _cookie(response, SESSION_COOKIE, self.c.sessions.open(name), self.c.tls)
        response.delete_cookie(PRE_COOKIE)
        return response

    async def logout(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        self.c.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    async def language(self, request: Request) -> Response:
        chosen = request.query_params.get("to", "")
        back = request.query_params.get("back", "/calls")
        if not back.startswith("/") or back.startswith("//") or "\\" in back:
            back = "/calls"
        response = RedirectResponse(back, status_code=303)
        if chosen in ("en-US", "pt-BR"):
            _cookie(response, LANG_COOKIE, chosen, self.c.tls, http_only=False)
        return response

    # --- invocation cards ------------------------------------------------------------------------

    async def calls_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        try:
            query = call_query_of(request.query_params.multi_items())
        except FilterError as exc:
            return _html(pages.message_page(words, who, request.url.path, words["bad_filter"].format(why=exc)), 400)
        return _html(pages.calls_page(words, who, _locale_of(request), None, query))

    async def call_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        run_id = request.path_params["run_id"]
        card = await _run(self.c.calls.fetch, run_id)
        if card is None or not who.sees(card.workspace):
            return self.not_found(request, who)
        return _html(pages.calls_page(words, who, _locale_of(request), run_id))

    async def api_calls(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        """A page of cards (`call_query_of`: filters, page size, the cursor `before`), oldest first as the
        page prepends them; `older`: the cursor of the page before it, or null."""
        try:
            query = call_query_of(request.query_params.multi_items())
        except FilterError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        head = await _run(self.c.calls.fetch_head)  # read first: a change after it is streamed, not lost
        cards, older = await _run(self.c.calls.fetch_page, query, who.scope)
        return JSONResponse({"cards": [shown_card(card) for card in reversed(cards)], "head": head, "older": older})

    async def api_call(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        head = await _run(self.c.calls.fetch_head)
        card = await _run(self.c.calls.fetch, request.path_params["run_id"])
        if card is None or not who.sees(card.workspace):
            return JSONResponse({"error": "not found"}, status_code=404)
        return JSONResponse({"card": shown_card(card), "head": head})

    async def api_tools(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        return JSONResponse(
            {
                name: {"inputSchema": dict(spec.input_schema), "title": spec.title}
                for name, spec in catalogue(self.c.policy).items()
            }
        )

    async def api_stream(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        """The cards changed after the cursor (`after`, or the `Last-Event-ID` of a reconnecting
        EventSource) that pass the list's filters (`call_query_of`), as server-sent events; without a
        cursor, from now on. A cursor more than
        `REPLAY_MAX` cards back gets one `reload` event instead of the backlog: the page's own
        reads are the way to catch up. A session or user past its share of streams gets 429."""
        try:
            query = call_query_of(request.query_params.multi_items(), extra=("after", "run"))
        except FilterError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        slot = self.c.streams.take(request.cookies.get(SESSION_COOKIE) or "", who.name)
        if isinstance(slot, str):
            return JSONResponse({"error": slot}, status_code=429, headers={"Retry-After": "5"})
        after = _cursor_of(request)
        only = request.query_params.get("run")

        async def events() -> Any:
            cursor = await _run(self.c.calls.fetch_head) if after is None else after
            if after is not None:
                backlog = await _run(self.c.calls.fetch_changed, cursor, who.scope, REPLAY_MAX + 1)
                if len(backlog) > REPLAY_MAX:
                    reason = f"more than {REPLAY_MAX} cards changed since this page was read: reload the page"
                    yield {"event": "reload", "data": json.dumps({"reason": reason})}
                    return
            polls = 0
            shown_marks: dict[str, tuple[tuple[int, int, int], ...]] = {}
            while True:
                if await request.is_disconnected():
                    return
                polls += 1
                if polls % RECHECK_POLLS == 0:
                    # A stream outlives the request that opened it: sign-out, a disabled user or
                    # workspaces taken away end or narrow it, as they would the next page.
                    now_who = await _run(self.viewer, request)
                    if now_who is None or now_who.scope != who.scope:
                        return
                cards = await _run(self.c.calls.fetch_changed, cursor, who.scope, 200)
                for card in cards:
                    cursor = max(cursor, card.last_event_id)
                    if (only is None or card.run_id == only) and query.matches(card):
                        yield {"event": "card", "id": str(card.last_event_id), "data": json.dumps(shown_card(card))}
                # A running card's open connections change without an audit event (decision 102): sent again when
                # their rows do, under the stream's own cursor (a reconnect replays from it, never from before).
                marks = await _run(self.c.calls.fetch_open_marks, who.scope)
                moved = {card for card, mark in marks.items() if shown_marks.get(card) != mark}
                moved |= shown_marks.keys() - marks.keys()
                moved -= {card.run_id for card in cards}
                shown_marks = marks
                again = await _run(self.c.calls.fetch_many, moved, who.scope) if moved else []
                for card in again:
                    if (only is None or card.run_id == only) and query.matches(card):
                        yield {"event": "card", "id": str(cursor), "data": json.dumps(shown_card(card))}
                if not cards and not again:
                    await anyio.sleep(POLL_S)

        return HeldStream(events(), slot, ping=15)

    # --- approvals -------------------------------------------------------------------------------

    def visible_questions(self, who: Viewer) -> list[Any]:
        pending = self.c.stores.consent_store.fetch_pending(self.c.stores.clock.now())
        return [q for q in pending if who.sees(q.workspace)]

    async def approvals_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        questions = await _run(self.visible_questions, who)
        now = self.c.stores.clock.now()
        notice = pages.notice_of(words, request.query_params.get("m"), request.query_params.get("d"))
        reviews = {q.id: await _run(self.review_of, q) for q in questions if is_change_review(q)}
        return _html(pages.approvals_page(words, who, questions, now, notice, reviews=reviews))

    def review_of(self, question: Any, max_patch_bytes: int = MAX_PATCH_BYTES) -> Review:
        """A change review's artifacts from its run's folder (gateway/consent/changes_view.py), bounded."""
        return load_review(review_dir(self.c.stores.runs.artifacts_dir, question), max_patch_bytes)

    async def review_patch(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        """The whole changes.patch of a change review the viewer may see, escaped, as text/plain."""
        question = await _run(self.c.stores.consent_store.fetch_request, request.path_params["question_id"])
        if question is None or not who.sees(question.workspace) or not is_change_review(question):
            return self.not_found(request, who)
        record = await _run(self.c.stores.runs.fetch, review_run_id(question))
        if record is not None and (record.workspace != question.workspace or not who.sees(record.workspace)):
            return self.not_found(request, who)
        status, text = await _run(whole_patch, review_dir(self.c.stores.runs.artifacts_dir, question))
        return Response(text, status_code=status, media_type="text/plain; charset=utf-8")

    async def api_questions(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        questions = await _run(self.visible_questions, who)
        return JSONResponse({"ids": [q.id for q in questions]})

    async def decide(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        question_id = request.path_params["question_id"]
        form = await request.form()
        chosen = _field(form, "decision") or ""
        question = await _run(self.c.stores.consent_store.fetch_request, question_id)
        if question is None or not who.sees(question.workspace):
            return self.not_found(request, who)
        if not who.may_decide:
            return _html(pages.message_page(words, who, "/approvals", words["cannot_decide"]), 403)
        offered = dict(actions_for(deny_first(question), await self.offered(question))).values()
        if chosen not in Decision.__members__ or Decision(chosen) not in offered:
            return RedirectResponse("/approvals?m=not_offered", status_code=303)
        decision = Decision(chosen)
        recorded = await _run(decide_question, self.c.stores, question_id, decision, _actor(who))
        query = {"m": "decided", "d": decision.value} if recorded else {"m": "not_recorded"}
        return RedirectResponse("/approvals?" + urlencode(query), status_code=303)

    async def offered(self, question: Any) -> tuple[str, ...] | None:
        """What may be decided: as its block offers it (a change review that cannot be read: Deny once only)."""
        review = await _run(self.review_of, question, 0) if is_change_review(question) else None
        return offered_in_block(question, review)

    # --- grants ----------------------------------------------------------------------------------

    async def grants_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        grants = await _run(self.c.stores.consent_store.list_grants, None, True)
        q = request.query_params
        now = self.c.stores.clock.now()
        return _html(
            pages.grants_page(
                words, who, grants, now, user=q.get("user", ""), tool=q.get("tool", ""), state=q.get("state", "")
            )
        )

    async def revoke(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        grant_id = _grant_id(request.path_params["grant_id"])
        grant = None if grant_id is None else await _run(self.c.stores.consent_store.fetch_grant, grant_id)
        if grant is None or not who.sees(grant.workspace):
            return self.not_found(request, who)
        if not who.may_decide:
            return _html(pages.message_page(words, who, "/grants", words["cannot_decide"]), 403)
        await _run(revoke_grant, self.c.stores, grant.id, _actor(who))
        return RedirectResponse("/grants", status_code=303)

    # --- upstreams -------------------------------------------------------------------------------

    async def upstreams_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        offered = offered_tools(self.c.policy)
        lines = tool_lines(offered, await _run(self.c.stores.pins.pins))
        m = request.query_params.get("m")
        notice = words[f"pin_{m}"] if m in PIN_NOTICES else None
        return _html(pages.upstreams_page(words, who, lines, frozenset(offered), notice))

    async def accept_pin(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        """Accept the changed definition the form showed (its digest), as this ADMIN, through the console."""
        if not may_accept(who):
            return _html(pages.message_page(words, who, "/upstreams", words["pin_cannot_accept"]), 403)
        form = await request.form()
        tool = tool_of_field(_field(form, "tool"))
        seen = _field(form, "seen") or ""
        if tool is None or not seen:
            return RedirectResponse("/upstreams?m=not_accepted", status_code=303)
        accept = functools.partial(self.c.stores.pins.accept, expected={tool: seen})
        accepted = await _run(accept, request.path_params["upstream"], tool, _actor(who))
        return RedirectResponse(f"/upstreams?m={'accepted' if accepted else 'not_accepted'}", status_code=303)

    # --- audit -----------------------------------------------------------------------------------

    async def audit_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        f = AuditFilter.of(request.query_params)
        events = await _run(fetch_audit_page, self.c.stores, f, who)
        return _html(pages.audit_page(words, who, f, events, self.c.chain))

    async def audit_export(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        f = AuditFilter.of(request.query_params)
        return StreamingResponse(
            export_audit(self.c.stores, f, who),
            media_type="application/jsonl",
            headers={"Content-Disposition": 'attachment; filename="audit.jsonl"'},
        )

    # --- runs ------------------------------------------------------------------------------------

    async def runs_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        runs = await _run(self.c.stores.runs.list, who.scope, 50)
        return _html(pages.runs_page(words, who, runs))

    async def run_page(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        record = await _run(self.c.stores.runs.fetch, request.path_params["run_id"])
        if record is None or not who.sees(record.workspace):
            return self.not_found(request, who)
        files = await _run(run_files, self.c.stores.runs.folder(record.run_id))
        return _html(pages.run_page(words, who, record, files))

    async def run_file(self, request: Request, who: Viewer, words: dict[str, str]) -> Response:
        record = await _run(self.c.stores.runs.fetch, request.path_params["run_id"])
        name = request.path_params["name"]
        if record is None or not who.sees(record.workspace):
            return self.not_found(request, who)
        files = await _run(run_files, self.c.stores.runs.folder(record.run_id))
        if name not in files:
            return self.not_found(request, who)
        return Response(shown_lines(files[name]), media_type="text/plain; charset=utf-8")

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/calls", status_code=303)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("console.js", "console.css", "tool.svg"):
            return Response("not found", status_code=404)
        return FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})


def build_app(console: Console) -> ASGIApp:
    """The console's routes behind its guard (security headers, Host and Origin checks)."""
    e = Endpoints(console)
    page = e.page
    routes = [
        Route("/", e.home),
        Route("/login", e.login_form, methods=["GET"]),
        Route("/login", e.login, methods=["POST"]),
        Route("/logout", page(e.logout), methods=["POST"]),
        Route("/lang", e.language),
        Route("/calls", page(e.calls_page)),
        Route("/calls/{run_id}", page(e.call_page)),
        Route("/api/calls", page(e.api_calls)),
        Route("/api/calls/{run_id}", page(e.api_call)),
        Route("/api/tools", page(e.api_tools)),
        Route("/api/stream", page(e.api_stream)),
        Route("/api/questions", page(e.api_questions)),
        Route("/approvals", page(e.approvals_page)),
        Route("/approvals/{question_id}", page(e.decide), methods=["POST"]),
        Route("/approvals/{question_id}/changes.patch", page(e.review_patch)),
        Route("/grants", page(e.grants_page)),
        Route("/grants/{grant_id}/revoke", page(e.revoke), methods=["POST"]),
        Route("/upstreams", page(e.upstreams_page)),
        Route("/upstreams/{upstream}/accept", page(e.accept_pin), methods=["POST"]),
        Route("/audit", page(e.audit_page)),
        Route("/audit/export.jsonl", page(e.audit_export)),
        Route("/runs", page(e.runs_page)),
        Route("/runs/{run_id}", page(e.run_page)),
        Route("/runs/{run_id}/files/{name}", page(e.run_file)),
        Route("/static/{name}", e.static),
    ]
    app = Starlette(routes=routes)
    return Guarded(app, console.hosts)


class Guarded:
    """Every response's security headers; a foreign Host or a cross-origin POST refused before routing."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        origin = headers.get("origin")
        refused = None
        if self.hosts is not None and host not in self.hosts:
            refused = (421, "this console answers only to its own address")
        elif scope["method"] == "POST" and origin is not None and origin.split("://", 1)[-1] != host:
            refused = (403, "cross-origin form refused")
        if refused is not None:
            response = Response(refused[1], status_code=refused[0], media_type="text/plain")
            await response(scope, receive, _with_headers(send))
            return
        await self.app(scope, receive, _with_headers(send))


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            extra = [
                (b"content-security-policy", CSP.encode()),
                (b"x-frame-options", b"DENY"),
                (b"x-content-type-options", b"nosniff"),
                (b"referrer-policy", b"same-origin"),  # no-referrer would make form POSTs send `Origin: null`
                (b"cross-origin-opener-policy", b"same-origin"),
            ]
            names = {k.lower() for k, _ in message.get("headers", [])}
            if b"cache-control" not in names:
                extra.append((b"cache-control", b"no-store"))
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return wrapped


class HeldStream(EventSourceResponse):
    """A live view that holds a `StreamSlot` until its response ends, however it ends (the client
    gone, the server stopping, an error, or before its first event)."""

    def __init__(self, content: Any, slot: StreamSlot, **options: Any) -> None:
        super().__init__(content, **options)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def _cursor_of(request: Request) -> int | None:
    """The stream's starting cursor: the larger of `after` and `Last-Event-ID`; None when neither is a number."""
    given = [request.query_params.get("after", ""), request.headers.get("last-event-id", "")]
    numbers = [int(text) for text in given if text.isdigit() and len(text) < 19]
    return max(numbers) if numbers else None


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _cookie(response: Response, name: str, value: str, tls: bool, *, http_only: bool = True) -> None:
    response.set_cookie(name, value, httponly=http_only, samesite="strict", secure=tls, path="/")


def _check_password(c: Console, name: str, password: str) -> bool:
    record = c.stores.users.fetch(name) if name else None
    stored = c.stores.users.fetch_password_hash(name) if record is not None and not record.disabled else None
    if stored is None or not password:
        return no_password_matches(password)
    return password_matches(password, stored)


def _audit_sign_in(c: Console, name: str, ok: bool, reason: str | None) -> None:
    known = bool(name) and c.stores.users.fetch(name) is not None
    # A name that is no user is not stored: it may be a password typed into the wrong field.
    detail: dict[str, Any] = {"ok": ok, "channel": str(Channel.CONSOLE)}
    if reason:
        detail["reason"] = reason
    c.stores.audit.append(EventDraft(EventType.CONSOLE_SIGN_IN, user=name if known else None, detail=detail))


def _actor(who: Viewer) -> Actor:
    return Actor(f"console:{who.name}", Channel.CONSOLE)


def _grant_id(text: str) -> int | None:
    """A grant id as its page links it (`str(id)`); None for anything else, which no grant has."""
    if not (text.isdecimal() and len(text) < 19 and str(int(text)) == text):
        return None
    return int(text)
