"""The gateway as root without CAP_SYS_ADMIN and CAP_NET_ADMIN (a default container; decision 57).

`serve` starts under `capsh --drop=cap_sys_admin,cap_net_admin`: it cannot make namespaces or
mounts as root, so each run drops to a pool uid and then takes the rootless path (its own user
namespace). The default policy (what `doctor` reports as holding here) must work: the sample
suite passes, and a hostile test finds the state folder, the network and the gateway closed.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_run_pytest import ELICITATION, SessionFactory, answer, bare_pytest_counts
from tests.harness import GatewayHome

HOSTILE = """
import os, socket

def test_probe():
    found = {}
    for path in (KEY, "/proc/1/environ", "/etc/shadow"):
        try:
            open(path, "rb").read(16)
            found[path] = "read"
        except OSError as exc:
            found[path] = type(exc).__name__
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
        found["tcp"] = "connected"
    except OSError as exc:
        found["tcp"] = exc.errno
    found["uid"] = os.getuid()
    raise AssertionError("PROBE " + repr(found))  # a failure's message is in the run's stdout (-rfE)
"""


@pytest.fixture
def capsh_python(tmp_path: Path) -> str:
    """An executable that runs this interpreter under capsh without CAP_SYS_ADMIN and CAP_NET_ADMIN."""
    wrapper = tmp_path / "python-without-sys-admin"
    wrapper.write_text(
        f'#!/bin/sh\nexec capsh --drop=cap_sys_admin,cap_net_admin -- -c \'exec "$0" "$@"\' {sys.executable} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def run_id_of(response: dict[str, object]) -> str:
    result = response["result"]
    assert isinstance(result, dict), response
    structured = result["structuredContent"]
    assert isinstance(structured, dict)
    return str(structured["run_id"])


def test_without_cap_sys_admin_the_sample_suite_runs_in_a_pool_uid_and_a_user_namespace(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, capsh_python: str
) -> None:
    gateway = make_gateway()
    gateway.add_user("alice", "USER")
    session = open_session(gateway, capabilities=ELICITATION, python=capsh_python)
    session.responder = answer("allow_once")
    response = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    structured = response["result"]["structuredContent"]
    expected = bare_pytest_counts()
    assert {k: structured[k] for k in expected} == expected, response
    evidence = json.loads((gateway.home / "artifacts" / run_id_of(response) / "evidence.json").read_text())
    layers = evidence["sandbox"]["layers"]
    assert {"uid_drop", "user_namespace", "network_namespace", "scratch_tmpfs", "pid_namespace", "landlock"} <= set(
        layers
    )
    assert evidence["sandbox"]["confinement"]["guarantees"]["own_identity"] == ["uid_drop", "user_namespace"]


def test_without_cap_sys_admin_a_hostile_test_finds_the_gateway_closed(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory, capsh_python: str
) -> None:
    gateway = make_gateway()
    gateway.add_user("alice", "USER")
    key = str(gateway.home / "signing.key")
    probe = gateway.workspace / "tests" / "test_probe.py"
    probe.write_text(f"KEY = {key!r}\n" + HOSTILE)
    probe.chmod(0o644)
    session = open_session(gateway, capabilities=ELICITATION, python=capsh_python)
    session.responder = answer("allow_once")
    response = session.call_tool("run_pytest", {"test_path": "tests/test_probe.py"}, gateway.token("alice"))
    stdout = (gateway.home / "artifacts" / run_id_of(response) / "stdout.txt").read_text()
    line = next(x for x in stdout.splitlines() if "PROBE {" in x)
    found = eval(line[line.index("PROBE {") + len("PROBE ") :], {})  # noqa: S307  (a dict literal this test's own code printed)
    assert found["uid"] >= 61000, "the run has a pool uid, not root"
    assert all(found[path] != "read" for path in ("/proc/1/environ", "/etc/shadow"))
    assert found["tcp"] == 1, "socket() refused (EPERM)"
    assert found[key] == "PermissionError", "the state folder is closed (file permissions and Landlock)"
