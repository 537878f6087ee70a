"""Pieces of bench/session.py: the recording upstream, the timed store, per-turn figures."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from proxy.store.base import Store
from tests.upstream import Ctx, FakeUpstream, respond

# Store calls made while a request waits (accounting's record_usage runs after the response).
REQUEST_PATH = frozenset({"find_checkpoint", "save_compaction", "get_summary", "put_summary"})


class Recorder:
    """A fake OpenAI upstream (tests.upstream) answering each request with the scripted reply."""

    def __init__(self) -> None:
        self.reply: dict[str, Any] = {"role": "assistant", "content": ""}
        self.upstream = FakeUpstream(default=self._answer)

    @property
    def bodies(self) -> list[bytes]:
        """The request bodies received since the last `clear`."""
        return [r.body for r in self.upstream.received]

    def clear(self) -> None:
        """Forget the bodies received so far."""
        self.upstream.received.clear()

    async def _answer(self, ctx: Ctx) -> None:
        reply = {k: v for k, v in self.reply.items() if k in ("role", "content", "tool_calls")}
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        await respond(body=body)(ctx)


class TimedStore:
    """Wraps a Store: every coroutine method is timed; request-path time is kept per request."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: dict[str, list[float]] = {}
        self._request: list[float] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await target(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - t0
                self.calls.setdefault(name, []).append(seconds)
                if name in REQUEST_PATH:
                    self._request.append(seconds)

        return timed

    def reset(self) -> None:
        """Start timing a new request."""
        self._request = []

    def request_seconds(self) -> float | None:
        """Store time the current request waited for; None if it made no store call."""
        return sum(self._request) if self._request else None


def message_spans(body: bytes) -> list[bytes]:
    """The raw bytes of each element of the body's top-level `messages` array, as sent."""
    text = body.decode()
    decoder = json.JSONDecoder()
    i = _skip(text, 0)
    if text[i] != "{":
        raise ValueError("body is not a JSON object")
    i = _skip(text, i + 1)
    while text[i] != "}":
        key, i = decoder.raw_decode(text, i)
        i = _skip(text, _skip(text, i) + 1)  # past ':'
        if key == "messages":
            return _array_spans(text, i, decoder)
        _, i = decoder.raw_decode(text, i)
        i = _skip(text, i)
        if text[i] == ",":
            i = _skip(text, i + 1)
    raise ValueError("body has no messages")


def _array_spans(text: str, i: int, decoder: json.JSONDecoder) -> list[bytes]:
    if text[i] != "[":
        raise ValueError("messages is not an array")
    spans = []
    i = _skip(text, i + 1)
    while text[i] != "]":
        _, end = decoder.raw_decode(text, i)
        spans.append(text[i:end].encode())
        i = _skip(text, end)
        if text[i] == ",":
            i = _skip(text, i + 1)
    return spans


def _skip(text: str, i: int) -> int:
    while text[i] in " \t\r\n":
        i += 1
    return i


def _is_prefix(prev: list[bytes], cur: list[bytes]) -> bool:
    return len(cur) >= len(prev) and cur[: len(prev)] == prev


def _common(prev: list[bytes], cur: list[bytes]) -> int:
    """Bytes of the leading messages both lists share (what a prompt cache could reuse)."""
    total = 0
    for a, b in zip(prev, cur, strict=False):
        if a != b:
            break
        total += len(b)
    return total


@dataclass
class TurnLog:
    """Per-turn figures of one corpus x store run."""

    sessions: int = 0
    turns: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    before: int = 0
    after: int = 0
    followups: int = 0
    """Turns with a previous turn in the same session (the prefix check applies)."""
    prefix_ok: int = 0
    canon_ok: int = 0
    quiet: int = 0
    """Follow-up turns without a compaction event."""
    quiet_ok: int = 0
    quiet_misses: list[str] = field(default_factory=list)
    shared_bytes: int = 0
    sent_bytes: int = 0
    store_seconds: list[float] = field(default_factory=list)
    miscounted: list[str] = field(default_factory=list)
    """Turns whose x-compactd-tokens-after differs from a count of the forwarded body."""
    event_ms: list[float] = field(default_factory=list)
    """x-compactd-overhead-ms of the turns with a compaction event (the trigger turns)."""
    turn_ms: list[float] = field(default_factory=list)
    """x-compactd-overhead-ms of every turn."""

    def add(
        self,
        *,
        status: int,
        action: str,
        before: int,
        after: int,
        spans: list[bytes],
        canon: list[bytes],
        previous: tuple[list[bytes], list[bytes]] | None,
        store_seconds: float | None,
        where: str,
        counted: int,
        overhead_ms: float = 0.0,
    ) -> None:
        """One turn: what the upstream received (and our count of it) and the proxy's headers."""
        self.turns += 1
        if counted != after:
            self.miscounted.append(f"{where}: header {after}, forwarded {counted}")
        self.actions[action] = self.actions.get(action, 0) + 1
        if action == "compacted":
            self.event_ms.append(overhead_ms / 1000)
        self.turn_ms.append(overhead_ms / 1000)
        self.errors += status != 200 or action == "error"
        self.before += before
        self.after += after
        self.sent_bytes += sum(len(s) for s in spans)
        if store_seconds is not None:
            self.store_seconds.append(store_seconds)
        if previous is None:
            self.sessions += 1
            return
        prev_spans, prev_canon = previous
        self.followups += 1
        ok = _is_prefix(prev_spans, spans)
        self.prefix_ok += ok
        self.canon_ok += _is_prefix(prev_canon, canon)
        self.shared_bytes += _common(prev_spans, spans)
        if action != "compacted":
            self.quiet += 1
            self.quiet_ok += ok
            if not ok:
                self.quiet_misses.append(where)


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f} %" if d else "n/a"


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0] * 1000:.2f}"
    cut = statistics.quantiles(values, n=100, method="inclusive")
    return f"{cut[round(q * 100) - 1] * 1000:.2f}"


def op_rows(corpus: str, store: str, timed: TimedStore) -> list[dict[str, Any]]:
    """Per store method: calls and p50/p99 (ms) of one corpus x store run."""
    return [
        {
            "corpus": corpus,
            "store": store,
            "op": op,
            "calls": len(values),
            "p50": _ms(values, 0.5),
            "p99": _ms(values, 0.99),
        }
        for op, values in sorted(timed.calls.items())
        if op not in ("close", "ping", "check_config")
    ]


def summarize(corpus: str, store: str, log: TurnLog) -> dict[str, Any]:
    """One table row."""
    events = log.actions.get("compacted", 0)
    return {
        "corpus": corpus,
        "store": store,
        "sessions": log.sessions,
        "turns": log.turns,
        "events_per_100": f"{100 * events / log.turns:.1f}" if log.turns else "n/a",
        "replayed": _pct(log.actions.get("replayed", 0), log.turns),
        "prefix_all": f"{_pct(log.prefix_ok, log.followups)} ({log.prefix_ok}/{log.followups})",
        "prefix_canon": _pct(log.canon_ok, log.followups),
        "prefix_quiet": f"{_pct(log.quiet_ok, log.quiet)} ({log.quiet_ok}/{log.quiet})",
        "cached_bytes": _pct(log.shared_bytes, log.sent_bytes),
        "tokens": f"{log.after:,} / {log.before:,} ({_pct(log.after, log.before)})",
        "store_ms": f"{_ms(log.store_seconds, 0.5)} / {_ms(log.store_seconds, 0.99)}"
        f" (n={len(log.store_seconds)})",
        "turn_ms": f"{_ms(log.turn_ms, 0.5)} / {_ms(log.turn_ms, 0.99)}",
        "event_ms": f"{_ms(log.event_ms, 0.5)} / {_ms(log.event_ms, 0.95)} / "
        f"{max(log.event_ms, default=0) * 1000:.2f}",
        "errors": log.errors,
        "miscounted": len(log.miscounted),
        "miscounted_at": log.miscounted[:5],
        "actions": dict(sorted(log.actions.items())),
        "quiet_misses": log.quiet_misses[:10],
    }
