"""Stored checkpoints decoded once per process, by their exact stored bytes.

A long conversation replays the same checkpoint on every turn until its next compaction. The
store still decides on every request WHICH checkpoint applies (a longer one another instance
wrote is found at once); only the decoding is skipped when the bytes it returned are the very
bytes decoded before. A stored checkpoint never changes in place (first writer wins), but a
purged conversation may get a different one under the same source digest: the full comparison
of the bytes (memcmp) makes that a miss, never a stale hit. The result is one Checkpoint object
for as long as its bytes stay the same, so what is derived from it (`proxy.replay`) can be
remembered by its identity, and its messages' strings keep their cached hashes (token counts).

Shared checkpoints are read, never mutated (as the request path treats every message).
Memory is bounded by the stored bytes kept (`max_bytes`; the decoded form is a small multiple).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from proxy.store import codec
from proxy.store.base import Checkpoint

KEY_BYTES = 256
"""A stored checkpoint starts with its tenant, conversation and source digest (codec's key
order): enough to tell checkpoints apart, and the rest is compared whole on a hit."""


class DecodedCheckpoints:
    """`load(raw, tenant)`: `codec.load_checkpoint(raw, tenant)`, the same object for the same
    bytes. Thread-safe (the SQLite store decodes on its reader and writer threads)."""

    def __init__(self, max_bytes: int = 8 << 20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[str, bytes], tuple[bytes, Checkpoint]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def load(self, raw: bytes | str, tenant: str) -> Checkpoint:
        """The checkpoint these stored bytes encode, if `tenant` wrote it (raises as
        `codec.load_checkpoint` does; a value that does not decode is never remembered)."""
        if isinstance(raw, str) or len(raw) > self._max_bytes:
            return codec.load_checkpoint(raw, tenant)
        key = (tenant, raw[:KEY_BYTES])
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found[0] == raw:
                self._entries.move_to_end(key)
                self.hits += 1
                return found[1]
        cp = codec.load_checkpoint(raw, tenant)
        with self._lock:
            self.misses += 1
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0])
            self._entries[key] = (raw, cp)
            self._bytes += len(raw)
            while self._bytes > self._max_bytes:
                _, (dropped, _) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
        return cp
