"""Compaction quality on real conversations: ratio, fit, validity, key facts kept, and speed.

    .venv/bin/python bench/quality.py [--limit N] [--providers trim,engine,...] [--corpora ...]
    .venv/bin/python bench/quality.py --big-only --providers engine --runs 20 --loop-runs 5

Corpora are read in place from the directory `$BENCH_CORPORA` names (never copied): tau-bench
airline (with its 14 tool schemas), aider sessions (console output kept), and the kinds
bench/corpora.py converts: coding-agent trajectories (`swe-agent`; `swe-windowed`, an agent with a
windowed file viewer), multi-session chats with questions about earlier sessions (`memorybank`,
`memory-tests`), long open-domain chats (`chitchat`) and IRC help threads full of links
(`irc-help`). docs/quality-bench.md lists sources and licences. Budgets are 50 % and 25 % of each
conversation's own tokens (o200k_base, tools included). Every provider is compared with the naive
baseline `drop-oldest` (drop the oldest whole units until it fits, like LiteLLM's `trim_messages`
but never orphaning a tool result; see `DropOldest`). `summarize` runs with a deterministic fake
completer that answers with the extractive summary of what it was asked to summarize, cut to the
word limit its prompt sets (no network; a real model's summaries read better but keep fewer exact
facts).

Fact probes are what the conversation uses next (bench/probes.py), never what a provider's extractor
recognises, and never found in the protected messages (system/developer, the last user message, the
final message). Agent runs (tau-bench, swe-agent, swe-windowed) are cut before an assistant turn
past 60 % of the run (swe-windowed: 40, 60 and 80 %): the history before the cut is compacted, and
the probes are the values the later tool calls pass, what the later turns name and (swe-agent) the
files, hunk functions and removed lines of the final patch, where the history holds them. QA chats
with annotated answers (memory-tests): the names, numbers and quoted strings of the answers. Other
chats (aider, memorybank, chitchat, irc-help): specific items (ids, numbers, dates, URLs in any
wrapping, paths, quoted or emphasised titles, names) that occur in at most three messages. The text
searched is the messages' text and their tool calls' names and arguments. Facts are reported per
split: "held-out" (a fifth of each corpus, by a hash of the id) is never looked at while tuning. Two
figures per split: facts kept *in context* (the probe with up to 24 non-space characters of its
original surroundings on each side, whitespace ignored: bench/measure.py), the figure that counts,
and facts kept *verbatim* (the probe appears anywhere), never reported alone.

A case can fit when system/developer + tools + the last user message (and a final message that
is not a tool result, or the calls that final tool results answer) fit with room for a marker
per reference the smallest reversible result names; "after/target" is the mean of tokens after
over the budget on those cases.

Times are CPU time of the `compress` call in this thread (`time.thread_time`), so they do not
depend on what else the machine runs; per-message token counts are warm, as in the proxy, which
counted the request before deciding to compact it. The first line printed is the host's speed on
two fixed workloads (`host_speed`), so timings from different hosts can be set side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import inspect
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import locations, quality_apis
from bench.measure import Windows, kept_verbatim, searchable, squeezed_text
from bench.probes import CUT_SHARE, agent_probes, answer_items, probes, rare_items
from proxy.app.application import SWITCH_INTERVAL
from proxy.providers.base import CompactionResult, CompressionConfig, ContextProvider, Message
from proxy.providers.engine import EngineProvider
from proxy.providers.registry import get_context_provider
from proxy.providers.units import (
    final_unit_start,
    hard_protected,
    last_index,
    message_text,
    split_units,
)
from proxy.providers.validate import check_result, pairing_problems
from proxy.text.extractive_summary import summarize_text
from proxy.tokens.counter import TokenCounter
from proxy.tokens.encodings import load_encoding

BUDGETS = (0.5, 0.25)
# One user message holding only `[compactd:ref=<10 hex>]` costs up to 20 tokens (o200k_base):
# the least that removing anything reversibly costs.
MARKER_TOKENS = 20
_PATH = re.compile(r"\b[\w.-]+(?:/[\w.-]+)*\.(?:py|md|js|ts|json|toml|yml|yaml|txt|sh|html|css)\b")
_TICKED = re.compile(r"`([^`\s]{3,60})`")


@dataclass
class Case:
    """One conversation of a corpus."""

    corpus: str
    id: str
    messages: list[Message]
    tools: list[Any] | None
    facts: list[str]
    split: str = ""

    def __post_init__(self) -> None:
        self.split = self.split or split_of(self.id)


@dataclass
class Row:
    """Accumulated figures for one (corpus, budget, provider)."""

    ratios: list[float] = field(default_factory=list)
    fit: list[bool] = field(default_factory=list)
    fit_possible: list[bool] = field(default_factory=list)
    valid: list[bool] = field(default_factory=list)
    used: list[float] = field(default_factory=list)
    """after / target for the cases that can fit (how much of the budget a result uses)."""
    kept: dict[str, int] = field(default_factory=dict)
    """Facts kept verbatim (anywhere) per split ("dev", "held-out")."""
    in_context: dict[str, int] = field(default_factory=dict)
    """Facts kept in context (bench/measure.py) per split."""
    facts: dict[str, int] = field(default_factory=dict)
    ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def split_of(case_id: str) -> str:
    """ "held-out" for a fifth of the ids (as bench/corpora.py splits the new corpora)."""
    return "held-out" if hashlib.sha256(case_id.encode()).digest()[0] % 5 == 0 else "dev"


def load_tau(limit: int | None) -> list[Case]:
    """tau-bench airline runs with their tool schemas, cut before an assistant turn; probes:
    the values the later tool calls pass and the later turns name (bench/probes.py)."""
    tau = locations.corpus(locations.TAU)
    tools = orjson.loads((tau / "airline_tools.json").read_bytes())
    cases = []
    for line in (tau / "messages_openai.jsonl").read_bytes().splitlines()[:limit]:
        row = orjson.loads(line)
        before, facts = agent_probes(row["messages"])
        cases.append(Case("tau-bench", row["id"], before, tools, facts))
    return cases


def load_aider(limit: int | None) -> list[Case]:
    """aider sessions with at least 4 messages; probes: their rare specific items."""
    cases = []
    for line in locations.corpus(locations.AIDER_SESSIONS).read_bytes().splitlines():
        row = orjson.loads(line)
        messages = row["messages"]
        if len(messages) < 4:
            continue
        cases.append(Case("aider", row["id"], messages, None, rare_items(messages)))
        if limit and len(cases) >= limit:
            break
    return cases


# The corpora bench/corpora.py writes (`locations.LABELS`): which probe rule each one takes.
_PROBES = {
    "swe-agent": "agent",
    "memorybank": "rare",
    "memory-tests": "answer-items",
    "chitchat": "rare",
    "swe-windowed": "agent",
    "irc-help": "rare",
}
# Where the runs of an agent corpus are cut (bench/probes.py): one cut a run, three for the
# small windowed-viewer corpus.
_CUTS = {"swe-windowed": (0.4, 0.6, 0.8)}


def load_new(label: str, limit: int | None) -> list[Case]:
    """One of the corpora of bench/corpora.py (skipped, with a note, if it is not there)."""
    rule = _PROBES[label]
    path = locations.converted(label)
    if path is None:
        return []
    cases = []
    for line in path.read_bytes().splitlines()[:limit]:
        row = orjson.loads(line)
        messages, tools, split = row["messages"], row.get("tools"), row["split"]
        if rule == "agent":
            for share in _CUTS.get(label, (CUT_SHARE,)):
                before, facts = agent_probes(messages, row["answers"], share)
                suffix = f"@{share:.0%}" if label in _CUTS else ""
                cases.append(Case(label, row["id"] + suffix, before, tools, facts, split))
            continue
        if rule == "answer-items":
            facts = probes(messages, answer_items(row["answers"]))
        else:
            facts = rare_items(messages)
        cases.append(Case(label, row["id"], messages, tools, facts, split))
    return cases


CORPUS_NAMES = ("tau-bench", "aider", *_PROBES)


def load(corpora: Sequence[str], limit: int | None) -> list[Case]:
    """The cases of the named corpora, in that order."""
    out: list[Case] = []
    for name in corpora:
        if name == "tau-bench":
            out += load_tau(limit)
        elif name == "aider":
            out += load_aider(limit)
        else:
            out += load_new(name, limit)
    return out


class DropOldest(ContextProvider):
    """Baseline: drop the oldest whole units (a user message, or an assistant message with all
    its tool results) until the request fits, like LiteLLM's `trim_messages` but valid: no tool
    result is ever orphaned. System/developer messages and the last user message stay; the
    newest units go last (the final one too, when only that fits)."""

    @property
    def name(self) -> str:
        """Registry-style name."""
        return "drop-oldest"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        """Drop units oldest first until the request is within `config.limit`."""
        last_user = last_index(messages, "user")
        keep = [True] * len(messages)
        total = config.count_tokens(messages)
        for unit in split_units(messages):
            if total <= config.limit:
                break
            if unit.kind == "system" or last_user in unit.indices():
                continue
            for i in unit.indices():
                keep[i] = False
                total -= config.count_message(messages[i])
        out = [m for m, k in zip(messages, keep, strict=True) if k]
        return CompactionResult(messages=out, source_digest="")


async def fake_complete(messages: list[Message], model: str, timeout: float) -> str:
    """A deterministic, obedient completer: the extractive summary of the text it was asked
    about, cut to the "at most N words" the prompt asks for."""
    limit = int(re.search(r"at most (\d+) words", messages[0]["content"]).group(1))  # type: ignore[union-attr]
    return " ".join(summarize_text(messages[-1]["content"], 0.3).split()[:limit])


def providers(names: Sequence[str]) -> list[ContextProvider]:
    """Instances of the requested providers (built-ins by entry point, plus the baseline)."""
    out: list[ContextProvider] = []
    for name in names:
        if name == "drop-oldest":
            out.append(DropOldest())
        elif name == "engine":
            out.append(EngineProvider())
        else:
            out.append(get_context_provider(name))
    return out


def can_fit(case: Case, count: Callable[[Sequence[Message]], int], budget: int) -> bool:
    """Whether the request is feasible: system/developer + tools + the last user message (and a
    final message that is not a tool result) fit the budget, with room for the one reference
    marker (`[compactd:ref=…]`) any reversible result needs. Final tool results do not count:
    as the last resort they may be cut head and tail, never dropped, so the tool calls they
    answer stay too (the calls alone: the text of their assistant message may go, but what
    stands in its place names its ref, one marker more), and the cut results name theirs."""
    messages = case.messages
    trailing = len(messages)
    while trailing > 0 and messages[trailing - 1].get("role") == "tool":
        trailing -= 1
    keep = {i for i in hard_protected(messages) if i < trailing}
    kept = [messages[i] for i in sorted(keep)]
    start = final_unit_start(messages)
    markers = int(len(keep) < len(messages)) + int(trailing < len(messages))
    if trailing < len(messages) and start < trailing and start not in keep:
        kept.append(
            {"role": "assistant", "content": None, "tool_calls": messages[start]["tool_calls"]}
        )
        markers += bool(message_text(messages[start]).strip())
    return count(kept) + MARKER_TOKENS * markers <= budget


@dataclass
class Bound:
    """What keeping whole messages verbatim could keep of one case's probes at one budget."""

    greedy: int
    """Probes kept by a greedy pick (most new probes per token first): reachable."""
    most: int
    """An upper bound for any verbatim pick (fractional knapsack, overlaps counted twice)."""


def verbatim_bound(
    case: Case,
    count: Callable[[Sequence[Message]], int],
    count_message: Callable[..., int],
    budget: int,
) -> Bound:
    """A feasibility bound, not a provider: it knows the probes, which no compaction does.

    The units holding a hard-protected message stay whole; every other unit (a user message, or
    an assistant message with its tool results) is kept verbatim or dropped, each run of dropped
    units leaving one reference marker (MARKER_TOKENS). `greedy` keeps, while they fit, the units
    with the most probes not yet kept per token (markers included): a pick that exists. `most`
    is the fractional-knapsack optimum of probes per unit with one marker in all, which no
    whole-unit pick can beat. A compaction that condenses (a facts line, a head-and-tail cut) can
    keep more than `most`: this bounds keeping messages, not compaction."""
    facts = set(case.facts)
    if count(case.messages) <= budget:
        return Bound(len(facts), len(facts))
    keep = hard_protected(case.messages)
    base: list[Message] = []
    # Per unit: its tokens and probes, None for a unit that stays.
    items: list[tuple[int, set[str]] | None] = []
    for unit in split_units(case.messages):
        run = [case.messages[i] for i in unit.indices()]
        if any(i in keep for i in unit.indices()):
            base += run
            items.append(None)
            continue
        text = searchable(run)
        items.append((sum(count_message(m) for m in run), {f for f in facts if f in text}))
    dropped = [it is not None for it in items]
    runs = sum(1 for u, d in enumerate(dropped) if d and (u == 0 or not dropped[u - 1]))
    room = budget - count(base)
    left = room - MARKER_TOKENS * runs
    if left < 0:
        return Bound(0, 0)

    def markers(u: int) -> int:
        """How many more markers keeping dropped unit u leaves (a run split, shortened or gone)."""
        before = u > 0 and dropped[u - 1]
        after = u + 1 < len(dropped) and dropped[u + 1]
        return MARKER_TOKENS * (int(before and after) - int(not before and not after))

    kept: set[str] = set()
    while True:
        best, best_gain = -1, 0.0
        for u, it in enumerate(items):
            if it is None or not dropped[u] or not it[1] - kept:
                continue
            cost = it[0] + markers(u)
            gain = len(it[1] - kept) / max(cost, 1)
            if cost <= left and gain > best_gain:
                best, best_gain = u, gain
        if best < 0:
            break
        found = items[best]
        assert found is not None
        left -= found[0] + markers(best)
        dropped[best] = False
        kept |= found[1]
    most, left_f = 0.0, float(room - MARKER_TOKENS)
    useful = [it for it in items if it and it[1]]
    useful.sort(key=lambda it: -len(it[1]) / max(it[0], 1))
    for cost, found in useful:
        if left_f <= 0:
            break
        take = min(1.0, left_f / max(cost, 1))
        most += take * len(found)
        left_f -= take * cost
    return Bound(len(kept), max(len(kept), min(len(facts), int(most))))


def valid(
    case: Case, result: CompactionResult, config: CompressionConfig, baseline: bool
) -> list[str]:
    """Invariant violations (pairing only, for the baseline that keeps no originals)."""
    if baseline:
        return sorted(pairing_problems(result.messages) - pairing_problems(case.messages))
    return check_result(case.messages, result, config, check_budget=False)


async def run(
    cases: list[Case],
    provs: list[ContextProvider],
    api: str = "chat",
    budgets: Sequence[float] = BUDGETS,
) -> dict[tuple[str, float, str], Row]:
    """Every provider on every case at every budget (`api`: the shape the cases are projected
    from, see bench/quality_apis.py; `budgets`: shares of each conversation's tokens)."""
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=200_000)
    per_message = quality_apis.counting(api, counter)
    rows: dict[tuple[str, float, str], Row] = {}
    for case in cases:

        def count(ms: Sequence[Message], case: Case = case) -> int:
            return per_message.count_messages(list(ms)) + counter.count_tools({"tools": case.tools})

        total = count(case.messages)  # warms the per-message cache, as the proxy's step 6 does
        windows = Windows(case.messages, case.facts)
        for fraction in budgets:
            budget = int(total * fraction)
            possible = can_fit(case, count, budget)
            config = CompressionConfig(
                limit=budget,
                budget=budget,
                count_tokens=count,
                count_message=per_message.count_message,
                complete=fake_complete,
            )
            for prov in provs:
                row = rows.setdefault((case.corpus, fraction, prov.name), Row())
                start = time.thread_time()
                out = prov.compress(list(case.messages), config)
                result = await out if inspect.isawaitable(out) else out
                row.ms.append((time.thread_time() - start) * 1000)
                after = count(result.messages)
                row.ratios.append(after / total)
                row.fit.append(after <= budget)
                row.fit_possible.append(possible)
                if possible:
                    row.used.append(after / budget)
                problems = valid(case, result, config, prov.name == "drop-oldest")
                row.valid.append(not problems)
                row.problems.extend(f"{case.id}@{fraction}: {p}" for p in problems[:1])
                kept = kept_verbatim(case.facts, searchable(result.messages))
                row.kept[case.split] = row.kept.get(case.split, 0) + kept
                in_context = windows.kept(squeezed_text(result.messages))
                row.in_context[case.split] = row.in_context.get(case.split, 0) + in_context
                row.facts[case.split] = row.facts.get(case.split, 0) + len(case.facts)
    return rows


def pct(values: Sequence[bool]) -> str:
    """Share of true values as a percentage."""
    return f"{100 * sum(values) / len(values):.0f} %" if values else "-"


def share(kept: int, total: int) -> str:
    """kept / total as a percentage ("-" when there is nothing to keep)."""
    return f"{100 * kept / total:.0f} %" if total else "-"


def table(rows: dict[tuple[str, float, str], Row]) -> str:
    """The markdown table: one row per corpus, budget and provider; facts kept in context and
    verbatim, per split."""
    head = (
        "| corpus | budget | provider | after/target | fit (when possible) | valid "
        "| in context (dev) | verbatim (dev) | in context (held-out) | verbatim (held-out) "
        "| p50 ms | p95 ms |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for (corpus, fraction, name), r in rows.items():
        possible = [f for f, p in zip(r.fit, r.fit_possible, strict=True) if p]
        ms = sorted(r.ms)
        used = f"{statistics.mean(r.used):.2f}" if r.used else "-"
        fit = f"{sum(possible)}/{len(possible)}"
        kept = " | ".join(
            share(counts.get(split, 0), r.facts.get(split, 0))
            for split in ("dev", "held-out")
            for counts in (r.in_context, r.kept)
        )
        lines.append(
            f"| {corpus} | {fraction:.0%} | {name} | {used} | {fit} | {pct(r.valid)} "
            f"| {kept} | {ms[len(ms) // 2]:.2f} | {ms[int(len(ms) * 0.95)]:.2f} |"
        )
    return "\n".join(lines)


def bound_table(cases: list[Case], api: str = "chat", budgets: Sequence[float] = BUDGETS) -> str:
    """Per corpus, budget and split: probes, and how many of them keeping whole messages
    verbatim could keep (`verbatim_bound`: reachable greedy pick, upper bound). A bound that
    knows the probes, printed apart from the providers so it is never read as one."""
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=200_000)
    per_message = quality_apis.counting(api, counter)
    sums: dict[tuple[str, float, str], list[int]] = {}
    for case in cases:

        def count(ms: Sequence[Message], case: Case = case) -> int:
            return per_message.count_messages(list(ms)) + counter.count_tools({"tools": case.tools})

        total = count(case.messages)
        for fraction in budgets:
            b = verbatim_bound(case, count, per_message.count_message, int(total * fraction))
            acc = sums.setdefault((case.corpus, fraction, case.split), [0, 0, 0])
            acc[0] += len(case.facts)
            acc[1] += b.greedy
            acc[2] += b.most
    lines = [
        "Feasibility bound (not a provider; it knows the probes): whole messages kept verbatim",
        "| corpus | budget | split | probes | greedy pick keeps | no verbatim pick keeps more |",
        "|---|---|---|---:|---:|---:|",
    ]
    for (corpus, fraction, split), (n, greedy, most) in sorted(
        sums.items(), key=lambda kv: (CORPUS_NAMES.index(kv[0][0]), -kv[0][1], kv[0][2])
    ):
        lines.append(
            f"| {corpus} | {fraction:.0%} | {split} | {n} | {greedy} ({share(greedy, n)}) "
            f"| {most} ({share(most, n)}) |"
        )
    return "\n".join(lines)


def synthetic(tokens: int) -> list[Message]:
    """A ~`tokens`-token agent conversation: prose, code, tool calls with JSON results."""
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    i = 0
    while len(orjson.dumps(messages)) < tokens * 4:
        messages.append(
            {
                "role": "user",
                "content": f"Please fix bug #{i} in src/module_{i}.py; it raises "
                f"KeyError: 'user_{i}' when the cache is cold. Sure, thanks a lot for the help!",
            }
        )
        call = f"call_{i:05d}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": f'{{"path": "src/module_{i}.py"}}',
                        },
                    }
                ],
            }
        )
        body = "\n".join(
            f"def handler_{i}_{k}(request):\n    return lookup(request, 'user_{i}')"
            for k in range(12)
        )
        messages.append({"role": "tool", "tool_call_id": call, "content": body})
        messages.append(
            {
                "role": "assistant",
                "content": "I looked at the file carefully. " * 6
                + f"The fix is to call `warm_cache()` before `lookup` in src/module_{i}.py. "
                + "Let me know if you need anything else. " * 4
                + f"\n\n```python\nwarm_cache()\nresult = lookup(request, 'user_{i}')\n```",
            }
        )
        i += 1
    messages.append({"role": "user", "content": "Now run the tests."})
    return messages


def concatenated(cases: list[Case], target_tokens: int, counter: TokenCounter) -> list[Message]:
    """One long conversation from real ones: the first system prompt, then every case's other
    messages in order, until it holds about `target_tokens` (ending on a user message)."""
    messages: list[Message] = []
    total = 0
    for case in cases:
        for message in case.messages:
            if message.get("role") == "system" and messages:
                continue
            messages.append(message)
            total += counter.count_message(message)
        if total >= target_tokens:
            break
    while messages and messages[-1].get("role") != "user":
        messages.pop()
    return messages


def freeze_loaded() -> None:
    """Keep what the bench has loaded (corpora, conversations) out of every later collection,
    as the proxy freezes its start-up objects (app.py): no worker holds them, and a full
    collection walking their millions of objects would land inside a timing."""
    gc.collect()
    gc.freeze()


def big_conversation_ms(provs: list[ContextProvider], runs: int = 3) -> list[str]:
    """CPU time to compress ~100k-token conversations, per sync provider, at two targets.

    Each run starts as a compaction in the proxy does: a fresh token counter that has counted the
    request (so the original messages' counts are cached, nothing a provider writes is), and a
    fresh provider call. The median of `runs` runs is reported, with the 95th percentile (nearest
    rank: the slowest of at most 20), per case and over all cases and targets at the end."""
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=200_000)
    conversations = {
        "synthetic": synthetic(100_000),
        "tau-bench runs": concatenated(load_tau(None), 100_000, counter),
        "aider sessions": concatenated(load_aider(None), 100_000, counter),
    }
    freeze_loaded()
    lines = []
    every: dict[str, list[float]] = {}
    for label, messages in conversations.items():
        total = counter.count_request({"messages": messages})
        lines.append(f"100k {label}: {len(messages)} messages, {total:,} tokens")
        for fraction in (0.7, 0.5):
            for prov in provs:
                if inspect.iscoroutinefunction(prov.compress) or prov.name == "none":
                    continue
                times = []
                for _ in range(runs):
                    fresh = TokenCounter(load_encoding("o200k_base"), cache_size=200_000)
                    fresh.count_request({"messages": messages})
                    config = CompressionConfig(
                        limit=int(total * fraction),
                        budget=int(total * fraction),
                        count_tokens=lambda ms, c=fresh: c.count_request({"messages": list(ms)}),
                        count_message=fresh.count_message,
                    )
                    start = time.thread_time()
                    result = prov.compress(list(messages), config)
                    times.append((time.thread_time() - start) * 1000)
                after = counter.count_request({"messages": result.messages})
                every.setdefault(prov.name, []).extend(times)
                lines.append(
                    f"- {fraction:.0%} target, {prov.name}: median {statistics.median(times):.0f} "
                    f"ms CPU (p95 {p95(times):.0f}), {after:,} tokens after"
                )
    for name, times in every.items():
        lines.append(
            f"all 100k runs, {name}: p50 {statistics.median(times):.0f} ms CPU, "
            f"p95 {p95(times):.0f} ({len(times)} runs)"
        )
    return lines


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def log_text(lines: int = 40_000, seed: int = 1) -> str:
    """A ~3 MB application log (paths, ids, errors, numbers) as one message would carry it."""
    rnd = random.Random(seed)
    words = ["ERROR", "failed", "src/app/module_3.py", "user_42", "the", "request", "timeout"]
    words += ["at", "line", "12", "KeyError:", "'x'", "ok"]
    return "\n".join(" ".join(rnd.choice(words) for _ in range(12)) for _ in range(lines))


def host_speed(rounds: int = 5) -> str:
    """CPU time of two fixed workloads that no compactd code runs in, so that timings taken on
    different hosts can be compared: o200k_base encoding a ~200 KB log, and the same log's lines
    split, hashed into sets and sorted in pure Python (the kind of glue the engine's search is
    made of). Each is the fastest of `rounds`, in this thread (`time.thread_time`)."""
    text = log_text(3_000, seed=7)
    encoding = load_encoding("o200k_base")

    def python_glue() -> None:
        seen: dict[str, int] = {}
        for line in text.splitlines():
            for term in set(line.split()):
                seen[term] = seen.get(term, 0) + len(term)
        sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        ",".join(line[:20] for line in text.splitlines())

    def fastest(work: Callable[[], object]) -> float:
        times = []
        for _ in range(rounds):
            start = time.thread_time()
            work()
            times.append((time.thread_time() - start) * 1000)
        return min(times)

    tiktoken_ms = fastest(lambda: encoding.encode_ordinary(text))
    python_ms = fastest(python_glue)
    return (
        f"host speed (fixed workloads, fastest of {rounds}; lower is a faster host): "
        f"tiktoken {tiktoken_ms:.1f} ms, Python {python_ms:.1f} ms"
    )


def event_loop_gaps(provs: list[ContextProvider], runs: int = 1) -> list[str]:
    """The longest the event loop waits while a provider compresses in a worker thread (as the
    proxy runs sync providers), on the 100k aider history with a 3 MB log message added
    (`runs` times per provider: each line is one run).

    A ticker sleeps 1 ms at a time on the loop; a gap well past the thread switch interval the
    proxy sets (2 ms) means one call held the GIL that long. On a host other processes load, a
    gap also holds the time the OS ran them instead: beside each gap, the CPU time this process
    used meanwhile (`time.process_time`) is its share that the worker thread took."""
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=200_000)
    messages = concatenated(load_aider(None), 100_000, counter)
    messages = [*messages[:5], {"role": "user", "content": log_text()}, *messages[5:]]
    total = counter.count_request({"messages": messages})
    config = CompressionConfig(
        limit=total // 2,
        budget=total // 2,
        count_tokens=lambda ms: counter.count_request({"messages": list(ms)}),
        count_message=counter.count_message,
    )
    freeze_loaded()
    sys.setswitchinterval(SWITCH_INTERVAL)  # as the proxy sets it at start-up
    lines = [f"event loop while compressing ({len(messages)} messages, {total:,} tokens, 50 %):"]

    async def measure(prov: ContextProvider) -> str:
        gaps: list[float] = []
        busy: list[float] = []  # this process's CPU time within each gap
        running = True

        async def ticker() -> None:
            last, last_cpu = time.perf_counter(), time.process_time()
            while running:
                await asyncio.sleep(0.001)
                now, cpu = time.perf_counter(), time.process_time()
                gaps.append(now - last)
                busy.append(cpu - last_cpu)
                last, last_cpu = now, cpu

        task = asyncio.create_task(ticker())
        start = time.perf_counter()
        await asyncio.to_thread(prov.compress, list(messages), config)
        wall = time.perf_counter() - start
        running = False
        await task
        longest = max(range(len(gaps)), key=gaps.__getitem__)
        gaps.sort()
        return (
            f"- {prov.name}: {wall * 1000:.0f} ms; longest loop gap {gaps[-1] * 1000:.1f} ms "
            f"({busy[longest] * 1000:.1f} ms CPU), p99 {gaps[int(len(gaps) * 0.99)] * 1000:.1f} "
            f"ms; longest gap in CPU {max(busy) * 1000:.1f} ms"
        )

    for prov in provs:
        if inspect.iscoroutinefunction(prov.compress) or prov.name in ("none", "drop-oldest"):
            continue
        for _ in range(runs):
            lines.append(asyncio.run(measure(prov)))
    return lines


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="conversations per corpus")
    parser.add_argument("--providers", default="drop-oldest,none,trim,middle-out,engine,summarize")
    parser.add_argument("--corpora", default=",".join(CORPUS_NAMES), help="which corpora")
    parser.add_argument("--big-only", action="store_true", help="only the 100k-token timing")
    parser.add_argument("--no-big", action="store_true", help="skip the 100k-token timing")
    parser.add_argument("--runs", type=int, default=3, help="runs per 100k-token case")
    parser.add_argument(
        "--loop-runs", type=int, default=1, help="event-loop measurements per provider"
    )
    parser.add_argument(
        "--bound", action="store_true", help="also print the verbatim feasibility bound"
    )
    parser.add_argument(
        "--api", choices=("chat", "responses", "messages"), default="chat", help="request shape"
    )
    parser.add_argument(
        "--budgets",
        default=",".join(str(b) for b in BUDGETS),
        help="shares of each conversation's tokens, comma-separated (tune at harder ones "
        "where a split is saturated at the defaults)",
    )
    parser.add_argument(
        "--split",
        choices=("all", "dev", "held-out"),
        default="all",
        help="only the cases of one split (tune with dev: held-out is never shown)",
    )
    args = parser.parse_args()
    print(host_speed())
    print()
    budgets = [float(b) for b in args.budgets.split(",")]
    provs = providers(args.providers.split(","))
    if args.big_only:
        print("\n".join(big_conversation_ms(provs, args.runs)))
        print("\n".join(event_loop_gaps(provs, args.loop_runs)))
        return
    cases = [quality_apis.as_api(c, args.api) for c in load(args.corpora.split(","), args.limit)]
    if args.split != "all":
        cases = [c for c in cases if c.split == args.split]
    freeze_loaded()
    rows = asyncio.run(run(cases, provs, args.api, budgets))
    print(table(rows))
    print()
    if args.bound:
        print(bound_table(cases, args.api, budgets))
        print()
    for (corpus, fraction, name), r in rows.items():
        for p in r.problems[:3]:
            print(f"invalid {corpus} {fraction:.0%} {name}: {p}")
    if not args.no_big:
        print("\n".join(big_conversation_ms(provs, args.runs)))


if __name__ == "__main__":
    main()
