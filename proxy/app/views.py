"""JSON views of what the store keeps, shared by the CLI, the HTTP API and the dashboard."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from proxy.chat.checkpoint import Restored, restore
from proxy.dialects import restore as shapes
from proxy.providers.units import refs_in
from proxy.store.base import Checkpoint, ConversationInfo, Message

CHAT = "chat.completions"

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


_ACTIVITY_FIELDS = ("api", "model", "requests", "compactions", "tokens_before", "tokens_after")


def conversation_list(
    infos: list[ConversationInfo], activity: list[dict[str, Any]], *, every: bool
) -> list[dict[str, Any]]:
    """The conversation list: each stored (compacted) conversation with its activity (API,
    model, requests, tokens before and after, saved) where recorded; with `every`, also the
    conversations that never compacted (nothing stored: only their activity). Most recently
    used first."""
    seen = {(a["tenant"], a["conversation"]): a for a in activity}
    out = []
    for info in infos:
        row = {**conversation_summary(info), "compacted": True}
        found = seen.pop((info.tenant, info.conversation), None)
        out.append(_with_activity(row, found))
    if every:
        for found in seen.values():
            row = {
                "tenant": found["tenant"],
                "conversation": found["conversation"],
                "created_at": found["first_seen"],
                "updated_at": found["last_seen"],
                "checkpoint_count": 0,
                "original_count": 0,
                "size_bytes": 0,
                "compacted": False,
            }
            out.append(_with_activity(row, found))
    out.sort(key=lambda r: -float(r["updated_at"]))
    return out


def _with_activity(row: dict[str, Any], found: dict[str, Any] | None) -> dict[str, Any]:
    if found is None:
        return {**row, **dict.fromkeys(_ACTIVITY_FIELDS), "tokens_saved": None}
    row.update({k: found[k] for k in _ACTIVITY_FIELDS})
    row["tokens_saved"] = found["tokens_before"] - found["tokens_after"]
    row["updated_at"] = max(float(row["updated_at"]), float(found["last_seen"]))
    return row


def conversation_api(info: ConversationInfo) -> str:
    """The API a stored conversation came through, by the items its messages carry."""
    stored = [*info.originals.values(), *(m for cp in info.checkpoints for m in cp.messages)]
    return shapes.api_of(stored)


def restored_json(info: ConversationInfo, restored: Restored | None) -> dict[str, Any]:
    """A restore (`compactd restore`, GET of a Responses or Messages conversation): the
    conversation's `api`, and its originals in that API's own shape, as the client sent them."""
    # No checkpoint that decodes: nothing restored, and every unreadable value says why.
    missing = restored.missing_ids if restored else [key for _, key in info.unreadable]
    api = conversation_api(info)
    return {
        "api": api,
        "covered_through": restored.checkpoint.covered_through if restored else -1,
        **shapes.write(api, restored.messages if restored else []),
        "missing_ids": missing,
    }


def conversation_json(info: ConversationInfo) -> dict[str, Any]:
    """One conversation with its checkpoints and originals (`GET .../conversations/{id}`).

    A chat conversation is shown as stored. A Responses or Messages one is stored as chat
    projections of the client's items; it is shown as those items instead: each checkpoint's
    forwarded items under the API's own key, and the restore of the longest checkpoint (no
    digest-keyed `originals`: a Messages message can span several projections).
    """
    out = dataclasses.asdict(info)
    api = conversation_api(info)
    if api == CHAT:
        return out
    for cp in out["checkpoints"]:
        cp.update(shapes.write(api, cp.pop("messages")))
    del out["originals"], out["refs"]
    return {**out, **restored_json(info, restore(info))}


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
    api = conversation_api(info)
    views = [_checkpoint_view(n, cp, info, count) for n, cp in enumerate(checkpoints, start=1)]
    if api != CHAT:
        # What the download saves: the client's own items, which the page cannot rebuild.
        for view, cp in zip(views, checkpoints, strict=True):
            restored = restore(info, cp)
            view["restored"] = shapes.write(api, restored.messages if restored else [])
    return {**conversation_summary(info), "api": api, "checkpoints": views, "originals": originals}


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
