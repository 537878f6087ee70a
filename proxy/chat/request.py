"""The values one chat decision is made of: the request as read once, and what was decided.

The handler reads a request into a `ChatRequest` (raw bytes, parsed body, headers, tenant, key id,
model, conversation) exactly once; `Compactor.decide` turns it into an `Outcome` (action, the
exact bytes to send, counts, providers, error). Both are immutable: a retry after a context-length
error decides again from the same request, with the window the upstream reported.

A request's `Dialect` (`proxy.dialects.chat`) maps its body to the chat messages compaction works
on and back; the decision (replay, chain, store, fail-open) stays the same for all three APIs.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import orjson

from proxy.chat.expand import ExpandPlan
from proxy.dialects.chat import CHAT, Dialect
from proxy.runtime.digest import conversation_id, message_digest
from proxy.store.base import valid_id
from proxy.wire.tenant import Identity, Tenancy, raw_header_map

Message = dict[str, Any]
Action = Literal[
    "passthrough",
    "lossless",
    "replayed",
    "compacted",
    "bypass",
    "shadow",
    "error",
    "server-history",
]
REWRITTEN: frozenset[str] = frozenset({"lossless", "replayed", "compacted"})
"""Actions whose bytes are ours; every other action sends the client's own bytes."""

CONVERSATION_HEADER = "x-compactd-conversation-id"
MAX_MESSAGES = 50_000
"""A history of more items than this is forwarded as sent without being projected, digested,
counted or compacted (`x-compactd-error: too_many_messages`): every step costs per item, so
~900k tiny messages (a 32 MB body) held a worker for ~50 s. At this many, a 1M-token window
leaves ~20 tokens each."""
_SAFE_CONV = re.compile(r"[A-Za-z0-9._:-]{1,96}")


@dataclass(frozen=True)
class ChatRequest:
    """One request as read, once. `body` is None when the bytes are not a JSON object (they are
    forwarded as they are); `messages` is None when there is nothing to compact."""

    raw: bytes
    headers: Mapping[str, str]
    """Lower-cased names; the value of the first occurrence."""
    identity: Identity
    body: Mapping[str, Any] | None = None
    messages: Sequence[Message] | None = None
    model: str = ""
    conversation: str = ""
    dialect: Dialect = CHAT
    started: float = field(default_factory=time.perf_counter)
    oversized: bool = False
    """More history items than `MAX_MESSAGES`: none projected, digested or counted (the
    decision fails open at once)."""
    narrow: bool = False
    """Known, when it was read, to hold no integer beyond 64 bits (`BodyCache.narrow`)."""

    @property
    def tenant(self) -> str | None:
        """Whose data this request reads and writes; None: no credential, nothing is stored."""
        return self.identity.tenant

    @property
    def key_id(self) -> str:
        """The credential's public fingerprint (policies, logs)."""
        return self.identity.fingerprint


def read_request(
    raw: bytes,
    raw_headers: Sequence[tuple[bytes, bytes]],
    tenancy: Tenancy,
    dialect: Dialect = CHAT,
    parse: Callable[[bytes], Any] = orjson.loads,
    *,
    identify: bool = True,
    started: float | None = None,
    project: Callable[[Mapping[str, Any]], list[Message] | None] | None = None,
) -> ChatRequest:
    """Parse the body once and derive everything the decision needs from it and the headers
    (the tenant in one call, `Tenancy.identify`). `parse`: orjson.loads or a drop-in that
    reuses earlier parses (proxy.chat.bodycache). `identify=False`: without the conversation id
    (`with_conversation` adds it). `started`: when reading began, if before this call.
    `project`: the dialect's `messages`, or a drop-in that reuses an earlier projection."""
    started = time.perf_counter() if started is None else started
    headers = raw_header_map(raw_headers)
    identity = tenancy.identify(headers)
    frozen = MappingProxyType(headers)
    try:
        body = parse(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return ChatRequest(raw, frozen, identity, dialect=dialect, started=started)
    model = body.get("model")
    items = body.get(dialect.field)
    oversized = isinstance(items, list) and len(items) > MAX_MESSAGES
    request = ChatRequest(
        raw=raw,
        headers=frozen,
        identity=identity,
        body=body,
        messages=None if oversized else (project or dialect.messages)(body),
        model=model if isinstance(model, str) else "",
        dialect=dialect,
        started=started,
        oversized=oversized,
    )
    return with_conversation(request, tenancy.secret) if identify else request


ROLE_KEY = b'"role"'
"""How a message's role key appears in a body's bytes. Inside a JSON string a quote is always
escaped, so counting this counts objects with a role key (an escaped key, `\u0072ole`, is
missed: that body is parsed and measured as any other)."""


def cannot_compact(
    raw: bytes,
    raw_headers: Sequence[tuple[bytes, bytes]],
    tenancy: Tenancy,
    started: float,
    anonymous_bytes: int,
) -> ChatRequest | None:
    """The request of a body that cannot be compacted, known without parsing it: one without a
    credential (nothing of it may be stored) and over `anonymous_bytes` is forwarded as sent
    (smaller ones are parsed, to be counted), one with more than MAX_MESSAGES messages fails
    open (`too_many_messages`). None: parse it. A 30 MB body of 1M tiny messages cost ~130 MB
    and a second of the event loop to parse before either was known."""
    headers = raw_header_map(raw_headers)
    identity = tenancy.identify(headers)
    frozen = MappingProxyType(headers)
    if identity.tenant is None and len(raw) > anonymous_bytes:
        return ChatRequest(raw, frozen, identity, started=started)
    if len(raw) > MAX_MESSAGES * len(ROLE_KEY) and raw.count(ROLE_KEY) > MAX_MESSAGES:
        return ChatRequest(raw, frozen, identity, body={}, started=started, oversized=True)
    return None


def with_conversation(request: ChatRequest, secret: bytes = b"") -> ChatRequest:
    """The request with its conversation id: the client's, else the digest of the messages up
    to the first user message, keyed with `secret` (per message of those: `Compactor.read`
    takes a long one's in a thread)."""
    messages = request.messages
    if messages is None:
        return request
    try:
        conversation = conversation_of(request.headers.get(CONVERSATION_HEADER), messages, secret)
    except (orjson.JSONEncodeError, RecursionError):
        # Nested deeper than a digest can be taken (orjson parses 1,024 levels, serializes
        # 254): nothing to compact, the upstream judges the bytes.
        return dataclasses.replace(request, messages=None)
    return dataclasses.replace(request, conversation=conversation)


def conversation_of(header: str | None, messages: Sequence[Message], secret: bytes) -> str:
    """The conversation a request belongs to: the client's `x-compactd-conversation-id` (made
    safe as a key), else the one its messages start (keyed with the server secret)."""
    if header:
        header = header.strip()
        # "." and ".." are URL dot-segments: no path to the API could name them.
        if _SAFE_CONV.fullmatch(header) and valid_id(header) and header not in (".", ".."):
            return header
        return "h-" + message_digest({"conversation": header})[:24]
    return conversation_id(messages, secret)


@dataclass(frozen=True)
class Outcome:
    """What one decision sends upstream and reports."""

    action: Action
    content: bytes
    """The exact bytes to send."""
    policy: str = ""
    conversation: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None
    """What is sent (for `shadow`: what enforce would have sent)."""
    providers: tuple[str, ...] = ()
    error: str | None = None
    shadow_action: str = ""
    unstored: bool = False
    """Compacted although the store failed (`on_store_error = "compact-unstored"`)."""
    no_credential: bool = False
    """Over its trigger but not compacted: without a credential nothing can be stored."""
    retried: bool = False
    """The decision made again after the upstream's context-length error."""
    injected_usage: bool = False
    """compactd added stream_options.include_usage, so the relay strips the usage chunk."""
    expand: ExpandPlan | None = None
    """The request offers the expand tool: how its answer is continued (`proxy.chat.expand`)."""
    cold: bool = False
    """The conversation's prompt cache had expired: budgeted deeper (`proxy.chat.cold_cache`)."""
    answered: Callable[[int, int], None] | None = field(default=None, compare=False, repr=False)
    """Told the upstream's prompt and cached tokens (`proxy.chat.cold_cache.ColdTurn.answered`)."""

    @property
    def tokens_sent(self) -> int:
        """What compactd counted for the bytes it sends upstream (0: not counted): shadow's
        tokens_after is what enforce would have sent instead, not what went."""
        return (self.tokens_after if self.action in REWRITTEN else self.tokens_before) or 0

    def headers(self) -> dict[str, str]:
        """Values for our `x-compactd-*` response headers."""
        return {
            "action": self.action,
            "tokens-before": "" if self.tokens_before is None else str(self.tokens_before),
            "tokens-after": "" if self.tokens_after is None else str(self.tokens_after),
            "provider": "+".join(self.providers) or "none",
            "policy": self.policy,
            "conversation": self.conversation,
            "shadow-action": self.shadow_action,
            "store": "unstored" if self.unstored else "no-credential" if self.no_credential else "",
            "error": self.error or "",
            "cache": "cold" if self.cold else "",
        }
