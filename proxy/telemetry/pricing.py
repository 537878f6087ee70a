"""What a request costs under a provider's prompt-cache rule, as the providers publish them.

One model serves the bench (`bench/cost.py` prices replayed sessions with it) and the proxy
(`compactd stats` and the dashboard price what compactd saved with it; the chat pipeline asks it
how long a model's cache lives). Prices are the model table's (USD per 1M tokens); the rules say
how cache reads and writes are billed relative to the input price and how long an entry lives.

The rules, as published (checked 2026-12-07):

- `openai` (OpenAI, models before GPT-5.6): caching is automatic for prompts of 1,024 tokens and
  more, matched in steps of 128; cached input is billed at the model's cached-input price (0.1x
  input on GPT-5.x); writing to the cache is free; an entry is typically cleared after 5 to 10
  minutes of inactivity and always within an hour (in-memory retention).
  https://developers.openai.com/docs/guides/prompt-caching,
  https://learn.microsoft.com/azure/foundry/openai/how-to/prompt-caching
- `openai-writes` (OpenAI, GPT-5.6 and later): explicit cache breakpoints; a cache write is
  billed at 1.25x input, a read at 0.1x; an entry lives at least 30 minutes.
  https://learn.microsoft.com/en-za/Azure/foundry-classic/openai/how-to/prompt-caching ("on
  gpt-5.6 and later models, cache writes are billed in addition to discounted cache reads"),
  https://ai-cost-estimator.com/blog/gpt-5-6-30-minute-cache-life-new-caching-economics-explained-coding-agents
- `anthropic` (Anthropic, 5-minute cache, the default TTL): `cache_control` breakpoints; a write
  is billed at 1.25x input, a read at 0.1x; the lifetime restarts on every hit.
  https://platform.claude.com/docs/en/build-with-claude/prompt-caching
- `anthropic-1h` (Anthropic, `"ttl": "1h"`): as above, writes at 2x input, an hour's lifetime.

`lifetime` is how long after its last use an entry is still served (the bench's cache model);
`cold_after` is how long a gap must be before compactd takes the cache to be surely gone (the
proxy's cold-cache decision): the published upper bound where there is one.
"""

from __future__ import annotations

from dataclasses import dataclass

MILLION = 1_000_000


@dataclass(frozen=True)
class CacheRule:
    """How one provider bills and keeps its prompt cache."""

    name: str
    lifetime: float
    """Seconds an entry lives after its last use."""
    cold_after: float
    """Seconds of silence after which the entry is surely gone."""
    read: float
    """A cache read's price as a multiple of the input price (where the table gives none)."""
    write: float
    """A cache write's price as a multiple of the input price (1.0: writes are free)."""
    breakpoints: bool
    """The client marks what is cached (Anthropic, OpenAI from GPT-5.6); else automatic."""
    minimum: int = 1024
    """Shortest prefix cached, in tokens."""
    step: int = 128
    """Automatic caching matches prefixes in steps of this many tokens past the minimum."""
    source: str = ""

    @property
    def bills_writes(self) -> bool:
        """Whether writing to the cache costs more than plain input."""
        return self.write > 1.0


_OPENAI_DOCS = "https://developers.openai.com/docs/guides/prompt-caching"
_OPENAI_56 = "https://learn.microsoft.com/en-za/Azure/foundry-classic/openai/how-to/prompt-caching"
_ANTHROPIC_DOCS = "https://platform.claude.com/docs/en/build-with-claude/prompt-caching"
# name, lifetime, cold after, read, write, breakpoints
OPENAI = CacheRule("openai", 300.0, 600.0, 0.1, 1.0, False, source=_OPENAI_DOCS)
OPENAI_WRITES = CacheRule("openai-writes", 1800.0, 3600.0, 0.1, 1.25, True, source=_OPENAI_56)
ANTHROPIC = CacheRule("anthropic", 300.0, 300.0, 0.1, 1.25, True, source=_ANTHROPIC_DOCS)
ANTHROPIC_1H = CacheRule("anthropic-1h", 3600.0, 3600.0, 0.1, 2.0, True, source=_ANTHROPIC_DOCS)
ASSUMPTIONS = (
    "saved $ (net) = the prompt tokens compactd did not send, at the blended price of the "
    "upstream's own cache-hit share, less each compaction event's new prefix billed once at the "
    "cache rule's write price instead of its read price (OpenAI before GPT-5.6: writes free, "
    "input price; GPT-5.6 and models whose table lists a cache write price: 1.25x input; "
    "Anthropic's Messages API: 1.25x, the 5-minute cache); output tokens are the same either way"
)
"""How `compactd stats` and the dashboard price savings, stated with every answer."""

RULES: dict[str, CacheRule] = {r.name: r for r in (OPENAI, OPENAI_WRITES, ANTHROPIC, ANTHROPIC_1H)}


def rule_for(api: str, *, input_price: float, cache_write_price: float) -> CacheRule:
    """The rule a model's traffic follows: the Messages API is Anthropic's (5-minute writes);
    a model whose table entry bills cache writes above input follows OpenAI's newer rule; any
    other, OpenAI's older one."""
    if api == "messages":
        return ANTHROPIC
    if input_price > 0 and cache_write_price > input_price:
        return OPENAI_WRITES
    return OPENAI


@dataclass(frozen=True)
class Prices:
    """A model's prices per token under one rule."""

    input: float
    cached: float
    written: float
    output: float

    @classmethod
    def of(
        cls,
        rule: CacheRule,
        *,
        input_price: float,
        cached_input_price: float,
        output_price: float,
        cache_write_price: float = -1.0,
    ) -> Prices:
        """Per-token prices from the table's per-1M figures: the table's cache prices where it
        has them (a cached price below input, a write price above), else the rule's multiples."""
        p_in = input_price / MILLION
        cached = cached_input_price / MILLION
        if rule.breakpoints and (cached >= p_in or cached < 0):
            # A table entry written for automatic caching (no discount listed) priced as the
            # rule publishes; automatic caching keeps the table's figure (no discount: none).
            cached = p_in * rule.read
        write = cache_write_price / MILLION
        if not rule.bills_writes:
            write = p_in
        elif write <= p_in:
            write = p_in * rule.write
        return cls(p_in, cached, write, output_price / MILLION)

    def cost(self, *, uncached: float, cached: float, written: float, output: float) -> float:
        """USD for one request's tokens (prompt split three ways, and the output)."""
        return (
            uncached * self.input
            + cached * self.cached
            + written * self.written
            + output * self.output
        )
