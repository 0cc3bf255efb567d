"""gateway/canonical.py: canonical JSON and args_hash (docs/operations.md, "Audit log")."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from gateway.canonical import args_hash, canonical_json, sha256_hex

SHA256_OF_EMPTY_OBJECT = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def independent_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"test_path": "tests/"},
        {"test_path": "tests/test_a.py", "keyword": "slow and not flaky", "max_failures": 3, "timeout_s": 60},
        {"nested": {"b": [3, 2, 1], "a": {"z": None, "y": True}}, "n": -1.5},
        {"unicode": "ação ✓ 測試 🚀"},
        [1, "two", {"three": 3}],
    ],
)
def test_args_hash_is_sha256_of_canonical_json(arguments: Any) -> None:
    assert args_hash(arguments) == independent_hash(arguments)


def test_canonical_json_has_sorted_keys_and_no_spaces() -> None:
    assert canonical_json({"b": 1, "a": [1, 2], "c": {"y": 2, "x": 1}}) == '{"a":[1,2],"b":1,"c":{"x":1,"y":2}}'


def test_key_order_is_irrelevant_at_every_level() -> None:
    one = {"test_path": "tests", "options": {"keyword": "k", "markers": "m"}}
    two = {"options": {"markers": "m", "keyword": "k"}, "test_path": "tests"}

    assert args_hash(one) == args_hash(two)


def test_list_order_matters() -> None:
    assert args_hash({"a": [1, 2]}) != args_hash({"a": [2, 1]})


def test_different_values_hash_differently() -> None:
    assert args_hash({"test_path": "tests"}) != args_hash({"test_path": "tests/"})
    assert args_hash({"n": 1}) != args_hash({"n": "1"})


def test_unicode_is_kept_as_utf8() -> None:
    value = {"k": "ação ✓"}

    assert canonical_json(value) == '{"k":"ação ✓"}'
    assert args_hash(value) == hashlib.sha256('{"k":"ação ✓"}'.encode()).hexdigest()
    assert args_hash(value) != hashlib.sha256(b'{"k":"a\\u00e7\\u00e3o \\u2713"}').hexdigest()


@pytest.mark.parametrize("arguments", [None, {}])
def test_no_arguments_hash_as_the_empty_object(arguments: Any) -> None:
    assert args_hash(arguments) == SHA256_OF_EMPTY_OBJECT


def test_sha256_hex_hashes_utf8() -> None:
    assert sha256_hex("ç") == hashlib.sha256("ç".encode()).hexdigest()


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_not_json(number: float) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        args_hash({"x": number})
