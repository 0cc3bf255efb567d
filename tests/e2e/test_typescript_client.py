"""A client nobody here wrote: the official TypeScript SDK (npm), through examples/typescript/client.ts,
drives a real `serve` with the environment token: it lists the tools, answers the consent
question the gateway asks by elicitation, and gets progress notifications before the result,
which keep the SDK's request timeout from firing while a person takes longer than it to answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_progress import slow_suite
from tests.harness import GatewayHome

CLIENT = Path(__file__).resolve().parents[2] / "examples" / "typescript" / "dist" / "client.js"


@pytest.fixture
def client() -> Path:
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed (make ts-client installs it as root)")
    if not CLIENT.is_file():
        pytest.fail(f"{CLIENT} is missing: run `make ts-client` (npm ci and tsc in examples/typescript)")
    return CLIENT


@pytest.fixture
def env_gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    gw = make_gateway({"auth": {"env_token": True}})
    gw.add_user("alice", "USER")
    return gw


def run_client(client: Path, gateway: GatewayHome, token: str, *flags: str) -> subprocess.CompletedProcess[str]:
    serve = [sys.executable, "-m", "gateway", "--home", str(gateway.home), "--db", gateway.url]
    serve += ["--policy", str(gateway.policy_path), "serve"]
    environment = {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_TOKEN"} | {"MCP_GATEWAY_TOKEN": token}
    return subprocess.run(
        ["node", str(client), *flags, "--", *serve],
        capture_output=True,
        text=True,
        env=environment,
        timeout=90,
        check=False,
    )


def test_the_typescript_sdk_runs_pytest_with_the_environment_token_consent_and_progress(
    client: Path, env_gateway: GatewayHome
) -> None:
    arguments = slow_suite(env_gateway)
    # The person answers after 7 s; the SDK gives up after 6 s without news. Progress resets it.
    flags = ("--test-path", arguments["test_path"], "--answer", "allow_once", "--answer-after-s", "7")
    done = run_client(client, env_gateway, env_gateway.token("alice"), *flags, "--timeout-ms", "6000")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)

    assert {"run_pytest", "list_artifacts", "get_evidence", "get_artifact_content"} <= set(report["tools"])
    (question,) = report["questions"]
    assert "run_pytest" in question["message"]
    result = report["result"]
    assert result["isError"] is False and result["structuredContent"]["passed"] == 6, result

    notes = report["progress"]
    assert all(note["at_s"] <= report["result_at_s"] for note in notes)
    waiting = [n for n in notes if n["message"].startswith("Waiting for a person")]
    assert "in your client's dialog" in waiting[0]["message"]
    assert any(n["at_s"] > 4 for n in waiting), "a heartbeat while the person thinks"
    assert report["result_at_s"] > 6, "the call outlived the SDK's timeout because progress reset it"
    running = [n["message"] for n in notes if n["message"].startswith("Running the tests")]
    assert running and running[-1] != "Running the tests in the sandbox: starting", running
    progress = [n["progress"] for n in notes]
    assert progress == sorted(set(progress))

    run_id = result["structuredContent"]["run_id"]
    events = env_gateway.events_of(run_id)
    decisions = [e["detail"] for e in events if e["event_type"] == "mcp.permission.decision"]
    assert [(d["decision"], d["channel"]) for d in decisions] == [("ALLOW_ONCE", "elicitation")]
    assert {e["user"] for e in events} == {"alice"}


def test_a_bad_environment_token_is_refused_in_the_typescript_sdk_as_auth_required(
    client: Path, env_gateway: GatewayHome
) -> None:
    forged = env_gateway.token("alice")[:-4] + "AAAA"
    done = run_client(client, env_gateway, forged, "--answer", "allow_once")
    assert done.returncode == 1 and done.stdout == ""
    assert "-32001" in done.stderr and '"reason":"bad_signature"' in done.stderr.replace(" ", ""), done.stderr
    assert forged not in done.stderr
