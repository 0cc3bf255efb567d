"""Canonical JSON and the argument hash of spec section 8 (sorted keys, no spaces, UTF-8)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def args_hash(arguments: Any) -> str:
    return sha256_hex(canonical_json(arguments if arguments is not None else {}))
