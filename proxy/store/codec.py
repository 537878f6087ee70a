"""How stored values are encoded, shared by every backend.

Every value carries the tenant that wrote it and is checked against the tenant reading it: if a
connection ever got out of step (the 2023 redis-py cancellation bug that leaked chats across
users), a read would raise TenantMismatchError rather than hand one tenant another's data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from proxy.errors import TenantMismatchError, UnreadableValueError
from proxy.store.base import DEFAULT_API, Checkpoint, Message, UsageDelta, UsageRecord

USAGE_METRICS = (
    "tokens_before",
    "tokens_after",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
)
SPARSE_USAGE_METRICS = ("cache_write_tokens",)
"""Counters only some APIs have (Anthropic's cache writes): kept, and shown, where not zero."""
MAX_USAGE_DAYS = 1000


def _load(raw: bytes | str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UnreadableValueError("stored value is not valid JSON") from exc
    if not isinstance(value, dict):
        raise UnreadableValueError("stored value is not an object")
    return value


def _owned(raw: bytes | str, tenant: str) -> dict[str, Any]:
    value = _load(raw)
    if value.get("t") != tenant:
        raise TenantMismatchError("a stored value belongs to another tenant")
    return value


def dump_checkpoint(cp: Checkpoint) -> bytes:
    """The stored form of a checkpoint."""
    return orjson.dumps(
        {
            "t": cp.tenant,
            "c": cp.conversation,
            "d": cp.source_digest,
            "k": cp.covered_through,
            "m": cp.messages,
            "p": cp.providers,
            "at": cp.created_at,
            "tb": cp.tokens_before,
            "ta": cp.tokens_after,
            "e": cp.ends,
            "r": cp.parts,
        }
    )


def load_checkpoint(raw: bytes | str, tenant: str) -> Checkpoint:
    """A stored checkpoint, if `tenant` wrote it and it has the shape of one."""
    v = _owned(raw, tenant)
    try:
        cp = Checkpoint(
            tenant=str(v["t"]),
            conversation=str(v["c"]),
            source_digest=str(v["d"]),
            covered_through=int(v["k"]),
            messages=list(v["m"]),
            providers=[str(p) for p in v["p"]],
            created_at=float(v["at"]),
            tokens_before=int(v.get("tb", 0)),
            tokens_after=int(v.get("ta", 0)),
            ends=[int(e) for e in v.get("e", [])],
            parts=[[str(r) for r in refs] for refs in v.get("r", [])],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableValueError(
            f"stored checkpoint is malformed ({type(exc).__name__})"
        ) from exc
    if not all(isinstance(m, dict) for m in cp.messages):
        raise UnreadableValueError("stored checkpoint has a message that is not an object")
    return cp


def dump_original(tenant: str, message: Message) -> bytes:
    """The stored form of one verbatim original message."""
    return orjson.dumps({"t": tenant, "m": message})


def load_original(raw: bytes | str, tenant: str) -> Message:
    """A stored original, if `tenant` wrote it."""
    message = _owned(raw, tenant).get("m")
    if not isinstance(message, dict):
        raise UnreadableValueError("stored original is not a message")
    return message


def dump_ref(tenant: str, digests: Sequence[str]) -> bytes:
    """The stored form of a reference id's original digests."""
    return orjson.dumps({"t": tenant, "d": list(digests)})


def load_ref(raw: bytes | str, tenant: str) -> list[str]:
    """The original digests a reference id stands for, if `tenant` wrote it."""
    digests = _owned(raw, tenant).get("d")
    if not isinstance(digests, list):
        raise UnreadableValueError("stored reference is not a list of digests")
    return [str(d) for d in digests]


_T = TypeVar("_T")


@dataclass(frozen=True)
class ConversationData:
    """A conversation's stored values as read for inspection and restore: the ones that decode,
    and the (kind, id) of each that does not, left out as absent."""

    checkpoints: list[Checkpoint]
    """Ordered by (covered_through, created_at)."""
    originals: dict[str, Message]
    refs: dict[str, list[str]]
    unreadable: list[tuple[str, str]]


def load_conversation(
    tenant: str,
    checkpoints: Iterable[tuple[str, bytes | str]],
    originals: Iterable[tuple[str, bytes | str]],
    refs: Iterable[tuple[str, bytes | str]],
) -> ConversationData:
    """Decode one conversation's (id, stored value) pairs, each on its own: one value that does
    not decode costs only itself (a restore then lists what it stood for as missing), never the
    whole conversation. A value naming another tenant still raises TenantMismatchError: that is
    a read gone out of step, and nothing of it is to be trusted. Checkpoints are keyed by source
    digest, originals by digest, refs by id."""
    unreadable: list[tuple[str, str]] = []

    def each(
        kind: str, rows: Iterable[tuple[str, bytes | str]], load: Callable[[bytes | str, str], _T]
    ) -> dict[str, _T]:
        out: dict[str, _T] = {}
        for key, raw in rows:
            try:
                out[key] = load(raw, tenant)
            except UnreadableValueError:  # (TenantMismatchError is not one: it propagates)
                unreadable.append((kind, key))
        return out

    cps = each("checkpoint", checkpoints, load_checkpoint)
    return ConversationData(
        checkpoints=sorted(cps.values(), key=lambda cp: (cp.covered_through, cp.created_at)),
        originals=each("original", originals, load_original),
        refs=each("ref", refs, load_ref),
        unreadable=unreadable,
    )


def dump_summary(tenant: str, digest: str, summary: str) -> bytes:
    """The stored form of a cached summary of what `digest` names."""
    return orjson.dumps({"t": tenant, "d": digest, "s": summary})


def load_summary(raw: bytes | str, tenant: str, digest: str) -> str | None:
    """A cached summary, if `tenant` wrote it; None if it summarizes another digest (Redis
    keys a summary by the start of its digest; values written before name none)."""
    value = _owned(raw, tenant)
    return str(value["s"]) if value.get("d", digest) == digest else None


def candidates(index: Mapping[str, int], prefix_digests: Sequence[str]) -> list[str]:
    """Source digests of known checkpoints that match this request's prefix, longest first."""
    n = len(prefix_digests)
    found = [(k, d) for d, k in index.items() if 0 <= k < n and prefix_digests[k] == d]
    return [d for _, d in sorted(found, reverse=True)]


def refresh_due(ttl: float, remaining: float) -> bool:
    """Whether using a conversation should push its expiry back: only when that moves it
    noticeably, so a busy conversation is not rewritten on every replay."""
    return ttl - remaining > min(60.0, ttl / 100)


API_SEPARATOR = "/"


def usage_increments(record: UsageRecord) -> dict[str, int]:
    """Counter name -> increment for one request (`action:<name>` counts actions,
    `fail_open:<reason>` fail-opens). A request on another API than chat completions has its
    counters under `<api>/`, so one (tenant, policy, model, day) aggregate holds every API."""
    incs = {"requests": 1, f"action:{record.action}": 1}
    if record.fail_open:
        incs[f"fail_open:{record.fail_open}"] = 1
    for metric in USAGE_METRICS:
        incs[metric] = int(getattr(record, metric))
    for metric in SPARSE_USAGE_METRICS:
        if getattr(record, metric):
            incs[metric] = int(getattr(record, metric))
    if record.api != DEFAULT_API:
        return {f"{record.api}{API_SEPARATOR}{name}": n for name, n in incs.items()}
    return incs


def usage_delta(record: UsageRecord) -> UsageDelta:
    """One request as a batch entry."""
    return UsageDelta(
        record.tenant, record.policy, record.model, record.day, usage_increments(record)
    )


def usage_row(
    tenant: str, policy: str, model: str, day: str, counters: Mapping[str, int]
) -> dict[str, Any]:
    """One aggregate as `Store.usage` returns it: chat completions' counters at the top level,
    other APIs' (if any) under `apis` as {api: counters of the same shape}."""
    by_api: dict[str, dict[str, int]] = {}
    for name, n in counters.items():
        api, _, counter = name.rpartition(API_SEPARATOR)
        by_api.setdefault(api or DEFAULT_API, {})[counter] = int(n)
    row: dict[str, Any] = {
        "tenant": tenant,
        "policy": policy,
        "model": model,
        "day": day,
        **_usage_counters(by_api.pop(DEFAULT_API, {})),
    }
    if by_api:
        row["apis"] = {api: _usage_counters(c) for api, c in sorted(by_api.items())}
    return row


def _usage_counters(counters: Mapping[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": int(counters.get("requests", 0))}
    for kind in ("action", "fail_open"):
        prefix = f"{kind}:"
        found = {
            name.removeprefix(prefix): int(n)
            for name, n in sorted(counters.items())
            if name.startswith(prefix)
        }
        if found or kind == "action":  # `fail_opens` only where a reason was recorded
            out[f"{kind}s"] = found
    for metric in USAGE_METRICS:
        out[metric] = int(counters.get(metric, 0))
    for metric in SPARSE_USAGE_METRICS:
        if counters.get(metric):
            out[metric] = int(counters[metric])
    return out


def days_since(since_day: str, today: dt.date | None = None) -> list[str]:
    """UTC days from `since_day` through tomorrow (clock skew between workers), capped."""
    try:
        start = dt.date.fromisoformat(since_day)
    except ValueError as exc:
        raise ValueError(f"since_day must be YYYY-MM-DD, not {since_day!r}") from exc
    end = (today or dt.datetime.now(dt.UTC).date()) + dt.timedelta(days=1)
    start = max(start, end - dt.timedelta(days=MAX_USAGE_DAYS))
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
