"""The plugin API's digests, computed faster: the same bytes as `base.canonical_json`.

`base` is standard library only, so third-party providers depend on nothing else; its JSON
encoder costs ~3 ms for a 100k-token history, which every compaction paid twice or more. For
the values a parsed request holds, orjson with sorted keys writes exactly those bytes (the same
escapes for every code point, the same key order) except for floats, which the two format
differently, and values orjson refuses (integers beyond 64 bits, non-string keys). Those go to
the standard library; everything else to orjson.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.providers.base import Message, canonical_json

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def _plain(value: Any) -> bool:
    """Whether orjson writes `value` exactly as `canonical_json` does (no floats, no ints beyond
    64 bits, string keys only)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(_INT_MIN <= value <= _INT_MAX)
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind is list:
        return all(_plain(v) for v in value)
    return False


def canonical_bytes(value: Any) -> bytes:
    """`canonical_json(value)`."""
    if _plain(value):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return canonical_json(value)


def source_digest(messages: Sequence[Message]) -> str:
    """`compute_source_digest(messages)`."""
    return hashlib.sha256(canonical_bytes(list(messages))).hexdigest()


def ref_id(originals: Sequence[Message]) -> str:
    """`make_ref_id(originals)`."""
    return source_digest(originals)[:10]


class Digests:
    """Digests of slices of one conversation, each message serialized once: a fit folds runs
    of the same messages again on every round, and walking them for floats costs more than
    hashing them."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self._messages = messages
        self._parts: dict[int, bytes | None] = {}

    def source_digest(self, start: int, end: int) -> str:
        """`source_digest(messages[start:end])`."""
        parts = [p for p in map(self._part, range(start, end)) if p is not None]
        if len(parts) < end - start:
            return source_digest(self._messages[start:end])
        # orjson writes a list as its items' own bytes, comma-separated, in brackets. Hashed
        # part by part, not joined: sha256 lets other threads run while it hashes a big part,
        # a join of megabytes would not.
        digest = hashlib.sha256(b"[")
        for k, part in enumerate(parts):
            if k:
                digest.update(b",")
            digest.update(part)
        digest.update(b"]")
        return digest.hexdigest()

    def ref_id(self, start: int, end: int) -> str:
        """`ref_id(messages[start:end])`."""
        return self.source_digest(start, end)[:10]

    def _part(self, i: int) -> bytes | None:
        if i not in self._parts:
            message = self._messages[i]
            plain = _plain(message)
            self._parts[i] = orjson.dumps(message, option=orjson.OPT_SORT_KEYS) if plain else None
        return self._parts[i]
