"""Compaction ahead of time: the trigger turn replays a checkpoint computed off the request path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.chat.checkpoint import restore
from proxy.config import PolicySettings
from tests.app.test_restore import turn
from tests.inprocess import Proxy, running

Message = dict[str, Any]


def chain_runs(proxy: Proxy) -> float:
    chain = "+".join(PolicySettings().providers)  # the default chain
    return proxy.metric("compactd_compaction_runs_total", policy="default", providers=chain)


async def grow(proxy: Proxy, turns: int) -> tuple[list[Message], list[str], list[bytes]]:
    """Turn by turn, waiting for precomputation between turns (as a real upstream's latency
    would); (the messages, each turn's action with "+chain" where the chain ran while the
    request waited, the bytes forwarded each turn)."""
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    actions, sent = [], []
    for k in range(turns):
        messages += turn(k)
        raw = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
        runs = chain_runs(proxy)
        r = await proxy.chat(raw)
        waited = "+chain" if chain_runs(proxy) > runs else ""
        actions.append(r.headers["x-compactd-action"] + waited)
        sent.append(proxy.upstream.last.content)
        assert actions[-1] != "passthrough" or sent[-1] == raw
        await proxy.services.compactor.precompute.drain()
    return messages, actions, sent


async def test_the_trigger_turn_replays_a_ready_checkpoint(tmp_path: Path) -> None:
    policy = {"budget_tokens": 4000}
    async with running(tmp_path / "a", default_policy=policy) as plain:
        _, before, _ = await grow(plain, 12)
    async with running(tmp_path / "b", default_policy={**policy, "precompute_ratio": 0.8}) as p:
        messages, after, _ = await grow(p, 12)
        stored = p.metric("compactd_precompute_total", outcome="stored")
        info = await p.services.store.get_conversation(None, p.conversations[-1])
    first = before.index("compacted+chain")
    assert before[:first] == after[:first]  # under the trigger nothing changes
    assert after[first] == "compacted"  # the event, from a ready checkpoint: no chain waited for
    assert stored >= 1
    assert not any(a.endswith("+chain") for a in after)
    restored = restore(info) if info is not None else None
    assert restored is not None
    exact = json.dumps(messages[: restored.checkpoint.covered_through + 1])
    assert (restored.missing_ids, json.dumps(restored.messages)) == ([], exact)


async def test_off_by_default_and_never_in_shadow_mode(tmp_path: Path) -> None:
    for i, policy in enumerate(
        (
            {"budget_tokens": 4000},
            {"budget_tokens": 4000, "precompute_ratio": 0.8, "mode": "shadow"},
        )
    ):
        async with running(tmp_path / str(i), default_policy=policy) as proxy:
            await grow(proxy, 8)
            assert proxy.metric("compactd_precompute_total", outcome="stored") == 0
