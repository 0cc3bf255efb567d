"""Hostile suites that go after the gateway's secrets: files, environments, links, /proc, import time."""

from __future__ import annotations

import os
from pathlib import Path

from tests.adversarial.conftest import CANARY_VAR, Arena, Listener
from tests.harness import enterable_by_everyone

READER = """
import os
from _kit import attempt, report

def read(path):
    with open(path, "rb") as handle:
        return handle.read(1 << 16)

def test_read_secrets():
    report(**{path: attempt(lambda path=path: read(path)) for path in PARAMS["paths"]})
"""


def read_attempt(arena: Arena, name: str, paths: list[str]) -> dict[str, str]:
    arena.write(f"adv/test_read_{name}.py", READER, paths=paths)
    run = arena.run(f"adv/test_read_{name}.py")
    found = run.report()
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    leaked = {path: outcome for path, outcome in found.items() if not outcome.startswith("blocked:")}
    assert leaked == {}, leaked
    return found


def test_signing_key_is_unreadable(arena: Arena) -> None:
    home = arena.gateway.home
    read_attempt(arena, "signing_key", [str(home / "signing.key"), str(home / "artifacts")])


def test_gateway_db_is_unreadable(arena: Arena) -> None:
    home = arena.gateway.home
    read_attempt(arena, "gateway_db", [str(home / "gateway.db"), str(home / "gateway.db-wal")])


def test_policy_file_is_unreadable(arena: Arena) -> None:
    # The policy is 0644 in a folder the run uid may enter: only Landlock stands in the way.
    assert arena.gateway.policy_path.stat().st_mode & 0o004
    logs = [str(p) for p in arena.gateway.root.glob("serve-stderr-*.log")]
    read_attempt(arena, "policy", [str(arena.gateway.policy_path), *logs])


def test_etc_shadow_is_unreadable(arena: Arena) -> None:
    read_attempt(arena, "shadow", ["/etc/shadow", "/etc/gshadow", "/root/.bash_history"])


def test_init_environ_is_unreadable(arena: Arena) -> None:
    if arena.backend == "native":
        read_attempt(arena, "init_environ", ["/proc/1/environ", "/proc/1/mem"])
        return
    # In the run's own PID namespace, pid 1 is bubblewrap's reaper: its memory stays closed, and
    # its environment, readable, must be exactly the one the gateway built for the run.
    read_attempt(arena, "init_mem", ["/proc/1/mem"])
    arena.write("adv/test_read_pid1_environ.py", ENVIRON_OF_PID_1)
    run = arena.run("adv/test_read_pid1_environ.py")
    found = run.report()
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    assert found["pid1"] == found["own"], found


ENVIRON_OF_PID_1 = """
import os
from _kit import report

def test_pid1_environ():
    with open("/proc/1/environ", "rb") as handle:
        pid1 = sorted(item.decode() for item in handle.read().split(b"\\0") if item)
    own = sorted("%s=%s" % item for item in os.environ.items() if not item[0].startswith("PYTEST_CURRENT"))
    report(pid1=[item for item in pid1 if not item.startswith("PWD=")], own=[item for item in own if not item.startswith(("PWD=", "PYTEST_VERSION="))])
"""


ENVIRON = """
import os
from _kit import attempt, report

def test_gateway_environment():
    serve = PARAMS["serve_pid"]
    report(
        own=sorted(os.environ),
        canary_in_own=PARAMS["canary_var"] in os.environ,
        **{
            path: attempt(lambda path=path: open(path, "rb").read(1 << 16))
            for path in (
                "/proc/%d/environ" % serve,
                "/proc/%d/environ" % os.getppid(),
                "/proc/%d/mem" % serve,
                "/proc/%d/fd/0" % serve,
                "/proc/self/environ",
            )
        },
    )
"""


def test_gateway_environment_is_not_visible(arena: Arena) -> None:
    arena.write("adv/test_environ.py", ENVIRON, serve_pid=arena.serve_pid, canary_var=CANARY_VAR)
    run = arena.run("adv/test_environ.py")
    found = run.report()
    run.assert_no_secret(arena.secrets["canary"])
    assert found["canary_in_own"] is False
    pytest_own = {"PYTEST_CURRENT_TEST", "PYTEST_VERSION"}  # set by pytest itself inside the run
    passed_in = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    if arena.backend == "bubblewrap":
        passed_in.add("PWD")  # bubblewrap sets it to the folder it changes into: the workspace
    assert set(found["own"]) <= passed_in | pytest_own
    serve = f"/proc/{arena.serve_pid}"
    for path in (f"{serve}/environ", f"{serve}/mem", f"{serve}/fd/0"):
        assert found[path].startswith("blocked:"), (path, found[path])


SYMLINK = """
from _kit import attempt, report

def test_follow_the_links():
    report(**{name: attempt(lambda name=name: open(name, "rb").read()) for name in PARAMS["links"]})
"""


def test_workspace_symlinks_to_secrets_do_not_read_them(arena: Arena) -> None:
    links = {
        "adv/link_to_key": arena.gateway.home / "signing.key",
        "adv/link_to_policy": arena.gateway.policy_path,
        "adv/link_to_state": arena.gateway.home,
    }
    (arena.workspace / "adv").mkdir(exist_ok=True)
    # Up to the state folder's door (itself still 0700): only the run uid and Landlock stand in the way.
    enterable_by_everyone(arena.gateway.root)
    for name, target in links.items():
        (arena.workspace / name).unlink(missing_ok=True)
        (arena.workspace / name).symlink_to(target)
    paths = [str(arena.workspace / "adv/link_to_key"), str(arena.workspace / "adv/link_to_policy")]
    paths.append(str(arena.workspace / "adv/link_to_state/gateway.db"))
    arena.write("adv/test_symlink.py", SYMLINK, links=paths)
    try:
        run = arena.run("adv/test_symlink.py")
    finally:
        for name in links:  # a link into the state folder would break later runs' collection of adv/
            (arena.workspace / name).unlink(missing_ok=True)
    found = run.report()
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found


HARDLINK = """
import os
from _kit import attempt, report

def link_and_read(source, name):
    target = os.path.join(os.environ["TMPDIR"], name)
    os.link(source, target)
    with open(target, "rb") as handle:
        return handle.read()

def test_hardlink_into_scratch():
    report(**{source: attempt(lambda source=source: link_and_read(source, "l%d" % i))
              for i, source in enumerate(PARAMS["sources"])})
"""


def test_hardlinks_of_secrets_into_scratch_fail(arena: Arena) -> None:
    sources = [str(arena.gateway.home / "signing.key"), str(arena.gateway.policy_path), "/etc/shadow"]
    arena.write("adv/test_hardlink.py", HARDLINK, sources=sources)
    run = arena.run("adv/test_hardlink.py")
    found = run.report()
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    assert all(outcome.startswith("blocked:") for outcome in found.values()), found


def test_proc_root_paths_do_not_reach_secrets(arena: Arena) -> None:
    key, policy = arena.gateway.home / "signing.key", arena.gateway.policy_path
    serve = arena.serve_pid
    read_attempt(
        arena,
        "proc_root",
        [
            f"/proc/self/root{key}",
            f"/proc/self/root{policy}",
            f"/proc/{serve}/root{policy}",
            f"/proc/{serve}/cwd/{os.path.relpath(policy, Path.cwd())}",
            f"/proc/thread-self/root{policy}",
        ],
    )


JUNIT_SWAP = """
import atexit, os, sys
from _kit import report

def swap():
    # After pytest wrote junit.xml: make the gateway copy a secret as the run's junit.xml.
    junit = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
    os.unlink(junit)
    os.symlink(PARAMS["target"], junit)

def test_swap_junit_for_a_link(request):
    atexit.register(swap)
    report(registered=True)
"""


def test_junit_replaced_by_a_link_to_a_secret_is_not_copied(arena: Arena) -> None:
    for name, target in (("key", arena.gateway.home / "signing.key"), ("policy", arena.gateway.policy_path)):
        arena.write(f"adv/test_junit_swap_{name}.py", JUNIT_SWAP, target=str(target))
        run = arena.run(f"adv/test_junit_swap_{name}.py")
        assert run.report()["registered"] is True
        for secret in arena.secrets.values():
            run.assert_no_secret(secret)
        assert run.run_dir is not None
        assert not (run.run_dir / "junit.xml").exists(), "the gateway copied what the link pointed to"
        assert run.structured["failed"] == 0, "with no junit.xml the counts must stay empty"


IMPORT_TIME = """
import os, socket
from _kit import attempt

def read(path):
    with open(path, "rb") as handle:
        return handle.read(1 << 16)

def write(path):
    with open(path, "wb") as handle:
        handle.write(b"written at conftest import")

def connect():
    with socket.create_connection(("127.0.0.1", PARAMS["port"]), timeout=2) as conn:
        conn.sendall(b"from conftest")

FINDINGS = {path: attempt(lambda path=path: read(path)) for path in PARAMS["read"]}
FINDINGS["write"] = attempt(lambda: write(PARAMS["write"]))
FINDINGS["connect"] = attempt(connect)
FINDINGS["environ"] = sorted(os.environ)
"""

IMPORT_TIME_TEST = """
from conftest import FINDINGS
from _kit import report

def test_report_what_conftest_did():
    report(**FINDINGS)
"""


def test_conftest_doing_everything_at_import_is_confined(arena: Arena, tcp_listener: Listener) -> None:
    port, received = tcp_listener.address[1], tcp_listener.received
    written = arena.outside / "from-conftest"
    home = arena.gateway.home
    params = {
        "read": [str(home / "signing.key"), str(arena.gateway.policy_path), "/proc/1/environ", "/etc/shadow"],
        "write": str(written),
        "port": port,
    }
    arena.write("adv/at_import/conftest.py", IMPORT_TIME, **params)
    arena.write("adv/at_import/test_at_import.py", IMPORT_TIME_TEST)
    run = arena.run("adv/at_import")
    found = run.report()
    for secret in arena.secrets.values():
        run.assert_no_secret(secret)
    # Under bubblewrap /proc/1 is the run's own reaper (test_init_environ_is_unreadable checks what it holds).
    must_fail = [p for p in params["read"] if not (arena.backend == "bubblewrap" and p == "/proc/1/environ")]
    assert all(found[path].startswith("blocked:") for path in must_fail), found
    assert found["write"].startswith("blocked:") and not written.exists()
    assert found["connect"].startswith("blocked:") and received == []
    assert CANARY_VAR not in found["environ"]


DESCRIPTORS = """
import os
from _kit import report

def test_inherited_descriptors():
    seen = {}
    for fd in range(0, 256):
        try:
            seen[fd] = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            continue
    report(fds=seen)
"""


def test_no_gateway_descriptor_is_inherited(arena: Arena) -> None:
    arena.write("adv/test_descriptors.py", DESCRIPTORS)
    run = arena.run("adv/test_descriptors.py")
    fds = run.report()["fds"]
    assert fds, "the suite could not list its descriptors"
    home = str(arena.gateway.home)
    allowed_in_home = (f"{home}/artifacts/{run.run_id}/stdout.txt", f"{home}/artifacts/{run.run_id}/stderr.txt")
    leaked = {fd: target for fd, target in fds.items() if target.startswith(home) and target not in allowed_in_home}
    assert leaked == {}, leaked
    assert not any(target.startswith("socket:") for target in fds.values()), fds
    # Nor the gateway's event loop or its database threads' wake-ups (epoll, eventfd).
    assert not any(target.startswith("anon_inode:") for target in fds.values()), fds
