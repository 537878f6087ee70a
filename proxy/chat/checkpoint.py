"""Checkpoints: which stored one a request may replay, and how a chain's result becomes one.

A checkpoint stands for the original messages [0..covered_through] of a conversation. For each of
its messages it records the originals it stands for (`ends`) and the reference ids it carries
(`parts`: none for an original kept as it is). That makes three things exact:

- replay: a checkpoint is used only if it covers a strict prefix that ends before the request's
  final unit, and keeps every message the request protects (system/developer messages, the last
  user message) as the original itself, so the forwarded request is as valid as the client's;
- building on a replayed checkpoint: every reference id of a new compaction maps to the ORIGINAL
  messages it stands for, never to an earlier placeholder, so a restore is one lookup deep
  however many compactions a conversation has had;
- restore: an original kept as is comes back by digest, a replacement as its refs' originals.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.chat.lossless import Lossless
from proxy.config import PolicySettings
from proxy.errors import CompactionError
from proxy.providers.base import CompactionResult, Message
from proxy.providers.chain import ChainOutcome
from proxy.providers.uncompress import uncompress
from proxy.providers.units import (
    final_tool_results,
    final_unit_start,
    hard_protected,
    refs_in,
)
from proxy.providers.validate import Alignment, align, pairing_problems
from proxy.runtime.digest import message_digest
from proxy.store.base import Checkpoint, Compaction, ConversationInfo
from proxy.tokens.budget import Budget


@dataclass(frozen=True)
class Restored:
    """A conversation's original messages as far as its longest checkpoint covers them."""

    checkpoint: Checkpoint
    messages: list[Message]
    """The originals [0..covered_through] as the client sent them, or, where one is missing,
    the compacted message standing for it."""
    missing_ids: list[str]
    """Every reference id (or original) that could not be resolved; empty if exact."""


def replay_problem(cp: Checkpoint, messages: Sequence[Message], digests: Sequence[str]) -> str:
    """Why `cp` must not be replayed for this request; "" if it may."""
    k = cp.covered_through
    if not 0 <= k < final_unit_start(messages):
        return "it reaches into the final unit"
    if not cp.ends:
        # Written before checkpoints recorded their structure: replay it only where it cannot
        # have touched a message this request protects (its system messages were kept then).
        protected = [i for i in hard_protected(messages) if messages[i].get("role") == "user"]
        if protected and k >= min(protected):
            return "it covers the last user message"
        return pairing_problem(cp, messages)
    return fit_problem(cp, messages, digests)


def fit_problem(cp: Checkpoint, messages: Sequence[Message], digests: Sequence[str]) -> str:
    """Whether a (structured) checkpoint, followed by the rest of this request, is a request as
    valid as the client's: it stands for these originals, keeps what this request protects, and
    pairs every tool call with its results. (The checkpoint another request stored first for the
    same prefix, first writer wins, is asked `replay_problem`: it may come from another branch,
    or from a longer request in which this request's final unit were middle messages.)"""
    return (
        structure_problem(cp, digests)
        or protected_problem(cp, messages)
        or pairing_problem(cp, messages)
    )


def pairing_problem(cp: Checkpoint, messages: Sequence[Message]) -> str:
    """Whether the checkpoint followed by the rest of the request breaks tool-call pairing
    where the client's own request did not (a branch may have dropped a call whose result this
    request goes on to send)."""
    candidate = [*cp.messages, *messages[cp.covered_through + 1 :]]
    after = pairing_problems(candidate)
    if after and after - pairing_problems(messages):  # the request's own: scanned only if needed
        return "with this request's messages after it, tool-call pairing breaks"
    return ""


def structure_problem(cp: Checkpoint, digests: Sequence[str]) -> str:
    """Whether `ends` and `parts` describe the checkpoint's messages over these originals."""
    n = len(cp.messages)
    if len(cp.ends) != n or len(cp.parts) != n or not n or cp.ends[-1] != cp.covered_through + 1:
        return "its structure does not match its messages"
    if cp.covered_through >= len(digests):
        return "it covers more messages than the request has"
    start = 0
    for message, end, refs in zip(cp.messages, cp.ends, cp.parts, strict=True):
        if end <= start:
            return "its structure does not match its messages"
        # A message without refs is an original kept as is: exactly one, and that one.
        if not refs and (end - start != 1 or message_digest(message) != digests[start]):
            return "a message it keeps is not the original it stands for"
        start = end
    return ""


def kept_originals(cp: Checkpoint) -> set[int]:
    """Indices of the originals a (structured) checkpoint keeps as they are."""
    return {end - 1 for end, refs in zip(cp.ends, cp.parts, strict=True) if not refs}


def protected_problem(cp: Checkpoint, messages: Sequence[Message]) -> str:
    """Whether a checkpoint rewrote a message this request protects (the tool results that end
    a request may be cut in place as a provider's last resort, as the validator allows; a replay
    never reaches them, since it ends before the final unit)."""
    kept = kept_originals(cp)
    for i in sorted(hard_protected(messages) - final_tool_results(messages)):
        if i <= cp.covered_through and i not in kept:
            return f"it rewrites protected message {i} ({messages[i].get('role')})"
    return ""


def compaction_for(
    *,
    messages: Sequence[Message],
    digests: Sequence[str],
    prefixes: Sequence[str],
    base: Checkpoint | None,
    result: CompactionResult,
    outcome: ChainOutcome,
    tenant: str,
    conversation: str,
    lossless: Lossless | None = None,
) -> Compaction:
    """The checkpoint, refs and originals for a chain's result over `base` + the rest of the
    request (`base` None: over the request itself). Raises CompactionError if the result cannot
    stand for the originals (it then must not be forwarded either).

    `lossless`: the chain ran on the request's lossless forms (`proxy.chat.lossless`); a form the
    result keeps is recorded under its ref, which maps to its original like any other ref."""
    replayed = list(base.messages) if base is not None else []
    offset = base.covered_through + 1 if base is not None else 0
    sent = lossless.messages if lossless is not None else messages
    form_refs = lossless.refs if lossless is not None else (None,) * len(messages)
    candidate = [*replayed, *sent[offset:]]
    # One past the last original each chain input message stands for.
    ends = [*(base.ends if base is not None else []), *range(offset + 1, len(messages) + 1)]
    starts = [0, *ends[:-1]]
    parts = [
        *(base.parts if base is not None else []),
        *([r] if r else [] for r in form_refs[offset:]),
    ]
    alignment = align(candidate, result.messages, result.verbatim)
    if isinstance(alignment, str):
        raise CompactionError(f"the chain's result does not align with its input: {alignment}")
    keep_from = max(result.covered_through + 1, len(replayed))
    if base is not None and keep_from == len(replayed) and len(candidate) > len(replayed):
        # The chain rewrote only the replayed prefix. Covering the same originals would reuse
        # the old checkpoint's source digest, and first-writer-wins would hand the old one
        # back (the request would go out uncompacted): cover one more original instead.
        keep_from += 1
    n = _prefix_length(alignment, keep_from)
    covered = ends[keep_from - 1] - 1
    cp_ends, cp_parts = [], []
    for (start, end), refs in zip(alignment.spans[:n], alignment.refs[:n], strict=True):
        cp_ends.append(ends[end - 1])
        cp_parts.append(list(refs) if refs else list(parts[start]))
    refs_map = {
        ref: list(digests[starts[s] : ends[e - 1]]) if e > s else []
        for ref, (s, e) in alignment.ref_spans.items()
    }
    for i in range(offset, covered + 1):  # the forms this checkpoint newly covers
        form_ref = form_refs[i]
        if form_ref is not None:
            refs_map.setdefault(form_ref, [digests[i]])
    cp = Checkpoint(
        tenant=tenant,
        conversation=conversation,
        source_digest=prefixes[covered],
        covered_through=covered,
        messages=list(result.messages[:n]),
        providers=list(outcome.providers),
        created_at=time.time(),
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        ends=cp_ends,
        parts=cp_parts,
    )
    problem = structure_problem(cp, digests) or protected_problem(cp, messages)
    if problem:
        raise CompactionError(f"the new checkpoint is not safe to replay: {problem}")
    # Every original of the covered span, as the client sent it in this request.
    originals = dict(zip(digests[: covered + 1], messages[: covered + 1], strict=True))
    return Compaction(checkpoint=cp, originals=originals, refs=refs_map)


def _prefix_length(alignment: Alignment, keep_from: int) -> int:
    """How many result messages stand for the chain input messages before `keep_from`."""
    for n, (_, end) in enumerate(alignment.spans, start=1):
        if end == keep_from:
            return n
        if end > keep_from:
            break
    raise CompactionError(f"no result message ends where the kept suffix starts ({keep_from})")


def worth_it(outcome: ChainOutcome, before: int, budget: Budget, policy: PolicySettings) -> bool:
    """A compaction event costs the prompt cache: only worth it if it saves enough, or if the
    request would not fit the model at all without it."""
    saved = before - outcome.tokens_after
    if saved <= 0:
        return False
    # Over budget, a small saving is worth it only if it makes the request fit; otherwise every
    # turn would pay a cache-busting compaction for a handful of tokens.
    fits_now = before > budget.budget and outcome.tokens_after <= budget.budget
    return fits_now or saved >= policy.min_saving * before


def restore(info: ConversationInfo, checkpoint: Checkpoint | None = None) -> Restored | None:
    """The originals behind the conversation's longest checkpoint (or `checkpoint`, one of its
    own), from what the store returned for it (`get_conversation`): no lookups, no depth. None
    if it has no checkpoint. A stored checkpoint that did not decode is listed as missing (it
    may have covered more), and so is every original or ref this restore needed and could not
    read."""
    if not info.checkpoints:
        return None
    cp = checkpoint or max(info.checkpoints, key=lambda c: c.covered_through)
    lost = [key for kind, key in info.unreadable if kind == "checkpoint"]

    def originals(ref: str) -> list[Message] | None:
        digests = info.refs.get(ref)
        if digests is None or any(d not in info.originals for d in digests):
            return None
        return [info.originals[d] for d in digests]

    out: list[Message] = []
    missing: list[str] = []
    if cp.ends and len(cp.parts) == len(cp.messages):
        for message, refs in zip(cp.messages, cp.parts, strict=True):
            if not refs:
                # An original kept as is: the client's own form of it, by digest.
                digest = message_digest(message)
                out.append(info.originals.get(digest, message))
                if digest not in info.originals:
                    missing.append(digest)
                continue
            found = [originals(ref) for ref in refs]
            if any(group is None for group in found):
                missing.extend(ref for ref, group in zip(refs, found, strict=True) if group is None)
                out.append(message)
                continue
            out.extend(m for group in found if group is not None for m in group)
        return Restored(cp, out, [*missing, *lost])
    # Written before checkpoints recorded their structure: follow the refs in the text.
    lookup = {ref: group for ref in info.refs if (group := originals(ref)) is not None}
    result = uncompress(cp.messages, lookup, recursive=True)
    out = [m if refs_in(m) else info.originals.get(message_digest(m), m) for m in result.messages]
    return Restored(cp, out, [*result.missing_ids, *lost])
