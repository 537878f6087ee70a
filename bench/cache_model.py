"""Prompt-cache pricing of a sequence of requests, following the providers' published rules.

A request is a list of segments (the tool schemas, then each message), each a token sequence; what
the provider renders is their concatenation. The rules and their sources are
`proxy.telemetry.pricing`'s (the proxy prices its savings with the same ones):

- automatic caching (`openai`, OpenAI before GPT-5.6): a request's longest prefix identical to a
  prefix of an earlier request still in the cache (last used within the rule's lifetime) is read
  from the cache, counted from 1,024 tokens up in steps of 128 (shorter prefixes are never
  cached); the rest is billed at the input price, its writing free. Every request's prompt is
  cached afterwards (its entries' clocks restart on use).
- breakpoints (`anthropic`, `anthropic-1h`, `openai-writes`: Anthropic, OpenAI from GPT-5.6): the
  client marks breakpoints; here, as agents such as Claude Code do, one on the tool schemas +
  system prompt and one on the last message. At each breakpoint the longest earlier-written
  breakpoint prefix it extends (within the 20 blocks before it) is read at the rule's read price
  and the rest up to the breakpoint is written at its write price (1.25x input; 2x for
  Anthropic's hour); a prefix under 1,024 tokens is never cached. Tokens after the last
  breakpoint are billed as input.

Segments are compared by value (the parsed JSON, keys in order, compactly serialized), not by the
bytes of the HTTP body: the provider caches the rendered prompt, which JSON whitespace does not
change. Token counts of a segment are of that serialization (o200k_base); the caller scales them
to its own count of the request (`Priced.scale`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from proxy.telemetry.pricing import ANTHROPIC, OPENAI, RULES, CacheRule

Rule = str
"""A rule's name: a key of `proxy.telemetry.pricing.RULES`."""
OPENAI_MIN = OPENAI.minimum
OPENAI_STEP = OPENAI.step
ANTHROPIC_MIN = ANTHROPIC.minimum
ANTHROPIC_LOOKBACK = 20
ANTHROPIC_WRITE = ANTHROPIC.write
ANTHROPIC_READ = ANTHROPIC.read


@dataclass(frozen=True)
class Segment:
    """One block of a prompt: its identity (serialized value) and its tokens."""

    key: bytes
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Priced:
    """How one request's prompt tokens split between cache reads, cache writes and input."""

    total: float
    cached: float
    written: float = 0
    """Breakpoint rules only: tokens written to the cache (billed at the rule's write price)."""

    @property
    def uncached(self) -> float:
        return self.total - self.cached - self.written

    def scale(self, prompt_tokens: int) -> Priced:
        """The same shares of another count of the same prompt (the proxy's own), unrounded."""
        if self.total <= 0:
            return Priced(prompt_tokens, 0, 0)
        f = prompt_tokens / self.total
        return Priced(prompt_tokens, self.cached * f, self.written * f)


@dataclass
class _Node:
    children: dict[bytes, _Node] = field(default_factory=dict)
    tokens: tuple[int, ...] = ()
    depth: int = 0
    """Tokens of the prefix ending with this node's segment."""
    used: float = float("-inf")
    """OpenAI: last time a request's prompt passed through here."""
    written: float = float("-inf")
    """Anthropic: last time a breakpoint here was written or read."""


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def openai_cached(prefix: int) -> int:
    """Tokens OpenAI reads from the cache for an identical prefix of `prefix` tokens."""
    if prefix < OPENAI_MIN:
        return 0
    return OPENAI_MIN + (prefix - OPENAI_MIN) // OPENAI_STEP * OPENAI_STEP


class PromptCache:
    """One provider-side cache (one organization, one model): feed it requests in time order."""

    def __init__(self, rule: Rule | CacheRule = "openai", ttl: float | None = None) -> None:
        self.rule = RULES[rule] if isinstance(rule, str) else rule
        self.ttl = self.rule.lifetime if ttl is None else ttl
        self.root = _Node()

    def price(self, segments: Sequence[Segment], now: float, head: int = 1) -> Priced:
        """Price one request sent at `now`, then remember it. `head`: how many leading segments
        the first Anthropic breakpoint covers (tools + system)."""
        if not self.rule.breakpoints:
            return self._openai(segments, now)
        return self._anthropic(segments, now, head)

    def _path(self, segments: Sequence[Segment]) -> list[_Node]:
        """The nodes of this request's segments, created where new."""
        node, path, depth = self.root, [], 0
        for seg in segments:
            child = node.children.get(seg.key)
            depth += len(seg.tokens)
            if child is None:
                child = node.children[seg.key] = _Node(tokens=seg.tokens, depth=depth)
            path.append(child)
            node = child
        return path

    def _openai(self, segments: Sequence[Segment], now: float) -> Priced:
        total = sum(len(s.tokens) for s in segments)
        alive: Callable[[_Node], bool] = lambda n: n.used >= now - self.ttl  # noqa: E731
        node, prefix = self.root, 0
        for seg in segments:
            child = node.children.get(seg.key)
            if child is None or not alive(child):
                # Diverges inside this segment: the best partial match among live siblings.
                prefix += max(
                    (_common(c.tokens, seg.tokens) for c in node.children.values() if alive(c)),
                    default=0,
                )
                break
            prefix += len(seg.tokens)
            node = child
        cached = openai_cached(min(prefix, total))
        for n in self._path(segments):
            n.used = now
        return Priced(total, cached)

    def _anthropic(self, segments: Sequence[Segment], now: float, head: int) -> Priced:
        total = sum(len(s.tokens) for s in segments)
        path = self._path(segments)
        if not path:
            return Priced(0, 0)
        breakpoints = sorted({min(head, len(path)) - 1, len(path) - 1} - {-1})
        read = written = 0
        covered = 0  # tokens up to the previous breakpoint, already priced
        for bp in breakpoints:
            end = path[bp].depth
            if end < self.rule.minimum:
                continue
            hit = 0
            for i in range(bp, max(-1, bp - ANTHROPIC_LOOKBACK), -1):
                node = path[i]
                if node.written >= now - self.ttl:
                    hit = node.depth
                    node.written = now
                    break
            hit = max(hit, covered)
            read += max(0, hit - covered)
            written += end - hit
            path[bp].written = now
            covered = end
        return Priced(total, read, written)
