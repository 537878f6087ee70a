"""From a chain's result to a checkpoint: what a compaction replaces, and whether it is worth it."""

from __future__ import annotations

import time

from proxy.budget import Budget
from proxy.config import PolicySettings
from proxy.digest import canonical_message, message_digest
from proxy.providers.base import CompactionResult, Message
from proxy.providers.chain import ChainOutcome
from proxy.store.base import Checkpoint, Compaction


def compaction_for(
    *,
    messages: list[Message],
    digests: list[str],
    prefixes: list[str],
    checkpoint: Checkpoint | None,
    result: CompactionResult,
    outcome: ChainOutcome,
    tenant: str,
    conversation: str,
) -> Compaction:
    """Map the chain's result (over the replayed candidate) back onto the original messages."""
    replayed = len(checkpoint.messages) if checkpoint is not None else 0
    base = checkpoint.covered_through if checkpoint is not None else -1
    candidate_len = replayed + len(messages) - (base + 1)
    keep_from = max(result.covered_through + 1, replayed)
    if checkpoint is not None and keep_from == replayed and candidate_len > replayed:
        # The chain rewrote only the replayed prefix. Covering the same originals would reuse
        # the old checkpoint's source digest, and first-writer-wins would hand the old one
        # back (the request would go out uncompacted): cover one more original instead.
        keep_from += 1
    suffix = candidate_len - keep_from
    covered = base + (keep_from - replayed)
    prefix = result.messages[: len(result.messages) - suffix]
    originals: dict[str, Message] = {}
    refs: dict[str, list[str]] = {}
    for ref, group in result.verbatim.items():
        group_digests = [message_digest(m) for m in group]
        originals.update(zip(group_digests, group, strict=True))
        refs[ref] = group_digests
    # The untouched originals of the covered span are kept too, so restore never has gaps.
    originals.update(zip(digests[: covered + 1], messages[: covered + 1], strict=True))
    cp = Checkpoint(
        tenant=tenant,
        conversation=conversation,
        source_digest=prefixes[covered],
        covered_through=covered,
        messages=[canonical_message(m) for m in prefix],
        providers=list(outcome.providers),
        created_at=time.time(),
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
    )
    return Compaction(checkpoint=cp, originals=originals, refs=refs)


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
