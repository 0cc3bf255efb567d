"""The isolation layers' names: spelled once (sandbox/layers.py), stored and reported as before, each read from the host's report."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandbox.confine import LayerReport
from sandbox.guarantees import LAYER_GUARANTEES, from_layers
from sandbox.layers import Layer
from sandbox.limits import BACKEND_LAYERS, LAYERS
from tests.fakes import FAKE_HOST

NOTHING = LayerReport(
    uid_drop=False,
    cgroup=False,
    network_namespace=False,
    scratch_tmpfs=False,
    rlimits=False,
    landlock=0,
    seccomp=False,
)

SPELLINGS = (
    "uid_drop", "user_namespace", "cgroup", "network_namespace", "ipc_namespace", "scratch_tmpfs", "rlimits",
    "landlock", "seccomp", "pid_namespace", "mount_tree",
)  # fmt: skip
"""As evidence.json, the audit's SANDBOX_EXEC, `doctor` and old policies' `sandbox.required_layers` spell them."""


def test_the_names_are_spelled_as_stored_and_reported() -> None:
    assert tuple(Layer) == SPELLINGS
    assert json.dumps(list(Layer)) == json.dumps(list(SPELLINGS))  # a StrEnum serializes as its plain value


def test_every_layer_is_applied_by_a_backend() -> None:
    assert set(LAYERS) == set(Layer)
    assert all(set(layers) <= set(Layer) for layers in BACKEND_LAYERS.values())


@pytest.mark.parametrize("layer", list(Layer))
def test_a_report_has_exactly_the_layer_its_field_says(layer: Layer) -> None:
    field = {"landlock": 3} if layer is Layer.LANDLOCK else {str(layer): True}
    report = dataclasses.replace(NOTHING, **field)  # the one field named as the layer
    assert report.has(layer)
    assert report.available() == {layer}
    assert not any(NOTHING.has(other) for other in Layer)
    assert NOTHING.available() == frozenset()


def test_each_backend_reports_only_its_own_layers() -> None:
    everything = dataclasses.replace(FAKE_HOST, user_namespace=True)
    assert everything.available() == set(Layer)
    assert everything.available("native") == set(Layer) - {Layer.MOUNT_TREE}
    assert everything.available("bubblewrap") == set(Layer) - {Layer.LANDLOCK}


def test_an_old_required_layers_list_is_read_by_its_plain_names() -> None:
    assert set(LAYER_GUARANTEES) == set(Layer) - {Layer.USER_NAMESPACE}
    assert from_layers(["uid_drop", "cgroup"]) == from_layers([Layer.UID_DROP, Layer.CGROUP])
    with pytest.raises(KeyError):
        from_layers(["user_namespace"])  # never a name of the old list
