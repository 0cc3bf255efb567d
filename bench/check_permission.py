"""What a rule-decided `check_permission` question costs over stdio, beside a `ping` in the same session.

One `mcp-gateway serve` with `permission_prompt.enabled` and the token in MCP_GATEWAY_TOKEN, as
Claude Code starts it. Rotating blocks of: `ping` (the transport and SDK floor), a Bash command
allowed by a rule (two parts, both judged), a Bash command denied by a rule, and an Edit allowed
by a path rule (the path resolved with realpath). Prints p50/p99 and each row's milliseconds over
the ping p50; then checks that the audit log holds three events per question and verifies.

    .venv/bin/python bench/check_permission.py [--per-block 30] [--blocks 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import GatewayHome, StdioSession

RULES = {"enabled": True, "deny": ["Bash(rm:*)"], "allow": ["Bash(pytest:*)", "Edit(src/**)"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-block", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=10)
    options = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-check-permission-")) / "gw"
    root.mkdir()
    gateway = GatewayHome(root, {"permission_prompt": RULES})
    gateway.add_user("alice")
    session = StdioSession(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token("alice")})
    session.initialize()
    edit = {"file_path": str(gateway.workspace / "src" / "a.py"), "old_string": "a", "new_string": "b"}
    rows: dict[str, tuple[str, Mapping[str, Any] | None, str | None]] = {
        "ping": ("ping", None, None),
        "Bash allowed (2 parts)": ("tools/call", _question("Bash", {"command": "pytest -q && pytest -x"}), "allow"),
        "Bash denied": ("tools/call", _question("Bash", {"command": "rm -rf build"}), "deny"),
        "Edit allowed (realpath)": ("tools/call", _question("Edit", edit), "allow"),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for block in range(options.blocks):
        for name, (method, params, behavior) in rows.items():
            for _ in range(options.per_block):
                started = time.perf_counter()
                response = session.request(method, params)
                elapsed = (time.perf_counter() - started) * 1000
                if (
                    behavior is not None
                    and json.loads(response["result"]["content"][0]["text"])["behavior"] != behavior
                ):
                    print(f"wrong answer for {name}: {response}", file=sys.stderr)
                    return 1
                if block > 0:  # the first block warms up
                    times[name].append(elapsed)
    session.close()

    floor = statistics.median(times["ping"])
    print(f"{'':26s} {'p50 ms':>8s} {'p99 ms':>8s} {'over ping p50':>14s}")
    for name, values in times.items():
        p50, p99 = statistics.median(values), sorted(values)[int(len(values) * 0.99)]
        print(f"{name:26s} {p50:8.2f} {p99:8.2f} {p50 - floor:14.2f}")
    questions = 3 * options.blocks * options.per_block
    events = len(gateway.audit_events())
    ok = events == 3 * questions and gateway.chain_ok()
    print(f"audit: {events} events for {questions} questions (3 each expected), chain {'ok' if ok else 'BROKEN'}")
    return 0 if ok else 1


def _question(tool: str, tool_input: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": "check_permission", "arguments": {"tool_name": tool, "input": dict(tool_input)}}


if __name__ == "__main__":
    sys.exit(main())
