"""The plugin API: what a compression provider is given and what it must return.

Standard library only, so a third-party provider depends on nothing but this module (and what
it re-exports: the marker forms of `proxy.providers.markers`, `OptionError` of `proxy.errors`).
Messages are plain OpenAI chat message dicts; providers must not mutate the lists or dicts they
are given.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from proxy.errors import OptionError  # re-exported: a provider raises it to name a key
from proxy.providers.markers import (
    DROPPED_PATTERN,
    REF_PATTERN,
    dropped_marker,
    ref_marker,
    short_marker,
)
from proxy.runtime.options import option, parse

__all__ = [
    "DROPPED_PATTERN",
    "REF_PATTERN",
    "CompactionResult",
    "Completer",
    "CompressionConfig",
    "ContextProvider",
    "Message",
    "MessageCounter",
    "OptionError",
    "RequestCounter",
    "SummaryCache",
    "canonical_json",
    "compute_source_digest",
    "dropped_marker",
    "make_ref_id",
    "option",
    "parse_options",
    "ref_marker",
    "short_marker",
]

Message = dict[str, Any]
"""One OpenAI chat message (`role`, `content`, optional `tool_calls`, `tool_call_id`, `name` …)."""

RequestCounter = Callable[[Sequence[Message]], int]
"""Tokens the whole request would cost with these messages (tool schemas and priming included)."""

MessageCounter = Callable[[Message], int]
"""Tokens one message costs inside a request (per-message overhead included)."""

Completer = Callable[[list[Message], str, float], Awaitable[str]]
"""Calls the upstream chat model: (messages, model, timeout seconds) -> the reply's text."""


class SummaryCache(Protocol):
    """Where an LLM-backed provider keeps summaries by source digest (the store implements it)."""

    async def get(self, digest: str) -> str | None:
        """The cached summary for this digest, if any."""

    async def put(self, digest: str, summary: str) -> None:
        """Keep a summary for this digest."""


@dataclass(frozen=True)
class CompressionConfig:
    """Everything a provider needs to know about one compaction."""

    limit: int
    """Target: the request should cost at most this many tokens after compaction."""
    budget: int
    """The hard budget the request must fit (limit <= budget)."""
    count_tokens: RequestCounter
    count_message: MessageCounter
    model: str = "gpt-4o"
    max_tool_result_tokens: int = 2000
    reasoning_strip_age_threshold: int = 3
    keep_head: int = 0
    """Messages after the system/developer prefix that are never dropped."""
    recency_turns: int = 2
    """Most recent user turns (a user message and everything after it) kept verbatim."""
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    complete: Completer | None = None
    summary_cache: SummaryCache | None = None


@dataclass
class CompactionResult:
    """A provider's output: the new message list and exactly what it replaced."""

    messages: list[Message]
    source_digest: str
    covered_through: int = -1
    """Index of the last input message that was rewritten or dropped; -1 if none was."""
    verbatim: dict[str, list[Message]] = field(default_factory=dict)
    """Reference id -> the original messages it stands for, in order."""
    limitations: list[str] = field(default_factory=list)
    """Human-readable notes about what was lost (e.g. "tool results truncated")."""


T = TypeVar("T")


def parse_options(schema: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """`values` (a policy's options for one provider) as an instance of the dataclass `schema`.

    Field types may be bool, int, float (an int is accepted), str, a `Literal` of strings,
    tuple[X, ...] (from a list), a nested option dataclass (from a table), `Mapping[str, Any]`
    (any table, unchecked) or any of these `| None`. Unknown keys, wrong types and values outside
    a field's `option()` bounds raise OptionError naming the key, dotted from `prefix`. It is the
    validator the config file is loaded with (`proxy.runtime.options.parse`).
    """
    return parse(schema, values, prefix, noun="option")


class ContextProvider(ABC):
    """A compression strategy. Subclasses set `name` and implement `compress`."""

    option_schema: ClassVar[type[Any] | None] = None
    """A frozen dataclass whose fields are this provider's options (see `parse_options`): the
    host checks every policy's options against it at start-up, so each key is typed, bounded and
    named in errors; `parse_options(schema, config.extra_config)` gives the typed values."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Unique identifier used in config and the `x-compactd-provider` header."""

    def should_compress(self, messages: list[Message], config: CompressionConfig) -> bool:
        """Whether this provider has work to do; by default, whether the request is over target."""
        return config.count_tokens(messages) > config.limit

    @abstractmethod
    def compress(
        self, messages: list[Message], config: CompressionConfig
    ) -> CompactionResult | Awaitable[CompactionResult]:
        """Return a compacted copy of `messages`; may be `async`. Never mutate the input."""

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise ValueError (OptionError to name a key) for options the schema cannot judge.

        Called at start-up (and by `compactd check-config`) for every policy that uses the
        provider, after its `option_schema` (if any) accepted them, so a misspelled option stops
        the server instead of being silently ignored.
        """
        del options


def canonical_json(value: Any) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def compute_source_digest(messages: Sequence[Message]) -> str:
    """SHA-256 hex of the canonical form of a message list."""
    return hashlib.sha256(canonical_json(list(messages))).hexdigest()


def make_ref_id(originals: Sequence[Message]) -> str:
    """Deterministic short reference id for a group of original messages."""
    return compute_source_digest(originals)[:10]
