"""JSON views of what the store keeps, shared by the CLI, the HTTP API and the dashboard."""

from __future__ import annotations

from typing import Any

from proxy.store.base import ConversationInfo

_SUMMARY_FIELDS = (
    "tenant",
    "conversation",
    "created_at",
    "updated_at",
    "expires_at",
    "size_bytes",
    "checkpoint_count",
    "original_count",
)


def conversation_summary(info: ConversationInfo) -> dict[str, Any]:
    """One conversation in a list: ids, times, size and counts; no empty placeholder fields
    (a listing never loads checkpoints or originals, so it does not pretend to have none)."""
    return {name: getattr(info, name) for name in _SUMMARY_FIELDS}
