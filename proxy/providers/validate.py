"""The pipeline validator: what every provider's result must satisfy before it is trusted.

Runs on every compaction, so it is one linear walk that aligns the result with its input: a result
message is either the next input message unchanged, or a replacement whose reference ids expand
(through `verbatim`, nested refs included) to exactly the next input messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proxy.providers.base import CompactionResult, CompressionConfig, Message
from proxy.providers.markers import is_written_stand_in
from proxy.providers.units import (
    final_tool_results,
    hard_protected,
    message_text,
    refs_in,
    tool_call_ids,
)

MAX_REF_DEPTH = 10
_MEDIA_TYPES = frozenset({"image_url", "input_audio", "file", "audio"})


@dataclass(frozen=True)
class _Replacement:
    position: int
    start: int
    end: int
    refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Alignment:
    """How a valid result stands for its input, message by message."""

    spans: list[tuple[int, int]]
    """Per result message: the input messages [start, end) it stands for."""
    refs: list[tuple[str, ...]]
    """Per result message: the reference ids it stands for, in order; () if it is unchanged."""
    ref_spans: dict[str, tuple[int, int]]
    """Every reference id used (outer or nested): the input messages [start, end) it stands for."""


def align(
    original: Sequence[Message], out: Sequence[Message], verbatim: Mapping[str, list[Message]]
) -> Alignment | str:
    """The alignment of `out` with `original`, or the first reason there is none."""
    problems: list[str] = []
    alignment = _align(original, out, verbatim, problems)
    return problems[0] if problems else alignment


def check_result(
    original: Sequence[Message],
    result: CompactionResult,
    config: CompressionConfig,
    *,
    check_budget: bool = True,
) -> list[str]:
    """Every invariant `result` breaks against its input `original`, as readable sentences."""
    out = result.messages
    problems: list[str] = []
    alignment = _align(original, out, result.verbatim, problems)
    if problems:
        return problems
    kept = [False] * len(original)
    replacements: list[_Replacement] = []
    for pos, ((start, end), refs) in enumerate(zip(alignment.spans, alignment.refs, strict=True)):
        if refs:
            replacements.append(_Replacement(pos, start, end, tuple(refs)))
        else:
            kept[start] = True
    # A final tool result may be cut as the last resort (issue 10), one for one, never dropped.
    protected = hard_protected(original)
    last = final_tool_results(original) & protected
    problems.extend(_final_results_dropped(original, out, replacements, last))
    for i in sorted(protected - last):
        if not kept[i]:
            role = original[i].get("role")
            problems.append(f"protected message {i} ({role}) was rewritten or dropped")
    for rep in replacements:
        problems.extend(_check_replacement(original, out, rep, config))
    problems.extend(_new_pairing_problems(original, out))
    problems.extend(_check_suffix(original, out, result.covered_through))
    if check_budget:
        tokens = config.count_tokens(out)
        if tokens > config.budget:
            problems.append(f"result costs {tokens} tokens, over the budget of {config.budget}")
    return problems


def _align(
    original: Sequence[Message],
    out: Sequence[Message],
    verbatim: Mapping[str, list[Message]],
    problems: list[str],
) -> Alignment:
    """Match result messages to input messages, greedily in order (no search: a replacement's
    refs, expanded through `verbatim`, must spell out exactly the next input messages)."""
    walk = _Walk(original, verbatim)
    spans: list[tuple[int, int]] = []
    refs: list[tuple[str, ...]] = []
    i = 0
    for pos, message in enumerate(out):
        if i < len(original) and message == original[i]:
            spans.append((i, i + 1))
            refs.append(())
            i += 1
            continue
        outer = _outer_refs(message, verbatim)
        end = walk.consume_refs(outer, i, 0) if outer else None
        if end is None or end == i:
            problems.append(
                f"result message {pos} is neither input message {i} unchanged nor a replacement "
                "whose ref ids (in verbatim) stand for the next input messages"
            )
            return Alignment(spans, refs, walk.ref_spans)
        spans.append((i, end))
        refs.append(tuple(outer))
        i = end
    if i != len(original):
        problems.append(f"input messages {i}..{len(original) - 1} are missing from the result")
    return Alignment(spans, refs, walk.ref_spans)


@dataclass
class _Walk:
    """Expands refs through `verbatim` against the input, recording the span of each ref."""

    original: Sequence[Message]
    verbatim: Mapping[str, list[Message]]
    ref_spans: dict[str, tuple[int, int]] = field(default_factory=dict)

    def consume(self, message: Message, i: int, depth: int) -> int | None:
        """Index after the input messages `message` stands for from `i`; None if it doesn't."""
        if i < len(self.original) and message == self.original[i]:
            return i + 1
        refs = _outer_refs(message, self.verbatim)
        return self.consume_refs(refs, i, depth) if refs else None

    def consume_refs(self, refs: Sequence[str], i: int, depth: int) -> int | None:
        """Index after the input messages these refs stand for, in order."""
        if depth > MAX_REF_DEPTH:
            return None
        for ref in refs:
            start = i
            for inner in self.verbatim[ref]:
                nxt = self.consume(inner, i, depth + 1)
                if nxt is None:
                    return None
                i = nxt
            self.ref_spans[ref] = (start, i)
        return i


def _outer_refs(message: Message, verbatim: Mapping[str, list[Message]]) -> list[str]:
    """Known refs of a message, minus those only quoted from inside another of its refs."""
    refs = [r for r in refs_in(message) if r in verbatim]
    if len(refs) < 2:
        return refs
    nested = {r for ref in refs for m in verbatim[ref] for r in refs_in(m)}
    return [r for r in refs if r not in nested]


def _final_results_dropped(
    original: Sequence[Message],
    out: Sequence[Message],
    replacements: Sequence[_Replacement],
    last: frozenset[int],
) -> list[str]:
    """A final tool result may be rewritten in place (cut head and tail), not folded away."""
    return [
        f"final tool result {rep.start} was folded into result message {rep.position}"
        for rep in replacements
        if any(i in last for i in range(rep.start, rep.end))
        and (rep.end - rep.start != 1 or _stands_in(original, out, rep))
    ]


def _stands_in(original: Sequence[Message], out: Sequence[Message], rep: _Replacement) -> bool:
    """Whether the replacement carries a "dropped" marker its provider wrote (not one quoted
    from the client's own text)."""
    replaced = "\n".join(message_text(original[k]) for k in range(rep.start, rep.end))
    return is_written_stand_in(message_text(out[rep.position]), rep.refs, replaced)


def _check_replacement(
    original: Sequence[Message],
    out: Sequence[Message],
    rep: _Replacement,
    config: CompressionConfig,
) -> list[str]:
    new = out[rep.position]
    before = sum(config.count_message(original[k]) for k in range(rep.start, rep.end))
    after = config.count_message(new)
    where = f"result message {rep.position}"
    problems = []
    if after > before:
        problems.append(f"{where} grew from {before} to {after} tokens")
    # A replacement whose marker says "dropped" stands in for whole messages: nothing of them
    # is kept in place, so only its own validity matters, not their shape.
    stand_in = _stands_in(original, out, rep)
    if rep.end - rep.start == 1 and not stand_in:
        problems.extend(_same_shape(original[rep.start], new, where))
    elif new.get("role") not in ("user", "assistant") or new.get("tool_calls"):
        problems.append(
            f"{where} stands for dropped messages but is not a plain user/assistant one"
        )
    return problems


def _same_shape(old: Message, new: Message, where: str) -> list[str]:
    """A one-for-one rewrite keeps role, tool identity, content type and media parts."""
    problems = []
    for key in ("role", "tool_call_id", "name"):
        if old.get(key) != new.get(key):
            problems.append(f"{where} changed its {key}")
    if tool_call_ids(old) != tool_call_ids(new):
        problems.append(f"{where} changed its tool_calls ids")
    a, b = old.get("content"), new.get("content")
    if isinstance(a, list):
        if not isinstance(b, list):
            problems.append(f"{where} turned a content-part list into {type(b).__name__}")
        else:
            media = [p for p in a if isinstance(p, dict) and p.get("type") in _MEDIA_TYPES]
            if any(p not in b for p in media):
                problems.append(f"{where} lost an image, audio or file part")
    elif isinstance(a, str) and not isinstance(b, str):
        problems.append(f"{where} turned string content into {type(b).__name__}")
    return problems


def pairing_problems(messages: Sequence[Message], after: PairingScan | None = None) -> set[str]:
    """Tool-call pairing errors: unanswered call ids and tool results answering no earlier call
    (`after`: of those messages following the ones `after` scanned, as one list)."""
    scan = pairing_scan(messages, after)
    return {*scan.problems, *(f"tool call {cid!r} has no tool result" for cid in scan.pending)}


@dataclass(frozen=True)
class PairingScan:
    """Where `pairing_problems` stands after some messages: the errors so far, and the call ids
    of the last assistant still waiting for their results."""

    problems: frozenset[str] = frozenset()
    pending: tuple[str, ...] = ()


def pairing_scan(messages: Sequence[Message], after: PairingScan | None = None) -> PairingScan:
    """The scan of `messages` (continuing `after`'s), to go on with later messages."""
    problems: set[str] = set(after.problems) if after is not None else set()
    pending: dict[str, int] = dict.fromkeys(after.pending, 0) if after is not None else {}
    for pos, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or pending.pop(call_id, None) is None:
                problems.add(f"tool result {call_id!r} answers no preceding tool call")
            continue
        # Any other message closes the previous assistant's block of answers.
        if pending:
            problems.update(f"tool call {cid!r} has no tool result" for cid in pending)
        calls = m.get("tool_calls") if role == "assistant" else None
        pending = dict.fromkeys(tool_call_ids(m), pos) if calls else {}
    return PairingScan(frozenset(problems), tuple(pending))


def _new_pairing_problems(original: Sequence[Message], out: Sequence[Message]) -> list[str]:
    """Pairing errors the result has and its input did not (a client's own mistakes stay theirs)."""
    after = pairing_problems(out)
    if not after:
        return []
    return sorted(after - pairing_problems(original))


def _check_suffix(
    original: Sequence[Message], out: Sequence[Message], covered_through: int
) -> list[str]:
    if not -1 <= covered_through < len(original):
        return [f"covered_through {covered_through} is outside the input"]
    tail = len(original) - covered_through - 1
    if tail > len(out) or (tail and list(out[-tail:]) != list(original[-tail:])):
        return [f"the input after covered_through {covered_through} is not an unchanged suffix"]
    return []
