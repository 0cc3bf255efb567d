"""Which layers a run gets: the host's, unless the policy requires a guarantee none keeps; and the runner without a cgroup."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Limits, RunResult, probe_host, run_sandboxed
from sandbox.confine import LayerReport, plan_layers
from sandbox.errors import SandboxStartError
from sandbox.guarantees import Guarantee
from sandbox.limits import BACKEND_LAYERS, Backend
from tests.sandbox.confined_child import DAEMONIZE, PYTHON, requires_root, shared_dir

EVERYTHING = LayerReport(
    uid_drop=True,
    cgroup=True,
    network_namespace=True,
    scratch_tmpfs=True,
    rlimits=True,
    landlock=7,
    seccomp=True,
    mount_tree=True,
    pid_namespace=True,
    ipc_namespace=True,
)
ROOTLESS = dataclasses.replace(EVERYTHING, uid_drop=False, cgroup=False, user_namespace=True)
NATIVE = set(BACKEND_LAYERS["native"]) - {"user_namespace"}
BUBBLEWRAP = set(BACKEND_LAYERS["bubblewrap"]) - {"user_namespace"}
G = Guarantee


@pytest.mark.parametrize(
    ("backend", "host", "lacking", "require", "expected"),
    [
        ("native", EVERYTHING, (), None, NATIVE),
        ("native", EVERYTHING, ("cgroup",), None, NATIVE - {"cgroup"}),  # memory_total is not required by default
        ("native", EVERYTHING, ("cgroup",), list(G), "guarantee_unavailable:memory_total"),
        ("native", EVERYTHING, ("cgroup", "scratch_tmpfs"), [G.OWN_IDENTITY, G.FILE_GRANTS], NATIVE - {"cgroup", "scratch_tmpfs"}),
        ("native", EVERYTHING, ("mount_tree",), None, NATIVE - {"mount_tree"}),  # not the native backend's layer
        ("native", EVERYTHING, ("pid_namespace",), None, "guarantee_unavailable:process_isolation"),
        ("native", EVERYTHING, ("pid_namespace", "cgroup"), None, "guarantee_unavailable:whole_run_kill,process_isolation"),
        ("native", EVERYTHING, ("ipc_namespace",), [G.OWN_IDENTITY, G.FILE_GRANTS], NATIVE - {"ipc_namespace"}),
        ("native", EVERYTHING, ("landlock", "seccomp"), [G.OWN_IDENTITY, G.FILE_GRANTS], "guarantee_unavailable:file_grants"),
        ("native", EVERYTHING, ("uid_drop",), [G.FILE_GRANTS, G.OWN_IDENTITY], "guarantee_unavailable:own_identity"),
        ("native", EVERYTHING, ("cgroup", "uid_drop"), None, "guarantee_unavailable:own_identity,process_total"),
        ("native", ROOTLESS, (), None, NATIVE - {"cgroup", "uid_drop"} | {"user_namespace"}),
        ("native", ROOTLESS, (), [*G], "guarantee_unavailable:memory_total"),
        ("native", ROOTLESS, ("user_namespace",), None, "guarantee_unavailable:own_identity,process_total"),
        ("bubblewrap", EVERYTHING, (), None, BUBBLEWRAP),
        ("bubblewrap", EVERYTHING, ("landlock",), None, BUBBLEWRAP),  # bubblewrap has no Landlock to miss
        ("bubblewrap", EVERYTHING, ("pid_namespace",), [G.OWN_IDENTITY, G.FILE_GRANTS], BUBBLEWRAP - {"pid_namespace"}),
        ("bubblewrap", EVERYTHING, ("mount_tree",), [G.OWN_IDENTITY, G.FILE_GRANTS], "guarantee_unavailable:file_grants"),
        ("bubblewrap", ROOTLESS, (), None, BUBBLEWRAP - {"cgroup", "uid_drop"} | {"user_namespace"}),
    ],
    ids=[
        "all", "memory-total-optional", "memory-total-required", "two-optional", "bwrap-layers-irrelevant",
        "pidns-required", "no-kill-at-all", "ipcns-optional", "no-file-grants", "no-identity", "no-identity-default",
        "rootless", "rootless-all-required", "rootless-no-userns", "bwrap-all", "bwrap-no-landlock",
        "bwrap-pidns-optional", "bwrap-mount-tree-required", "bwrap-rootless",
    ],
)  # fmt: skip
def test_plan_layers(
    backend: Backend,
    host: LayerReport,
    lacking: tuple[str, ...],
    require: list[Guarantee] | None,
    expected: set[str] | str,
) -> None:
    off: dict[str, Any] = dict.fromkeys(set(lacking) - {"landlock"}, False)
    host = dataclasses.replace(host, **off)
    if "landlock" in lacking:
        host = dataclasses.replace(host, landlock=0)
    limits = Limits(
        timeout_s=1,
        memory_limit_mb=64,
        max_processes=8,
        max_output_bytes=1024,
        backend=backend,
        require=None if require is None else frozenset(require),
    )
    if isinstance(expected, str):
        with pytest.raises(SandboxStartError) as caught:
            plan_layers(host, limits)
        assert caught.value.reason == expected
    else:
        assert plan_layers(host, limits) == expected


def test_the_unwaivable_guarantees_are_required_whatever_the_list() -> None:
    assert Limits(1, 64, 8, 1024, require=frozenset()).required == {G.OWN_IDENTITY, G.FILE_GRANTS}


def test_no_network_is_not_required_of_a_run_with_network() -> None:
    assert G.NO_NETWORK not in Limits(1, 64, 8, 1024, network=True).required
    assert G.NO_NETWORK not in Limits(1, 64, 8, 1024, network=True, require=frozenset({G.NO_NETWORK})).required


def test_the_missing_guarantees_follow_the_required_set() -> None:
    host = dataclasses.replace(EVERYTHING, cgroup=False, landlock=0)
    assert host.missing("native", frozenset(G)) == [G.FILE_GRANTS, G.MEMORY_TOTAL]
    assert host.missing("bubblewrap", frozenset(G)) == [G.MEMORY_TOTAL]  # its mount tree keeps file_grants
    assert host.missing("native", frozenset({G.OWN_IDENTITY})) == []


@requires_root
def test_this_host_keeps_every_guarantee() -> None:
    # CI runs as root on the same kind of machine: a layer lost there must fail loudly, not silently go missing.
    report = probe_host()
    assert report.missing("native", frozenset(G)) == [] and report.missing("bubblewrap", frozenset(G)) == [], report
    assert report.available() >= NATIVE | BUBBLEWRAP and not report.rootless


def run(folder: Path, code: str, limits: Limits, host: LayerReport) -> tuple[RunResult, int | None]:
    scratch = folder / "scratch"
    scratch.mkdir()
    result = anyio.run(
        lambda: run_sandboxed(
            [PYTHON, "-I", "-c", code], folder, limits, folder / "out", folder / "err", scratch=scratch, host=host
        )
    )
    out = (folder / "out").read_text().strip()
    return result, int(out) if out else None


def limits(required: tuple[Guarantee, ...] | None = None) -> Limits:
    return Limits(
        timeout_s=20,
        memory_limit_mb=256,
        max_processes=16,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin"},
        scratch_bytes=8 << 20,
        require=None if required is None else frozenset(required),
    )


def assert_gone(pid: int | None) -> None:
    assert pid is not None
    daemon = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 5
    while daemon.exists() and daemon.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not daemon.exists() or daemon.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the daemon outlived the run"


@requires_root
def test_without_the_cgroup_and_pid_namespace_layers_the_uid_sweep_still_kills_a_daemon() -> None:
    host = dataclasses.replace(probe_host(), cgroup=False, pid_namespace=False)
    with shared_dir() as folder:
        result, daemon_pid = run(folder, DAEMONIZE, limits((G.OWN_IDENTITY, G.FILE_GRANTS, G.SYSCALL_FILTER)), host)
    assert "cgroup" not in result.layers and "pid_namespace" not in result.layers and "landlock" in result.layers
    assert result.survivors_killed >= 1
    assert_gone(daemon_pid)


@requires_root
def test_without_the_cgroup_layer_the_pid_namespace_takes_a_daemon_down_with_the_run() -> None:
    host = dataclasses.replace(probe_host(), cgroup=False)
    with shared_dir() as folder:
        result, daemon_pid = run(folder, DAEMONIZE, limits((G.OWN_IDENTITY, G.WHOLE_RUN_KILL)), host)
    assert "cgroup" not in result.layers and "pid_namespace" in result.layers
    assert daemon_pid is not None and daemon_pid < 10, "the daemon saw its pid in the run's own namespace"
    # The same uid sweep that finds the daemon without the namespace (above) found nothing left.
    assert result.survivors_killed == 0, "pid 1's exit killed the daemon before any sweep looked"


@requires_root
def test_a_required_layer_the_host_lacks_stops_the_run_before_it_starts() -> None:
    host = dataclasses.replace(probe_host(), scratch_tmpfs=False)
    marker = Path(f"/tmp/mcp-confine-ran-{os.getpid()}")
    with shared_dir() as folder, pytest.raises(SandboxStartError) as caught:
        run(folder, f"open({str(marker)!r}, 'w')", limits(), host)
    assert caught.value.reason == "guarantee_unavailable:bounded_scratch"
    assert not marker.exists()
