"""`trim`: gptme's rule-based compaction, done right for OpenAI messages.

Stages, in order, each stopping as soon as the request is under target:

1. stub stale tool results (old, large, not errors, no path in them mentioned later), keeping a
   head/tail preview;
2. strip old reasoning (`<think>`/`<thinking>` blocks, `reasoning_content`-style fields);
3. truncate the largest tool results first, keeping a preview (results over
   `max_tool_result_tokens` are first capped to about half of it);
4. condense long prose extractively (code fences, paths, identifiers, numbers, errors kept), the
   user's as well as the assistant's, so a long chat loses detail before whole turns;
5. drop the oldest units after the head, each run of them replaced by one placeholder that lists
   the ids, numbers, paths, names and quoted titles it removed.

The stages run first outside the recency window, then with the window shrunk to the last
`recent_units` units, then with only the hard protection left (system/developer messages, the last
user message, the final message, `keep_head`), ending with marker-only stubs. When even that is
over target, the full markers (~25 tokens each) give way to short `[compactd:ref=<id>]` ones, with
every droppable unit dropped if need be, and as the very last resort the final tool results are
cut head and tail (never dropped); so every request that can fit at all does. Every
rewritten or dropped message goes into `verbatim` under a ref id its replacement shows. Same
input, same output bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
    option,
    parse_options,
)
from proxy.providers.trim_plan import TrimPlan


@dataclass(frozen=True)
class TrimOptions:
    """`extra_config` keys of the trim provider (unknown keys are rejected)."""

    stale_min_tokens: int = 200
    """A tool result at least this large can be stubbed as stale."""
    stale_min_age: int = 3
    """... if at least this many units came after it."""
    preview_chars: int = 400
    """Characters of head + tail kept in a stubbed or truncated tool result."""
    prose_min_tokens: int = 150
    """Messages of `condense_roles` at least this large are condensed extractively."""
    prose_keep_ratio: float = option(0.5, above=0, maximum=1)
    """Share of the droppable prose sentences a condensed message keeps."""
    condense_roles: tuple[str, ...] = ("user", "assistant")
    strip_reasoning: bool = True
    """Strip reasoning older than `reasoning_strip_age_threshold` units."""
    drop_fact_chars: int = 240
    """Characters of ids, numbers, dates and paths that a placeholder lists from the messages it
    dropped, and a cut tool result from its cut middle (0: none). Placeholders lose the list
    when nothing else can make the request fit, and use any room left under target for more."""
    recent_units: int = 4
    """Units kept verbatim in the second pass, when the recency window had to be opened."""


class TrimProvider(ContextProvider):
    """Rule-based, deterministic, reversible trimming."""

    name = "trim"
    option_schema = TrimOptions

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        """Trim until the request costs at most `config.limit` (or nothing is left to trim)."""
        plan = TrimPlan(messages, config, parse_options(TrimOptions, config.extra_config))
        return plan.run()
