"""A pip install is enough: the built wheel, in a fresh venv outside the checkout, in another folder.

The wheel is built from this checkout with pip (build isolation: setuptools from the index),
installed with its dependencies into a new venv made from the system interpreter, and driven
from a folder that is not the checkout: `init` writes a policy whose workspace is the sample
project the wheel carries, `demo` passes and cleans up, and a real `tools/call` over stdio
runs the sample suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, enterable_by_everyone

SYSTEM_PYTHON = "/usr/bin/python3"
pytestmark = pytest.mark.timeout(900)  # the first test builds and installs the wheel: 125 s seen at load 20-25


def run(
    argv: list[str], *, cwd: Path, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_GATEWAY", "PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(
        argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """The venv the wheel is installed into (module scope: one build and one install for the file)."""
    with tempfile.TemporaryDirectory(prefix="mcp-wheel-") as folder:
        root = Path(folder)
        enterable_by_everyone(root)
        built = run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"), str(REPO)], cwd=root
        )
        assert built.returncode == 0, built.stderr[-2000:]
        (wheel,) = (root / "dist").glob("mcp_write_gateway-*.whl")
        venv = root / "venv"
        made = run([SYSTEM_PYTHON, "-m", "venv", str(venv)], cwd=root)
        assert made.returncode == 0, made.stderr
        pip = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=root, timeout=600)
        assert pip.returncode == 0, pip.stderr[-2000:]
        (root / "elsewhere").mkdir()
        yield venv


def gateway(venv: Path, home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(
        [str(venv / "bin" / "mcp-gateway"), "--home", str(home), *args], cwd=venv.parent / "elsewhere", stdin=stdin
    )


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Path) -> None:
    where = run(
        [str(installed / "bin" / "python"), "-c", "import gateway; print(gateway.__file__)"], cwd=installed.parent
    )
    assert where.stdout.startswith(str(installed)), where.stdout
    assert not where.stdout.startswith(str(REPO))


def test_init_and_demo_work_from_the_wheel_in_any_folder(installed: Path) -> None:
    home = installed.parent / "state-demo"
    initialised = gateway(installed, home, "init")
    assert initialised.returncode == 0, initialised.stderr
    policy = (home / "policy.yaml").read_text()
    sample = installed / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    sample = sample / "gateway" / "shipped" / "examples" / "sample_project"
    assert f"default: {sample}" in policy, "the workspace is the sample project the wheel carries, absolute"
    assert (sample / "tests" / "test_inventory.py").is_file()
    checked = gateway(installed, home, "policy", "check")
    assert checked.returncode == 0, checked.stderr
    demo = gateway(installed, home, "demo")
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert '"passed": 8' in demo.stdout and "audit verify: ok" in demo.stdout
    assert "removed the demo's state folder" in demo.stdout


def _messages(stdout: str) -> dict[Any, dict[str, Any]]:
    found = {}
    for line in stdout.splitlines():
        message = json.loads(line)
        if "id" in message:
            found[message["id"]] = message
    return found


def test_a_real_call_through_the_installed_serve(installed: Path) -> None:
    home = installed.parent / "state-call"
    for args in (
        ("init",),
        ("user", "add", "alice", "--role", "USER"),
        ("consent", "grant", "alice", "run_pytest", "--always"),
    ):
        done = gateway(installed, home, *args)
        assert done.returncode == 0, done.stderr
    token = gateway(installed, home, "token", "issue", "alice").stdout.strip()
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "wheel-test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_pytest", "arguments": {"test_path": "tests"}, "auth": {"token": token}}},
    ]  # fmt: skip
    log = installed.parent / "serve-stderr.log"
    with (
        log.open("w") as errors,
        subprocess.Popen(
            [str(installed / "bin" / "mcp-gateway"), "--home", str(home), "serve"],
            cwd=installed.parent / "elsewhere",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        ) as served,
    ):
        assert served.stdin is not None
        assert served.stdout is not None
        for request in requests:
            served.stdin.write(json.dumps(request) + "\n")
            served.stdin.flush()
        answers: dict[Any, dict[str, Any]] = {}
        while 2 not in answers:
            line = served.stdout.readline()
            assert line, log.read_text()[-2000:]
            answers |= _messages(line)
        served.stdin.close()
        served.wait(timeout=60)
    result = answers[2]["result"]
    assert result["structuredContent"]["passed"] == 8 and result["structuredContent"]["failed"] == 0, result
    assert gateway(installed, home, "audit", "verify").returncode == 0
