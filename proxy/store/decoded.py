"""Stored checkpoints decoded once per process, by their exact stored bytes.

A long conversation replays the same checkpoint on every turn until its next compaction. The
store still decides on every request WHICH checkpoint applies (a longer one another instance
wrote is found at once); only the decoding is skipped when the bytes it returned are the very
bytes decoded before. A stored checkpoint never changes in place (first writer wins), but a
purged conversation may get a different one under the same source digest: the full comparison
of the bytes (memcmp) makes that a miss, never a stale hit. The result is one Checkpoint object
for as long as its bytes stay the same, so what is derived from it (`proxy.chat.replay`) can be
remembered by its identity, and its messages' strings keep their cached hashes (token counts).

Shared checkpoints are read, never mutated (as the request path treats every message).
Memory is bounded by the stored bytes kept (`max_bytes`; the decoded form is a small multiple).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence

from proxy.store import codec
from proxy.store.base import Checkpoint, version_of

KEY_BYTES = 256
"""A stored checkpoint starts with its tenant, conversation and source digest (codec's key
order): enough to tell checkpoints apart, and the rest is compared whole on a hit."""

_Conv = tuple[str, str]


class DecodedCheckpoints:
    """`load(raw, tenant)`: `codec.load_checkpoint(raw, tenant)`, the same object for the same
    bytes, its `version` set. Thread-safe (the SQLite store decodes on its reader and writer
    threads). What it holds is also found by conversation (`known`, `get`): a store then asks
    its backend only whether the version it has is still the one stored."""

    def __init__(self, max_bytes: int = 8 << 20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[str, bytes], tuple[bytes, Checkpoint]] = OrderedDict()
        self._by_conv: dict[_Conv, dict[str, Checkpoint]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def load(self, raw: bytes | str, tenant: str) -> Checkpoint:
        """The checkpoint these stored bytes encode, if `tenant` wrote it (raises as
        `codec.load_checkpoint` does; a value that does not decode is never remembered)."""
        if isinstance(raw, str) or len(raw) > self._max_bytes:
            data = raw.encode() if isinstance(raw, str) else raw
            return dataclasses.replace(codec.load_checkpoint(raw, tenant), version=version_of(data))
        key = (tenant, raw[:KEY_BYTES])
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found[0] == raw:
                self._entries.move_to_end(key)
                self.hits += 1
                return found[1]
        cp = dataclasses.replace(codec.load_checkpoint(raw, tenant), version=version_of(raw))
        with self._lock:
            self.misses += 1
            old = self._entries.pop(key, None)
            if old is not None:
                self._drop(old)
            self._entries[key] = (raw, cp)
            self._by_conv.setdefault((cp.tenant, cp.conversation), {})[cp.source_digest] = cp
            self._bytes += len(raw)
            while self._bytes > self._max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._drop(dropped)
        return cp

    def known(
        self, tenant: str, conversation: str, prefix_digests: Sequence[str]
    ) -> Checkpoint | None:
        """The longest checkpoint held of this conversation that matches `prefix_digests`."""
        with self._lock:
            held = list(self._by_conv.get((tenant, conversation), {}).values())
        n = len(prefix_digests)
        fits = [
            cp
            for cp in held
            if 0 <= cp.covered_through < n
            and prefix_digests[cp.covered_through] == cp.source_digest
        ]
        return max(fits, key=lambda cp: cp.covered_through, default=None)

    def get(self, tenant: str, conversation: str, digest: str, version: str) -> Checkpoint | None:
        """The checkpoint held for this source digest, if it is of that version."""
        with self._lock:
            cp = self._by_conv.get((tenant, conversation), {}).get(digest)
        if cp is None or not version or cp.version != version:
            return None
        self.hits += 1
        return cp

    def _drop(self, entry: tuple[bytes, Checkpoint]) -> None:
        raw, cp = entry
        self._bytes -= len(raw)
        conv = (cp.tenant, cp.conversation)
        held = self._by_conv.get(conv, {})
        if held.get(cp.source_digest) is cp:
            del held[cp.source_digest]
            if not held:
                del self._by_conv[conv]
