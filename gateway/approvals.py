"""`mcp-gateway approvals` (spec sections 3 and 7): a terminal approver for questions waiting in the database.

A gateway whose client cannot elicit leaves its question in `consent_requests`; this loop
shows each one (tool, server, user, workspace, risk, the arguments' preview, time left) with
numbered actions: 1 allow once, 2 allow always (never for a destructive tool), 3 deny once,
4 deny always, 5 allow for the session. Esc is deny once; Enter takes the default, Allow once,
or Deny once for a destructive tool. The decision is a conditional UPDATE, so when several
approvers (or gateways) share the database each question is decided exactly once; whoever
comes second is told so.
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
import unicodedata
from collections.abc import Iterator
from typing import TextIO

from gateway.clock import Clock
from gateway.consent import Decision, copy_for
from gateway.consent_store import ConsentStore, PendingRequest

ESC = "\x1b"
ENTER = ("\r", "\n")
NUMBERED: tuple[tuple[str, Decision], ...] = (
    ("1", Decision.ALLOW_ONCE),
    ("2", Decision.ALLOW_ALWAYS),
    ("3", Decision.DENY_ONCE),
    ("4", Decision.DENY_ALWAYS),
    ("5", Decision.ALLOW_SESSION),
)
IDLE_POLL_S = 0.25


def actions_for(destructive: bool) -> tuple[tuple[str, Decision], ...]:
    """The numbered actions offered; Allow always is left out for a destructive tool."""
    return tuple((key, d) for key, d in NUMBERED if not (destructive and d is Decision.ALLOW_ALWAYS))


def default_for(destructive: bool) -> Decision:
    """What Enter chooses: the least commitment (seed 000 R3), Deny once where the tool is destructive."""
    return Decision.DENY_ONCE if destructive else Decision.ALLOW_ONCE


def decision_for_key(key: str, destructive: bool) -> Decision | None:
    """The decision a key stands for; None for a key that means nothing here (it is ignored)."""
    if key == ESC:
        return Decision.DENY_ONCE
    if key in ENTER:
        return default_for(destructive)
    return dict(actions_for(destructive)).get(key)


def shown(text: str) -> str:
    """`text` as it may reach a terminal: every control and format character (escape sequences, a
    carriage return that would overwrite the line, bidi overrides that reorder it) written out as
    an escape, so what the person reads is what the tool would get."""
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text)


def render(request: PendingRequest, now: float, locale: str) -> str:
    copy = copy_for(locale)
    left = max(0, int(request.expires_at - now))
    default = default_for(request.destructive)
    actions = "  ".join(f"[{key}] {copy[d.value]}" for key, d in actions_for(request.destructive))
    if request.preview is None:
        what = [f"  {copy['args']}: {shown(request.args_preview)}"]
    else:
        what = [f"    {shown(line)}" for line in request.preview.split("\n")]
    lines = [
        f"--- consent request {shown(request.id)} ---",
        f"{copy['title']} {shown(request.tool_name)}",
        f"  {copy['from'].format(server=shown(request.server_id))}",
        f"  risk:      {copy[request.risk_tier]}" + ("  (destructive)" if request.destructive else ""),
        f"  user:      {shown(request.user)}    workspace: {shown(request.workspace)}",
        *what,
        f"  answer within {left} s",
        f"  {actions}",
        f"  [Enter] {copy[default.value]}   [Esc] {copy[Decision.DENY_ONCE.value]}   [q] quit",
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
        self, store: ConsentStore, clock: Clock, keys: Keys, out: TextIO, *, locale: str, who: str | None = None
    ) -> None:
        self._store = store
        self._clock = clock
        self._keys = keys
        self._out = out
        self._locale = locale
        self._who = who or approver_name()

    def run(self) -> int:
        """Answer questions until `q`, Ctrl-C or the end of input."""
        self._say("mcp-gateway approvals: waiting for consent requests (q or Ctrl-C to quit)")
        with self._keys.reading(), contextlib.suppress(KeyboardInterrupt):
            while True:
                pending = self._store.fetch_pending(self._clock.now())
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
        while True:
            left = request.expires_at - self._clock.now()
            if left <= 0:
                self._say("  -> expired: the gateway denied it (no answer in time)")
                return True
            key = self._keys.read(min(left, 1.0))
            if key is None:
                current = self._store.fetch_request(request.id)
                if current is None or current.status != "pending":
                    self._say("  -> no longer waiting: decided elsewhere or withdrawn")
                    return True
                continue
            if key in ("q", ""):
                return False
            decision = decision_for_key(key, request.destructive)
            if decision is None:
                continue
            if self._store.decide(request.id, decision.value, self._who, self._clock.now()):
                self._say(f"  -> {decision.value} ({copy_for(self._locale)[decision.value]})")
            else:
                self._say("  -> not recorded: another approver decided first, or it expired")
            return True

    def _say(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()


def run_approvals(store: ConsentStore, clock: Clock, locale: str, stdin: TextIO | None = None) -> int:
    return Approver(store, clock, Keys(stdin or sys.stdin), sys.stdout, locale=locale).run()
