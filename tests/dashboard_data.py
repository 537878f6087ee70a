"""Traffic for the dashboard's tests (and the screenshots in docs/): two teams' agent
conversations through the real proxy, compacted and replayed, a shadow policy, a provider that
fails open, and a few weeks of earlier days' usage written to the store."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import httpx

from proxy.providers.base import CompactionResult, CompressionConfig, ContextProvider, Message
from proxy.providers.registry import ProviderRegistry
from proxy.store.base import UsageRecord
from proxy.store.sqlite.store import SqliteStore
from tests.inprocess import MockUpstream, _Body
from tests.upstream import chat_completion

SECRET = "dashboard-test-secret"
ADMIN = "sk-admin-dashboard-0000"
ALPHA = "sk-team-alpha-0001"
BETA = "sk-team-beta-0002"
GAMMA = "sk-team-gamma-0003"


class Flaky(ContextProvider):
    """A provider that always raises: its policy fails open (reason `provider`)."""

    name = "flaky"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        raise RuntimeError("flaky provider")


def registry() -> ProviderRegistry:
    """The installed providers plus `flaky`."""
    found = ProviderRegistry()
    found.register("flaky", Flaky)
    return found


def config(data_dir: Path) -> dict[str, Any]:
    """Config sections: an admin key, trim under a small budget by default, a shadow policy for
    the search team (header x-team: search) and a policy whose provider fails."""
    return {
        "server": {"admin_key": ADMIN, "secret": SECRET, "data_dir": str(data_dir)},
        "default_policy": {"providers": ["trim"], "budget_tokens": 2000},
        "policies": [
            {
                "name": "search-shadow",
                "match_header": "x-team",
                "match_header_values": ["search"],
                "mode": "shadow",
                "providers": ["engine", "trim"],
                "budget_tokens": 2000,
            },
            {
                "name": "experimental",
                "match_header": "x-team",
                "match_header_values": ["lab"],
                "providers": ["flaky"],
                "budget_tokens": 2000,
            },
        ],
    }


def upstream() -> MockUpstream:
    """Answers every chat with `usage` as a caching upstream would: after the first turn, most
    of the prompt is a cache hit."""
    seen: set[str] = set()

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = max(1, len(request.content) // 4)
        first = str(body["messages"][:2])
        cached = prompt * 6 // 10 if first in seen else 0
        seen.add(first)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": 40,
            "total_tokens": prompt + 40,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        raw = json.dumps(chat_completion("Done.", usage=usage)).encode()
        headers = {"content-type": "application/json", "content-length": str(len(raw))}
        return httpx.Response(200, stream=_Body(raw), headers=headers)

    return MockUpstream(default=answer)


def agent_history(team: str, turns: int) -> list[dict[str, Any]]:
    """An agent run: each turn a user ask, a tool call and a long tool result naming the team."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are the {team} team's build agent."}
    ]
    for t in range(turns):
        call = f"call_{team}_{t}"
        messages += [
            {"role": "user", "content": f"Step {t}: check build {4400 + t} of the {team} service."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "read_log", "arguments": f'{{"build": {4400 + t}}}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call,
                "content": f"{team.upper()} BUILD {4400 + t} LOG\n"
                + "".join(
                    f"{team}: step {s} of build {4400 + t} compiled module_{s}.py in {s * 7} ms\n"
                    for s in range(40)
                ),
            },
            {"role": "assistant", "content": f"Build {4400 + t} of {team} is green."},
        ]
    messages.append({"role": "user", "content": f"Summarize the {team} builds so far."})
    return messages


async def chat(
    client: httpx.AsyncClient, key: str, messages: list[dict[str, Any]], **headers: str
) -> httpx.Response:
    """One chat completion through the proxy with this key."""
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {key}", **headers},
    )
    response.raise_for_status()
    return response


async def drive(client: httpx.AsyncClient) -> dict[str, int]:
    """The traffic; returns how many requests each kind made."""
    made = {"alpha": 0, "beta": 0, "gamma": 0, "lab": 0}
    for turns in range(1, 9):  # alpha's run grows past its budget: compactions, then replays
        await chat(client, ALPHA, agent_history("alpha", turns))
        made["alpha"] += 1
    for turns in (2, 5, 6):
        await chat(client, BETA, agent_history("beta", turns))
        made["beta"] += 1
    for turns in (3, 6):
        await chat(client, GAMMA, agent_history("gamma", turns), **{"x-team": "search"})
        made["gamma"] += 1
    await chat(client, GAMMA, agent_history("lab", 6), **{"x-team": "lab"})
    made["lab"] += 1
    return made


async def seed_history(db: Path, tenants: list[str], days: int = 20, seed: int = 7) -> None:
    """Earlier days' usage, as the proxy would have recorded it (for a chart with a past)."""
    rng = random.Random(seed)
    today = dt.datetime.now(dt.UTC).date()
    store = await SqliteStore.open(db)
    try:
        for back in range(days, 0, -1):
            day = (today - dt.timedelta(days=back)).isoformat()
            for tenant in tenants:
                for _ in range(rng.randint(4, 9)):
                    before = rng.randint(9000, 60000)
                    compacted = rng.random() < 0.25
                    replayed = not compacted and rng.random() < 0.6
                    after = (
                        int(before * rng.uniform(0.35, 0.6)) if compacted or replayed else before
                    )
                    action = "compacted" if compacted else "replayed" if replayed else "passthrough"
                    failed = not compacted and not replayed and rng.random() < 0.08
                    await store.record_usage(
                        UsageRecord(
                            tenant=tenant,
                            policy="default",
                            model="gpt-4o",
                            day=day,
                            action="error" if failed else action,
                            tokens_before=before,
                            tokens_after=after,
                            prompt_tokens=after,
                            cached_tokens=int(after * rng.uniform(0.3, 0.7)),
                            completion_tokens=rng.randint(100, 900),
                            fail_open="timeout" if failed else "",
                        )
                    )
    finally:
        await store.close()
