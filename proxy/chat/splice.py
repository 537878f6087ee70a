"""A replayed request's bytes, spliced from parts kept across turns instead of rebuilt.

`rewrite.with_messages` serializes the whole body: the fields around the messages (an agent's
tool schemas), the checkpoint's messages and the messages after it, on every turn. Only the last
part is new on a replayed turn. So the body is cut into a frame (every byte of the output but
its messages, serialized once per session: `BodyCache.memo`), the checkpoint's messages
(serialized once per stored version of the checkpoint: `PrefixBytes`, bounded), and the messages
after it (serialized each turn). Joined, they are the bytes `with_messages` gives, exactly:
orjson's compact output of a list is `[` + its items' outputs joined by `,` + `]`, and of an
object the same with any one value replaced (tests/chat/test_splice.py).
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.chat.bodycache import BodyCache
from proxy.store.base import Checkpoint
from proxy.telemetry.metrics import Metrics
from proxy.wire.rewrite import with_messages

Message = dict[str, Any]
Frame = tuple[bytes, bytes]


def frame(body: Mapping[str, Any], field: str) -> Frame:
    """The bytes `orjson.dumps(body)` gives before and after the value of `field`."""
    # A fresh random marker cannot occur in a client's values: the split is unambiguous.
    marker = f"\x00compactd-splice-{secrets.token_hex(16)}"
    out = dict(body)
    out[field] = marker
    whole = orjson.dumps(out)
    mark = orjson.dumps(marker)
    at = whole.index(mark)
    return whole[:at], whole[at + len(mark) :]


def items(messages: Sequence[Message]) -> bytes:
    """The bytes of the items of `orjson.dumps(list(messages))`, without the brackets."""
    return orjson.dumps(list(messages))[1:-1] if messages else b""


def spliced(parts: Frame, prefix: bytes, rest: Sequence[Message]) -> bytes:
    """The body: its frame around `[prefix, rest...]` (`prefix`: items' bytes, maybe empty)."""
    after = items(rest)
    sep = b"," if prefix and after else b""
    return b"".join((parts[0], b"[", prefix, sep, after, b"]", parts[1]))


class PrefixBytes:
    """Checkpoint version -> its messages' bytes (`items`), least recently used out past
    `max_bytes`. Thread-safe (counted in a thread for long histories)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evicted = 0

    def get(self, version: str, messages: Sequence[Message]) -> tuple[bytes, bool]:
        """(the bytes of `messages`, the checkpoint of that version's, whether they were kept)."""
        with self._lock:
            found = self._entries.get(version)
            if found is not None:
                self._entries.move_to_end(version)
                self.hits += 1
                return found, True
        made = items(messages)
        with self._lock:
            self.misses += 1
            if not version or len(made) > self.max_bytes:
                return made, False
            old = self._entries.pop(version, None)
            self._bytes += len(made) - (len(old) if old is not None else 0)
            self._entries[version] = made
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
                self.evicted += 1
        return made, False

    @property
    def size(self) -> int:
        """Bytes held."""
        return self._bytes


class Splicer:
    """Chat bodies with their messages replaced, spliced where a checkpoint begins them."""

    def __init__(self, bodies: BodyCache, max_bytes: int, metrics: Metrics) -> None:
        self.bodies = bodies
        self.prefixes = PrefixBytes(max_bytes)
        self.metrics = metrics

    def chat_body(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message] | None,
        sent: Sequence[Message],
        cp: Checkpoint | None,
    ) -> bytes:
        """`with_messages(body, sent)`, where `messages` are the body's own (from the body
        cache's parse) and `cp` the stored checkpoint whose messages begin `sent`, if any."""
        n = 0 if cp is None else len(cp.messages)
        if (
            cp is None
            or not cp.version
            or self.prefixes.max_bytes <= 0
            or len(sent) < n
            or any(a is not b for a, b in zip(sent, cp.messages, strict=False))
        ):
            return with_messages(body, sent)
        # The frame depends only on the fields around the messages: kept with the body's bytes.
        parts = self.bodies.memo(
            messages if messages is not None else sent, "frame", lambda: frame(body, "messages")
        )
        evicted = self.prefixes.evicted
        prefix, kept = self.prefixes.get(cp.version, cp.messages)
        self.metrics.replay_prefix(kept=kept, evicted=self.prefixes.evicted - evicted)
        return spliced(parts, prefix, sent[n:])
