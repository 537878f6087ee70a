"""A real token counter for provider tests (the app's TokenCounter replaces it in production)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import tiktoken

from proxy.providers.base import CompressionConfig, Message
from proxy.tokens.encodings import load_encoding


@functools.cache
def encoding() -> tiktoken.Encoding:
    """o200k_base, loaded offline once per test session."""
    return load_encoding("o200k_base")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def count_message(message: Message) -> int:
    """3 tokens of overhead plus the tokens of every string in the message."""
    return 3 + sum(_count_string(s) for s in _strings(message))


@functools.lru_cache(maxsize=65536)
def _count_string(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))


def count_tokens(messages: Sequence[Message]) -> int:
    """Every message plus the 3 tokens that prime the reply."""
    return 3 + sum(count_message(m) for m in messages)


def make_config(limit: int, budget: int | None = None, **kwargs: Any) -> CompressionConfig:
    """A CompressionConfig counting with o200k_base."""
    return CompressionConfig(
        limit=limit,
        budget=limit if budget is None else budget,
        count_tokens=count_tokens,
        count_message=count_message,
        **kwargs,
    )
