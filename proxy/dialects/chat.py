"""The `Dialect` protocol, and Chat Completions: the dialect whose messages are the body's own.

A `Dialect` maps an API's request body to the chat messages compaction works on (its units) and
back. Chat Completions is the identity; the Responses API's items and Anthropic's content blocks
are projected by the adapters beside this module (`responses.py`, `messages.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Protocol

from proxy.dialects.projection import Counting
from proxy.providers.base import CompactionResult
from proxy.tokens.counter import TokenCounter
from proxy.wire import rewrite

Message = dict[str, Any]


class Dialect(Protocol):
    """How one API's request body maps to chat messages and back."""

    @property
    def name(self) -> str:
        """The API's name, e.g. `chat.completions`."""

    @property
    def field(self) -> str:
        """The body field that holds the history (`messages`, `input`)."""

    def messages(self, body: Mapping[str, Any]) -> list[Message] | None:
        """The body's messages as chat messages, or None if it has none we can work on."""

    @property
    def stream_usage_option(self) -> bool:
        """Whether streaming usage must be asked for (`stream_options.include_usage`)."""

    def fixed_tokens(self, counter: TokenCounter, body: Mapping[str, Any]) -> int:
        """What the request costs besides its messages (tool schemas, response format)."""

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> bytes:
        """The request's bytes with its messages replaced (`proxy.wire.rewrite.with_messages`)."""

    def history_elsewhere(self, body: Mapping[str, Any]) -> bool:
        """Whether the request continues history the server keeps (it is then never compacted:
        what is not in the request cannot be counted or kept)."""

    def counter(self, base: TokenCounter) -> Counting:
        """The counter for this API's messages, built on the model's chat counter."""

    def problems(self, original: Sequence[Message], result: CompactionResult) -> list[str]:
        """Invariants of this API a provider's result breaks (besides the chat validator's)."""

    def repair(self, original: Sequence[Message], result: CompactionResult) -> CompactionResult:
        """A provider's result with what this API forbids changing put back where it can be."""

    def set_aside(self, messages: Sequence[Message]) -> int:
        """How many final messages no provider sees (they go upstream as they are)."""


@dataclass(frozen=True)
class ChatCompletions:
    """`POST /v1/chat/completions`: the messages are the body's `messages`, as they are."""

    name: str = "chat.completions"
    field: str = "messages"
    stream_usage_option: bool = True

    def messages(self, body: Mapping[str, Any]) -> list[Message] | None:
        """The `messages` list, if every item is an object (else the upstream judges it)."""
        messages = body.get("messages")
        # map() keeps the check in C: a long history costs a few microseconds, not tens.
        if not isinstance(messages, list) or not all(map(isinstance, messages, repeat(dict))):
            return None
        return messages

    def fixed_tokens(self, counter: TokenCounter, body: Mapping[str, Any]) -> int:
        """Tool schemas and the response format."""
        return counter.count_tools(body) + counter.count_response_format(body)

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> bytes:
        """Only `messages` replaced; see `proxy.wire.rewrite.with_messages`."""
        return rewrite.with_messages(body, messages)

    def history_elsewhere(self, body: Mapping[str, Any]) -> bool:
        """Chat requests carry their whole history."""
        del body
        return False

    def counter(self, base: TokenCounter) -> Counting:
        """The chat counter itself."""
        return base

    def problems(self, original: Sequence[Message], result: CompactionResult) -> list[str]:
        """None beyond the chat validator's."""
        del original, result
        return []

    def repair(self, original: Sequence[Message], result: CompactionResult) -> CompactionResult:
        """Nothing to put back."""
        del original
        return result

    def set_aside(self, messages: Sequence[Message]) -> int:
        """None: providers see every message."""
        del messages
        return 0


CHAT = ChatCompletions()
