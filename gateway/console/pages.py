"""The console's pages as HTML, built with `html.el` only (every value escaped by construction), and
every text an agent, a run or a caller supplied shown through `shown` (gateway/console/shown.py).

A consent question is shown as the terminal approver shows it (`approvals.whole_of`: the same
`visible` escaping), always whole: the page scrolls instead of cutting, and says the length and
sha256 of what it shows. The five choices are the approver's (`approvals.actions_for`: never
Allow always for a destructive tool), with the same default focused (`approvals.default_for`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from gateway.approvals import actions_for, default_for, deny_first, whole_of
from gateway.audit import AuditEvent
from gateway.calls import CallQuery, CardStatus
from gateway.clock import iso_utc
from gateway.consent.changes_view import Review
from gateway.consent.store import Grant, PendingRequest
from gateway.console.changes import offered_in_block, review_block
from gateway.console.copy import LOCALES
from gateway.console.html import Safe, el, join
from gateway.console.shown import shown, shown_lines
from gateway.console.upstreams import upstreams_body
from gateway.console.views import PAGE, AuditFilter, ChainWatch, Viewer, call_query_string, grant_state
from gateway.runs import RunRecord
from gateway.upstreams.pins import ToolLine
from gateway.visible import Excerpt, excerpt

SECTIONS = ("calls", "approvals", "grants", "upstreams", "audit", "runs")


def shell(
    words: Mapping[str, str], who: Viewer | None, path: str, title: str, *body: object, live: bool = False
) -> str:
    """The page around `body`: skip link, navigation, language switch, sign-out, the page's own CSS and JS."""
    nav = None
    if who is not None:
        links = [
            el(
                "li",
                None,
                el("a", {"href": f"/{s}", "aria_current": "page" if path.startswith(f"/{s}") else None}, words[s]),
            )
            for s in SECTIONS
        ]
        nav = el(
            "nav",
            {"aria_label": words["nav"]},
            el("ul", None, links),
            el("span", {"class": "who"}, words["signed_in_as"].format(user=shown(who.name), role=shown(who.role))),
            el(
                "form",
                {"method": "post", "action": "/logout", "class": "inline"},
                el("input", {"type": "hidden", "name": "csrf", "value": who.csrf}),
                el("button", {"type": "submit"}, words["sign_out"]),
            ),
        )
    switch = el(
        "p",
        {"class": "lang"},
        words["language"] + ": ",
        [
            el("a", {"href": "/lang?" + urlencode({"to": loc, "back": path}), "hreflang": loc}, loc, " ")
            for loc in LOCALES
        ],
    )
    page = el(
        "html",
        {"lang": words.get("_lang", "en")},
        el(
            "head",
            None,
            el("meta", {"charset": "utf-8"}),
            el("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
            el("title", None, f"{title} · {words['console']}"),
            el("link", {"rel": "stylesheet", "href": "/static/console.css"}),
            el("script", {"src": "/static/console.js", "defer": True}),
        ),
        el(
            "body",
            {"data_live": "1" if live else None},
            el("a", {"href": "#main", "class": "skip"}, title),
            el("header", None, el("p", {"class": "brand"}, words["console"]), nav, switch),
            el("main", {"id": "main", "tabindex": "-1"}, el("h1", None, title), *body),
            words_script(words),
        ),
    )
    return "<!doctype html>\n" + page


def words_script(words: Mapping[str, str]) -> Safe:
    """The words the script needs, as JSON data (not script: the CSP runs none inline); `<` escaped."""
    data = (
        json.dumps(dict(words), ensure_ascii=True)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    return Safe(f'<script type="application/json" id="words">{data}</script>')


def message_page(words: Mapping[str, str], who: Viewer | None, path: str, message: str) -> str:
    return shell(words, who, path, words["console"], el("p", {"role": "alert"}, message))


def login_page(words: Mapping[str, str], csrf: str, error: str | None = None) -> str:
    form = el(
        "form",
        {"method": "post", "action": "/login", "class": "login"},
        el("input", {"type": "hidden", "name": "csrf", "value": csrf}),
        el("label", {"for": "user"}, words["user"]),
        el("input", {"id": "user", "name": "user", "autocomplete": "username", "required": True, "autofocus": True}),
        el("label", {"for": "password"}, words["password"]),
        el(
            "input",
            {
                "id": "password",
                "name": "password",
                "type": "password",
                "autocomplete": "current-password",
                "required": True,
            },
        ),
        el("button", {"type": "submit"}, words["sign_in"]),
    )
    alert = el("p", {"role": "alert", "class": "error"}, error) if error else None
    return shell(words, None, "/login", words["sign_in"], alert, form)


def calls_page(
    words: Mapping[str, str], who: Viewer, locale: str, run_id: str | None, query: CallQuery | None = None
) -> str:
    """The cards (the page's script reads them from /api/calls with `data-query`, the checked filters); for
    the list, the filter form and the paging links the script fills in (`#paging`)."""
    query = query or CallQuery()
    feed = el(
        "div",
        {
            "id": "cards",
            "role": "feed",
            "aria_busy": "true",
            "aria_label": words["calls"],
            "data_run": run_id,
            "data_query": None if run_id else call_query_string(query),
            "data_filters": None if run_id else call_query_string(query, before=None, limit=None),
        },
    )
    live = query.before is None
    status = el(
        "p",
        {"id": "live", "class": "live", "role": "status", "aria_live": "polite"},
        words["live" if live else "paged"],
    )
    empty = el("p", {"id": "empty", "hidden": True}, words["no_calls"])
    if run_id is not None:
        return shell(words, who, "/calls", words["calls"], status, empty, feed, live=True)
    paging = el("nav", {"id": "paging", "class": "paging", "aria_label": words["paging"]})
    return shell(
        words, who, "/calls", words["calls"], calls_filters(words, query), status, empty, feed, paging, live=live
    )


def calls_filters(words: Mapping[str, str], query: CallQuery) -> Safe:
    """The list's filters as a GET form: its query string is the page's (`call_query_of` checks it)."""
    outcomes = ("", *CardStatus)
    return el(
        "form",
        {"method": "get", "action": "/calls", "class": "filters", "aria_label": words["filters"]},
        _field(words["tool"], "tool", query.tool or ""),
        _field(words["upstream"], "upstream", query.upstream or ""),
        _field(words["user"], "user", query.user or ""),
        _choice(
            words["outcome"],
            "outcome",
            query.status or "",
            [(o, words.get(o, o) if o else words["any"]) for o in outcomes],
        ),
        el("input", {"type": "hidden", "name": "limit", "value": str(query.limit)}) if query.limit != PAGE else None,
        el("button", {"type": "submit"}, words["filter"]),
    )


NOTICES = ("decided", "not_recorded", "not_offered")


def notice_of(words: Mapping[str, str], m: str | None, decision: str | None) -> str | None:
    """The message a redirect after a decision asks for: one of ours, never text from the query."""
    if m not in NOTICES:
        return None
    if m == "decided":
        return words["decided"].format(decision=words.get(decision or "", "?"))
    return words[m]


def question_block(
    words: Mapping[str, str], who: Viewer, q: PendingRequest, now: float, review: Review | None = None
) -> Safe:
    """A permission block: what is asked, by which tool of which server, risk, who, the whole preview, time left.

    For a change review (`review`: gateway/console/changes.py), the diff view instead of the preview,
    Allow once and Deny once only, Deny once the default; Deny once alone when the set cannot be read."""
    whole = whole_of(q)
    part = excerpt(whole, words, max_lines=len(whole.split("\n")), max_line_chars=len(whole) + 1)
    heading_id = f"q-{q.id}"
    risk = el("span", {"class": f"risk risk-{q.risk_tier}"}, words.get(q.risk_tier, shown(q.risk_tier)))
    actions = actions_for(deny_first(q), offered_in_block(q, review))
    default = default_for(deny_first(q), False, offered_in_block(q, review))
    if who.may_decide:
        buttons = [
            el(
                "button",
                {
                    "type": "submit",
                    "name": "decision",
                    "value": d.value,
                    "class": "default" if d is default else None,
                    "data_default": "1" if d is default else None,
                },
                words[d.value],
            )
            for _, d in actions
        ]
        form = el(
            "form",
            {"method": "post", "action": f"/approvals/{q.id}", "class": "choices"},
            el("input", {"type": "hidden", "name": "csrf", "value": who.csrf}),
            buttons,
        )
    else:
        form = el("p", {"class": "note"}, words["cannot_decide"])
    left = max(0, int(q.expires_at - now))
    return el(
        "article",
        {"class": "question", "role": "region", "aria_labelledby": heading_id, "data_id": q.id},
        el(
            "h2",
            {"id": heading_id},
            words["review_title" if review else "title"],
            " ",
            el("code", None, shown(q.tool_name)),
        ),
        el(
            "p",
            None,
            el("span", {"class": "chip"}, words["from"].format(server=shown(q.server_id))),
            " ",
            risk,
            el("span", {"class": "note"}, " · " + words["destructive"]) if q.destructive else None,
        ),
        el("p", None, words["user_workspace"].format(user=shown(q.user), workspace=shown(q.workspace))),
        review_block(words, q.id, review) if review is not None else _preview(words, whole, part),
        el(
            "p",
            {"class": "countdown", "data_expires": str(q.expires_at), "data_now": str(now)},
            words["time_left"].format(seconds=left),
        ),
        form,
    )


def _preview(words: Mapping[str, str], whole: str, part: Excerpt) -> Safe:
    return join(
        el("p", {"class": "note"}, words["whole"].format(chars=part.chars, lines=part.lines, digest=part.digest)),
        el("pre", {"class": "preview", "tabindex": "0", "aria_label": words["arguments"]}, whole),
    )


def approvals_page(
    words: Mapping[str, str],
    who: Viewer,
    questions: Sequence[PendingRequest],
    now: float,
    notice: str | None,
    *,
    reviews: Mapping[str, Review] | None = None,
) -> str:
    blocks = [question_block(words, who, q, now, (reviews or {}).get(q.id)) for q in questions]
    status = el("p", {"id": "notice", "role": "status", "aria_live": "polite"}, notice or "")
    empty = el("p", None, words["no_questions"]) if not questions else None
    ids = el("div", {"id": "questions", "data_ids": ",".join(q.id for q in questions)}, blocks)
    return shell(words, who, "/approvals", words["approvals"], status, empty, ids)


def grants_page(
    words: Mapping[str, str], who: Viewer, grants: Sequence[Grant], now: float, *, user: str, tool: str, state: str
) -> str:
    listed = [
        g
        for g in grants
        if who.sees(g.workspace)
        and (not user or g.user == user)
        and (not tool or g.tool_name == tool)
        and (not state or grant_state(g, now) == state)
    ]
    states = ("", "active", "expired", "revoked")
    form = el(
        "form",
        {"method": "get", "action": "/grants", "class": "filters"},
        _field(words["user"], "user", user),
        _field(words["tool"], "tool", tool),
        _choice(
            words["state"],
            "state",
            state,
            [(s, words[s] if s in ("active", "revoked") else (s or words["any"])) for s in states],
        ),
        el("button", {"type": "submit"}, words["filter"]),
    )
    rows = []
    for g in listed:
        current = grant_state(g, now)
        action = None
        if who.may_decide and current == "active":
            action = el(
                "form",
                {"method": "post", "action": f"/grants/{g.id}/revoke", "class": "inline"},
                el("input", {"type": "hidden", "name": "csrf", "value": who.csrf}),
                el("button", {"type": "submit", "aria_label": f"{words['revoke']} #{g.id}"}, words["revoke"]),
            )
        rows.append(
            el(
                "tr",
                {"data_grant": str(g.id), "data_state": current},
                el("td", None, str(g.id)),
                el("td", None, shown(g.user)),
                el("td", None, shown(g.workspace)),
                el("td", None, shown(g.tool_name)),
                el("td", None, shown(g.decision)),
                el("td", None, iso_utc(g.expires_at) if g.expires_at is not None else words["never"]),
                el("td", None, shown(g.granted_by)),
                el("td", {"class": f"state-{current}"}, words.get(current, current)),
                el("td", None, action),
            )
        )
    head = el(
        "tr",
        None,
        [
            el("th", {"scope": "col"}, h)
            for h in (
                "#",
                words["user"],
                words["workspace"],
                words["tool"],
                words["decision"],
                words["expires"],
                words["granted_by"],
                words["state"],
                "",
            )
        ],
    )
    table = (
        el("table", None, el("thead", None, head), el("tbody", None, rows))
        if rows
        else el("p", None, words["no_grants"])
    )
    return shell(words, who, "/grants", words["grants"], form, table)


def upstreams_page(
    words: Mapping[str, str],
    who: Viewer,
    lines: Mapping[str, Sequence[ToolLine]],
    in_policy: frozenset[str],
    notice: str | None,
) -> str:
    """Each upstream, its tools and their pin state; a changed definition's diff (gateway/console/upstreams.py)."""
    status = el("p", {"id": "notice", "role": "status", "aria_live": "polite"}, notice or "")
    body = upstreams_body(words, who, lines, in_policy)
    return shell(words, who, "/upstreams", words["upstreams"], status, *body)


def _choice(label: str, name: str, chosen: str, options: Sequence[tuple[str, str]]) -> Safe:
    """A labelled select of a filter form: (value, words) per option, `chosen` selected."""
    return join(
        el("label", {"for": f"f-{name}"}, label),
        el(
            "select",
            {"id": f"f-{name}", "name": name},
            [el("option", {"value": value, "selected": value == chosen}, text) for value, text in options],
        ),
    )


def _field(label: str, name: str, value: str) -> Safe:
    return join(
        el("label", {"for": f"f-{name}"}, label), el("input", {"id": f"f-{name}", "name": name, "value": value})
    )


def chain_line(words: Mapping[str, str], chain: ChainWatch) -> Safe:
    report = chain.report
    if report is None or chain.checked_at is None:
        return el("p", {"class": "chain", "role": "status"}, words["chain_pending"])
    at = iso_utc(chain.checked_at)
    if report.ok:
        return el("p", {"class": "chain ok", "role": "status"}, words["chain_ok"].format(checked=report.checked, at=at))
    text = words["chain_bad"].format(first_bad=report.first_bad_id, problem=report.problem, at=at)
    return el("p", {"class": "chain bad", "role": "alert"}, text)


def audit_page(
    words: Mapping[str, str], who: Viewer, f: AuditFilter, events: Sequence[AuditEvent], chain: ChainWatch
) -> str:
    form = el(
        "form",
        {"method": "get", "action": "/audit", "class": "filters"},
        _field(words["user"], "user", f.user or ""),
        _field(words["tool"], "tool", f.tool or ""),
        _field(words["event_type"], "event_type", f.event_type or ""),
        _field(words["code"], "code", "" if f.code is None else str(f.code)),
        _field(words["since"], "since", f.since or ""),
        _field(words["until"], "until", f.until or ""),
        el("button", {"type": "submit"}, words["filter"]),
    )
    export = el("a", {"href": "/audit/export.jsonl?" + urlencode(f.query_string(before=None))}, words["export"])
    rows = [
        el(
            "tr",
            {"data_event": str(e.id)},
            el("td", None, str(e.id)),
            el("td", None, e.ts),
            el("td", None, shown(e.event_type)),
            el("td", None, shown(e.user)),
            el("td", None, shown(e.workspace)),
            el("td", None, shown(e.tool_name)),
            el("td", None, "" if e.code is None else str(e.code)),
            el("td", None, el("a", {"href": f"/calls/{quote(e.run_id)}"}, shown(e.run_id)) if e.run_id else ""),
            el("td", None, el("code", None, shown(json.dumps(dict(e.detail), ensure_ascii=False)[:300]))),
        )
        for e in events
    ]
    head = el(
        "tr",
        None,
        [
            el("th", {"scope": "col"}, h)
            for h in (
                "#",
                words["when"],
                words["event_type"],
                words["user"],
                words["workspace"],
                words["tool"],
                words["code"],
                "run",
                "detail",
            )
        ],
    )
    table = (
        el("table", None, el("thead", None, head), el("tbody", None, rows))
        if rows
        else el("p", None, words["no_events"])
    )
    older = None
    if len(events) == PAGE:
        older = el(
            "a", {"href": "/audit?" + urlencode(f.query_string(before=events[-1].id)), "rel": "next"}, words["older"]
        )
    return shell(
        words, who, "/audit", words["audit"], chain_line(words, chain), form, el("p", None, export), table, older
    )


def runs_page(words: Mapping[str, str], who: Viewer, runs: Sequence[RunRecord]) -> str:
    rows = [
        el(
            "tr",
            None,
            el("td", None, el("a", {"href": f"/runs/{quote(r.run_id)}"}, shown(r.run_id))),
            el("td", None, iso_utc(r.created_at)),
            el("td", None, shown(r.user)),
            el("td", None, shown(r.workspace)),
            el("td", None, shown(r.tool_name)),
            el("td", None, shown(r.status)),
            el("td", None, "" if r.exit_code is None else str(r.exit_code)),
        )
        for r in runs
    ]
    head = el(
        "tr",
        None,
        [
            el("th", {"scope": "col"}, h)
            for h in (
                "run",
                words["when"],
                words["user"],
                words["workspace"],
                words["tool"],
                words["status"],
                words["exit_code"],
            )
        ],
    )
    table = (
        el("table", None, el("thead", None, head), el("tbody", None, rows)) if rows else el("p", None, words["no_runs"])
    )
    return shell(words, who, "/runs", words["runs"], table)


def run_page(words: Mapping[str, str], who: Viewer, record: RunRecord, files: Mapping[str, str]) -> str:
    facts = el(
        "dl",
        None,
        el("dt", None, words["user"]),
        el("dd", None, shown(record.user)),
        el("dt", None, words["workspace"]),
        el("dd", None, shown(record.workspace)),
        el("dt", None, words["tool"]),
        el("dd", None, shown(record.tool_name)),
        el("dt", None, words["status"]),
        el("dd", None, shown(record.status)),
        el("dt", None, words["exit_code"]),
        el("dd", None, "" if record.exit_code is None else str(record.exit_code)),
    )
    sections: list[Safe] = []
    evidence = _evidence(files.get("evidence.json"))
    governance = evidence.get("governance") if isinstance(evidence, dict) else None
    if isinstance(governance, dict):
        sections.append(el("h2", None, words["governance"]))
        sections.append(
            el(
                "dl",
                {"class": "governance"},
                [
                    join(el("dt", None, shown(k)), el("dd", None, shown(json.dumps(v, ensure_ascii=False))))
                    for k, v in governance.items()
                ],
            )
        )
    for name, title in (
        ("evidence.json", words["evidence"]),
        ("junit.xml", words["junit"]),
        ("stdout.txt", "stdout"),
        ("stderr.txt", "stderr"),
    ):
        if name in files:
            sections.append(
                el(
                    "details",
                    {"open": name == "evidence.json"},
                    el(
                        "summary",
                        None,
                        title,
                        " ",
                        el("a", {"href": f"/runs/{quote(record.run_id)}/files/{name}"}, name),
                    ),
                    el("pre", {"tabindex": "0"}, shown_lines(files[name])),
                )
            )
    return shell(words, who, "/runs", f"{words['runs']}: {shown(record.run_id)}", facts, sections)


def _evidence(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
