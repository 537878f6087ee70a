"""Session replay in all three API shapes: chat completions, the Responses API, Anthropic Messages.

    .venv/bin/python bench/session_apis.py [--limit 20] [--api all|chat|responses|messages]
        [--budget-ratio 0.4] [--min-turns 4] [--no-calibration] [--count-tokens-band 0.1]
        [--corpora tau-bench,aider] [--keys shared|own]

The corpora of bench/session.py (by default tau-bench airline with its tool schemas and aider
sessions, the two its first report's figures are of; `--corpora` names others), read in place,
each session converted turn by turn into the API's own shape, as Codex CLI and Claude Code send
them: Responses — a developer message, user messages with input_text parts, every assistant
turn as a reasoning item (issued by the fake upstream, so its encrypted content is genuine) + an
assistant message + function calls, results as function_call_output; Messages — `system` with a
breakpoint, every assistant turn as a signed thinking block + text + tool_use blocks, consecutive
results as one user message of tool_result blocks, and the client's sliding breakpoint on the
last block of the last message (moved every turn, as Claude Code does), thinking enabled.

Each session's budget is bench/session.py's (on the chat form: what no provider may touch plus
`--budget-ratio` of the rest). The proxy runs in-process (the default chain, `engine`) in front
of the fake upstreams of tests/api_fakes.py, which refuse what each real API refuses and simulate
prompt caching (OpenAI: the longest common prefix with an earlier request, in 128-token steps
from 1,024; Anthropic: read at a breakpoint or up to 20 blocks before one, written at each).

Figures per corpus and API: compaction events per 100 turns; cache-stable share (of the turns
without an event, those whose forwarded history starts with the previous turn's, item for item,
breakpoints aside); the cached share of prompt tokens in the fake upstream's own usage
(Anthropic: cache reads, with compactd moving a breakpoint lost to a compaction to the end of
the compacted prefix); facts kept (bench/quality's probes of specific items, on the last turn of
the sessions whose last request was rewritten: found in the text that was forwarded); requests
the upstream refused.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api_shapes import FIELD, MODEL, Convert
from bench.measure import searchable
from bench.probes import probes, specific_items
from bench.session import Corpus, Session, budget_policies, load_corpora, table, with_budgets
from tests.dialects.harness import harness

Json = dict[str, Any]


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _strings(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(_strings(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(_strings(v) for v in value)
    return ""


def _usage(api: str, body: Json) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of an answer, as the fake upstream billed them."""
    u = body.get("usage") or {}
    if api == "chat":
        return u.get("prompt_tokens", 0), (u.get("prompt_tokens_details") or {}).get(
            "cached_tokens", 0
        )
    if api == "responses":
        return u.get("input_tokens", 0), (u.get("input_tokens_details") or {}).get(
            "cached_tokens", 0
        )
    read = u.get("cache_read_input_tokens", 0)
    return u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + read, read


@dataclass
class Tally:
    """One corpus in one shape: turn counts (events, quiet turns and the stable among them),
    prompt and cached tokens, facts probed and kept, refusals, errors, the learned ratio."""

    n: Counter[str] = field(default_factory=Counter)
    """turns, events, quiet, stable, prompt, cached, facts, kept, refused, errors"""
    ratio: float = 1.0
    actions: dict[str, int] = field(default_factory=dict)
    fail_opens: list[str] = field(default_factory=list)


async def run(
    corpus: Corpus, api: str, *, calibrate: bool = True, band: float = 0.0, own_keys: bool = False
) -> Tally:
    """Every session of a corpus through a fresh proxy in one API's shape (`band`: Anthropic's
    count_tokens asked near the trigger, `tokens.count_tokens_band`; `own_keys`: each session
    sends an API key of its own, as bench/session.py's `--keys own`)."""
    tally = Tally()
    policies = budget_policies(corpus.sessions)
    tokens = {"count_tokens_band": band}
    with tempfile.TemporaryDirectory(prefix="compactd-bench-apis-") as tmp:
        async with harness(
            Path(tmp), policies=policies, accounting={"enabled": False}, tokens=tokens
        ) as h:
            fake = h.messages if api == "messages" else h.responses
            if not calibrate:
                h.services.calibration.apis = frozenset()
            send = {"chat": h.chat, "responses": h.create, "messages": h.message}[api]
            for session in corpus.sessions:
                await _session(h, send, fake, api, session, tally, own_key=own_keys)
            tally.ratio = h.services.calibration.ratio(api, MODEL[api])
            counted = [r for r in fake.received if r.path.endswith("/count_tokens")]
            tally.n["confirms"] = len(counted)
    return tally


async def _session(
    h: Any, send: Any, fake: Any, api: str, session: Session, tally: Tally, *, own_key: bool
) -> None:
    convert = Convert(api, h.responses, h.messages)
    previous: list[Any] | None = None
    refused = len(fake.refused)
    headers = {"x-bench-budget": str(session.budget)}
    auth = {"key": f"sk-bench-apis-{session.id}"} if own_key else {}  # else the harness's key
    for n, index in enumerate(session.turns):
        chat = session.messages[:index]
        body = convert.body(session, chat)
        r = await send(body, **auth, **headers)
        action = r.headers.get("x-compactd-action", "")
        if action == "error":
            tally.fail_opens.append(f"{session.id}@{index}: {r.headers.get('x-compactd-error')}")
        tally.n["turns"] += 1
        tally.actions[action] = tally.actions.get(action, 0) + 1
        if r.status_code != 200:
            tally.n["errors"] += 1
            previous = None
            continue
        forwarded = _unmarked(fake.last.json()[FIELD[api]])
        if action == "compacted":
            tally.n["events"] += 1
        elif previous is not None:
            tally.n["quiet"] += 1
            tally.n["stable"] += forwarded[: len(previous)] == previous
        previous = forwarded
        prompt, cached = _usage(api, r.json())
        tally.n["prompt"] += prompt
        tally.n["cached"] += cached
        if n == len(session.turns) - 1 and action in ("compacted", "replayed"):
            facts = probes(chat, specific_items(searchable(chat)))
            text = _strings(forwarded)
            tally.n["facts"] += len(facts)
            tally.n["kept"] += sum(f in text for f in facts)
    tally.n["refused"] += len(fake.refused) - refused


def _row(corpus: str, api: str, t: Tally) -> Json:
    n = t.n

    def pct(a: str, b: str) -> str:
        return f"{100 * n[a] / n[b]:.1f} %" if n[b] else "—"

    return {
        "corpus": corpus,
        "api": api,
        "turns": n["turns"],
        "events": f"{100 * n['events'] / n['turns']:.1f}" if n["turns"] else "—",
        "stable": f"{pct('stable', 'quiet')} of {n['quiet']}",
        "cached": pct("cached", "prompt"),
        "facts": f"{pct('kept', 'facts')} of {n['facts']}",
        "refused": n["refused"],
        "errors": n["errors"],
        "ratio": f"{t.ratio:.3f}",
        "confirms": n["confirms"],
        "actions": t.actions,
        "fail_opens": t.fail_opens[:3],
    }


COLUMNS = (
    ("corpus", "corpus"),
    ("API", "api"),
    ("turns", "turns"),
    ("compactions / 100 turns", "events"),
    ("cache-stable share (turns without an event)", "stable"),
    ("cached share of prompt tokens (upstream usage)", "cached"),
    ("facts kept (last turn, rewritten)", "facts"),
    ("refused by the upstream", "refused"),
    ("calibration (upstream / estimate)", "ratio"),
    ("count_tokens asked", "confirms"),
    ("errors", "errors"),
)


async def main() -> None:
    """Parse arguments, replay each corpus in each API's shape, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--api", choices=("all", "chat", "responses", "messages"), default="all")
    parser.add_argument("--limit", type=int, default=20, help="sessions per corpus")
    parser.add_argument("--min-turns", type=int, default=4)
    parser.add_argument(
        "--corpora", default="tau-bench,aider", help="which of bench/session.py's corpora"
    )
    parser.add_argument(
        "--keys", choices=("shared", "own"), default="shared", help="as bench/session.py's"
    )
    parser.add_argument("--budget-ratio", type=float, default=0.4)
    parser.add_argument(
        "--no-calibration", action="store_true", help="budget Claude requests by the estimate"
    )
    parser.add_argument(
        "--count-tokens-band",
        type=float,
        default=0.0,
        help="ask Anthropic's count_tokens within this fraction of the trigger (0: never)",
    )
    args = parser.parse_args()
    corpora = with_budgets(
        load_corpora(args.limit, args.min_turns, args.corpora.split(",")),
        args.budget_ratio,
        0,
        "compressible",
    )
    apis = ("chat", "responses", "messages") if args.api == "all" else (args.api,)
    started = time.perf_counter()
    rows = []
    for corpus in corpora:
        for api in apis:
            tally = await run(
                corpus,
                api,
                calibrate=not args.no_calibration,
                band=args.count_tokens_band,
                own_keys=args.keys == "own",
            )
            rows.append(_row(corpus.name, api, tally))
            print(f"{corpus.name} [{api}] done", file=sys.stderr)
    print(
        f"budget: {args.budget_ratio:g} x last request (compressible); sessions: >= "
        f"{args.min_turns} requests, {args.limit} per corpus; keys: {args.keys}; "
        f"count_tokens band {args.count_tokens_band:g}; "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(table(rows, COLUMNS))
    for row in rows:
        print(f"\n{row['corpus']} [{row['api']}]: actions {row['actions']}", end="")
        for line in row["fail_opens"]:
            print(f"\n  failed open at {line}", end="")
    print()


if __name__ == "__main__":
    asyncio.run(main())
