"""Fuzzing `mcp-gateway serve` over real stdio (decision 47).

Seeded and bounded (`FUZZ_SECONDS`, `FUZZ_MESSAGES`): mutations of valid requests (lone
surrogates, NaN/Infinity, huge strings, deep nesting, wrong types for id/method/params,
batches, garbage and invalid UTF-8, truncation, lines at the 1 MiB cap). After every line
the gateway must answer a sentinel `ping` under its own id; every error it sends must carry
a standard code and the right id (the request's when readable, else null); and stderr must
stay small. Set FUZZ_SEED to replay another sequence.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.transport import DEFAULT_MAX_MESSAGE_BYTES
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
SEED = int(os.environ.get("FUZZ_SEED", "20261123"))
FUZZ_SECONDS = float(os.environ.get("FUZZ_SECONDS", "20"))
FUZZ_MESSAGES = int(os.environ.get("FUZZ_MESSAGES", "1500"))
STANDARD_CODES = {-32700, -32600, -32601, -32602, -32603, *range(-32008, -32000)}
STDERR_BYTES_PER_100 = 3000
SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff", "a\ud83d", "\ude00b")
NOT_NUMBERS = ("NaN", "Infinity", "-Infinity")


@dataclass
class Line:
    raw: bytes
    expect: str | int | bool | None
    """The id an answer must carry; None: an answer, if any, carries id null; False: no answer may come."""
    kind: str


def base_messages(token: str, request_id: int) -> list[dict[str, Any]]:
    auth = {"auth": {"token": token}}
    return [
        {"jsonrpc": "2.0", "id": request_id, "method": "ping"},
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": dict(auth)},
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "list_artifacts", "arguments": {}, **auth},
        },
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "get_artifact_content", "arguments": {"run_id": "r" * 32, "name": "junit.xml"}, **auth},
        },
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "run_pytest", "arguments": {"test_path": "tests", "keyword": "k"}},
        },
        {"jsonrpc": "2.0", "id": request_id, "method": "resources/read", "params": {"uri": "mcp-gateway://x/y"}},
        {"jsonrpc": "2.0", "id": request_id, "method": "resources/list"},
        {"jsonrpc": "2.0", "id": request_id, "method": "no/such/method", "params": {}},
    ]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value under `params` (dict keys and list indexes)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _set(message: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target: Any = message
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value


def _dump(message: Any) -> bytes:
    return json.dumps(message, ensure_ascii=True).encode()


def _readable(message: dict[str, Any]) -> str | int | bool | None:
    if "id" not in message:
        return False  # a notification: never answered
    request_id = message["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    if isinstance(request_id, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in request_id):
        return None
    return request_id


def mutate(rng: random.Random, token: str, request_id: int) -> Line:
    message = rng.choice(base_messages(token, request_id))
    kind = rng.choice(
        [
            "surrogate",
            "surrogate-id",
            "surrogate-key",
            "nan",
            "huge-string",
            "deep",
            "wrong-id",
            "wrong-method",
            "wrong-params",
            "batch",
            "garbage",
            "invalid-utf8",
            "truncated",
            "near-cap",
            "notification",
            "extra-fields",
            "valid",
        ]
    )
    value_paths = [("method",), *(("params", *p) for p in _paths(message.get("params", {})))]
    if kind == "surrogate":
        path = rng.choice(value_paths)
        _set(message, path, rng.choice(SURROGATES))
    elif kind == "surrogate-id":
        message["id"] = f"id{request_id}{rng.choice(SURROGATES)}"
    elif kind == "surrogate-key":
        message.setdefault("params", {})[rng.choice(SURROGATES)] = 1
    elif kind == "nan":
        path = rng.choice(value_paths)
        _set(message, path, "@@CONSTANT@@")
        raw = _dump(message).replace(b'"@@CONSTANT@@"', rng.choice(NOT_NUMBERS).encode())
        return Line(raw + b"\n", _readable(message), kind)
    elif kind == "huge-string":
        path = rng.choice(value_paths)
        _set(message, path, "h" * rng.randint(10_000, 900_000))
    elif kind == "deep":
        depth = rng.choice([60, 65, 200, 900, 990, 1000, 5000, 50_000])
        opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
        message.setdefault("params", {})["deep"] = "@@DEEP@@"
        raw = _dump(message).replace(b'"@@DEEP@@"', (opener * depth + "1" + closer * depth).encode())
        return Line(raw + b"\n", _readable(message), kind)
    elif kind == "wrong-id":
        message["id"] = rng.choice([1.5, True, False, None, [1], {"id": 1}, -0.0])
    elif kind == "wrong-method":
        message["method"] = rng.choice([5, None, ["ping"], {"m": 1}, "", "x" * 5000])
    elif kind == "wrong-params":
        message["params"] = rng.choice(["params", 7, [1, 2], None, True])
    elif kind == "batch":
        return Line(_dump([message, message]) + b"\n", None, kind)
    elif kind == "garbage":
        garbage = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))).replace(b"\n", b" ")
        return Line(garbage + b"\n", None, kind)
    elif kind == "invalid-utf8":
        raw = _dump(message)
        cut = rng.randrange(len(raw))
        return Line(
            raw[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]) + raw[cut:] + b"\n", None, kind
        )
    elif kind == "truncated":
        raw = _dump(message)
        return Line(raw[: rng.randrange(1, len(raw))] + b"\n", None, kind)
    elif kind == "near-cap":
        message = base_messages(token, request_id)[3]
        message["params"]["arguments"] = {"pad": "@@PAD@@"}
        skeleton = _dump(message)
        size = DEFAULT_MAX_MESSAGE_BYTES + rng.randint(-3, 3)
        raw = skeleton.replace(b"@@PAD@@", b"p" * (size - len(skeleton) + len(b"@@PAD@@")))
        assert len(raw) == size
        fits = len(raw) <= DEFAULT_MAX_MESSAGE_BYTES
        return Line(raw + b"\n", request_id if fits else None, kind)
    elif kind == "notification":
        message.pop("id")
    elif kind == "extra-fields":
        message["extra"] = {"x": [1, {"y": None}]}
        message.setdefault("params", {})["_unknown"] = "?"
    return Line(_dump(message) + b"\n", _readable(message), kind)


def test_fuzzed_lines_never_stop_the_gateway(gateway: GatewayHome, open_session: SessionFactory) -> None:
    rng = random.Random(SEED)  # noqa: S311  (a replayable sequence, not a secret)
    session = open_session(gateway)
    token = gateway.token("alice", ttl_s=3600)
    outstanding: dict[Any, Line] = {}
    answered: set[Any] = set()
    null_answers = 0
    may_answer_null = 0
    deadline = time.monotonic() + FUZZ_SECONDS
    sent = 0

    def check(message: dict[str, Any], line: Line | None) -> None:
        nonlocal null_answers
        assert "method" not in message, f"unexpected request from the gateway: {message}"
        if "error" in message:
            assert message["error"]["code"] in STANDARD_CODES, (line, message)
            assert isinstance(message["error"]["message"], str), message
        else:
            assert "result" in message, message
        request_id = message.get("id")
        if request_id is None:
            null_answers += 1
            assert "error" in message, message
            return
        assert request_id in outstanding, (f"answer under an id nobody sent, or twice (seed {SEED})", message)
        expected = outstanding.pop(request_id)
        answered.add(request_id)
        assert expected.expect == request_id, (f"seed {SEED}", expected.kind, expected.raw[:300], message)

    while sent < FUZZ_MESSAGES and time.monotonic() < deadline:
        request_id = 10_000 + sent
        line = mutate(rng, token, request_id)
        sent += 1
        if line.expect is None:
            may_answer_null += 1
        elif line.expect is not False:
            outstanding[line.expect] = line
        session.send_raw(line.raw)
        sentinel = f"sentinel-{sent}"
        session.send_raw(_dump({"jsonrpc": "2.0", "id": sentinel, "method": "ping"}) + b"\n")
        while True:
            try:
                message = session.read_message(timeout=30)
            except EOFError:
                raise AssertionError(
                    f"the gateway stopped after {line.kind}: {line.raw[:300]!r} (seed {SEED})"
                ) from None
            if message.get("id") == sentinel:
                assert message.get("result") == {}, message
                break
            check(message, line)
        assert session.process.poll() is None, (line.kind, line.raw[:300])

    settle = time.monotonic() + 30
    while outstanding and time.monotonic() < settle:
        check(session.read_message(timeout=30), None)
    assert not outstanding, {k: (v.kind, v.raw[:200]) for k, v in outstanding.items()}
    assert null_answers <= may_answer_null
    assert sent >= 100, f"only {sent} lines in {FUZZ_SECONDS} s"
    print(f"fuzz: seed {SEED}, {sent} lines, {null_answers} answers under id null")
    assert session.close() == 0
    stderr = session.stderr_path.read_bytes()
    assert len(stderr) <= 2000 + STDERR_BYTES_PER_100 * sent // 100, stderr[-3000:]
    assert b"Traceback" not in stderr, stderr[-3000:]
