"""The `summarize` provider: an LLM summary of the oldest turns, through the upstream itself.

The oldest whole units (a user message, or an assistant message with all its tool results) after
the protected head are replaced by one message holding a summary written by a cheap model, called
with the tenant's own key through `config.complete`. Escalation: the normal prompt, then the
aggressive prompt when the call fails, times out or returns nothing shorter than its input, then the
deterministic `engine`. Facts of the span (ids, paths, names, numbers) that the model left out are
appended to its summary, so an imperfect summary never loses them. Summaries are cached by the
digest of the span they replace, so a span is never paid for twice and a replayed span always gets
the same bytes.

When the summarizing model is the conversation's own (`model = ""`, or the name the client asked
for) the request reads from the provider's prompt cache: it is the conversation's messages exactly
as the provider is given them, up to the end of the span, followed by one user instruction to
summarize the last messages above (`cached_request`); every input token but the instruction's is
then a cached read. A different model (the default, `gpt-4o-mini`) cannot share that cache, so it
gets a fresh prompt with the span pasted in as text (`fresh_request`), as does a span longer than
`max_input_chars` (the cached shape cannot cut it). The cache is only shared when `summarize` is
first in its chain (a provider before it changes the messages) and the conversation has no tool
schemas (the completer sends none, and they head the cached prefix).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.providers import canonical
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
    option,
    parse_options,
    ref_marker,
)
from proxy.providers.engine import EngineOptions, compact
from proxy.providers.units import (
    Unit,
    common_suffix,
    droppable,
    message_text,
    protection,
    split_units,
)

log = logging.getLogger(__name__)

_MARKER_ALLOWANCE = 40
"""Tokens the marker line and message overhead add to a summary."""

_RULES = (
    "Keep verbatim every file path, identifier (function, class, variable and table names), id, "
    "number and amount, date, URL, error message and every decision made or requested. Drop "
    "greetings, thanks and filler. Write in the conversation's language. Output only the summary."
)
NORMAL_PROMPT = (
    "You compress chat history. Summarize the conversation excerpt below so the assistant can "
    "continue the conversation without it, in at most {words} words. " + _RULES
)
CACHED_INSTRUCTION = (
    "Stop the conversation here: do not answer or continue it. Summarize the last {count} "
    "messages above so the assistant can continue the conversation without them, in at most "
    "{words} words. "
)
"""The one instruction after the cached conversation ({count} messages, then {words})."""
CACHED_AGGRESSIVE = (
    "Stop the conversation here: do not answer or continue it. Reduce the last {count} messages "
    "above to terse bullet points of facts only, at most {words} words in total. "
)
AGGRESSIVE_PROMPT = (
    "You compress chat history. Reduce the conversation excerpt below to terse bullet points of "
    "facts only, at most {words} words in total. " + _RULES
)


@dataclass(frozen=True)
class SummarizeOptions:
    """The summarize provider's `extra_config` keys (unknown keys are rejected)."""

    model: str = "gpt-4o-mini"
    """The summarizing model; "": the conversation's own, whose prompt cache the call reads."""
    timeout: float = option(20.0, above=0)
    summary_tokens: int = option(400, minimum=16)
    max_input_chars: int = option(200_000, minimum=1000)
    engine: Mapping[str, Any] | None = option(None, schema=EngineOptions)


def transcript(messages: Sequence[Message], max_chars: int) -> str:
    """The span as plain text for the summarizer: one `role: text` block per message."""
    parts = []
    for m in messages:
        role = str(m.get("role"))
        if m.get("name"):
            role = f"{role} ({m['name']})"
        text = message_text(m)
        if text:
            parts.append(f"{role}: {text}")
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts.append(f"{role} called {fn.get('name')}({fn.get('arguments', '')})")
    text = "\n\n".join(parts)
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n[…]\n{text[-half:]}"


def summary_budget(span_tokens: int, summary_tokens: int) -> int:
    """Tokens a summary of a span may take: a third of the span, at most `summary_tokens`."""
    return max(16, min(summary_tokens, span_tokens // 3))


def choose_span(messages: list[Message], config: CompressionConfig, summary_tokens: int) -> range:
    """The oldest run of droppable units whose replacement by a summary reaches the target."""
    units = split_units(messages)
    prot = protection(messages, units, config.keep_head, config.recency_turns)
    total = config.count_tokens(messages)
    for relaxed in (False, True):
        run: list[Unit] = []
        for unit in units:
            if run and not droppable(unit, prot, relaxed=relaxed):
                break
            if droppable(unit, prot, relaxed=relaxed):
                run.append(unit)
        if not run:
            continue
        saved = 0
        for unit in run:
            saved += sum(config.count_message(messages[i]) for i in unit.indices())
            allowance = summary_budget(saved, summary_tokens) + _MARKER_ALLOWANCE
            if total - saved + allowance <= config.limit:
                return range(run[0].start, unit.end)
        if relaxed:
            return range(run[0].start, run[-1].end)
    return range(0)


class SummarizeProvider(ContextProvider):
    """Summaries by an upstream model, escalating to the deterministic engine."""

    option_schema = SummarizeOptions

    @property
    def name(self) -> str:
        """Registry name."""
        return "summarize"

    async def compress(
        self, messages: list[Message], config: CompressionConfig
    ) -> CompactionResult:
        """Replace the oldest turns with an LLM summary, or fall back to the engine."""
        opts = parse_options(SummarizeOptions, config.extra_config)
        span = choose_span(messages, config, opts.summary_tokens)
        if len(span) > 0 and config.complete is not None:
            result = await self._with_llm(messages, config, opts, span)
            if result is not None:
                return result
        # The engine is CPU work; off the event loop like every sync provider.
        engine = parse_options(EngineOptions, opts.engine or {})
        fallback = await asyncio.to_thread(compact, messages, config, engine)
        fallback.limitations.append("LLM summary unavailable: deterministic engine summary used")
        return fallback

    async def _with_llm(
        self,
        messages: list[Message],
        config: CompressionConfig,
        opts: SummarizeOptions,
        span: range,
    ) -> CompactionResult | None:
        originals = messages[span.start : span.stop]
        digest = canonical.source_digest(originals)
        span_tokens = sum(config.count_message(m) for m in originals)
        cache = config.summary_cache
        summary = await cache.get(digest) if cache is not None else None
        if summary is None:
            summary = await self._ask(messages, span, span_tokens, config, opts)
            if summary is None:
                return None
            if cache is not None:
                await cache.put(digest, summary)
        result = build_result(messages, span, summary, config)
        if result is None or config.count_tokens(result.messages) <= config.limit:
            return result
        # Still over target: let the engine finish the job on top of the (paid) summary; its
        # references nest, so `uncompress(recursive=True)` still restores the original.
        engine = parse_options(EngineOptions, opts.engine or {})
        more = await asyncio.to_thread(compact, result.messages, config, engine)
        if config.count_tokens(more.messages) > config.budget:
            return None
        return CompactionResult(
            messages=more.messages,
            source_digest=result.source_digest,
            covered_through=len(messages) - 1 - common_suffix(messages, more.messages),
            verbatim={**result.verbatim, **more.verbatim},
            limitations=[*result.limitations, *more.limitations],
        )

    async def _ask(
        self,
        messages: list[Message],
        span: range,
        span_tokens: int,
        config: CompressionConfig,
        opts: SummarizeOptions,
    ) -> str | None:
        """Normal, then aggressive prompt; None when neither gives a usable, shorter summary."""
        assert config.complete is not None
        model = opts.model or config.model
        # Half a word per token: code and ids cost several tokens per word.
        words = summary_budget(span_tokens, opts.summary_tokens) // 2
        for aggressive in (False, True):
            budget = words // 2 if aggressive else words
            if model == config.model and fits(messages[span.start : span.stop], opts):
                request = cached_request(messages, span, budget, aggressive=aggressive)
            else:
                request = fresh_request(messages[span.start : span.stop], budget, opts, aggressive)
            try:
                reply = await asyncio.wait_for(
                    config.complete(request, model, opts.timeout), opts.timeout
                )
            except Exception as exc:  # noqa: BLE001 - any upstream failure means: escalate
                log.warning("summarize: %s call failed: %s", model, type(exc).__name__)
                continue
            reply = reply.strip() if isinstance(reply, str) else ""
            if reply and config.count_message({"role": "user", "content": reply}) < span_tokens:
                return reply
            log.info("summarize: %s reply was empty or not shorter; escalating", model)
        return None


def fits(originals: Sequence[Message], opts: SummarizeOptions) -> bool:
    """Whether the span is short enough to be read whole (`max_input_chars` of its transcript)."""
    return len(transcript(originals, opts.max_input_chars + 1)) <= opts.max_input_chars


def cached_request(
    messages: Sequence[Message], span: range, words: int, *, aggressive: bool = False
) -> list[Message]:
    """The conversation as given, up to the span's end, then one instruction: a cached prefix."""
    template = CACHED_AGGRESSIVE if aggressive else CACHED_INSTRUCTION
    instruction = template.format(count=len(span), words=words) + _RULES
    return [*messages[: span.stop], {"role": "user", "content": instruction}]


def fresh_request(
    originals: Sequence[Message], words: int, opts: SummarizeOptions, aggressive: bool
) -> list[Message]:
    """A new prompt with the span pasted in as text (for a model that cannot share the cache)."""
    prompt = (AGGRESSIVE_PROMPT if aggressive else NORMAL_PROMPT).format(words=words)
    text = transcript(originals, opts.max_input_chars)
    return [{"role": "system", "content": prompt}, {"role": "user", "content": text}]


def build_result(
    messages: list[Message], span: range, summary: str, config: CompressionConfig
) -> CompactionResult | None:
    """The request with `span` replaced by one message carrying the summary and its marker."""
    originals = messages[span.start : span.stop]
    ref = canonical.ref_id(originals)
    tokens = sum(config.count_message(m) for m in originals)
    marker = ref_marker(ref, len(originals), tokens, "summarized")
    first = originals[0]
    role = "user" if first.get("role") == "user" else "assistant"
    text = f"{marker}\nSummary of the earlier conversation:\n{summary}"
    content: Any = (
        [{"type": "text", "text": text}] if isinstance(first.get("content"), list) else text
    )
    replacement: Message = {"role": role, "content": content}
    if config.count_message(replacement) >= tokens:
        return None
    return CompactionResult(
        messages=[*messages[: span.start], replacement, *messages[span.stop :]],
        source_digest=canonical.source_digest(messages),
        covered_through=span.stop - 1,
        verbatim={ref: list(originals)},
        limitations=["oldest turns replaced by an LLM summary"],
    )
