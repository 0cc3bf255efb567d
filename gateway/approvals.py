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

A change review (gateway/consent/changes_view.py `is_change_review`: may a `workspace: review`
run's change set be applied; decision 81) is shown from its run's artifacts: what is asked, the
counts, the names, the refused entries, the start of the patch. Only 1 Allow once and 3 Deny once
are offered, and Enter is Deny once. `v` pages through the whole patch (`Pager`: Space or `n` on,
`b` back, `g` and `G` to either end, `q` or Esc back to the question), every line escaped and
nothing handed to a shell or another pager; when the panel was cut, Allow once needs the pager to
have reached the patch's end first.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import select
import shutil
import socket
import sys
import termios
import tty
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from gateway.consent.actions import Actor, ConsentStores, decide_question
from gateway.consent.changes_view import (
    MAX_WHOLE_BYTES,
    PatchView,
    ReviewText,
    UnreadableError,
    is_change_review,
    load_patch,
    review_dir,
    review_text,
)
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
REVIEW_CHOICES = (Decision.ALLOW_ONCE.value, Decision.DENY_ONCE.value)
"""A change review's only answers (decision 80): nothing about it lasts beyond its run."""
PANEL_CHARS = 6000
"""A change review's panel at most (its summary and the start of the patch); `v` shows the rest."""


def offered_for(request: PendingRequest) -> tuple[str, ...] | None:
    """The decisions a question may be given: its `choices`; for a change review, only those of them
    that are Allow once or Deny once, whatever the row says."""
    if not is_change_review(request):
        return request.choices
    return tuple(c for c in (request.choices or REVIEW_CHOICES) if c in REVIEW_CHOICES)


def deny_first(request: PendingRequest) -> bool:
    """Whether Enter denies whatever else holds: a destructive tool's question, or any change review."""
    return request.destructive or is_change_review(request)


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


def review_of(request: PendingRequest, artifacts_dir: Path | None) -> ReviewText:
    """A change review's panel, from its run's artifacts; the stored question's text, marked cut, when
    the approver was not told where the artifacts are."""
    run_dir = None if artifacts_dir is None else review_dir(artifacts_dir, request)
    if run_dir is None:
        return ReviewText(visible(request.preview or "", lines=True), True)
    return review_text(run_dir, request.tool_name, PANEL_CHARS)


def render_review(request: PendingRequest, review: ReviewText, now: float, locale: str) -> str:
    copy = copy_for(locale)
    left = max(0, int(request.expires_at - now))
    lines = [
        f"--- consent request {visible(request.id)} --- a change review ---",
        f"  user:      {visible(request.user)}    workspace: {visible(request.workspace)}",
        *(f"    {line}" for line in review.text.split("\n")),
        *([f"  {REVIEW_SEE_ALL}"] if review.cut and not review.unreadable else []),
        f"  answer within {left} s",
        *keys_help(request, True, copy, review_offers(request, review)),
    ]
    return "\n".join(lines)


REVIEW_SEE_ALL = "\u26a0 [v] pages through the whole patch; Allow once needs its end seen first."


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


def review_offers(request: PendingRequest, review: ReviewText) -> tuple[str, ...] | None:
    """A change review's answers: Deny once alone when its set cannot be shown."""
    return (Decision.DENY_ONCE.value,) if review.unreadable else offered_for(request)


def keys_help(
    request: PendingRequest, cut: bool, copy: Mapping[str, str], offered: tuple[str, ...] | None = None
) -> list[str]:
    offered = offered_for(request) if offered is None else offered
    actions = "  ".join(f"[{key}] {copy[d.value]}" for key, d in actions_for(deny_first(request), offered))
    default = default_for(deny_first(request), cut, offered)
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


class Pager:
    """A change review's whole patch, a page of `rows` lines at a time, in this terminal: each line
    escaped as it is shown (`visible`, which leaves what is escaped already as it is), numbered."""

    def __init__(self, patch: PatchView, rows: int) -> None:
        self._patch = patch
        self._lines: Sequence[str] = patch.text.removesuffix("\n").split("\n")  # "\r" and the rest escaped per line
        self._rows = rows
        self._top = 0
        self.seen_end = False

    def move(self, key: str) -> bool:
        """Turn the page for `key`; False for a key that means nothing here."""
        last = max(0, len(self._lines) - self._rows)
        moves = {" ": self._top + self._rows, "n": self._top + self._rows, "b": self._top - self._rows,
                 "p": self._top - self._rows, "g": 0, "G": last}  # fmt: skip
        if key not in moves:
            return False
        self._top = min(max(0, moves[key]), last)
        return True

    def page(self) -> str:
        shown = self._lines[self._top : self._top + self._rows]
        end = self._top + len(shown)
        total = len(self._lines)
        self.seen_end = self.seen_end or (end >= total and self._patch.complete)
        width = len(str(total))
        lines = [
            f"  --- changes.patch: {self._patch.size:,} bytes in {total:,} lines, sha256 {self._patch.digest}\u2026 ---",
            *(f"  {n:>{width}} {visible(line)}" for n, line in enumerate(shown, self._top + 1)),
        ]
        if end >= total and not self._patch.complete:
            lines.append(
                f"  \u26a0 [\u2702 CUT: past {MAX_WHOLE_BYTES:,} bytes the patch is not shown here: read changes.patch"
                " in the run's artifacts, or deny]"
            )
        where = "end of the patch" if end >= total else f"lines {self._top + 1}-{end} of {total:,}"
        lines.append(f"  -- {where} --  [Space] next  [b] back  [g] top  [G] end  [q] back to the question")
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
        artifacts: Path | None = None,
    ) -> None:
        self._stores = stores
        self._artifacts = artifacts
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
        copy = copy_for(self._locale)
        review = is_change_review(request)
        offered = offered_for(request)
        if review:
            panel = review_of(request, self._artifacts)
            self._say(render_review(request, panel, self._clock.now(), self._locale))
            cut, offered = panel.cut, review_offers(request, panel)
        else:
            self._say(render(request, self._clock.now(), self._locale))
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
                if review:
                    seen_whole = self._page_patch(request) or seen_whole
                    self._say("\n".join(keys_help(request, True, copy, offered)))
                else:
                    self._say(render_whole(request, self._locale))
                    seen_whole = True
                continue
            decision = decision_for_key(key, deny_first(request), cut, offered)
            if decision is None:
                continue
            if decision.allows and not seen_whole:
                self._say(f"  {REVIEW_SEE_ALL if review else copy['see_all_first']}")
                continue
            if self._asker_gone(request):
                self._say("  -> not recorded: the gateway that asked is gone, nobody would act on it")
            elif decide_question(self._stores, request.id, decision, self._who):
                self._say(f"  -> {decision.value} ({copy[decision.value]})")
            else:
                self._say("  -> not recorded: another approver decided first, or it expired")
            return True

    def _page_patch(self, request: PendingRequest) -> bool:
        """`v` on a change review: the whole patch, a page at a time; True when its end was seen."""
        run_dir = None if self._artifacts is None else review_dir(self._artifacts, request)
        try:
            if run_dir is None:
                raise UnreadableError("the approver does not know where the run's artifacts are")
            patch = load_patch(run_dir, MAX_WHOLE_BYTES, escaped=False)
        except UnreadableError as exc:
            self._say(f"  \u26a0 changes.patch cannot be shown: {visible(exc.why)}. Deny: nobody has seen it.")
            return False
        pager = Pager(patch, max(4, shutil.get_terminal_size((100, 24)).lines - 3))
        self._say(pager.page())
        while True:
            left = request.expires_at - self._clock.now()
            if left <= 0:
                return pager.seen_end
            key = self._keys.read(min(left, 1.0))
            if key is None:
                continue
            if key in ("q", ESC, ""):
                return pager.seen_end
            if pager.move(key):
                self._say(pager.page())

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
    stores: ConsentStores,
    locale: str,
    stdin: TextIO | None = None,
    sessions: SessionStore | None = None,
    artifacts: Path | None = None,
) -> int:
    keys = Keys(stdin or sys.stdin)
    return Approver(stores, keys, sys.stdout, locale=locale, sessions=sessions, artifacts=artifacts).run()
