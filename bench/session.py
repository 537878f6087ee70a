"""Session replay: real multi-turn conversations through compactd, turn by turn, as sent.

    .venv/bin/python bench/session.py [--store redis|sqlite|both] [--limit 30] [--min-tokens N]
        [--corpora tau-bench,aider,swe-agent,memorybank,memory-tests,chitchat]
        [--budget-ratio 0.4] [--budget-base compressible|total] [--budget N] [--echo corpus|sdk]
        [--no-accounting] [--precompute 0.85] [--providers engine] [--keys shared|own]

Corpora (read from the directory `$BENCH_CORPORA` names, never copied; `--corpora` picks them by
bench/quality's labels): tau-bench airline runs (gpt-4o agent, native tool calls, the 14 tool
schemas sent as `tools`), aider sessions (console output kept as user messages), and the dev split
of bench/corpora.py's four (swe-agent trajectories with their tool schema, memorybank and
memory-tests multi-session chats, long chitchat conversations). Every assistant message of a
session is one request: the history before it, exactly as the client would send it (the full
history so far). A fake upstream on a real socket answers each request with that recorded
assistant message, so the next turn's history is the
corpus's (`--echo sdk` appends it as the OpenAI SDK re-serializes it, with null/empty extra
fields).

Each session gets a budget from the tokens of its last request: the part no provider may touch
(system messages + tool schemas) plus `--budget-ratio` of the rest (`--budget-base total`: the
ratio of the whole), or `--budget N` for all; one header-selected policy per distinct budget. The
proxy runs in-process behind uvicorn with the default chain (`--providers` sets another); the
store is wrapped to time each call. Redis uses DB 13 (flushed at start); SQLite a fresh file.
Every session sends one API key (one tenant), or with `--keys own` a key of its own: checkpoints
are content-addressed within a tenant, so under one key a session that shares its first messages
with an earlier one (a fork: the multi-session corpora hold one history with several final
questions) replays that one's checkpoints, later ones included. Prints markdown tables.
The forwarded bytes are what the fake upstream received: a turn's prefix is byte-identical when
the raw bytes of the previous turn's forwarded messages start its own messages array.
"Trigger turns" are the turns with a compaction event; their added latency is compactd's own
`x-compactd-overhead-ms`. `--precompute R` sets every policy's precompute_ratio and waits for the
precomputation after each answer (a real upstream's answer takes longer than it does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import locations
from bench.session_replay import (
    Recorder,
    TimedStore,
    TurnLog,
    message_spans,
    op_rows,
    summarize,
)
from proxy.app.application import create_app
from proxy.config import APIS, Settings, StoreSettings, load_settings
from proxy.runtime.digest import canonical_bytes
from proxy.store.factory import open_store
from proxy.tokens.budget import ModelTable
from proxy.tokens.counter import TokenCounter, Tokenizers
from tests.upstream import serve

REDIS_URL = "redis://127.0.0.1:6379/13"
MODEL = "gpt-4o"
BUDGET_HEADER = "x-bench-budget"
# The OpenAI SDK's re-serialization of a received assistant message: extra null/empty fields.
SDK_FIELDS: dict[str, Any] = {
    "refusal": None,
    "function_call": None,
    "audio": None,
    "annotations": [],
}


@dataclass(frozen=True)
class Session:
    """One recorded conversation: its messages, the tools sent with it, its request indices."""

    corpus: str
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    turns: list[int]
    """Indices of the assistant messages: each is one request (the history before it)."""
    budget: int = 0


@dataclass
class Corpus:
    """A corpus's sessions, ready to replay."""

    name: str
    sessions: list[Session] = field(default_factory=list)


CORPORA = ("tau-bench", "aider", *locations.LABELS)
"""What `--corpora` names: bench/quality's corpora, by its labels."""


def load_corpora(limit: int, min_turns: int, names: Sequence[str] = CORPORA) -> list[Corpus]:
    """The first `limit` sessions of each named corpus with at least `min_turns` requests (of
    bench/corpora.py's converted ones, the dev split only: the held-out cases stay unseen; a
    converted corpus not made yet is skipped with a note, as bench/quality does)."""
    out = []
    for name in names:
        if name == "tau-bench":
            tau = locations.corpus(locations.TAU)
            tools = json.loads((tau / "airline_tools.json").read_text())
            label, path, tool_list = "tau-bench airline", tau / "messages_openai.jsonl", tools
        elif name == "aider":
            label, path = "aider (console kept)", locations.corpus(locations.AIDER_SESSIONS)
            tool_list = None
        else:
            label, tool_list = name, None
            found = locations.converted(name)
            if found is None:
                continue
            path = found
        with path.open() as f:
            out.append(sessions_of(label, map(json.loads, f), tool_list, limit, min_turns))
    return out


def sessions_of(
    label: str,
    rows: Iterable[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    limit: int,
    min_turns: int,
) -> Corpus:
    """The first `limit` dev-split rows with at least `min_turns` requests, as sessions (a row's
    own `tools` before the corpus's; a row without a split is dev)."""
    corpus = Corpus(label)
    for row in rows:
        if row.get("split", "dev") != "dev":
            continue
        msgs = row["messages"]
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i > 0]
        if len(turns) >= min_turns:
            own = row.get("tools") or tools
            corpus.sessions.append(Session(label, str(row["id"]), msgs, own, turns))
        if len(corpus.sessions) >= limit:
            break
    return corpus


def model_counter() -> TokenCounter:
    """The proxy's own counter for the benchmark's model."""
    return Tokenizers().for_model(ModelTable.load().lookup(MODEL))


def with_budgets(
    corpora: list[Corpus], ratio: float, fixed: int, base: str, min_tokens: int = 0
) -> list[Corpus]:
    """Each session's budget: `fixed`, else from its last request's tokens (2 digits).

    Sessions whose last request is under `min_tokens` are left out.
    base "total": ratio x the last request. base "compressible": the part no provider may touch
    (system messages and tool schemas) plus ratio x the rest, so a budget is never below what
    compaction can reach.
    """
    counter = model_counter()
    for corpus in corpora:
        sessions = []
        for s in corpus.sessions:
            history = s.messages[: s.turns[-1]]
            tools = counter.count_tools({"tools": s.tools} if s.tools else {})
            tokens = counter.count_messages(history) + tools
            head = 0
            if base == "compressible":
                system = [m for m in history if m["role"] in ("system", "developer")]
                head = counter.count_messages(system) + tools
            budget = fixed or _two_digits(head + int((tokens - head) * ratio))
            if tokens < min_tokens:
                continue
            sessions.append(Session(s.corpus, s.id, s.messages, s.tools, s.turns, budget))
        corpus.sessions = sessions
    return corpora


def _two_digits(n: int) -> int:
    """Round to two significant digits, so sessions share a few policies."""
    scale = int(10 ** max(0, len(str(n)) - 2))
    return max(1, round(n / scale) * scale)


def budget_policies(
    sessions: list[Session], precompute: float = 0, providers: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """One policy per distinct budget, selected by the `x-bench-budget` header (`providers`: the
    chain of every policy; empty: the default policy's)."""
    chain = {"providers": list(providers)} if providers else {}
    return [
        {
            **chain,
            "name": f"b{b}",
            "match_header": BUDGET_HEADER,
            "match_header_values": [str(b)],
            "budget_tokens": b,
            "cap_apis": list(APIS),
            "precompute_ratio": precompute,
        }
        for b in sorted({s.budget for s in sessions})
    ]


def settings_for(
    sessions: list[Session],
    upstream: str,
    data_dir: str,
    accounting: bool,
    precompute: float = 0,
    providers: tuple[str, ...] = (),
) -> Settings:
    """Proxy settings: one header-selected policy per distinct budget."""
    overrides = {
        "server": {"data_dir": data_dir, "secret": "bench-session-secret"},
        "upstream": {"url": upstream},
        "policies": budget_policies(sessions, precompute, providers),
        "accounting": {"enabled": accounting},
    }
    return load_settings(None, env={}, overrides=overrides)


async def open_bench_store(kind: str, data_dir: str) -> TimedStore:
    """A fresh store of that kind (Redis DB 13 flushed), wrapped for timing."""
    if kind == "redis":
        import redis.asyncio as aioredis  # noqa: PLC0415

        client = aioredis.from_url(REDIS_URL)
        await client.flushdb()
        await client.aclose()
        url = REDIS_URL
    else:
        url = f"sqlite:///{data_dir}/bench.db"
    return TimedStore(await open_store(StoreSettings(url=url), Path(data_dir)))


def client_copy(message: dict[str, Any], echo: str) -> dict[str, Any]:
    """The assistant message as the client appends it to its history."""
    if echo == "sdk":
        return {**message, **SDK_FIELDS}
    return message


async def replay(
    corpus: Corpus,
    kind: str,
    echo: str,
    accounting: bool,
    progress: Callable[[str], None],
    precompute: float = 0,
    providers: tuple[str, ...] = (),
    *,
    own_keys: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Replay every session of a corpus through a fresh proxy + store; the summary row.
    `own_keys`: each session sends an API key of its own (a tenant apart), else all share one."""
    log = TurnLog()
    recorder = Recorder()
    counter = model_counter()
    with tempfile.TemporaryDirectory(prefix="compactd-bench-") as tmp:
        store = await open_bench_store(kind, tmp)
        async with serve(recorder.upstream) as up:
            settings = settings_for(
                corpus.sessions, up + "/v1", tmp, accounting, precompute, providers
            )
            app = create_app(settings, store=store)
            async with serve(app, lifespan="on") as url, httpx.AsyncClient(timeout=120) as c:
                services = app.router.state.services
                drain = services.compactor.precompute.drain if precompute else None
                for n, session in enumerate(corpus.sessions):
                    await _session(
                        c,
                        url,
                        session,
                        recorder,
                        store,
                        log,
                        echo,
                        counter,
                        drain=drain,
                        own_key=own_keys,
                    )
                    progress(f"{corpus.name} [{kind}] {n + 1}/{len(corpus.sessions)}")
    return summarize(corpus.name, kind, log), op_rows(corpus.name, kind, store)


async def _session(
    client: httpx.AsyncClient,
    url: str,
    session: Session,
    recorder: Recorder,
    store: TimedStore,
    log: TurnLog,
    echo: str,
    counter: TokenCounter,
    *,
    drain: Callable[[], Awaitable[None]] | None = None,
    own_key: bool = False,
) -> None:
    """Send each turn with the history so far; the upstream answers with the recorded reply.
    `drain`: waits for precomputation after each answer (a real upstream takes that long);
    `own_key`: the session's API key names it (a tenant of its own)."""
    history: list[dict[str, Any]] = []
    previous: tuple[list[bytes], list[bytes]] | None = None
    cursor = 0
    key = f"sk-bench-session-{session.id}" if own_key else "sk-bench-session"
    headers = {"authorization": f"Bearer {key}", BUDGET_HEADER: str(session.budget)}
    for index in session.turns:
        history.extend(session.messages[cursor:index])
        body: dict[str, Any] = {"model": MODEL, "messages": history}
        if session.tools:
            body["tools"] = session.tools
        recorder.reply = session.messages[index]
        recorder.clear()
        store.reset()
        r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        sent = recorder.bodies[-1]
        spans = message_spans(sent)
        forwarded = json.loads(sent)
        canon = [canonical_bytes(m) for m in forwarded["messages"]]
        counted = counter.count_messages(forwarded["messages"]) + counter.count_tools(forwarded)
        log.add(
            status=r.status_code,
            action=r.headers.get("x-compactd-action", ""),
            before=int(r.headers.get("x-compactd-tokens-before") or 0),
            after=int(r.headers.get("x-compactd-tokens-after") or 0),
            spans=spans,
            canon=canon,
            previous=previous,
            store_seconds=store.request_seconds(),
            where=f"{session.id}@{index}",
            counted=counted,
            overhead_ms=float(r.headers.get("x-compactd-overhead-ms") or 0),
        )
        if drain is not None:  # as long as a real upstream would take: precomputation finishes
            await drain()
        previous = (spans, canon)
        history.append(client_copy(r.json()["choices"][0]["message"], echo))
        cursor = index + 1


SUMMARY_COLUMNS = (
    ("corpus", "corpus"),
    ("store", "store"),
    ("sessions", "sessions"),
    ("turns", "turns"),
    ("compactions / 100 turns", "events_per_100"),
    ("replayed turns", "replayed"),
    ("prefix byte-identical, all turns", "prefix_all"),
    ("… turns without a compaction", "prefix_quiet"),
    ("cacheable share of forwarded bytes", "cached_bytes"),
    ("tokens forwarded / without compactd", "tokens"),
    ("store p50 / p99 per request (ms)", "store_ms"),
    ("all turns: added ms p50 / p99", "turn_ms"),
    ("trigger turns: added ms p50 / p95 / max", "event_ms"),
    ("tokens-after header ≠ forwarded", "miscounted"),
    ("errors", "errors"),
)
OP_COLUMNS = (
    ("corpus", "corpus"),
    ("store", "store"),
    ("store call", "op"),
    ("calls", "calls"),
    ("p50 (ms)", "p50"),
    ("p99 (ms)", "p99"),
)


def table(rows: list[dict[str, Any]], cols: tuple[tuple[str, str], ...]) -> str:
    """Rows as a markdown table."""
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(row[k]) for _, k in cols) + " |" for row in rows]
    return "\n".join(lines)


def _progress(line: str) -> None:
    print(line, file=sys.stderr)


async def main() -> None:
    """Parse arguments, replay, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("redis", "sqlite", "both"), default="both")
    parser.add_argument("--limit", type=int, default=30, help="sessions per corpus")
    parser.add_argument(
        "--corpora", default=",".join(CORPORA), help="which corpora (bench/quality's labels)"
    )
    parser.add_argument("--min-turns", type=int, default=4, help="requests per session, at least")
    parser.add_argument("--min-tokens", type=int, default=0, help="tokens of the last request")
    parser.add_argument("--budget-ratio", type=float, default=0.4)
    parser.add_argument("--budget", type=int, default=0, help="fixed budget for every session")
    parser.add_argument("--budget-base", choices=("compressible", "total"), default="compressible")
    parser.add_argument("--echo", choices=("corpus", "sdk"), default="corpus")
    parser.add_argument(
        "--keys",
        choices=("shared", "own"),
        default="shared",
        help="one API key (tenant) for every session, or one per session: sessions that share "
        "their first messages (forks) replay each other's checkpoints only within a tenant",
    )
    parser.add_argument(
        "--no-accounting", action="store_true", help="no usage writes after each response"
    )
    parser.add_argument(
        "--precompute", type=float, default=0.0, help="precompute_ratio of every policy"
    )
    parser.add_argument(
        "--providers",
        default="",
        help="chain of every policy, comma-separated (default: the default policy's, engine)",
    )
    args = parser.parse_args()
    chain = tuple(p for p in args.providers.split(",") if p)
    limit = args.limit if not args.min_tokens else 10**6
    corpora = load_corpora(limit, args.min_turns, args.corpora.split(","))
    corpora = with_budgets(
        corpora, args.budget_ratio, args.budget, args.budget_base, args.min_tokens
    )
    for corpus in corpora:
        corpus.sessions = corpus.sessions[: args.limit]
    kinds = ("redis", "sqlite") if args.store == "both" else (args.store,)
    rows, ops = [], []
    started = time.perf_counter()
    for corpus in corpora:
        for kind in kinds:
            row, op = await replay(
                corpus,
                kind,
                args.echo,
                not args.no_accounting,
                _progress,
                args.precompute,
                chain,
                own_keys=args.keys == "own",
            )
            rows.append(row)
            ops += op
    budget = f"fixed {args.budget}"
    if not args.budget:
        budget = f"{args.budget_ratio:g} x last request ({args.budget_base})"
    accounting = "off" if args.no_accounting else "on"
    if args.precompute:
        accounting += f"; precompute_ratio {args.precompute:g}"
    if chain:
        accounting += f"; providers {','.join(chain)}"
    print(
        f"budget: {budget}; sessions: >= {args.min_turns} requests, last >= {args.min_tokens}"
        f" tokens; echo: {args.echo}; keys: {args.keys}; accounting {accounting}; "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(table(rows, SUMMARY_COLUMNS))
    print()
    print(table(ops, OP_COLUMNS))
    for row in rows:
        print(f"\n{row['corpus']} [{row['store']}]: actions {row['actions']}", end="")
        if row["miscounted_at"]:
            print(f"; tokens-after header wrong at {row['miscounted_at']}", end="")
        if row["quiet_misses"]:
            print(f"; prefix changed without a compaction at {row['quiet_misses']}", end="")
    print()


if __name__ == "__main__":
    asyncio.run(main())
