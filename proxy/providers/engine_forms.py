"""The compacted forms of messages the engine provider chooses between, memoized per run.

Levels, from least to most lossy: 1 = summary (or a duplicate reference), 2 = facts only,
3 = dropped into a stub that stands for a run of whole units (with their facts), and the forced
forms: the short reference marker with fewer and fewer facts, down to the marker alone. A form
is offered only if it costs fewer tokens than what it replaces, so no message ever grows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.providers.base import (
    REF_PATTERN,
    CompressionConfig,
    Message,
    canonical_json,
    compute_source_digest,
    ref_marker,
)
from proxy.providers.dedup import Duplicate
from proxy.providers.facts import TextFacts, analyze, candidates_of, facts_within, pack_facts
from proxy.providers.summary import SentenceCache, summarize_text
from proxy.providers.units import message_text, with_text

SUMMARY, FACTS, DROPPED, FORCED = 1, 2, 3, 4
_SNIPPET = 60
# Fields that cost tokens but carry nothing the summary keeps; the originals hold them.
_DROP_ON_REWRITE = ("reasoning_content", "reasoning", "thinking")


@dataclass(frozen=True)
class FormSettings:
    """The engine options that shape forms."""

    summary_ratio: float
    facts_ratio: float
    stub_facts_ratio: float
    max_facts_chars: int


@dataclass(frozen=True)
class Form:
    """A replacement for input messages `start .. end-1`."""

    message: Message
    start: int
    end: int
    body: str
    """The replacement's text without its marker line (what a merge joins)."""
    ref: str
    tokens: int
    """What the replacement message costs (counted once, when built)."""


def fact_text(message: Message) -> str:
    """A message's text plus its tool-call names and arguments (where agents keep ids)."""
    parts = [message_text(message)]
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(p for p in parts if p)


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _SNIPPET else flat[:_SNIPPET].rstrip() + "…"


@dataclass
class Forms:
    """Lazily built, memoized forms and token costs for one compaction."""

    messages: Sequence[Message]
    config: CompressionConfig
    settings: FormSettings
    duplicates: dict[int, Duplicate]
    costs: list[int] = field(init=False)
    _prefix: list[int] = field(init=False)
    _memo: dict[tuple[int, int, int], Form | None] = field(default_factory=dict)
    _merges: dict[tuple[tuple[int, int, int, str], ...], Form] = field(default_factory=dict)
    _texts: dict[int, str] = field(default_factory=dict)
    _refs: dict[tuple[int, int], str] = field(default_factory=dict)
    _facts: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    _found: dict[str, TextFacts] = field(default_factory=dict)
    _canonical: dict[int, bytes] = field(default_factory=dict)
    _sentences: SentenceCache = field(default_factory=SentenceCache)

    def __post_init__(self) -> None:
        self.costs = [self.config.count_message(m) for m in self.messages]
        self._prefix = [0]
        for c in self.costs:
            self._prefix.append(self._prefix[-1] + c)

    def cost(self, form: Form) -> int:
        """Tokens a form costs."""
        return form.tokens

    def span_cost(self, start: int, end: int) -> int:
        """Tokens input messages start .. end-1 cost."""
        return self._prefix[end] - self._prefix[start]

    def _make(
        self, start: int, end: int, verb: str | None, body: str, role: str | None = None
    ) -> Form:
        """A replacement for messages start .. end-1; without a verb, only the short marker."""
        originals = list(self.messages[start:end])
        ref = self._refs.get((start, end))
        if ref is None:
            ref = self._refs[(start, end)] = self.span_digest(start, end)[:10]
        # Forced forms carry the shortest marker the validator and `uncompress` recognise: the
        # long one alone costs ~25 tokens, more than the slack a tight budget leaves.
        if verb is None:
            marker = f"[compactd:ref={ref}]"
        else:
            marker = ref_marker(ref, end - start, self.span_cost(start, end), verb)
        text = f"{marker}\n{body}" if body else marker
        first = originals[0]
        # A stub is always a plain user/assistant message, even for one dropped message (an
        # orphan tool result rewritten in place would claim to answer a call).
        if end - start == 1 and role is None:
            message = with_text(first, text)
            for key in _DROP_ON_REWRITE:
                message.pop(key, None)
        else:
            content: object = text
            if isinstance(first.get("content"), list):
                content = [{"type": "text", "text": text}]
            message = {"role": role or first.get("role"), "content": content}
            if first.get("name") is not None and all(
                m.get("name") == first.get("name") for m in originals
            ):
                message["name"] = first["name"]
        return Form(message, start, end, body, ref, self.config.count_message(message))

    def source_digest(self) -> str:
        """`compute_source_digest(messages)`, reusing the per-message JSON the refs cached."""
        return self.span_digest(0, len(self.messages))

    def span_digest(self, start: int, end: int) -> str:
        """`compute_source_digest(messages[start:end])`, serializing each message at most once
        when the span is mostly serialized already.

        The canonical JSON of a list is its items' joined by commas in brackets, so the source
        digest and the many overlapping spans a search tries (stubs, merges) share the bytes; a
        span mostly new is serialized in one call, which is faster than one per message."""
        cached = self._canonical
        if end - start > 1 and 2 * sum(i in cached for i in range(start, end)) < end - start:
            return compute_source_digest(self.messages[start:end])
        digest = hashlib.sha256(b"[")
        for i in range(start, end):
            data = cached.get(i)
            if data is None:
                data = cached[i] = canonical_json(self.messages[i])
            if i > start:
                digest.update(b",")
            digest.update(data)
        digest.update(b"]")
        return digest.hexdigest()

    def _accept(self, form: Form) -> Form | None:
        return form if self.cost(form) < self.span_cost(form.start, form.end) else None

    def _analysis(self, text: str) -> TextFacts:
        # One fact scan per distinct text serves the facts form, every forced cap and the
        # stubs (a message's fact text is usually its text).
        found = self._found.get(text)
        if found is None:
            found = self._found[text] = analyze(text, self._sentences.facts)
        return found

    def _facts_cap(self, text: str) -> int:
        ratio = self.settings.facts_ratio
        return min(self.settings.max_facts_chars, max(48, int(len(text) * ratio)))

    def single(self, i: int, level: int) -> Form | None:
        """Message i at SUMMARY or FACTS level; None if that would not make it smaller."""
        key = (i, i + 1, level)
        if key not in self._memo:
            self._memo[key] = self._build_single(i, level)
        return self._memo[key]

    def _build_single(self, i: int, level: int) -> Form | None:
        text = message_text(self.messages[i])
        if level == FACTS:
            facts = facts_within(self._analysis(text), self._facts_cap(text))
            best = self._accept(
                self._make(i, i + 1, "reduced to facts", f"facts: {facts}" if facts else "")
            )
            if best is None:
                return self.single(i, SUMMARY)
            # The ladder puts every message at SUMMARY before FACTS, so the summary is usually
            # built already; building it here too keeps the form independent of probe order.
            lighter = self.single(i, SUMMARY)
            return lighter if lighter is not None and lighter.tokens <= best.tokens else best
        if not text.strip() or REF_PATTERN.search(text):
            # Already a compacted form (a replayed checkpoint): summarizing it again loses more.
            return None
        dup = self.duplicates.get(i)
        if dup is not None:
            role = self.messages[dup.target].get("role")
            if dup.similarity >= 1.0:
                body = f'Same text as a later {role} message: "{_snippet(text)}"'
                return self._accept(self._make(i, i + 1, "deduplicated", body))
            cap = int(len(text) * self.settings.summary_ratio)
            only = "\n".join(dup.only_here)[:cap]
            body = (
                f"{round(dup.similarity * 100)}% the same lines as a later {role} message "
                f'("{_snippet(message_text(self.messages[dup.target]))}"); lines only here:\n{only}'
            )
            form = self._accept(self._make(i, i + 1, "deduplicated", body))
            if form is not None:
                return form
        found = self._found.get(text)
        if found is not None and found.json is not None:
            return None  # a JSON document's summary is itself
        ratio = self.settings.summary_ratio
        summary = summarize_text(text, ratio, self.settings.max_facts_chars, self._sentences)
        if summary == text:
            return None
        return self._accept(self._make(i, i + 1, "summarized", summary))

    def merged(self, parts: Sequence[Form]) -> Form:
        """One message for consecutive same-role rewritten messages (a single marker)."""
        key = tuple((p.start, p.end, p.tokens, p.body) for p in parts)
        form = self._merges.get(key)
        if form is None:
            body = "\n\n".join(p.body for p in parts if p.body)
            form = self._make(parts[0].start, parts[-1].end, "summarized", body)
            self._merges[key] = form
        return form

    def _fact_text(self, i: int) -> str:
        if i not in self._texts:
            self._texts[i] = fact_text(self.messages[i])
        return self._texts[i]

    def _candidates(self, i: int) -> list[tuple[int, str]]:
        if i not in self._facts:
            self._facts[i] = candidates_of(self._analysis(self._fact_text(i)))
        return self._facts[i]

    def stub(self, start: int, end: int, force_cap: int | None = None) -> Form | None:
        """A run of whole units dropped, replaced by one user/assistant message with its facts.

        Forced stubs (`force_cap` set) carry the short marker and at most `force_cap` chars of
        facts (none at 0)."""
        key = (start, end, DROPPED if force_cap is None else -1 - force_cap)
        if key not in self._memo:
            role = "user" if self.messages[start].get("role") == "user" else "assistant"
            chars = sum(len(self._fact_text(i)) for i in range(start, end))
            cap = min(
                self.settings.max_facts_chars, max(40, int(chars * self.settings.stub_facts_ratio))
            )
            if force_cap is not None:
                cap = min(cap, force_cap)
            body = ""
            if cap > 0:
                candidates = [c for i in range(start, end) for c in self._candidates(i)]
                facts = pack_facts(candidates, cap)
                body = f"facts: {facts}" if facts else ""
            verb = None if force_cap is not None else "dropped"
            self._memo[key] = self._accept(self._make(start, end, verb, body, role))
        return self._memo[key]

    def forced(self, i: int, force_cap: int) -> Form | None:
        """Message i with the short marker and at most `force_cap` chars of facts."""
        key = (i, i + 1, -1 - force_cap)
        if key not in self._memo:
            facts = ""
            if force_cap > 0:
                text = message_text(self.messages[i])
                cap = min(self._facts_cap(text), force_cap)
                facts = facts_within(self._analysis(text), cap)
            form = self._accept(self._make(i, i + 1, None, f"facts: {facts}" if facts else ""))
            if form is None and force_cap > 0:
                form = self.forced(i, 0)
            self._memo[key] = form
        return self._memo[key]
