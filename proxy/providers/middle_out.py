"""`middle-out`: OpenRouter's transform, made tool-pair-safe and reversible.

OpenRouter removes messages from the middle of the prompt until it fits, because models attend
least to the middle. Here the dropped pieces are whole units (an assistant message travels with
all its tool results), the head (system prefix, `keep_head`) and the protected tail (last user
message, final message) stay, and each dropped run becomes one placeholder carrying its ref.
"""

from __future__ import annotations

from proxy.providers import canonical
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
)
from proxy.providers.units import (
    Unit,
    drop_units,
    droppable,
    placeholder,
    placeholder_cost,
    protection,
    split_units,
)


class MiddleOutProvider(ContextProvider):
    """Drops whole units from the middle outwards until the request fits the target."""

    name = "middle-out"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        """Drop middle units (nearest the middle first) until under `config.limit`."""
        units = split_units(messages)
        prot = protection(messages, units, config.keep_head, config.recency_turns)
        candidates = [u for u in drop_units(messages, units) if droppable(u, prot, relaxed=True)]
        total = config.count_tokens(messages)
        dropped: set[int] = set()
        cost = placeholder_cost(config)
        for unit in middle_first(candidates):
            if total <= config.limit:
                break
            total -= sum(config.count_message(messages[i]) for i in unit.indices())
            dropped.update(unit.indices())
            total += cost
        return _build(messages, dropped, config)


def middle_first(units: list[Unit]) -> list[Unit]:
    """Units ordered by distance from the middle (ties: the later one first, keeping the head)."""
    mid = (len(units) - 1) / 2
    order = sorted(range(len(units)), key=lambda k: (abs(k - mid), -k))
    return [units[k] for k in order]


def _build(
    messages: list[Message], dropped: set[int], config: CompressionConfig
) -> CompactionResult:
    out: list[Message] = []
    verbatim: dict[str, list[Message]] = {}
    last = -1
    i, n = 0, len(messages)
    while i < n:
        if i not in dropped:
            out.append(messages[i])
            i += 1
            continue
        j = i
        while j in dropped:
            j += 1
        run = messages[i:j]
        tokens = sum(config.count_message(m) for m in run)
        ref, stand_in = placeholder(run, tokens)
        if config.count_message(stand_in) >= tokens:
            out.extend(run)  # too small to be worth a placeholder
        else:
            out.append(stand_in)
            verbatim[ref] = list(run)
            last = j - 1
        i = j
    return CompactionResult(
        messages=out,
        source_digest=canonical.source_digest(messages),
        covered_through=last,
        verbatim=verbatim,
        limitations=["middle messages dropped (originals kept by reference)"] if verbatim else [],
    )
