"""JSON views of what the store keeps, shared by the CLI, the HTTP API and the dashboard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.providers.units import refs_in
from proxy.store.base import Checkpoint, ConversationInfo, Message

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


def inspection(info: ConversationInfo, count: Callable[[Message], int]) -> dict[str, Any]:
    """One conversation for the inspector: every checkpoint, oldest first, message by message,
    with what each forwarded message stands for and every message's token count.

    Each original appears once, under `originals` (digest -> message and tokens); a checkpoint's
    row names, per reference id its forwarded message carries, the digests of the originals it
    replaced, in order (`stands_for`: [{ref, digests}]), and the span of original positions it
    covers (`first`..`last`). A row with no `refs` is an original kept as it was. Ids a
    checkpoint refers to that the store no longer has are listed in `missing`.
    """
    originals = {
        digest: {"message": message, "tokens": count(message)}
        for digest, message in info.originals.items()
    }
    checkpoints = sorted(info.checkpoints, key=lambda c: (c.covered_through, c.created_at))
    return {
        **conversation_summary(info),
        "checkpoints": [
            _checkpoint_view(n, cp, info, count) for n, cp in enumerate(checkpoints, start=1)
        ],
        "originals": originals,
    }


def _checkpoint_view(
    number: int, cp: Checkpoint, info: ConversationInfo, count: Callable[[Message], int]
) -> dict[str, Any]:
    rows, missing, start = [], [], 0
    for i, message in enumerate(cp.messages):
        refs = list(cp.parts[i]) if i < len(cp.parts) else refs_in(message)
        stands_for: list[dict[str, Any]] = []
        for ref in refs:
            digests = info.refs.get(ref)
            if digests is None:
                missing.append(ref)
                continue
            stands_for.append({"ref": ref, "digests": [d for d in digests if d in info.originals]})
            missing.extend(d for d in digests if d not in info.originals)
        covered = sum(len(g["digests"]) for g in stands_for) if refs else 1
        end = cp.ends[i] if i < len(cp.ends) else start + covered
        rows.append(
            {
                "message": message,
                "tokens": count(message),
                "refs": refs,
                "stands_for": stands_for,
                "first": start,
                "last": end - 1,
            }
        )
        start = end
    return {
        "number": number,
        "covered_through": cp.covered_through,
        "created_at": cp.created_at,
        "providers": list(cp.providers),
        "tokens_before": cp.tokens_before,
        "tokens_after": cp.tokens_after,
        "rows": rows,
        "missing": list(dict.fromkeys(missing)),
    }
