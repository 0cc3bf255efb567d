"""Holes in the pipeline an outside review found (decisions 31-35), tried again through the real gateway.

Each test states the promise it checks. The review's own cases come first in each section,
then variants of ours. Everything is judged from outside: the JSON-RPC answers, the audit
log, the artifacts and the budget ledger's rows.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from gateway import db
from gateway.tools.run_pytest import MAX_COUNT
from tests.adversarial.conftest import Arena, Run, open_arena
from tests.harness import reachable_by_everyone

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox confines only when the gateway runs as root")


def collect(arena: Arena, request_id: int, timeout: float = 120) -> Run:
    """The answer to a call sent with `send_call`, as `Arena.run` would have returned it."""
    response = arena.session.wait_response(request_id, timeout)
    run = Run(response, None, [], time.time())
    if run.run_id:
        run.run_dir = arena.gateway.home / "artifacts" / run.run_id
        run.events = arena.gateway.events_of(run.run_id)
    return run


def charges(arena: Arena, user: str = "alice") -> dict[str, int]:
    """The budget ledger's rows of `user`: run_id -> elapsed_ms charged."""
    with arena.gateway.engine.connect() as connection:
        rows = connection.execute(
            select(db.budget_charges.c.run_id, db.budget_charges.c.elapsed_ms).where(
                db.budget_charges.c.user_name == user
            )
        ).all()
    return {str(r.run_id): int(r.elapsed_ms) for r in rows}


def event_types(run: Run) -> list[str]:
    return [e["event_type"] for e in run.events]


# --- concurrent calls cannot overshoot the elapsed-time budget ---------------------------

SLEEPER = "import time\n\n\ndef test_sleeps():\n    time.sleep({seconds})\n"


def budget_arena(root: Path, elapsed_ms_total: int) -> Any:
    return open_arena(
        root, {"budget": {"window_s": 3600, "attempts_total": 1000, "elapsed_ms_total": elapsed_ms_total}}
    )


def test_four_concurrent_3s_runs_on_a_2s_budget_run_once(tmp_path: Path) -> None:
    """Promise: the run time a user can start in a window is bounded by the budget (plus one run's limit)."""
    with budget_arena(tmp_path / "gw", 2000) as arena:
        arena.write("budget_sleep/test_sleep.py", SLEEPER.format(seconds=3))
        sent = [
            arena.session.send_call("run_pytest", {"test_path": "budget_sleep", "timeout_s": 6}, arena.token)
            for _ in range(4)
        ]
        runs = [collect(arena, request_id) for request_id in sent]
        charged = charges(arena)

    ran = [r for r in runs if "result" in r.response]
    refused = [r for r in runs if r.error_code == -32005]
    assert len(ran) == 1 and len(refused) == 3, [r.response for r in runs]
    (run,) = ran
    assert run.structured["passed"] == 1
    for refusal in refused:
        error = refusal.response["error"]
        assert error["data"]["reason"] == "elapsed_exhausted"
        assert error["data"]["retry_after_s"] >= 1
        assert "retry after" in error["message"] and "timeout_s" in error["message"], error["message"]
        assert "SANDBOX_EXEC" not in event_types(refusal) and "TOOL_STARTED" not in event_types(refusal)
    duration = run.sandbox_event()["duration_ms"]
    assert charged == {run.run_id: duration}, "the reservation (6000 ms) is settled to the run's own time"
    assert 3000 <= sum(charged.values()) <= 2000 + 6000


def test_many_short_concurrent_runs_stay_within_the_budget_plus_one_run(tmp_path: Path) -> None:
    """Variant: ten quick runs at once; whatever the timing, the total started is at most budget + one timeout."""
    with budget_arena(tmp_path / "gw", 5000) as arena:
        arena.write("budget_quick/test_quick.py", SLEEPER.format(seconds=0.8))
        sent = [
            arena.session.send_call("run_pytest", {"test_path": "budget_quick", "timeout_s": 2}, arena.token)
            for _ in range(10)
        ]
        runs = [collect(arena, request_id) for request_id in sent]
        charged = charges(arena)

    started = [r for r in runs if "SANDBOX_EXEC" in event_types(r)]
    refused = [r for r in runs if r.error_code == -32005]
    assert started and refused, [r.response.get("error", "ok") for r in runs]
    assert len(started) + len(refused) == 10
    assert sorted(charged) == sorted(str(r.run_id) for r in started), "a refused call reserves nothing"
    for run in started:
        assert charged[str(run.run_id)] == run.sandbox_event()["duration_ms"]
    grace_ms = 1000  # the kill at the time limit is not instantaneous
    assert sum(charged.values()) <= 5000 + 2000 + grace_ms, charged


def test_every_way_out_settles_the_reservation(tmp_path: Path) -> None:
    """Variant: consent denied costs an attempt and 0 ms; a cancelled run costs the time it ran, not its limit."""
    with budget_arena(tmp_path / "gw", 10**9) as arena:
        arena.write("budget_cancel/test_long_sleep.py", SLEEPER.format(seconds=60))
        arena.session.responder = lambda _message: {"action": "decline"}
        denied = arena.run("budget_cancel", timeout_s=300)
        assert denied.error_code == -32008, denied.response
        assert charges(arena) == {denied.run_id: 0}, "nothing ran: the 300 s reservation is given back"

        arena.session.responder = lambda _message: {"action": "accept", "content": {"decision": "allow_once"}}
        request_id = arena.session.send_call(
            "run_pytest", {"test_path": "budget_cancel", "timeout_s": 300}, arena.token
        )
        deadline = time.monotonic() + 30
        while not arena.leftovers("budget_cancel") and time.monotonic() < deadline:
            try:  # answers the consent prompt while waiting for the run to start
                arena.session.wait_response(request_id, timeout=0.2)
            except queue.Empty:
                continue
        assert arena.leftovers("budget_cancel"), "the run never started"
        time.sleep(1)
        arena.session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})
        deadline = time.monotonic() + 30
        cancelled: dict[str, int] = {}
        while time.monotonic() < deadline:
            cancelled = {k: v for k, v in charges(arena).items() if k != denied.run_id}
            if cancelled and next(iter(cancelled.values())) < 300_000:
                break
            time.sleep(0.1)
    (spent,) = cancelled.values()
    assert 900 <= spent < 30_000, f"a cancelled run is charged the time it ran ({spent} ms), not its 300 s limit"


def test_a_refusal_after_the_budget_stage_gives_the_time_back(tmp_path: Path) -> None:
    """Variant: -32006 at the sandbox precondition ran nothing: an attempt, 0 ms (not the 300 s reserved)."""
    policy = {"sandbox": {"enabled": False}, "budget": {"elapsed_ms_total": 10_000}}
    with open_arena(tmp_path / "gw", policy) as arena:
        refused = [arena.run("tests", timeout_s=300) for _ in range(3)]
        charged = charges(arena)

    assert [r.error_code for r in refused] == [-32006] * 3, [r.response for r in refused]
    assert charged == {str(r.run_id): 0 for r in refused}, "each attempt counts; none holds time"


# --- a token never widens what the user may see today ----------------------------------


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[Arena]:
    """`default` and `other`; boss is an ADMIN of default, bob a USER of both; a run of bob's lies in `other`."""
    other = Path(tempfile.mkdtemp(prefix="mcp-gw-other-"))
    (other / "tests").mkdir()
    (other / "tests" / "test_other.py").write_text(
        "def test_other_tenant():\n    assert False, 'OTHER-TENANT-OUTPUT'\n"
    )
    reachable_by_everyone(other)
    try:
        with open_arena(tmp_path / "gw", {"workspaces": {"other": str(other)}}) as arena:
            arena.gateway.add_user("boss", "ADMIN", ("default",))
            arena.gateway.add_user("bob", "USER", ("default", "other"))
            yield arena
    finally:
        shutil.rmtree(other, ignore_errors=True)


def issued(arena: Arena, user: str, workspace: str) -> str:
    """A token from the real CLI, as an operator would issue it."""
    result = arena.gateway.cli("token", "issue", user, "--workspace", workspace)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def bobs_run_in_other(arena: Arena) -> str:
    response = arena.session.call_tool(
        "run_pytest", {"test_path": "tests", "workspace": "other"}, arena.gateway.token("bob"), timeout=120
    )
    return str(response["result"]["structuredContent"]["run_id"])


def what_the_token_reads(arena: Arena, token: str, run_id: str) -> dict[str, Any]:
    session = arena.session
    listed = session.call_tool("list_artifacts", {}, token)
    return {
        "list": [r["run_id"] for r in listed["result"]["structuredContent"]["runs"]] if "result" in listed else listed,
        "evidence": session.call_tool("get_evidence", {"run_id": run_id}, token),
        "content": session.call_tool("get_artifact_content", {"run_id": run_id, "name": "stdout.txt"}, token),
        "resource": session.request(
            "resources/read", {"uri": f"mcp-gateway://runs/{run_id}/stdout.txt", "auth": {"token": token}}
        ),
        "list_other": session.call_tool("list_artifacts", {"workspace": "other"}, token),
    }


def assert_sees_nothing(seen: dict[str, Any]) -> None:
    assert seen["list"] == [], seen["list"]
    for name in ("evidence", "content", "resource"):
        error = seen[name].get("error")
        assert error is not None, (name, seen[name])
        assert (error["code"], error["data"]["reason"]) == (-32602, "run_not_found"), (name, error)
    assert seen["list_other"]["error"]["code"] == -32004
    assert "OTHER-TENANT-OUTPUT" not in json.dumps(seen)


def test_an_admin_token_for_another_workspace_reads_nothing_after_demotion(tenants: Arena) -> None:
    """The review's case: an ADMIN's token for `other`, then `user set-role` to USER with only `default`."""
    run_id = bobs_run_in_other(tenants)
    token = issued(tenants, "boss", "other")
    before = what_the_token_reads(tenants, token, run_id)
    assert before["list"] == [run_id] and "result" in before["evidence"], "control: an ADMIN reads it"
    assert "OTHER-TENANT-OUTPUT" in before["content"]["result"]["content"][0]["text"]

    demoted = tenants.gateway.cli("user", "set-role", "boss", "USER")
    assert demoted.returncode == 0, demoted.stderr

    assert_sees_nothing(what_the_token_reads(tenants, token, run_id))


def test_a_user_token_for_a_workspace_taken_from_the_user_reads_nothing(tenants: Arena) -> None:
    """Variant: the user keeps their role but loses the workspace (no CLI for it yet: the operator edits the row)."""
    run_id = bobs_run_in_other(tenants)
    token = issued(tenants, "bob", "other")
    assert what_the_token_reads(tenants, token, run_id)["list"] == [run_id], "control: bob reads his own run"
    with tenants.gateway.engine.begin() as connection:
        bob = connection.execute(select(db.users.c.id).where(db.users.c.name == "bob")).scalar_one()
        connection.execute(
            delete(db.user_workspaces).where(
                db.user_workspaces.c.user_id == bob, db.user_workspaces.c.workspace == "other"
            )
        )

    assert_sees_nothing(what_the_token_reads(tenants, token, run_id))
    unlimited = tenants.gateway.token("bob")
    assert what_the_token_reads(tenants, unlimited, run_id)["list"] == [], "and without a ws claim neither"


# --- a hostile junit.xml cannot hide how a run ended -------------------------------------

REWRITER = """
import atexit
import os


def _rewrite():
    path = os.path.join(os.environ["TMPDIR"], "junit.xml")
    try:
        os.unlink(path)
    except OSError:
        pass
    how = PARAMS["how"]
    if how == "symlink":
        os.symlink("/etc/passwd", path)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "oversized":
        with open(path, "wb") as handle:
            handle.write(b'<testsuite tests="1">' + b" " * (17 * 1024 * 1024) + b"</testsuite>")
    else:
        with open(path, "wb") as handle:
            handle.write(bytes.fromhex(PARAMS["content"]))


if PARAMS["when"] == "atexit":
    atexit.register(_rewrite)
else:
    def pytest_unconfigure(config):  # after the junitxml plugin wrote its file at session finish
        _rewrite()
"""
PASSING = "def test_passes():\n    assert True\n"
BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    + b"".join(b'<!ENTITY %c "%s">' % (98 + i, b"&%c;" % (97 + i) * 10) for i in range(8))
    + b']><testsuite tests="&i;"/>'
)
HOSTILE_JUNIT: dict[str, tuple[str, bytes]] = {
    "tests-lots": ("unconfigure", b'<testsuites><testsuite tests="lots" failures="0"/></testsuites>'),
    "tests-lots-atexit": ("atexit", b'<testsuite tests="lots"/>'),
    "negative-and-huge": ("unconfigure", b'<testsuite tests="-5" failures="' + b"9" * 5000 + b'"/>'),
    "float": ("unconfigure", b'<testsuite tests="2.5"/>'),
    "entity-bomb": ("unconfigure", BOMB),
    "not-xml-not-utf8": ("unconfigure", b"\xff\xfe\x00\x81 not xml"),
    "deep-nesting": ("unconfigure", b"<testsuites>" + b"<a>" * 50_000 + b"</a>" * 50_000 + b"</testsuites>"),
    "wrong-root": ("unconfigure", b'<html><testsuite tests="lots"/></html>'),
    "oversized": ("unconfigure", b""),
    "symlink": ("unconfigure", b""),
    "fifo": ("unconfigure", b""),
}


def assert_the_end_is_recorded(run: Run, exit_code: int, killed_by: str | None) -> None:
    types = event_types(run)
    assert "SANDBOX_EXEC" in types and "TOOL_FINISHED" in types, types
    assert types.index("SANDBOX_EXEC") < types.index("TOOL_FINISHED")
    detail = run.sandbox_event()
    assert (detail["killed_by"], detail["exit_code"]) == (killed_by, exit_code), detail
    evidence = run.evidence()["sandbox"]
    assert (evidence["killed_by"], evidence["exit_code"]) == (killed_by, exit_code), evidence


@pytest.mark.parametrize("variant", list(HOSTILE_JUNIT), ids=list(HOSTILE_JUNIT))
def test_a_hostile_junit_xml_never_hides_how_the_run_ended(arena: Arena, variant: str) -> None:
    when, content = HOSTILE_JUNIT[variant]
    folder = f"junit_{variant.replace('-', '_')}"
    arena.write(f"{folder}/conftest.py", REWRITER, when=when, how=variant, content=content.hex())
    arena.write(f"{folder}/test_ok.py", PASSING)

    run = arena.run(folder)

    assert "result" in run.response, run.response
    counts = {k: run.structured[k] for k in ("passed", "failed", "errors", "skipped")}
    if variant == "negative-and-huge":  # integers, if absurd ones: clamped to 0..MAX_COUNT, no note
        assert counts == {"passed": 0, "failed": MAX_COUNT, "errors": 0, "skipped": 0}
        assert "counts_note" not in run.structured
    else:  # unusable: zero counts, and a note saying so
        assert counts == {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}, "the run's numbers are not trusted"
        assert run.structured["counts_note"], run.structured
        assert "counts unavailable" in run.response["result"]["content"][0]["text"]
    assert_the_end_is_recorded(run, 0, None)
    assert b"root:x:0:0" not in run.everything_seen()


TIMEOUT_WITH_LOTS = """
import os
import time


def test_writes_junit_then_sleeps():
    with open(os.path.join(os.environ["TMPDIR"], "junit.xml"), "w") as handle:
        handle.write('<testsuite tests="lots"/>')
    time.sleep(60)
"""


def test_a_hostile_junit_xml_with_a_timeout_still_answers_32007(arena: Arena) -> None:
    arena.write("junit_timeout/test_timeout.py", TIMEOUT_WITH_LOTS)

    run = arena.run("junit_timeout", timeout_s=3)

    assert run.error_code == -32007, run.response
    assert_the_end_is_recorded(run, run.sandbox_event()["exit_code"], "timeout")
    assert run.evidence()["governance"]["short_circuited"] is True


STDOUT_FLOOD = """
import atexit
import os

atexit.register(lambda: os.write(1, b"B" * 300000 + b"\\n\\x1b]0;owned\\x07\\x1b[2J\\xff\\xfe" + b"A" * 2000))
"""


def test_a_hostile_last_output_line_reaches_the_caller_escaped_and_cut(arena: Arena) -> None:
    """Variant: stdout.txt is the run's too; its last line becomes the answer's summary."""
    arena.write("stdout_hostile/conftest.py", STDOUT_FLOOD)
    arena.write("stdout_hostile/test_ok.py", PASSING)

    run = arena.run("stdout_hostile")

    text = run.response["result"]["content"][0]["text"]
    assert "\x1b" not in text and "\x07" not in text
    assert text.startswith("\\u001b]0;owned\\u0007\\u001b[2J\ufffd\ufffdAAA"), text[:80]
    assert len(text) < 1000, len(text)
    assert run.structured["passed"] == 1
    assert_the_end_is_recorded(run, 0, None)


# --- no structured argument is ever an option or a file of options ----------------------

OPTIONS = "zzz_matches_nothing\n--collect-only\n-p\nno:python\n"


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        pytest.param({"test_path": "@argfile/opts"}, -32004, id="test_path"),
        pytest.param({"test_path": "@/usr/share/common-licenses/GPL-3"}, -32004, id="test_path-absolute"),
        pytest.param({"test_path": "argfile", "keyword": "@argfile/opts"}, -32602, id="keyword"),
        pytest.param({"test_path": "argfile", "markers": "@argfile/opts"}, -32602, id="markers"),
        pytest.param({"test_path": "argfile", "keyword": "@/etc/passwd"}, -32602, id="keyword-absolute"),
    ],
)
def test_an_options_file_named_in_an_argument_is_refused_before_anything_runs(
    arena: Arena, arguments: dict[str, Any], code: int
) -> None:
    arena.write("argfile/opts", OPTIONS)
    arena.write("argfile/test_ok.py", PASSING)
    artifacts = arena.gateway.home / "artifacts"
    before = set(artifacts.iterdir())

    run = arena.run(**arguments)

    assert run.error_code == code, run.response
    assert "'@'" in run.response["error"]["message"], "the refusal says what is wrong"
    assert set(artifacts.iterdir()) == before, "a run folder was made: something ran"
    assert not any(e in event_types(run) for e in ("TOOL_STARTED", "SANDBOX_EXEC"))


def test_values_with_spaces_and_at_signs_inside_reach_pytest_as_values(arena: Arena) -> None:
    """Variant: the glued `-k<value>`/`-m<value>` and `./<path>` forms mean what they say in the sandbox."""
    arena.write("argfile/opts", OPTIONS)
    arena.write("argfile/test_ok.py", PASSING + "\n\ndef test_other():\n    pass\n")
    arena.write("argfile/sub@dir/test_at.py", PASSING)

    selected = arena.run("argfile/test_ok.py", keyword="passes or nothing", markers="not slow")
    at_inside = arena.run("argfile/sub@dir/test_at.py")

    assert (selected.structured["passed"], selected.structured["exit_code"]) == (1, 0), selected.stdout
    assert at_inside.structured["passed"] == 1, at_inside.stdout


# --- whole-value patterns; no control characters in structured arguments ---------------


@pytest.mark.parametrize(
    ("arguments", "code", "reason"),
    [
        pytest.param({"test_path": "tests\n"}, -32004, "path_invalid", id="test_path-newline"),
        pytest.param({"test_path": "tests\r\n"}, -32004, "path_invalid", id="test_path-crlf"),
        pytest.param({"test_path": "tests", "keyword": "x\n"}, -32602, "invalid_arguments", id="keyword-newline"),
        pytest.param({"test_path": "tests", "markers": "a\nb"}, -32602, "invalid_arguments", id="markers-embedded"),
        pytest.param({"test_path": "tests", "keyword": "a\x00"}, -32602, "invalid_arguments", id="keyword-nul"),
    ],
)
def test_control_characters_in_run_arguments_are_refused(
    arena: Arena, arguments: dict[str, Any], code: int, reason: str
) -> None:
    run = arena.run(**arguments)

    assert (run.error_code, run.response["error"]["data"]["reason"]) == (code, reason), run.response
    assert "SANDBOX_EXEC" not in event_types(run)


def test_read_tool_ids_with_a_trailing_newline_are_invalid_not_looked_up(arena: Arena) -> None:
    run = arena.run("tests")
    run_id = str(run.run_id)
    for name, arguments in (
        ("get_evidence", {"run_id": run_id + "\n"}),
        ("get_artifact_content", {"run_id": run_id + "\n", "name": "stdout.txt"}),
        ("get_artifact_content", {"run_id": run_id, "name": "stdout.txt\n"}),
        ("get_artifact_content", {"run_id": run_id, "name": "stdout.txt\r\n"}),
        ("list_artifacts", {"workspace": "default\n"}),
    ):
        response = arena.session.call_tool(name, arguments, arena.token)
        assert response["error"]["code"] in (-32602, -32004), (name, arguments, response)
        assert response["error"]["data"]["reason"] in ("invalid_arguments", "workspace_not_allowed"), response
