"""A replayed request's bytes, spliced from parts kept across turns instead of rebuilt.

`rewrite.with_messages` serializes the whole body: the fields around the messages (an agent's
tool schemas), the checkpoint's messages and the messages after it, on every turn. Only the last
part is new on a replayed turn. So the body is cut into a frame (every byte of the output but
its messages, serialized once per session: `BodyCache.memo`), the checkpoint's messages
(serialized once per stored version of the checkpoint: `PrefixBytes`, bounded), and the messages
after it (serialized each turn). Joined, they are the bytes `with_messages` gives, exactly:
orjson's compact output of a list is `[` + its items' outputs joined by `,` + `]`, and of an
object the same with any one value replaced (tests/chat/test_splice.py).

A Responses or Messages body is spliced the same way from its API's items (`native_body`): the
checkpoint's messages emitted as items once per version, the request's own messages after it
emitted each turn (with their breakpoints), and the frame. That is what rebuilding gives when
no breakpoint of the request falls on what the checkpoint replaces (then nothing of the
request's is put on, or moved onto, the checkpoint's items) and the turn's first message opens
an item of its own, or joins the checkpoint's last one, which is then emitted again with it
(tests/dialects/test_replay_fast.py). Otherwise the body is rebuilt whole.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.chat.bodycache import BodyCache
from proxy.dialects.adapter import Adapter
from proxy.dialects.incremental import Projected
from proxy.providers.chain import LONG_HISTORY
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

    def get(self, version: str, messages: Callable[[], Sequence[Any]]) -> tuple[bytes, bool]:
        """(the bytes of `messages()`, those the checkpoint of that version begins a body with,
        whether they were kept)."""
        with self._lock:
            found = self._entries.get(version)
            if found is not None:
                self._entries.move_to_end(version)
                self.hits += 1
                return found, True
        made = items(messages())
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
        prefix = self._prefix(cp.version, lambda: cp.messages)
        return spliced(parts, prefix, sent[n:])

    async def native_body(
        self,
        adapter: Adapter,
        body: Mapping[str, Any],
        sent: Sequence[Message],
        cp: Checkpoint | None,
    ) -> bytes:
        """`adapter.with_messages(body, sent)` for a Responses or Messages request read with
        its projection kept (`Incremental`), where `cp` is the stored checkpoint whose
        messages begin `sent`, if any, and the rest of `sent` is the request's own messages
        after it (see the module doc for what is spliced, and when)."""
        items = body.get(adapter.field)
        projected = None if items is None else self.bodies.recall(items, adapter.name)
        if not isinstance(projected, Projected):
            return await _per_message(items or sent, adapter.with_messages, body, sent)
        current = (projected.messages, projected.marks)
        # Rebuilding costs per message sent and of the request's own (matched by digest).
        longer = max(sent, projected.messages, key=len)
        tail = _replayed_tail(projected.messages, sent, cp)
        if cp is None or tail is None:
            return await _per_message(longer, adapter.replayed, body, current, sent, 0)
        rest = sent[len(cp.messages) :]
        head = len(projected.messages) - tail
        joins = bool(rest and cp.messages) and not adapter.opens(cp.messages[-1], rest[0])
        if (
            not cp.version
            or self.prefixes.max_bytes <= 0
            or any(projected.marks.per_message[:head])  # breakpoints in what it replaces
            or (joins and adapter.continued is None)
        ):
            return await _per_message(longer, adapter.replayed, body, current, sent, tail)
        parts = self.bodies.memo(
            projected.messages, ("frame", adapter.field), lambda: frame(body, adapter.field)
        )
        key = f"{adapter.name}:{cp.version}"
        if not joins or adapter.continued is None:
            prefix = self._prefix(key, lambda: adapter.emit(None, cp.messages, 0))
            return spliced(parts, prefix, adapter.emit(current, rest, tail))
        # The turn's first message joins the checkpoint's last one: that one is emitted again
        # with it, after the bytes of the others.
        prefix = self._prefix(f"{key}:head", lambda: adapter.emit(None, cp.messages, 0)[:-1])
        last = orjson.loads(
            b"["
            + self._prefix(f"{key}:last", lambda: adapter.emit(None, cp.messages, 0)[-1:])
            + b"]"
        )[0]
        return spliced(parts, prefix, adapter.continued(current, rest, tail, last))

    def _prefix(self, version: str, make: Callable[[], Sequence[Any]]) -> bytes:
        evicted = self.prefixes.evicted
        prefix, kept = self.prefixes.get(version, make)
        self.metrics.replay_prefix(kept=kept, evicted=self.prefixes.evicted - evicted)
        return prefix


def _replayed_tail(
    current: Sequence[Message], sent: Sequence[Message], cp: Checkpoint | None
) -> int | None:
    """How many of the request's own messages follow the checkpoint's in `sent` (the same
    objects, in order, to the end of both), or None if `sent` is not built that way."""
    if cp is None:
        return None
    n = len(cp.messages)
    tail = len(sent) - n
    if tail < 0 or tail > len(current) or cp.covered_through + 1 + tail != len(current):
        return None
    if any(a is not b for a, b in zip(sent, cp.messages, strict=False)):
        return None
    start = len(current) - tail
    if any(a is not b for a, b in zip(sent[n:], current[start:], strict=True)):
        return None
    return tail


async def _per_message(
    history: Sequence[Message], fn: Callable[..., bytes], /, *args: Any
) -> bytes:
    """`fn(*args)`, work that costs per message of `history`: in a thread if it is long."""
    if len(history) > LONG_HISTORY:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
