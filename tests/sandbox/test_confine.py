"""Which layers a run gets: the host's, unless the policy requires one it lacks; and the runner without a cgroup."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import anyio
import pytest

from sandbox import Limits, RunResult, probe_host, run_sandboxed
from sandbox.confine import LayerReport, plan_layers
from sandbox.errors import SandboxStartError
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
NATIVE, BUBBLEWRAP = set(BACKEND_LAYERS["native"]), set(BACKEND_LAYERS["bubblewrap"])


@pytest.mark.parametrize(
    ("backend", "lacking", "required", "expected"),
    [
        ("native", (), None, NATIVE),
        ("native", ("cgroup",), ("uid_drop", "landlock"), NATIVE - {"cgroup"}),
        ("native", ("cgroup", "scratch_tmpfs"), ("uid_drop",), NATIVE - {"cgroup", "scratch_tmpfs"}),
        ("native", ("mount_tree",), None, NATIVE),  # not the native backend's layer
        ("native", ("pid_namespace",), None, "layer_unavailable:pid_namespace"),
        ("native", ("ipc_namespace",), ("uid_drop",), NATIVE - {"ipc_namespace"}),
        ("native", ("cgroup",), None, "layer_unavailable:cgroup"),
        ("native", ("landlock", "seccomp"), ("uid_drop", "seccomp", "landlock"), "layer_unavailable:landlock,seccomp"),
        ("native", ("uid_drop",), ("landlock",), "layer_unavailable:uid_drop"),  # never optional, listed or not
        ("bubblewrap", (), None, BUBBLEWRAP),
        ("bubblewrap", ("landlock",), None, BUBBLEWRAP),  # bubblewrap has no Landlock to miss
        ("bubblewrap", ("pid_namespace",), ("uid_drop", "mount_tree"), BUBBLEWRAP - {"pid_namespace"}),
        ("bubblewrap", ("mount_tree",), ("uid_drop",), "layer_unavailable:mount_tree"),  # never optional either
    ],
    ids=[
        "all", "cgroup-optional", "two-optional", "bwrap-layers-irrelevant", "pidns-required", "ipcns-optional",
        "cgroup-required", "two-required",
        "uid-drop-always", "bwrap-all", "bwrap-no-landlock", "bwrap-pidns-optional", "bwrap-mount-tree-always",
    ],
)  # fmt: skip
def test_plan_layers(
    backend: Backend, lacking: tuple[str, ...], required: tuple[str, ...] | None, expected: set[str] | str
) -> None:
    host = dataclasses.replace(EVERYTHING, **dict.fromkeys(set(lacking) - {"landlock"}, False))
    if "landlock" in lacking:
        host = dataclasses.replace(host, landlock=0)
    limits = Limits(
        timeout_s=1,
        memory_limit_mb=64,
        max_processes=8,
        max_output_bytes=1024,
        backend=backend,
        required_layers=None if required is None else frozenset(required),
    )
    if isinstance(expected, str):
        with pytest.raises(SandboxStartError) as caught:
            plan_layers(host, limits)
        assert caught.value.reason == expected
    else:
        assert plan_layers(host, limits) == expected


def test_limits_refuse_a_layer_the_backend_does_not_have() -> None:
    with pytest.raises(ValueError, match="landlock"):
        Limits(1, 64, 8, 1024, backend="bubblewrap", required_layers=frozenset({"uid_drop", "landlock"}))


def test_the_missing_layers_follow_the_required_set() -> None:
    host = dataclasses.replace(EVERYTHING, cgroup=False, landlock=0)
    assert host.missing() == ["cgroup", "landlock"]
    assert host.missing(frozenset({"uid_drop", "landlock"})) == ["landlock"]
    assert host.missing(frozenset({"uid_drop"})) == []


@requires_root
def test_this_host_has_every_layer() -> None:
    # CI runs as root on the same kind of machine: a layer lost there must fail loudly, not silently go missing.
    assert probe_host().missing() == [], probe_host()


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


def limits(required: tuple[str, ...] | None = None) -> Limits:
    return Limits(
        timeout_s=20,
        memory_limit_mb=256,
        max_processes=16,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin"},
        scratch_bytes=8 << 20,
        required_layers=None if required is None else frozenset(required),
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
        result, daemon_pid = run(folder, DAEMONIZE, limits(("uid_drop", "landlock", "seccomp")), host)
    assert "cgroup" not in result.layers and "pid_namespace" not in result.layers and "landlock" in result.layers
    assert result.survivors_killed >= 1
    assert_gone(daemon_pid)


@requires_root
def test_without_the_cgroup_layer_the_pid_namespace_takes_a_daemon_down_with_the_run() -> None:
    host = dataclasses.replace(probe_host(), cgroup=False)
    with shared_dir() as folder:
        result, daemon_pid = run(folder, DAEMONIZE, limits(("uid_drop", "pid_namespace")), host)
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
    assert caught.value.reason == "layer_unavailable:scratch_tmpfs"
    assert not marker.exists()
