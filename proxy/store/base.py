"""The store interface every backend implements; one contract test suite runs against each."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.errors import TenantMismatchError, UnreadableValueError

Message = dict[str, Any]

INSPECTION_TIMEOUT_SECONDS = 10.0
"""Calls off the request path (get/list/purge/usage/resolve_refs: API, CLI) may take this long
even when the configured store timeout, which bounds what a proxied request waits, is 200 ms."""

# Ids become parts of Redis keys and hash tags: no braces, whitespace or control characters.
_ID_PATTERN = re.compile(r"[A-Za-z0-9._:@=+/-]{1,128}")


def valid_id(value: str) -> bool:
    """Whether a tenant or conversation id is safe to use as part of a store key."""
    return _ID_PATTERN.fullmatch(value) is not None


_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")
_DIGEST_CHARS = 12


def key_name(text: str, limit: int) -> str:
    """A client-chosen name (a model) as key material: printable ASCII, at most `limit` chars.

    A longer name keeps its start plus a digest of the whole, so distinct names stay distinct
    but bounded; nothing a client sends can make a key of megabytes."""
    head = _UNPRINTABLE.sub("?", text[: limit + 1]) or "unknown"
    if len(text) <= limit:
        return head
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    return f"{head[: max(limit - _DIGEST_CHARS - 1, 1)]}~{digest}"


def check_ids(tenant: str | None, conversation: str) -> None:
    """Raise ValueError unless the ids are safe key parts (a client sends conversation ids)."""
    if tenant is not None and not valid_id(tenant):
        raise ValueError(f"invalid tenant id {tenant[:40]!r}")
    if not valid_id(conversation):
        raise ValueError(f"invalid conversation id {conversation[:40]!r}")


def version_of(stored: bytes) -> str:
    """The version of a stored checkpoint: `<SHA-1 of its bytes>:<their length>` (Redis's
    `sha1hex`; the length lets a store check it against the stored value's in O(1), so a
    value overwritten behind compactd's back at another length is read again)."""
    return f"{hashlib.sha1(stored, usedforsecurity=False).hexdigest()}:{len(stored)}"


def version_length(version: str) -> int:
    """The stored length a version names (-1 if it names none)."""
    _, _, length = version.partition(":")
    return int(length) if length.isdigit() else -1


DEFAULT_API = "chat.completions"
"""The API of usage counters stored without an API prefix (all of them, before APIs were told
apart)."""


@dataclass(frozen=True)
class Checkpoint:
    """Original messages [0..covered_through] of a conversation are replaced by `messages`."""

    tenant: str
    conversation: str
    source_digest: str
    """Rolling prefix digest of the original messages [0..covered_through]
    (see proxy.runtime.digest)."""
    covered_through: int
    messages: list[Message]
    """The compacted prefix, replayed verbatim on every later turn."""
    providers: list[str]
    created_at: float
    tokens_before: int = 0
    tokens_after: int = 0
    ends: list[int] = field(default_factory=list)
    """Per message: one past the last original it stands for (the last is covered_through + 1).
    Empty for a checkpoint written before this was recorded (replayed, never built upon)."""
    parts: list[list[str]] = field(default_factory=list)
    """Per message: the reference ids it stands for, in order; [] for an original kept as is."""
    version: str = field(default="", compare=False)
    """Which stored bytes it was read from (`version_of` them; "" if not read from a store):
    a store answers "the same checkpoint, this version" instead of sending it again."""


@dataclass(frozen=True)
class Compaction:
    """Everything one compaction writes, atomically: originals + reference map + checkpoint."""

    checkpoint: Checkpoint
    originals: dict[str, Message]
    """Message digest -> verbatim original message (content-addressed per tenant)."""
    refs: dict[str, list[str]]
    """Reference id -> digests of the ORIGINAL messages it stands for, in order (never of an
    earlier placeholder: a restore is one lookup however many compactions came before)."""


@dataclass(frozen=True)
class ConversationInfo:
    """What the store knows about one conversation."""

    tenant: str
    conversation: str
    created_at: float
    updated_at: float
    checkpoints: list[Checkpoint] = field(default_factory=list)
    originals: dict[str, Message] = field(default_factory=dict)
    refs: dict[str, list[str]] = field(default_factory=dict)
    size_bytes: int = 0
    """Bytes of stored checkpoints, originals and refs (the values, as the store keeps them)."""
    expires_at: float = 0.0
    """When retention deletes it unless it is used again (epoch seconds)."""
    checkpoint_count: int = 0
    original_count: int = 0
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    """(kind, id) of every stored value left out above because it does not decode: kind
    "checkpoint" (id: its source digest), "original" (its digest) or "ref"."""


@dataclass(frozen=True)
class UsageRecord:
    """Accounting for one request, aggregated per (tenant, policy, model, day)."""

    tenant: str
    policy: str
    model: str
    day: str
    """UTC date, YYYY-MM-DD."""
    action: str
    tokens_before: int
    tokens_after: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cache_write_tokens: int = 0
    """The part of `prompt_tokens` written to the prompt cache (Anthropic bills it above input)."""
    api: str = DEFAULT_API
    """The API the request came in on (the decision's dialect, e.g. `chat.completions`)."""
    fail_open: str = ""
    """With action `error`: why it failed open, as the metric's bounded reason (`provider` ...)."""


@dataclass(frozen=True)
class UsageDelta:
    """Counters to add to one (tenant, policy, model, day) aggregate: `requests`,
    `action:<name>` and the token counters (see `codec.usage_increments`)."""

    tenant: str
    policy: str
    model: str
    day: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class ActivityDelta:
    """What one worker saw of one conversation since its last flush (every request the upstream
    accepted, compacted or not): the API and model it last used, and counters to add."""

    tenant: str
    conversation: str
    api: str
    model: str
    seen_at: float
    """Epoch seconds of the latest request."""
    counters: Mapping[str, int]
    """`ACTIVITY_FIELDS` to add (a missing one adds 0)."""


ACTIVITY_FIELDS = ("requests", "compactions", "tokens_before", "tokens_after")
"""Requests; those that compacted (a new checkpoint); tokens as the clients sent them and as
compactd forwarded them in their place: added up per conversation."""


class Store(Protocol):
    """Async store interface. Every method is scoped to a tenant; `tenant=None` means admin."""

    async def find_checkpoint(
        self, tenant: str, conversation: str, prefix_digests: list[str]
    ) -> Checkpoint | None:
        """The checkpoint with the largest covered_through whose source_digest equals
        prefix_digests[covered_through]; at most two round trips, not one per message."""

    async def save_compaction(self, compaction: Compaction, ttl_seconds: int) -> Checkpoint:
        """Write originals, refs and checkpoint in one atomic step (all or nothing).

        First writer wins: if a checkpoint for the same source digest already exists it is kept
        (its originals and refs are still written, so the caller's ref ids resolve) and returned;
        the caller should forward the returned checkpoint's messages, not its own."""

    async def save_originals(
        self,
        tenant: str,
        conversation: str,
        originals: Mapping[str, Message],
        refs: Mapping[str, list[str]],
        ttl_seconds: int,
    ) -> None:
        """Write originals (digest -> message) and refs (ref id -> digests) without a
        checkpoint, in one atomic step: what the lossless tier forwards outside every
        checkpoint. Idempotent (both are content-addressed); pushes the conversation's expiry
        back like a compaction."""

    async def resolve_refs(self, tenant: str, ref_ids: list[str]) -> dict[str, list[Message]]:
        """Reference id -> original messages, for the ids this tenant owns (others omitted)."""

    async def ref_conversations(self, tenant: str, ref_ids: list[str]) -> dict[str, list[str]]:
        """Reference id -> the live conversations of this tenant that store it."""

    async def get_conversation(
        self, tenant: str | None, conversation: str
    ) -> ConversationInfo | None:
        """Metadata, checkpoints and originals of a conversation; None if absent or not visible.
        Admin (None): the most recently used conversation of that id across tenants."""

    async def list_conversations(self, tenant: str | None) -> list[ConversationInfo]:
        """Conversations visible to this tenant (all for admin), without originals."""

    async def purge(self, tenant: str | None, conversation: str) -> bool:
        """Delete a conversation and everything only it references; True if it existed.
        Admin (None): every tenant's conversation of that id."""

    async def get_summary(self, tenant: str, digest: str) -> str | None:
        """A cached LLM summary by source digest."""

    async def put_summary(self, tenant: str, digest: str, summary: str, ttl_seconds: int) -> None:
        """Cache an LLM summary by source digest."""

    async def record_usage(self, record: UsageRecord) -> None:
        """Add one request to its (tenant, policy, model, day) aggregate."""

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        """Add a batch of aggregates in one step, on a path of its own: it never holds a
        connection, lock or thread that a compaction write waits for."""

    async def usage(self, tenant: str | None, since_day: str) -> list[dict[str, Any]]:
        """Aggregates from `since_day` on: one dict per (tenant, policy, model, day) with keys
        tenant, policy, model, day, requests, actions ({action: count}), tokens_before,
        tokens_after, prompt_tokens, cached_tokens, completion_tokens (chat completions'), and
        where recorded fail_opens ({reason: count}) and apis ({api: the same counters})."""

    async def add_activity(self, deltas: Sequence[ActivityDelta], ttl_seconds: int) -> None:
        """Add a batch of conversations' activity; each is kept `ttl_seconds` after its last
        request (every conversation, compacted or not: what the listing shows)."""

    async def activity(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        """The `limit` most recently active conversations of a tenant (admin: of all), newest
        first: tenant, conversation, api, model, first_seen, last_seen and the counters."""

    async def put_window(self, scope: str, model: str, window: int, ttl_seconds: int) -> None:
        """Record a context window learned from an upstream (scope) for a model, expiring after
        `ttl_seconds`; the latest write wins."""

    async def windows(self, scope: str) -> dict[str, int]:
        """Every unexpired learned window of a scope: model -> window."""

    async def put_calibration(self, api: str, model: str, ratio: float, ttl_seconds: int) -> None:
        """Record an API's learned token-count ratio for a model (`proxy.tokens.calibration`),
        expiring after `ttl_seconds`; the latest write wins."""

    async def calibrations(self, api: str) -> dict[str, float]:
        """Every unexpired calibration ratio of an API: model -> ratio."""

    async def ping(self) -> None:
        """Raise StoreError unless the store answers."""

    async def check_config(self) -> list[str]:
        """Warnings about settings that risk losing stored originals (for the start-up log)."""

    async def close(self) -> None:
        """Release connections."""


async def resolve_readable(
    store: Store, tenant: str, ref_ids: list[str]
) -> dict[str, list[Message]]:
    """`store.resolve_refs`, where a stored value that does not decode (or names another
    tenant) loses only its own id, as absent: the batch is retried one id at a time. For the
    uncompress API and the expand tool alike."""
    try:
        return await store.resolve_refs(tenant, ref_ids)
    except (UnreadableValueError, TenantMismatchError):
        if len(ref_ids) == 1:
            return {}
    found: dict[str, list[Message]] = {}
    for ref in ref_ids:
        found.update(await resolve_readable(store, tenant, [ref]))
    return found
