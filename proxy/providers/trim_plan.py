"""The working state of one `trim` run: per-message rewrites and drops over the untouched input.

See `proxy.providers.trim` for the stages and the options.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.providers import canonical
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    Message,
)
from proxy.providers.markers import ref_marker, short_marker
from proxy.providers.units import (
    drop_units,
    final_tool_results,
    message_text,
    placeholder,
    placeholder_cost,
    protection,
    split_units,
    with_text,
)
from proxy.text.facts import name_matches
from proxy.text.prose import (
    condense,
    fact_tokens,
    facts,
    has_name,
    looks_like_error,
    paths_in,
    preview,
    strip_reasoning,
)

if TYPE_CHECKING:
    from proxy.providers.trim import TrimOptions

REASONING_KEYS = ("reasoning_content", "reasoning", "reasoning_details")
_NEVER = 3
# A cut final tool result keeps this share of the characters its room would hold (the count of
# the cut text is not known before it is written; digits and code cost more per character).
_CUT_SAFETY = 0.8
_CUTS = 4
_SLACK_TRIES = 2
# Longer prose is not condensed: splitting megabytes into sentences and joining them back holds
# the GIL for milliseconds per call.
_CONDENSE_MAX_CHARS = 1_000_000
_TIERS = (0, 1, 2)


class TrimPlan:
    """One trim run: current per-message state over the untouched input."""

    def __init__(self, messages: list[Message], config: CompressionConfig, opts: TrimOptions):
        self.src, self.config, self.opts = messages, config, opts
        self.orig = [config.count_message(m) for m in messages]
        self.tokens = list(self.orig)
        # Request overhead (priming, tool schemas) plus the messages: one pass instead of two.
        self.overhead = config.count_tokens([])
        self.total = self.overhead + sum(self.orig)
        self.units = split_units(messages)
        self.drop_units = drop_units(messages, self.units)
        self.unit_of = [k for k, u in enumerate(self.units) for _ in u.indices()]
        self.level = self._levels()
        self.base: dict[int, Message] = {}
        self.body: dict[int, str] = {}
        self.verbs: dict[int, list[str]] = {}
        self.dropped = [False] * len(messages)
        self.fact_chars = opts.drop_fact_chars
        self.short = False
        """Past the last resort: short markers (`[compactd:ref=…]`) on stand-ins and stubs."""
        # Digit-heavy text costs up to ~1 token per 2 characters.
        self.placeholder = placeholder_cost(config) + self.fact_chars // 2
        self._referenced: list[bool] | None = None
        self._refs: dict[int, str] = {}
        self._fact_cache: dict[int, list[str]] = {}
        self._digest: str | None = None

    def _levels(self) -> list[int]:
        """The first tier in which each message may be touched (_NEVER: hard protection, head)."""
        prot = protection(self.src, self.units, self.config.keep_head, self.config.recency_turns)
        keep = self.opts.recent_units
        last_units = self.units[-keep].start if 0 < keep <= len(self.units) else 0
        if keep <= 0:
            last_units = len(self.src)

        def level(i: int) -> int:
            if i in prot.hard or i in prot.head:
                return _NEVER
            if i not in prot.recent:
                return 0
            return 2 if i >= last_units else 1

        return [level(i) for i in range(len(self.src))]

    def over(self) -> bool:
        return self.total > self.config.limit

    def run(self) -> CompactionResult:
        """Apply the stages tier by tier until the request is under target (or all are done)."""
        stages: list[Callable[[int], None]] = [
            self._stub_stale,
            self._strip_reasoning,
            self._truncate_largest,
            self._condense,
            self._drop_oldest,
            self._bare,
        ]
        for tier in _TIERS:
            for stage in stages:
                if not self.over():
                    # The running total only estimates placeholders: confirm with the real count.
                    result = self.result()
                    self.total = self.config.count_tokens(result.messages)
                    if not self.over():
                        return self._spend_slack(result)
                stage(tier)
        self.fact_chars = 0  # last resort: placeholders without their fact lists
        result = self.result()
        if self.config.count_tokens(result.messages) <= self.config.limit:
            return result
        return self._minimal() or result

    def _minimal(self) -> CompactionResult | None:
        """Short markers, then every droppable unit dropped and every stub bare, stopping as soon
        as the request fits; then, as the last resort, the final tool results cut head and tail.
        None if even that does not fit (the fuller result is kept then)."""
        # The full marker alone costs ~25 tokens a stand-in: more than the room a tight budget
        # leaves once the hard-protected messages are in, where `[compactd:ref=…]` still fits.
        final = [i for i in sorted(final_tool_results(self.src)) if self.level[i] == _NEVER]
        floor = self.overhead + sum(t for i, t in enumerate(self.orig) if self.level[i] == _NEVER)
        if floor - sum(self.orig[i] for i in final) > self.config.limit:
            return None
        self.short = True
        self.placeholder = self.config.count_message(
            {"role": "assistant", "content": short_marker("f" * 10)}
        )
        for i in self.verbs:
            self.tokens[i] = self.config.count_message(self._rewritten(i))
        tier = _TIERS[-1]
        stages: list[Callable[[int], None]] = [self._drop_oldest, self._bare, self._force]
        result = self.result()
        for stage in stages:
            self.total = self.config.count_tokens(result.messages)
            if not self.over():
                return result
            stage(tier)
            result = self.result()
        for attempt in range(_CUTS + 1 if final else 0):
            total = self.config.count_tokens(result.messages)
            if total <= self.config.limit:
                break
            self._cut_final(final, total, bare=attempt == _CUTS)
            result = self.result()
        return result if self.config.count_tokens(result.messages) <= self.config.limit else None

    def _cut_final(self, final: list[int], total: int, bare: bool = False) -> None:
        """The last resort (issue 10): the final tool results, which alone keep the request
        over target, cut head and tail (stored and referenced like any rewrite, never dropped),
        each by its share of what the request is over; with `bare`, to the marker alone (a few
        tokens over after the proportional cuts: the head and tail left cost that much)."""
        over = total - self.config.limit
        size = sum(self.tokens[i] for i in final)
        for i in final:
            keep = self.tokens[i] - over * self.tokens[i] // max(size, 1)
            text = message_text(self.src[i])
            kept = self.body.get(i, text)
            chars = int(len(kept) * max(keep, 0) / max(self.tokens[i], 1) * _CUT_SAFETY)
            self._attempt(i, "" if bare else preview(text, chars), "truncated")

    def _spend_slack(self, result: CompactionResult) -> CompactionResult:
        """Fill the room left under target with more facts of the dropped runs, if any: the
        most that fits of a few sizes tried, halving from two characters a token of room."""
        slack = self.config.limit - self.total
        if not self.fact_chars or slack < 20 or not any(self.dropped):
            return result
        base = self.fact_chars
        extra = slack * 2
        for _ in range(_SLACK_TRIES):
            self.fact_chars = base + extra
            richer = self.result()
            if self.config.count_tokens(richer.messages) <= self.config.limit:
                return richer
            extra //= 2
        self.fact_chars = base
        return result

    def _cut(self, i: int, chars: int) -> str:
        """Head and tail of message i's text, then the facts of the original that they lost."""
        text = self._text(i)
        kept = preview(text, chars)
        if kept == text or not self.opts.drop_fact_chars:
            return kept
        lost = facts(self._facts_of(i), self.opts.drop_fact_chars, exclude=kept)
        return f"{kept}\nfacts: {lost}" if lost else kept

    def _eligible(self, tier: int) -> list[int]:
        return [i for i, lv in enumerate(self.level) if lv <= tier and not self.dropped[i]]

    def _text(self, i: int) -> str:
        return self.body[i] if i in self.body else message_text(self.src[i])

    def _attempt(self, i: int, body: str, verb: str, base: Message | None = None) -> bool:
        """Rewrite message i if that makes it cheaper; its marker always names the original."""
        base = base if base is not None else self.base.get(i, self.src[i])
        verbs = [*self.verbs.get(i, []), *([verb] if verb not in self.verbs.get(i, []) else [])]
        candidate = _compose(base, body, self.ref(i), self.orig[i], verbs, short=self.short)
        cost = self.config.count_message(candidate)
        if cost >= self.tokens[i]:
            return False
        self.total += cost - self.tokens[i]
        self.tokens[i], self.base[i], self.body[i], self.verbs[i] = cost, base, body, verbs
        return True

    def _stub_stale(self, tier: int) -> None:
        age_limit = len(self.units) - 1 - self.opts.stale_min_age
        for i in self._eligible(tier):
            if (
                self.src[i].get("role") == "tool"
                and i not in self.body
                and self.tokens[i] >= self.opts.stale_min_tokens
                and self.unit_of[i] <= age_limit
                and not looks_like_error(self._text(i))
                and not self.referenced()[i]
            ):
                self._attempt(i, self._cut(i, self.opts.preview_chars), "stubbed")
                if not self.over():
                    return

    def referenced(self) -> list[bool]:
        """Per message: whether a file path in it is mentioned by a later message (or call)."""
        if self._referenced is None:
            seen: set[str] = set()
            out = [False] * len(self.src)
            for i in range(len(self.src) - 1, -1, -1):
                text = message_text(self.src[i])
                args = _arguments(self.src[i])
                paths = paths_in("\n".join([text, *args])) if args else paths_in(text)
                if self.src[i].get("role") == "tool":
                    # Without tool calls (always, for a tool result) the two scans are one.
                    out[i] = bool((paths_in(text) if args else paths) & seen)
                seen.update(paths)
            self._referenced = out
        return self._referenced

    def _strip_reasoning(self, tier: int) -> None:
        if not self.opts.strip_reasoning:
            return
        age_limit = len(self.units) - 1 - self.config.reasoning_strip_age_threshold
        for i in self._eligible(tier):
            m = self.base.get(i, self.src[i])
            text = self._text(i)
            if m.get("role") != "assistant" or self.unit_of[i] > age_limit:
                continue
            if any(k in m for k in REASONING_KEYS) or "<think" in text:
                base = {k: v for k, v in m.items() if k not in REASONING_KEYS}
                self._attempt(i, strip_reasoning(text), "reasoning stripped", base)
                if not self.over():
                    return

    def _truncate_largest(self, tier: int) -> None:
        # First cap results over max_tool_result_tokens to about half of it (gptme's phase 2,
        # keeping a generous head and tail); then cut any result to the short preview.
        cap = self.config.max_tool_result_tokens
        tools = [i for i in self._eligible(tier) if self.src[i].get("role") == "tool"]
        for threshold, chars in ((cap, cap * 2), (0, self.opts.preview_chars)):
            for i in sorted(tools, key=lambda i: (-self.tokens[i], i)):
                text = self._text(i)
                if self.tokens[i] > threshold and len(text) > chars:
                    self._attempt(i, self._cut(i, chars), "truncated")
                    if not self.over():
                        return

    def _condense(self, tier: int) -> None:
        for i in self._eligible(tier):
            if (
                self.src[i].get("role") in self.opts.condense_roles
                and self.tokens[i] >= self.opts.prose_min_tokens
            ):
                text = self._text(i)
                if len(text) > _CONDENSE_MAX_CHARS:
                    continue  # a multi-megabyte paste is cut or dropped, not condensed
                shorter = condense(text, self.opts.prose_keep_ratio)
                if shorter != text and self._attempt(i, shorter, "condensed") and not self.over():
                    return

    def _drop_oldest(self, tier: int) -> None:
        n = len(self.src)
        for unit in self.drop_units:
            if unit.kind == "system" or self.dropped[unit.start]:
                continue
            if any(self.level[i] > tier for i in unit.indices()):
                continue
            joins_before = unit.start > 0 and self.dropped[unit.start - 1]
            joins_after = unit.end < n and self.dropped[unit.end]
            for i in unit.indices():
                self.dropped[i] = True
                self.total -= self.tokens[i]
            self.total += self.placeholder * (1 - joins_before - joins_after)
            if not self.over():
                return

    def _bare(self, tier: int, until_fit: bool = True) -> None:
        """Last resort: reduce what is left (outside the hard protection) to its marker."""
        if tier != _TIERS[-1]:
            return
        for i in sorted(self._eligible(tier), key=lambda i: (-self.tokens[i], i)):
            base = {
                k: v for k, v in self.base.get(i, self.src[i]).items() if k not in REASONING_KEYS
            }
            if self._attempt(i, "", "elided", base) and until_fit and not self.over():
                return

    def _force(self, tier: int) -> None:
        """Drop every droppable unit and bare every other rewritable message, whatever the
        running estimate says (it only estimates the stand-ins)."""
        for unit in self.drop_units:
            if unit.kind != "system" and all(self.level[i] <= tier for i in unit.indices()):
                for i in unit.indices():
                    self.dropped[i] = True
        self._bare(tier, until_fit=False)

    def result(self) -> CompactionResult:
        """The trimmed messages, with every replaced original in `verbatim`."""
        out: list[Message] = []
        verbatim: dict[str, list[Message]] = {}
        last = -1
        i, n = 0, len(self.src)
        while i < n:
            j = i
            while j < n and self.dropped[j]:
                j += 1
            stand_in = self._stand_in(i, j) if j > i else None
            if stand_in is not None:
                ref, message = stand_in
                out.append(message)
                verbatim[ref] = list(self.src[i:j])
                last, i = j - 1, j
                continue
            # A run too small to pay for its placeholder is kept as it was.
            for k in range(i, max(j, i + 1)):
                if k in self.verbs:
                    out.append(self._rewritten(k))
                    verbatim[self.ref(k)] = [self.src[k]]
                    last = k
                else:
                    out.append(self.src[k])
            i = max(j, i + 1)
        return CompactionResult(
            messages=out,
            source_digest=self.digest(),
            covered_through=last,
            verbatim=verbatim,
            limitations=self._limitations(),
        )

    def _stand_in(self, i: int, j: int) -> tuple[str, Message] | None:
        """The placeholder for dropped run i..j-1: with the run's facts if that still saves
        tokens, else the bare marker, else None (the run is kept)."""
        run, tokens = self.src[i:j], sum(self.orig[i:j])
        if self.short:
            return self._short_stand_in(i, j, tokens)
        if self.fact_chars:
            note = facts(self._facts_between(i, j), self.fact_chars)
            ref, message = placeholder(run, tokens, f"facts: {note}" if note else "")
            if self.config.count_message(message) < tokens:
                return ref, message
        ref, message = placeholder(run, tokens)
        return (ref, message) if self.config.count_message(message) < tokens else None

    def _short_stand_in(self, i: int, j: int, tokens: int) -> tuple[str, Message] | None:
        """The stand-in of dropped run i..j-1 with the short marker only: a plain user/assistant
        message, or for a single message a rewrite of the same shape (the validator checks a
        one-for-one replacement's shape unless its marker says "dropped")."""
        ref, message = placeholder(self.src[i:j], tokens)
        if j - i == 1:
            message = {k: v for k, v in self.src[i].items() if k not in REASONING_KEYS}
        message = with_text(message, short_marker(ref))
        return (ref, message) if self.config.count_message(message) < tokens else None

    def _facts_between(self, i: int, j: int) -> list[str]:
        """Fact tokens of messages i..j-1, read from the end only until there are enough names
        to fill the fact list (the latest win anyway), so a long dropped run costs little."""
        found: list[list[str]] = []
        names = 0
        for k in range(j - 1, i - 1, -1):
            found.append(self._facts_of(k))
            names += sum(len(t) + 2 for t in found[-1] if has_name(t))
            if names > 2 * self.fact_chars:
                break
        return list(itertools.chain.from_iterable(reversed(found)))

    def _facts_of(self, i: int) -> list[str]:
        """Fact tokens of input message i, its tool-call arguments included, then for prose
        (not tool output) the names and quoted phrases of its text (found once each): in a
        chat those are what a dropped run said."""
        if i not in self._fact_cache:
            m = self.src[i]
            text = message_text(m)
            tokens = [t for x in (text, *_arguments(m)) for t in fact_tokens(x)]
            names = name_matches(text) if m.get("role") != "tool" else []
            self._fact_cache[i] = tokens + names
        return self._fact_cache[i]

    def ref(self, i: int) -> str:
        """The ref id of input message i (hashing is the costly part of a rewrite: once each)."""
        if i not in self._refs:
            self._refs[i] = canonical.ref_id([self.src[i]])
        return self._refs[i]

    def _rewritten(self, i: int) -> Message:
        base, body, verbs = self.base[i], self.body[i], self.verbs[i]
        return _compose(base, body, self.ref(i), self.orig[i], verbs, short=self.short)

    def digest(self) -> str:
        """The input's digest, computed once (result() may run several times per plan)."""
        if self._digest is None:
            self._digest = canonical.source_digest(self.src)
        return self._digest

    def _limitations(self) -> list[str]:
        done = {verb for verbs in self.verbs.values() for verb in verbs}
        if any(self.dropped):
            done.add("dropped")
        return [f"messages {verb} (originals kept by reference)" for verb in sorted(done)]


def _compose(
    base: Message, body: str, ref: str, tokens: int, verbs: list[str], *, short: bool = False
) -> Message:
    marker = short_marker(ref) if short else ref_marker(ref, 1, tokens, ", ".join(verbs))
    return with_text(base, f"{marker}\n{body}" if body else marker)


def _arguments(message: Message) -> list[str]:
    """The argument strings of a message's tool calls."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [str(c.get("function", {}).get("arguments", "")) for c in calls if isinstance(c, dict)]
