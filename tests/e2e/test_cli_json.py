"""`--format json` for reviewers and CI gates: one JSON document on stdout, parsed and its fields asserted.

Also the exit statuses a gate reads: `policy explain` 0 (would run) or 3 (would be refused),
`policy check --strict` 1 on warnings, `audit verify` 1 on a broken chain.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import gw
from tests.harness import REPO


@pytest.fixture
def home(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    assert gw(state, "init").returncode == 0
    assert gw(state, "user", "add", "alice", "--role", "USER").returncode == 0
    assert gw(state, "user", "add", "vic", "--role", "VIEWER").returncode == 0
    return state


def document(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def test_user_list_as_json_and_the_text_header_stays_off_stdout(home: Path) -> None:
    assert gw(home, "user", "disable", "vic").returncode == 0
    users = document(gw(home, "user", "list", "--format", "json"))["users"]
    assert users == [
        {"name": "alice", "role": "USER", "state": "active", "workspaces": ["default"]},
        {"name": "vic", "role": "VIEWER", "state": "disabled", "workspaces": ["default"]},
    ]
    text = gw(home, "user", "list")
    assert text.stderr.splitlines()[0] == "name\trole\tstate\tworkspaces"
    assert text.stdout.splitlines() == ["alice\tUSER\tactive\tdefault", "vic\tVIEWER\tdisabled\tdefault"]


def test_consent_list_as_json(home: Path) -> None:
    assert gw(home, "consent", "grant", "alice", "run_pytest", "--always").returncode == 0
    assert gw(home, "consent", "grant", "alice", "list_artifacts", "--deny", "--expires-in", "1h").returncode == 0
    rows = document(gw(home, "consent", "list", "--format", "json"))["decisions"]
    assert [(r["tool"], r["decision"], r["state"], r["scope"]) for r in rows] == [
        ("run_pytest", "ALLOW", "active", "any-args"),
        ("list_artifacts", "DENY", "active", "any-args"),
    ]
    assert all(isinstance(r["id"], int) and r["user"] == "alice" and r["workspace"] == "default" for r in rows)
    assert rows[0]["expires"].endswith("Z") and rows[0]["granted_by"].startswith("cli:") and rows[0]["channel"] == "cli"
    text = gw(home, "consent", "list")
    assert text.stderr.splitlines()[0].split("\t") == [
        "id", "user", "workspace", "tool", "decision", "scope", "expires", "state", "granted_by", "channel"
    ]  # fmt: skip
    assert len(text.stdout.splitlines()) == 2


def test_audit_verify_as_json_intact_then_broken(home: Path) -> None:
    intact = gw(home, "audit", "verify", "--format", "json")
    assert intact.returncode == 0
    assert document(intact) == {
        "ok": True,
        "checked": document(intact)["checked"],
        "first_bad_id": None,
        "problem": None,
    }
    assert document(intact)["checked"] >= 2  # the two user additions
    with sqlite3.connect(home / "gateway.db") as db:
        db.execute("UPDATE audit_events SET detail = '{\"forged\": true}' WHERE id = 1")
    broken = gw(home, "audit", "verify", "--format", "json")
    assert broken.returncode == 1
    assert document(broken)["ok"] is False and document(broken)["first_bad_id"] == 1 and document(broken)["problem"]


def test_policy_check_as_json_valid_invalid_and_strict(tmp_path: Path) -> None:
    valid = gw(tmp_path, "policy", "check", str(REPO / "policy.yaml"), "--format", "json")
    assert valid.returncode == 0, valid.stderr
    checked = document(valid)
    assert checked["valid"] is True and checked["errors"] == [] and checked["guarantees_missing"] == []
    assert checked["sandbox"].startswith("sandbox on this host: root")

    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\nsandbox:\n  timeout: 5\n")
    invalid = gw(tmp_path, "policy", "check", str(broken), "--format", "json")
    assert invalid.returncode == 1
    (error,) = document(invalid)["errors"]
    assert error["where"] == f"{broken}:3" and "unknown key 'timeout' in sandbox" in error["message"]

    risky = tmp_path / "risky.yaml"
    risky.write_text((REPO / "policy.yaml").read_text().replace("network: false", "network: true"))
    lenient = gw(tmp_path, "policy", "check", str(risky), "--format", "json")
    strict = gw(tmp_path, "policy", "check", str(risky), "--format", "json", "--strict")
    assert lenient.returncode == 0 and strict.returncode == 1
    messages = [w["message"] for w in document(strict)["warnings"]]
    assert any("sandbox.network is true" in m for m in messages)
    assert document(strict)["valid"] is False and document(strict)["strict"] is True
    text = gw(tmp_path, "policy", "check", str(risky), "--strict")
    assert text.returncode == 1 and "invalid under --strict" in text.stdout


def test_policy_explain_as_json_and_its_exit_status(home: Path) -> None:
    arguments = '{"test_path":"tests"}'
    fine = gw(
        home, "policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", arguments, "--format", "json"
    )
    assert fine.returncode == 0
    walked = document(fine)
    assert walked["would_run"] is True and walked["code"] is None
    assert [s["stage"] for s in walked["stages"]] == [
        "authenticate", "authorize", "policy", "validate", "preflight", "budget", "sandbox", "consent"
    ]  # fmt: skip
    assert all(s["result"] == "pass" for s in walked["stages"])

    refused = gw(
        home, "policy", "explain", "--user", "vic", "--tool", "run_pytest", "--args", arguments, "--format", "json"
    )
    assert refused.returncode == 3
    walked = document(refused)
    assert walked["would_run"] is False and walked["code"] == -32003
    assert walked["stages"][-1] == {
        "stage": "authorize", "result": "refused", "code": -32003, "reason": "missing_permission",
        "note": walked["stages"][-1]["note"],
    }  # fmt: skip


def test_policy_explain_for_a_role_needs_no_state_folder(tmp_path: Path) -> None:
    nowhere = tmp_path / "never-initialised"
    arguments = '{"test_path":"tests"}'
    user = gw(
        nowhere, "policy", "explain", "--role", "USER", "--tool", "run_pytest", "--args", arguments, "--format", "json"
    )
    assert user.returncode == 0, user.stderr
    walked = document(user)
    assert walked["would_run"] is True
    assert walked["stages"][0]["note"] == "role USER on workspace default (given; no user read)"
    assert "without a database" in next(s["note"] for s in walked["stages"] if s["stage"] == "budget")
    viewer = gw(nowhere, "policy", "explain", "--role", "VIEWER", "--tool", "run_pytest", "--args", arguments)
    assert viewer.returncode == 3 and "-32003 missing_permission" in viewer.stdout
    outside = gw(
        nowhere, "policy", "explain", "--role", "USER", "--tool", "run_pytest", "--args", '{"test_path":"../x"}'
    )
    assert outside.returncode == 3 and "-32004 path_outside_workspace" in outside.stdout
    assert not nowhere.exists(), "nothing was created: no state folder, no database"


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("--role", "AUDITOR"), "unknown role 'AUDITOR' (the policy defines: ADMIN, USER, VIEWER)", 1),
        (
            ("--role", "USER", "--workspace", "elsewhere"),
            "unknown workspace 'elsewhere' (the policy defines: default)",
            1,
        ),
        (("--user", "alice", "--workspace", "default"), "--workspace goes with --role", 2),
        (("--role", "USER", "--agent"), "--agent needs --user", 2),
    ],
    ids=["unknown-role", "unknown-workspace", "workspace-without-role", "agent-without-user"],
)
def test_policy_explain_refuses_a_bad_role_or_workspace_in_one_line(
    tmp_path: Path, args: tuple[str, ...], message: str, code: int
) -> None:
    """A name that matches nothing: 1; flags that do not go together: 2, a usage error."""
    done = gw(tmp_path / "state", "policy", "explain", *args, "--tool", "run_pytest")
    assert done.returncode == code
    assert message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_policy_explain_needs_a_user_or_a_role(tmp_path: Path) -> None:
    neither = gw(tmp_path, "policy", "explain", "--tool", "run_pytest")
    both = gw(tmp_path, "policy", "explain", "--user", "a", "--role", "USER", "--tool", "run_pytest")
    assert neither.returncode == 2 and "one of the arguments --user --role is required" in neither.stderr
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_policy_check_reports_every_sections_error_in_one_pass_with_the_value_found(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "version: 1\n"
        "budget:\n  attempts_total: lots\n"  # line 3
        "sandbox:\n  network: maybe\n"  # line 5
        "consent:\n  timeout_s: -4\n"  # line 7
    )
    as_json = gw(tmp_path, "policy", "check", str(broken), "--format", "json")
    assert as_json.returncode == 1
    errors = [(e["where"], e["message"]) for e in document(as_json)["errors"]]
    assert errors == [
        (f"{broken}:3", "budget.attempts_total must be an integer (found 'lots')"),
        (
            f"{broken}:5",
            "sandbox.network must be true or false, or a mapping of allow, ask, deny, resolve (found 'maybe')",
        ),
        (f"{broken}:7", "consent.timeout_s must be at least 1 (found -4)"),
    ]
    text = gw(tmp_path, "policy", "check", str(broken))
    assert text.returncode == 1
    assert text.stderr.splitlines() == [f"{where}: {message}" for where, message in errors]
