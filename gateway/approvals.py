"""`mcp-gateway approvals` (docs/consent.md, "The terminal approver"): questions waiting in the database, answered.

A gateway whose client cannot elicit leaves its question in `consent_requests`; this loop
shows each one (tool, server, user, workspace, risk, the arguments or preview, time left) with
numbered actions: 1 allow once, 2 allow always (never for a destructive tool), 3 deny once,
4 deny always, 5 allow for the session. Esc is deny once; Enter takes the default, Allow once,
or Deny once for a destructive tool or a request not shown whole. The decision is a conditional
UPDATE, so when several approvers (or gateways) share the database each question is decided
exactly once; whoever comes second is told so. A question whose gateway is gone (it was killed,
or its lease ran out: gateway/liveness.py) is not shown, and a decision on it is not recorded:
no gateway would act on it (gateway/recovery.py closes it).

Everything shown is `visible` (escaped as on every channel). A preview too long for the screen
is cut loudly (its length and sha256, `visible.excerpt`), and then an allowing key does nothing
until `v` has shown the whole request.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import select
import socket
import sys
import termios
import tty
from collections.abc import Collection, Iterator, Mapping
from typing import TextIO

from gateway.consent.actions import Actor, ConsentStores, decide_question
from gateway.consent.stage import Decision
from gateway.consent.store import Channel, PendingRequest, QuestionStatus
from gateway.consent.text import copy_for, cut_notice
from gateway.liveness import SessionStore, is_gone, this_process
from gateway.visible import Excerpt, excerpt, visible

ESC = "\x1b"
ENTER = ("\r", "\n")
SEE_ALL = "v"
NUMBERED: tuple[tuple[str, Decision], ...] = (
    ("1", Decision.ALLOW_ONCE),
    ("2", Decision.ALLOW_ALWAYS),
    ("3", Decision.DENY_ONCE),
    ("4", Decision.DENY_ALWAYS),
    ("5", Decision.ALLOW_SESSION),
)
IDLE_POLL_S = 0.25


def actions_for(destructive: bool, offered: Collection[str] | None = None) -> tuple[tuple[str, Decision], ...]:
    """The numbered actions offered: those the gateway offers (the request's `choices`, from the policy's
    consent.channels.approver; None: all), and Allow always never for a destructive tool."""
    return tuple(
        (key, d)
        for key, d in NUMBERED
        if not (destructive and d is Decision.ALLOW_ALWAYS) and (offered is None or d in offered)
    )


def default_for(destructive: bool, cut: bool = False, offered: Collection[str] | None = None) -> Decision:
    """What Enter chooses: the least commitment (decision 40); Deny once where the tool is
    destructive, the request was not shown whole, or Allow once is not offered."""
    allow_once = offered is None or Decision.ALLOW_ONCE in offered
    return Decision.DENY_ONCE if destructive or cut or not allow_once else Decision.ALLOW_ONCE


def decision_for_key(
    key: str, destructive: bool, cut: bool = False, offered: Collection[str] | None = None
) -> Decision | None:
    """The decision a key stands for; None for a key that means nothing here (it is ignored)."""
    if key == ESC:
        return Decision.DENY_ONCE
    if key in ENTER:
        return default_for(destructive, cut, offered)
    return dict(actions_for(destructive, offered)).get(key)


def whole_of(request: PendingRequest) -> str:
    """All the request shows about the call, `visible`: its preview, else its arguments (one per line)."""
    return visible(request.preview if request.preview is not None else request.args_preview, lines=True)


def shown_of(request: PendingRequest, copy: Mapping[str, str]) -> Excerpt:
    """What fits the panel of the request's whole (`whole_of`), cut loudly."""
    return excerpt(whole_of(request), copy)


def render(request: PendingRequest, now: float, locale: str) -> str:
    copy = copy_for(locale)
    part = shown_of(request, copy)
    left = max(0, int(request.expires_at - now))
    notice = [f"  {cut_notice(part, copy)}", f"  {copy['cut_approver']}"] if part.cut else []
    heading = [] if request.preview is not None else [f"  {copy['args']}:"]
    lines = [
        f"--- consent request {visible(request.id)} ---",
        f"{copy['title']} {visible(request.tool_name)}",
        f"  {copy['from'].format(server=visible(request.server_id))}",
        f"  risk:      {copy.get(request.risk_tier, visible(request.risk_tier))}"
        + ("  (destructive)" if request.destructive else ""),
        f"  user:      {visible(request.user)}    workspace: {visible(request.workspace)}",
        *notice,
        *heading,
        *(f"    {line}" for line in part.text.split("\n")),
        *notice,
        f"  answer within {left} s",
        *keys_help(request, part.cut, copy),
    ]
    return "\n".join(lines)


def keys_help(request: PendingRequest, cut: bool, copy: Mapping[str, str]) -> list[str]:
    actions = "  ".join(f"[{key}] {copy[d.value]}" for key, d in actions_for(request.destructive, request.choices))
    default = default_for(request.destructive, cut, request.choices)
    see_all = f"   [{SEE_ALL}] {copy['see_all']}" if cut else ""
    deny = copy[Decision.DENY_ONCE.value]
    return [f"  {actions}", f"  [Enter] {copy[default.value]}   [Esc] {deny}{see_all}   [q] quit"]


def render_whole(request: PendingRequest, locale: str) -> str:
    """The whole request, for `v`: every line of it, between its length and sha256, then the keys again."""
    copy = copy_for(locale)
    whole = whole_of(request)
    part = excerpt(whole, copy, max_lines=len(whole.split("\n")), max_line_chars=len(whole) + 1)
    lines = [
        f"  --- {copy['whole'].format(chars=part.chars, lines=part.lines, digest=part.digest)} ---",
        *(f"    {line}" for line in whole.split("\n")),
        f"  --- {copy['whole_end'].format(digest=part.digest)} ---",
        *keys_help(request, True, copy),
    ]
    return "\n".join(lines)


def approver_name() -> str:
    """Who decided, for the audit log: this terminal's user and host."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return f"approvals:{user}@{socket.gethostname()}"


class Keys:
    """Single key presses from a terminal (cbreak mode), or first characters of lines from a pipe."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._tty = os.isatty(self._fd)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Keys]:
        if not self._tty:
            yield self
            return
        saved = termios.tcgetattr(self._fd)
        tty.setcbreak(self._fd)
        try:
            yield self
        finally:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, saved)

    def read(self, timeout_s: float) -> str | None:
        """One key, or None when none came within `timeout_s`; "" at end of input."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        if not ready:
            return None
        if not self._tty:
            line = self._stream.readline()
            return line[:1] if line else ""
        key = os.read(self._fd, 1).decode(errors="replace")
        if key == ESC and select.select([self._fd], [], [], 0.05)[0]:
            os.read(self._fd, 16)  # an escape sequence (an arrow key), not Esc: ignored
            return "?"
        return key


class Approver:
    def __init__(
        self,
        stores: ConsentStores,
        keys: Keys,
        out: TextIO,
        *,
        locale: str,
        who: str | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        self._stores = stores
        self._store = stores.consent_store
        self._sessions = sessions
        self._here = this_process()
        self._clock = stores.clock
        self._keys = keys
        self._out = out
        self._locale = locale
        self._who = Actor(who or approver_name(), Channel.APPROVER)

    def run(self) -> int:
        """Answer questions until `q`, Ctrl-C or the end of input."""
        self._say("mcp-gateway approvals: waiting for consent requests (q or Ctrl-C to quit)")
        with self._keys.reading(), contextlib.suppress(KeyboardInterrupt):
            while True:
                pending = [r for r in self._store.fetch_pending(self._clock.now()) if not self._asker_gone(r)]
                if not pending:
                    key = self._keys.read(IDLE_POLL_S)
                    if key in ("q", ""):
                        return 0
                    continue
                if not self._answer(pending[0]):
                    return 0
        return 0

    def _answer(self, request: PendingRequest) -> bool:
        """Ask about one request; False when the person quits."""
        self._say(render(request, self._clock.now(), self._locale))
        copy = copy_for(self._locale)
        cut = shown_of(request, copy).cut
        seen_whole = not cut
        while True:
            left = request.expires_at - self._clock.now()
            if left <= 0:
                self._say("  -> expired: the gateway denied it (no answer in time)")
                return True
            key = self._keys.read(min(left, 1.0))
            if key is None:
                current = self._store.fetch_request(request.id)
                if current is None or current.status != QuestionStatus.PENDING:
                    self._say("  -> no longer waiting: decided elsewhere or withdrawn")
                    return True
                continue
            if key in ("q", ""):
                return False
            if key == SEE_ALL:
                self._say(render_whole(request, self._locale))
                seen_whole = True
                continue
            decision = decision_for_key(key, request.destructive, cut, request.choices)
            if decision is None:
                continue
            if decision.allows and not seen_whole:
                self._say(f"  {copy['see_all_first']}")
                continue
            if self._asker_gone(request):
                self._say("  -> not recorded: the gateway that asked is gone, nobody would act on it")
            elif decide_question(self._stores, request.id, decision, self._who):
                self._say(f"  -> {decision.value} ({copy[decision.value]})")
            else:
                self._say("  -> not recorded: another approver decided first, or it expired")
            return True

    def _asker_gone(self, request: PendingRequest) -> bool:
        """Whether the gateway that asked is gone. The store already hides questions whose gateway's lease
        ran out; this also sees, on the gateway's own machine, a process that died within its lease."""
        if self._sessions is None:
            return False
        session = self._sessions.fetch([request.session_id]).get(request.session_id)
        return session is not None and is_gone(session, self._clock.now(), self._here)

    def _say(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()


def run_approvals(
    stores: ConsentStores, locale: str, stdin: TextIO | None = None, sessions: SessionStore | None = None
) -> int:
    return Approver(stores, Keys(stdin or sys.stdin), sys.stdout, locale=locale, sessions=sessions).run()
