"""The cost of real sessions with and without compactd, net of prompt caching.

    .venv/bin/python bench/cost.py [--corpus tau-bench,aider,...] [--limit 5] [--model gpt-5.4]
        [--rule openai|openai-writes|anthropic|anthropic-1h] [--seed 0] [--gap S] [--ttl S]
        [--policies default,cap-16k,...] [--json out.json]
        [--plot out.png] [--sessions [--session-policies default,cap-16k]]

Every session of the chosen corpora (bench/quality's loaders and fact probes; longest first,
`--limit` per corpus) is replayed turn by turn through compactd in-process (tests/inprocess.py:
the real app, store and providers, an `httpx.MockTransport` upstream answering each request with
the recorded assistant message), once per policy, each policy under its own API key (tenant).
Every request the client sends and every request compactd forwards is priced with a prompt-cache
model of the provider's published rules (bench/cache_model.py on proxy/telemetry/pricing.py; one
cache per session and arm, entries living the rule's lifetime or `--ttl` seconds) at the model's
prices from config/models.toml. Requests are sent at the corpus's real times where it has them
and a seeded gap model's otherwise (bench/timing.py; `--gap S`: a turn every S seconds instead);
compactd's clock follows the same times, so its cold-cache compaction sees the gaps. Output
tokens are the recorded reply's tokens, the same in both arms; the savings are also given per
kind of gap (the turns after an agent's tool call, a human's message, a return, a new day).

Every fail-open is counted per policy with its reason (`x-compactd-error`); a policy with any is
not eligible as a default. The store's timeout is `--store-timeout-ms` (5 s: on a shared VM a
store call slower than the shipped 200 ms is load, not policy; bench/store measures the store).

At the end of each session one more request asks about it (the session's messages, plus a user
question when they do not end with one), and the quality probes of bench/quality are looked for
in what compactd forwards: a fact is kept *in context* when some occurrence of it is still in the
text or tool-call arguments of a non-system message with up to 24 non-space characters of its
original surroundings on each side (bench/measure.py, the measure bench/quality reports); facts
kept verbatim (anywhere, with or without their surroundings) are printed beside it. "Reachable"
also counts facts kept in context inside the originals of the refs the forwarded messages carry
(what the model could expand). That request is not priced.

Policies: `default` (the shipped default policy; under `--rule anthropic` as it budgets a Messages
request, which its `cap_apis` leave uncapped), `no-cap` (budget_tokens = 0: the budget is the
model's window), `cap-<N>k` (budget_tokens = N x 1000), `window-<P>%` (budget_fraction, no cap), the
caps on every API, each also with `+lossless` and `+expand` and both, where the policy keys exist,
and `cap-<N>k+summarize` (the `summarize` provider with the conversation's own model: its calls are
answered with the span's first words, as many as it asks for, and priced in the "with" arm through
the same cache, which their prefix shares). Prints markdown tables: the totals per policy, net
saving / facts kept per policy and corpus, and the prompt tokens the lossless tier alone saves per
corpus (`no-cap+lossless`: nothing else rewrites a request under a 1M window); `--sessions` adds one
row per corpus and policy and one per session for the `--session-policies` (default: the shipped
default and the policies the rule picks). Last, the rule's picks (`choose_default`): over every
policy, over those that forward requests under their trigger byte for byte (what the shipped default
may be), and letting sessions pay more (the `savings` preset). `--json` keeps every session's
figures, `--plot` draws net saving and facts kept against the budget cap, one line per corpus (needs
matplotlib: the `bench` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cache_model import Priced, PromptCache, Rule, Segment
from bench.measure import Windows, kept_verbatim, squeezed_text
from bench.quality import CORPUS_NAMES, Case, load, searchable
from bench.session import table
from bench.timing import KINDS, timing
from proxy.chat.cold_cache import ColdCache
from proxy.config import APIS, PolicySettings
from proxy.providers.summarize import CACHED_AGGRESSIVE, CACHED_INSTRUCTION, NORMAL_PROMPT
from proxy.providers.units import message_text, refs_in
from proxy.telemetry.pricing import RULES, CacheRule, Prices
from proxy.tokens.budget import ModelInfo, ModelTable
from proxy.tokens.counter import TokenCounter, Tokenizers
from proxy.tokens.encodings import load_encoding
from tests.inprocess import MockUpstream, reply, running
from tests.upstream import chat_completion

POLICY_HEADER = "x-bench-policy"
PROBE = "Before we finish: sum up everything above that I may still need, with exact details."
CAPS = (4, 8, 16, 32, 64)
COLD_BUDGETS = (8, 16, 32)
"""The `+cold<N>k` policies' cold_budget_tokens, in thousands (proxy/chat/cold_cache.py)."""
PEAK = 32_000
"""The issue's target is over sessions whose largest request exceeds this many tokens."""
FRACTIONS = (0.25, 0.5)
LOSSLESS_ALONE = "no-cap+lossless"
SUMMARIZE = {"providers": ["summarize"], "options": {"summarize": {"model": ""}}}
"""The `+summarize` policies' chain: LLM summaries by the conversation's own model, whose
requests read the conversation from the cache (proxy/providers/summarize.py)."""
_STARTS = tuple(t.split("{", 1)[0] for t in (CACHED_INSTRUCTION, CACHED_AGGRESSIVE, NORMAL_PROMPT))


@dataclass(frozen=True)
class Policy:
    """A benchmarked policy: its name and the [[policies]] keys that make it."""

    name: str
    keys: dict[str, Any]
    cap: int | None = None
    """The budget cap it stands for on the plot (tokens; None: not a cap policy)."""

    @property
    def variant(self) -> str:
        """ "" for the base policy, else e.g. "+lossless"."""
        return self.name[self.name.find("+") :] if "+" in self.name else ""

    @property
    def base(self) -> str:
        return self.name.split("+", 1)[0]


def _has_key(key: str) -> bool:
    return key in {f.name for f in dataclasses.fields(PolicySettings)}


def all_policies() -> list[Policy]:
    """Every policy the issue asks for, with the variants whose keys exist in this build."""
    every = {"cap_apis": list(APIS)} if _has_key("cap_apis") else {}
    bases = [Policy("default", {}), Policy("no-cap", {"budget_tokens": 0})]
    bases += [Policy(f"cap-{k}k", {"budget_tokens": k * 1000, **every}, cap=k * 1000) for k in CAPS]
    bases += [
        Policy(f"window-{int(f * 100)}%", {"budget_tokens": 0, "budget_fraction": f, **every})
        for f in FRACTIONS
    ]
    variants: list[tuple[str, dict[str, Any]]] = [("", {})]
    if _has_key("lossless"):
        variants.append(("+lossless", {"lossless": True}))
    if _has_key("expand_tool"):
        variants.append(("+expand", {"expand_tool": True}))
        if _has_key("lossless"):
            variants.append(("+lossless+expand", {"lossless": True, "expand_tool": True}))
    grid = [
        Policy(b.name + suffix, {**b.keys, **extra}, b.cap)
        for b in bases
        for suffix, extra in variants
    ]
    if _has_key("cold_budget_tokens"):
        # Cold-cache compaction on top of each base (no-cap+cold8k: cold-cache compaction
        # alone), where the cold budget is under the base's cap (else it changes nothing).
        grid += [
            Policy(f"{b.name}+cold{k}k", {**b.keys, "cold_budget_tokens": k * 1000}, b.cap)
            for b in bases
            for k in COLD_BUDGETS
            if b.cap is None or k * 1000 < b.cap
        ]
    # The summarize provider on the caps (its calls are priced into the bill).
    grid += [Policy(f"{b.name}+summarize", {**b.keys, **SUMMARIZE}, b.cap) for b in bases if b.cap]
    return grid


@dataclass
class Arm:
    """One side of the comparison: the client's own requests, or what compactd forwarded."""

    usd: float = 0.0
    prompt: float = 0
    cached: float = 0
    """Prompt tokens read from the cache (and, under the Anthropic rule, written to it)."""
    written: float = 0

    def add(self, priced: Priced, usd: float) -> None:
        self.usd += usd
        self.prompt += priced.total
        self.cached += priced.cached
        self.written += priced.written

    def merge(self, other: Arm) -> None:
        for f in dataclasses.fields(Arm):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Figures:
    """What is summed over turns and sessions."""

    turns: int = 0
    plain: Arm = field(default_factory=Arm)
    sent: Arm = field(default_factory=Arm)
    compactions: int = 0
    errors: int = 0
    overhead_ms: list[float] = field(default_factory=list)
    facts: int = 0
    kept: int = 0
    """Facts kept in context (bench/measure.py: with up to 24 non-space characters of their own
    surroundings each side) in what is forwarded at the end of the session ..."""
    reachable: int = 0
    """... or in the originals of the refs it carries (what the expand tool can bring back)."""
    verbatim: int = 0
    """Facts still anywhere in what is forwarded, with or without their surroundings."""
    summary_calls: int = 0
    """Calls the summarize provider made upstream; their cost is in `sent` ..."""
    summary_usd: float = 0.0
    """... and is this much of it."""

    @property
    def saving(self) -> float:
        """Net saving share of the bill (negative: compactd cost money)."""
        return 1 - self.sent.usd / self.plain.usd if self.plain.usd else 0.0

    @property
    def kept_share(self) -> float:
        return self.kept / self.facts if self.facts else 1.0


_SUMMED = tuple(f.name for f in dataclasses.fields(Figures))


@dataclass
class SessionResult(Figures):
    """One session under one policy."""

    corpus: str = ""
    session: str = ""
    policy: str = ""
    actions: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, list[float]] = field(default_factory=dict)
    """Per kind of gap (bench/timing.py): turns, USD without, USD with."""
    peak: int = 0
    """The largest request the client sent (tokens)."""

    def add_gap(self, kind: str, without: float, with_: float) -> None:
        row = self.gaps.setdefault(kind, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += without
        row[2] += with_


@dataclass(frozen=True)
class Pricing:
    """A model's prices, per token, under a cache rule (`proxy.telemetry.pricing`)."""

    prices: Prices

    @classmethod
    def of(cls, info: ModelInfo, rule: Rule | CacheRule) -> Pricing:
        """The table's prices, its cache prices where it has them, else the rule's multiples."""
        cache_rule = RULES[rule] if isinstance(rule, str) else rule
        return cls(
            Prices.of(
                cache_rule,
                input_price=info.input_price,
                cached_input_price=info.cached_input_price,
                output_price=info.output_price,
                cache_write_price=info.cache_write_price,
            )
        )

    def cost(self, priced: Priced, output: int) -> float:
        return self.prices.cost(
            uncached=priced.uncached, cached=priced.cached, written=priced.written, output=output
        )


class Segmenter:
    """Requests as cache segments: the tool schemas, then each message, tokenized once."""

    def __init__(self) -> None:
        self.encoding = load_encoding("o200k_base")
        self._tokens: dict[bytes, tuple[int, ...]] = {}

    def segment(self, value: Any) -> Segment:
        key = orjson.dumps(value)
        tokens = self._tokens.get(key)
        if tokens is None:
            tokens = tuple(self.encoding.encode(key.decode(), disallowed_special=()))
            self._tokens[key] = tokens
        return Segment(key, tokens)

    def request(self, body: dict[str, Any]) -> list[Segment]:
        head = [self.segment(body["tools"])] if body.get("tools") else []
        return head + [self.segment(m) for m in body.get("messages", [])]


def _head(body: dict[str, Any]) -> int:
    """Segments the first Anthropic breakpoint covers: the tools and the leading system messages."""
    n = 1 if body.get("tools") else 0
    for m in body.get("messages", []):
        if m.get("role") not in ("system", "developer"):
            break
        n += 1
    return max(n, 1)


def summary_call(body: dict[str, Any]) -> bool:
    """Whether an upstream request is the summarize provider's (by its instruction's words)."""
    messages = body.get("messages") or []
    ends = messages[-1].get("content") if messages else None
    starts = messages[0].get("content") if messages else None
    return any(isinstance(t, str) and t.startswith(_STARTS) for t in (ends, starts))


def fake_summary(body: dict[str, Any]) -> str:
    """The bench's summarizer: the first words of the span, as many as the instruction allows."""
    messages = body["messages"]
    asked = messages[-1]["content"]
    if asked.startswith(_STARTS[:2]):
        count = int(re.search(r"the last (\d+) messages", asked).group(1))  # type: ignore[union-attr]
        text = " ".join(message_text(m) for m in messages[-1 - count : -1])
    else:
        asked, text = messages[0]["content"], asked
    words = int(re.search(r"at most (\d+) words", asked).group(1))  # type: ignore[union-attr]
    return " ".join(text.split()[:words]) or "nothing"


def turns_of(case: Case) -> list[int]:
    """Indices of the assistant messages after the first message: each is one request."""
    return [i for i, m in enumerate(case.messages) if m.get("role") == "assistant" and i > 0]


def probe_request(case: Case) -> list[dict[str, Any]]:
    """The end-of-session question: the whole session, and a user question unless it ends so."""
    messages = list(case.messages)
    if messages[-1].get("role") != "user":
        messages.append({"role": "user", "content": PROBE})
    return messages


class _Clock:
    """compactd's clock in the replay: the simulated send time of the current request."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


class Replayer:
    """Replays sessions through one in-process compactd that knows every policy."""

    def __init__(
        self,
        model: str,
        rule: Rule,
        ttl: float | None,
        gap: float | None,
        policies: Sequence[Policy],
        store_timeout_ms: int = 5000,
    ) -> None:
        self.model = model
        self.rule: Rule = rule
        self.ttl = ttl
        self.gap = gap
        """Seconds between turns; None: the corpus's times, else bench/timing's gap model."""
        self.seed = 0
        self.clock = _Clock()
        self.policies = list(policies)
        table = ModelTable.load()
        info = table.lookup(model)
        self.pricing = Pricing.of(info, rule)
        self.counter: TokenCounter = Tokenizers().for_model(info)
        self.segmenter = Segmenter()
        self.upstream = MockUpstream(default=self._answer)
        self.reply: dict[str, Any] = {"role": "assistant", "content": ""}
        self.store_timeout_ms = store_timeout_ms
        self.summaries: list[tuple[dict[str, Any], str]] = []
        """The summarize provider's calls since the last turn was priced, with their replies."""

    def _answer(self, request: httpx.Request) -> httpx.Response:
        message = {k: v for k, v in self.reply.items() if k in ("role", "content", "tool_calls")}
        asked = orjson.loads(request.content)
        if summary_call(asked):
            message = {"role": "assistant", "content": fake_summary(asked)}
            self.summaries.append((asked, message["content"]))
        body = chat_completion()
        body["choices"][0]["message"] = {**message, "refusal": None}
        body["choices"][0]["finish_reason"] = "tool_calls" if message.get("tool_calls") else "stop"
        return reply(200, body)(request)

    def sections(self) -> dict[str, Any]:
        policies = [
            {
                "name": p.name,
                "match_header": POLICY_HEADER,
                "match_header_values": [p.name],
                **p.keys,
            }
            for p in self.policies
            if p.name != "default"
        ]
        default = next((p.keys for p in self.policies if p.name == "default"), {})
        if _has_key("cold_after_seconds"):
            # compactd takes the cache as gone after the priced rule's surely-gone bound.
            after = {"cold_after_seconds": RULES[self.rule].cold_after}
            policies = [{**p, **after} for p in policies]
            default = {**default, **after}
        return {
            "default_policy": default,
            "policies": policies,
            "accounting": {"enabled": False},
            # A store call slower than the shipped 200 ms fails open, which on a shared VM is
            # load, not policy: the bench prices policies, bench/store measures the store.
            "store": {"timeout_ms": self.store_timeout_ms},
        }

    async def run(self, cases: Sequence[Case], progress: bool = True) -> list[SessionResult]:
        out: list[SessionResult] = []
        with tempfile.TemporaryDirectory(prefix="compactd-cost-") as tmp:
            async with running(Path(tmp), self.upstream, **self.sections()) as proxy:
                for n, case in enumerate(cases):
                    for policy in self.policies:
                        out.append(await self._session(proxy, case, policy))
                    if progress:
                        print(f"  {case.corpus} {n + 1}/{len(cases)} {case.id}", file=sys.stderr)
        return out

    async def _session(self, proxy: Any, case: Case, policy: Policy) -> SessionResult:
        result = SessionResult(corpus=case.corpus, session=case.id, policy=policy.name)
        result.facts = len(case.facts)
        without, with_ = PromptCache(self.rule, self.ttl), PromptCache(self.rule, self.ttl)
        key = f"sk-bench-{policy.name}"
        headers = {POLICY_HEADER: policy.name} if policy.name != "default" else {}
        turns = turns_of(case)
        times = timing(case.corpus, case.id, case.messages, turns, self.seed)
        # compactd's clock follows the session's times; its cold-cache memory starts empty.
        sizing = proxy.services.compactor.sizing
        sizing.cold = ColdCache(sizing.metrics, self.clock)
        for turn, index in enumerate(turns):
            self.clock.now = times.times[turn] if self.gap is None else turn * self.gap
            body = self._body(case, case.messages[:index])
            self.reply = case.messages[index]
            self.summaries.clear()
            response = await proxy.chat(body, key=key, **headers)
            forwarded = orjson.loads(proxy.upstream.last.content)
            if response.status_code != 200:
                why = f"error: http {response.status_code}"
                result.actions[why] = result.actions.get(why, 0) + 1
                result.errors += 1
                continue
            action = response.headers.get("x-compactd-action", "")
            if action == "error":  # the fail-open reason, e.g. "error: store"
                action = f"error: {response.headers.get('x-compactd-error', '?')[:60]}"
            result.actions[action] = result.actions.get(action, 0) + 1
            result.compactions += action == "compacted"
            result.errors += action.startswith("error")
            before = int(response.headers.get("x-compactd-tokens-before") or 0)
            after = int(response.headers.get("x-compactd-tokens-after") or before)
            result.overhead_ms.append(float(response.headers.get("x-compactd-overhead-ms") or 0))
            now = self.clock.now
            result.peak = max(result.peak, before)
            # The summarizer's calls went before the forwarded request, through the same cache.
            summarized = self._price_summaries(with_, now, result)
            plain = without.price(self.segmenter.request(body), now, _head(body)).scale(before)
            sent = with_.price(self.segmenter.request(forwarded), now, _head(forwarded)).scale(
                after
            )
            output = self.counter.count_message(self.reply)
            result.turns += 1
            usd = self.pricing.cost(plain, output), self.pricing.cost(sent, output)
            result.plain.add(plain, usd[0])
            result.sent.add(sent, usd[1])
            kind = times.kinds[turn] if self.gap is None else "fixed"
            result.add_gap(kind, usd[0], usd[1] + summarized)
        await self._probe(proxy, case, result, key, headers)
        return result

    def _price_summaries(self, cache: PromptCache, now: float, result: SessionResult) -> float:
        """Price this turn's summarizer calls into `result.sent`: their prompt (its cached share
        by the arm's cache, which their prefix shares) and their reply. Returns their USD."""
        usd = 0.0
        for asked, answer in self.summaries:
            tokens = self.counter.count_messages(asked["messages"])
            priced = cache.price(self.segmenter.request(asked), now, _head(asked)).scale(tokens)
            cost = self.pricing.cost(
                priced, self.counter.count_message({"role": "assistant", "content": answer})
            )
            result.sent.add(priced, cost)
            result.summary_calls += 1
            usd += cost
        result.summary_usd += usd
        self.summaries.clear()
        return usd

    def _body(self, case: Case, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if case.tools:
            body["tools"] = case.tools
        return body

    async def _probe(
        self, proxy: Any, case: Case, result: SessionResult, key: str, headers: dict[str, str]
    ) -> None:
        self.reply = {"role": "assistant", "content": "ok"}
        response = await proxy.chat(self._body(case, probe_request(case)), key=key, **headers)
        forwarded = orjson.loads(proxy.upstream.last.content)["messages"]
        windows = Windows(case.messages, case.facts)
        result.kept = windows.kept(squeezed_text(forwarded))
        result.verbatim = kept_verbatim(case.facts, searchable(forwarded))
        result.reachable = result.kept
        if response.status_code == 200 and any(refs_in(m) for m in forwarded):
            restored = await proxy.uncompress(forwarded, key=key)
            if restored.status_code == 200:
                full = squeezed_text(restored.json()["messages"])
                result.reachable = windows.kept(full)


def longest_first(cases: list[Case], counter: TokenCounter, limit: int) -> list[Case]:
    """The `limit` longest sessions with at least two requests (0: all)."""
    usable = [c for c in cases if len(turns_of(c)) >= 2]
    usable.sort(key=lambda c: -counter.count_messages(c.messages))
    return usable[:limit] if limit else usable


# ---- figures --------------------------------------------------------------------------------


@dataclass
class Total(Figures):
    """Sums over a set of sessions."""

    sessions: int = 0
    worst: float = 0.0
    negative: int = 0
    shares: list[float] = field(default_factory=list)
    """Each session's share of its facts kept."""

    @property
    def mean_kept(self) -> float:
        """Facts kept with every session weighing the same (one long session with thousands of
        facts weighs as much as a short one)."""
        return statistics.fmean(self.shares) if self.shares else 1.0

    def add(self, r: SessionResult) -> None:
        self.shares.append(r.kept_share)
        self.worst = r.saving if not self.sessions else min(self.worst, r.saving)
        self.sessions += 1
        self.negative += r.saving < -1e-9
        for name in _SUMMED:
            mine = getattr(self, name)
            if isinstance(mine, Arm):
                mine.merge(getattr(r, name))
            else:
                setattr(self, name, mine + getattr(r, name))

    def row(self, key: str) -> dict[str, str]:
        mean = statistics.fmean(self.overhead_ms) if self.overhead_ms else 0.0
        p95 = (
            sorted(self.overhead_ms)[int(0.95 * (len(self.overhead_ms) - 1))]
            if self.overhead_ms
            else 0
        )
        return {
            "policy": key,
            "sessions": str(self.sessions),
            "usd": f"{self.plain.usd:.2f} → {self.sent.usd:.2f}",
            "saving": f"{self.saving * 100:+.1f} %",
            "worst": f"{self.worst * 100:+.1f} %",
            "hit": f"{_share(self.plain.cached, self.plain.prompt)} → "
            f"{_share(self.sent.cached, self.sent.prompt)}",
            "events": str(self.compactions),
            "tokens": f"{self.sent.prompt / 1e6:.2f}M / {self.plain.prompt / 1e6:.2f}M",
            "facts": f"{_share(self.kept, self.facts)}"
            + (f" ({_share(self.reachable, self.facts)})" if self.reachable != self.kept else ""),
            "mean facts": f"{self.mean_kept * 100:.1f} %",
            "verbatim": _share(self.verbatim, self.facts),
            "latency": f"{mean:.1f} / {p95:.1f}",
            "errors": str(self.errors),
            "summaries": f"{self.summary_calls} / {self.summary_usd:.2f}",
        }


def _share(a: float, b: float) -> str:
    return f"{a / b * 100:.1f} %" if b else "—"


COLUMNS = (
    ("policy", "policy"),
    ("sessions", "sessions"),
    ("USD without → with", "usd"),
    ("net saving", "saving"),
    ("worst session", "worst"),
    ("cache-hit share without → with", "hit"),
    ("compaction events", "events"),
    ("tokens forwarded / without", "tokens"),
    ("facts kept in context (reachable)", "facts"),
    ("in context, session mean", "mean facts"),
    ("facts verbatim", "verbatim"),
    ("added ms / turn, mean / p95", "latency"),
    ("errors", "errors"),
    ("summarizer calls / USD (in `with`)", "summaries"),
)


def totals(results: Sequence[SessionResult], by: str = "policy") -> dict[str, Total]:
    out: dict[str, Total] = {}
    for r in results:
        key = getattr(r, by) if by != "corpus+policy" else f"{r.corpus} · {r.policy}"
        out.setdefault(key, Total()).add(r)
    return out


def matrix(results: Sequence[SessionResult], corpora: Sequence[str]) -> str:
    """Net saving / facts kept per policy (rows) and corpus (columns)."""
    cells = totals(results, "corpus+policy")
    policies = list(dict.fromkeys(r.policy for r in results))
    lines = ["| policy | " + " | ".join(corpora) + " |", "|" + "---|" * (len(corpora) + 1)]
    for p in policies:
        row = []
        for c in corpora:
            t = cells.get(f"{c} · {p}")
            row.append(f"{t.saving * 100:+.1f} % / {t.kept_share * 100:.0f} %" if t else "—")
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def lossless_alone(results: Sequence[SessionResult], corpora: Sequence[str]) -> str:
    """Prompt tokens the lossless tier saves on its own, per corpus: `no-cap+lossless` against
    what the client sent (no cap: nothing else rewrites these sessions)."""
    cells = totals([r for r in results if r.policy == LOSSLESS_ALONE], "corpus")
    lines = [
        "| corpus | prompt tokens without → with the lossless tier | saved | net saving |",
        "|---|---|---|---|",
    ]
    for c in corpora:
        t = cells.get(c)
        if t is None:
            continue
        saved = 1 - t.sent.prompt / t.plain.prompt if t.plain.prompt else 0.0
        lines.append(
            f"| {c} | {t.plain.prompt / 1e6:.3f}M → {t.sent.prompt / 1e6:.3f}M"
            f" | {saved * 100:.1f} % | {t.saving * 100:+.1f} % |"
        )
    return "\n".join(lines)


def per_session(results: Sequence[SessionResult], policies: Sequence[str]) -> str:
    """One row per session and policy (the policies named, in that order)."""
    rows = []
    for name in policies:
        for r in results:
            if r.policy == name:
                t = Total()
                t.add(r)
                rows.append(t.row(f"{r.corpus} · {r.session[:40]} · {name}"))
    return table(rows, COLUMNS)


def by_gap(results: Sequence[SessionResult], policies: Sequence[str]) -> str:
    """Net saving per policy (rows) and kind of gap (columns): the turns after such a gap."""
    sums: dict[tuple[str, str], list[float]] = {}
    for r in results:
        for kind, (n, without, with_) in r.gaps.items():
            row = sums.setdefault((r.policy, kind), [0, 0.0, 0.0])
            row[0] += n
            row[1] += without
            row[2] += with_
    kinds = [k for k in (*KINDS, "fixed") if any(k == kk for _, kk in sums)]
    lines = ["| policy | " + " | ".join(kinds) + " |", "|" + "---|" * (len(kinds) + 1)]
    for p in policies:
        cells = []
        for k in kinds:
            n, without, with_ = sums.get((p, k), [0, 0.0, 0.0])
            saving = 1 - with_ / without if without else 0.0
            cells.append(f"{saving * 100:+.1f} % ({int(n)} turns)" if n else "—")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def error_reasons(results: Sequence[SessionResult]) -> str:
    """Every fail-open of the replay, per policy and reason."""
    counts: dict[tuple[str, str], int] = {}
    for r in results:
        for action, n in r.actions.items():
            if action.startswith("error"):
                key = (r.policy, action.removeprefix("error: "))
                counts[key] = counts.get(key, 0) + n
    return "; ".join(f"{p}: {why} x{n}" for (p, why), n in sorted(counts.items()))


def choose_default(
    results: Sequence[SessionResult],
    min_facts: float = 0.9,
    *,
    transparent: bool = False,
    any_session: bool = False,
    session_mean: bool = False,
) -> str | None:
    """The policy with the largest total net saving such that no session's net saving is
    negative and at least `min_facts` of the facts are kept (over all sessions), without errors.

    `transparent`: only policies that forward every request under its trigger byte for byte
    (no lossless tier), as the shipped default must (the first promise). `any_session`: sessions
    may pay more (how the `savings` preset is picked). `session_mean`: facts kept as the mean
    of the sessions' shares instead of over all facts."""
    eligible = [
        (t.saving, name)
        for name, t in totals(results).items()
        if (any_session or t.negative == 0)
        and (t.mean_kept if session_mean else t.kept_share) >= min_facts
        and t.errors == 0
        and not (transparent and "+lossless" in name)
    ]
    return max(eligible)[1] if eligible else None


def plot(results: Sequence[SessionResult], policies: Sequence[Policy], path: Path) -> None:
    """Net saving and facts kept against the budget cap, one line per corpus (solid: the cap
    alone, dashed: with the lossless tier)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cells = totals(results, "corpus+policy")
    corpora = list(dict.fromkeys(r.corpus for r in results))
    capped = [p for p in policies if p.cap and p.variant in ("", "+lossless")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for i, corpus in enumerate(corpora):
        for variant, style in (("", "-"), ("+lossless", "--")):
            pts = [
                (p.cap, t)
                for p in capped
                if p.variant == variant and (t := cells.get(f"{corpus} · {p.name}"))
            ]
            if not pts:
                continue
            xs = [x for x, _ in pts]
            label = corpus if not variant else None
            for ax, ys in (
                (axes[0], [t.saving * 100 for _, t in pts]),
                (axes[1], [t.kept_share * 100 for _, t in pts]),
            ):
                ax.plot(xs, ys, style, color=f"C{i}", marker="o", label=label)
    caps = sorted({p.cap for p in capped if p.cap})
    for ax, title in zip(axes, ("net saving, % of the bill", "facts kept, %"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps, [f"{c // 1000}k" for c in caps])
        ax.set_xlabel("budget cap (tokens)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].axhline(0, color="black", lw=0.8)
    axes[1].axhline(90, color="grey", lw=0.8, ls=":")
    handles, labels = axes[0].get_legend_handles_labels()
    title = "solid: cap alone\ndashed: + lossless"
    fig.legend(handles, labels, loc="center right", fontsize=8, title=title)
    fig.suptitle("compactd on real sessions, net of prompt caching (bench/cost.py)")
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    fig.savefig(path, dpi=110)


def replot(json_path: Path, path: Path) -> None:
    """The plot again from a `--json` file, without replaying."""
    rows = json.loads(json_path.read_text())
    results = []
    for row in rows:
        plain, sent = Arm(**row.pop("plain")), Arm(**row.pop("sent"))
        row.pop("saving", None)
        results.append(SessionResult(plain=plain, sent=sent, **row))
    plot(results, all_policies(), path)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=",".join(CORPUS_NAMES))
    parser.add_argument("--limit", type=int, default=5, help="sessions per corpus (0: all)")
    parser.add_argument("--model", default="gpt-5.4")
    parser.add_argument("--rule", choices=tuple(RULES), default="openai")
    parser.add_argument(
        "--ttl", type=float, default=None, help="cache entry lifetime (s; default: the rule's)"
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=None,
        help="seconds between turns (default: the corpora's times and bench/timing's gap model)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the gap model")
    parser.add_argument("--policies", default="", help="comma-separated names (default: all)")
    parser.add_argument("--providers", default="", help="chain for every policy, e.g. engine")
    parser.add_argument(
        "--store-timeout-ms", type=int, default=5000, help="store.timeout_ms of the replay"
    )
    parser.add_argument("--json", type=Path, help="write every session's figures here")
    parser.add_argument("--plot", type=Path, help="draw the PNG here (needs matplotlib)")
    parser.add_argument("--sessions", action="store_true", help="print the per-session table")
    parser.add_argument(
        "--session-policies", default="", help="policies of --sessions (default: the picks)"
    )
    parser.add_argument("--replot", type=Path, help="only draw --plot from this --json file")
    args = parser.parse_args()
    if args.replot:
        replot(args.replot, args.plot or args.replot.with_suffix(".png"))
        return
    policies = all_policies()
    if args.rule.startswith("anthropic") and _has_key("cap_apis"):
        # Anthropic's rule stands for Messages traffic: `default` as the shipped default
        # budgets a Messages request (the chat replay is capped only if it caps that API).
        capped = ["chat.completions"] if "messages" in PolicySettings().cap_apis else []
        policies = [
            dataclasses.replace(p, keys={"cap_apis": capped, **p.keys})
            if p.base == "default"
            else p
            for p in policies
        ]
    if args.providers:
        chain = args.providers.split(",")
        # A policy that names its own chain (+summarize) keeps it.
        policies = [dataclasses.replace(p, keys={"providers": chain, **p.keys}) for p in policies]
    if args.policies:
        wanted = args.policies.split(",")
        policies = [p for p in policies if p.name in wanted]
    names = [c.strip() for c in args.corpus.split(",") if c.strip()]
    replayer = Replayer(
        args.model, args.rule, args.ttl, args.gap, policies, store_timeout_ms=args.store_timeout_ms
    )
    replayer.seed = args.seed
    started = time.perf_counter()
    results: list[SessionResult] = []
    for name in names:
        cases = longest_first(load([name], None), replayer.counter, args.limit)
        results += await replayer.run(cases)
    seconds = time.perf_counter() - started
    when = "the corpora's times + gap model" if args.gap is None else f"a turn every {args.gap:g} s"
    ttl = RULES[args.rule].lifetime if args.ttl is None else args.ttl
    print(
        f"model {args.model} ({args.rule} cache rule, ttl {ttl:g} s, {when}, seed {args.seed});"
        f" {args.limit or 'all'} longest sessions per corpus; "
        f"providers {args.providers or 'as configured'}; {seconds:.0f} s\n"
    )
    print(table([t.row(k) for k, t in totals(results).items()], COLUMNS))
    long = [r for r in results if r.peak > PEAK]
    print(
        f"\nover the {len({(r.corpus, r.session) for r in long})} sessions whose peak exceeds "
        f"{PEAK // 1000}k tokens:\n"
    )
    print(table([t.row(k) for k, t in totals(long).items()], COLUMNS))
    print("\nnet saving / facts kept, per corpus:\n")
    print(matrix(results, names))
    if any(r.policy == LOSSLESS_ALONE for r in results):
        print("\nthe lossless tier alone (no-cap+lossless), per corpus:\n")
        print(lossless_alone(results, names))
    print("\nper kind of gap (bench/timing.py), each turn's cost in both arms:\n")
    print(by_gap(results, ["default", *(p.name for p in policies if p.name != "default")][:6]))
    failed = error_reasons(results)
    if failed:
        print("\nfailed open (policy: reason x times):", failed)
    chosen = choose_default(results)
    shipped = choose_default(results, transparent=True)
    savings = choose_default(results, any_session=True)
    if args.sessions:
        print("\nper corpus and policy:\n")
        rows = [t.row(k) for k, t in totals(results, "corpus+policy").items()]
        print(table(rows, COLUMNS))
        picked = ["default", shipped, chosen, savings]
        wanted = args.session_policies.split(",") if args.session_policies else picked
        print("\nper session:\n")
        print(per_session(results, list(dict.fromkeys(w for w in wanted if w))))
    print(
        "\nby the rule (largest net saving, no session negative, >= 90 % facts, no errors):"
        f" {chosen}; among policies that forward requests under their trigger byte for byte"
        f" (the shipped default): {shipped}; letting sessions pay more (the savings preset):"
        f" {savings}"
    )
    print(
        "with facts kept as the sessions' mean share (each session weighing the same):"
        f" {choose_default(results, transparent=True, session_mean=True)}"
    )
    if args.json:
        data = [{**dataclasses.asdict(r), "saving": r.saving} for r in results]
        args.json.write_text(json.dumps(data, indent=1))
    if args.plot:
        plot(results, policies, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    asyncio.run(main())
