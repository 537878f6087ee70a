"""Calibration: the upstream's own count against our estimate, per API and model, shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import StoreSettings
from proxy.store.factory import open_store
from proxy.tokens.budget import Budget
from proxy.tokens.calibration import HIGH, MIN_ESTIMATE, Calibration, sees_all

BUDGET = Budget(
    window=200_000, reserved_output=8000, margin=64, budget=190_000, trigger=190_000, target=133_000
)


def test_ratios_converge_to_the_upstreams_count_and_scale_the_budget() -> None:
    c = Calibration()
    assert c.budget("messages", "claude-sonnet-5", BUDGET) == BUDGET
    for _ in range(30):
        c.observe("messages", "claude-sonnet-5", 10_000, 12_000)
    assert c.ratio("messages", "claude-sonnet-5") == pytest.approx(1.2, rel=1e-3)
    scaled = c.budget("messages", "Claude-Sonnet-5", BUDGET)
    assert scaled.trigger == pytest.approx(190_000 / 1.2, rel=1e-3)
    assert scaled.window == BUDGET.window  # the window itself is the model's


def test_small_requests_other_apis_and_wild_samples_teach_nothing_or_are_bounded() -> None:
    c = Calibration()
    c.observe("messages", "m", MIN_ESTIMATE - 1, 50_000)
    c.observe("chat.completions", "gpt-4o", 10_000, 20_000)
    assert c.ratio("messages", "m") == 1.0
    assert c.ratio("chat.completions", "gpt-4o") == 1.0
    c.observe("messages", "m", 10_000, 10**9)
    assert c.ratio("messages", "m") == HIGH


def _with(*blocks: dict[str, object]) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": list(blocks)}]}


INLINE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iV"}}
BY_URL = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
BY_ID = {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
CLEAR = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 3}}


@pytest.mark.parametrize(
    ("body", "seen"),
    [
        (_with({"type": "text", "text": "hi"}, INLINE), True),
        ({"messages": [{"role": "user", "content": "hi"}]}, True),
        (_with(BY_URL), False),
        (_with(BY_ID), False),
        (_with({"type": "tool_result", "tool_use_id": "t", "content": [BY_URL]}), False),
        ({**_with(INLINE), "mcp_servers": [{"type": "url", "url": "https://mcp.test"}]}, False),
        ({**_with(INLINE), "context_management": {"edits": [CLEAR]}}, False),
    ],
)
def test_a_request_with_input_the_estimate_never_sees_teaches_nothing(
    body: dict[str, object], seen: bool
) -> None:
    c = Calibration()
    c.observe("messages", "m", 10_000, 30_000, body)
    assert sees_all(body) is seen
    assert c.ratio("messages", "m") == (3.0 if seen else 1.0)


async def test_what_one_worker_learns_the_others_read_through_the_store(tmp_path: Path) -> None:
    store = await open_store(StoreSettings(url=f"sqlite:///{tmp_path}/c.db"), tmp_path)
    try:
        a, b = Calibration(store), Calibration(store)
        a.observe("messages", "claude-opus-5", 10_000, 13_000)
        await a.sync()
        await b.sync()
        assert b.ratio("messages", "claude-opus-5") == pytest.approx(1.3, rel=1e-3)
        # b learns more; a's older view does not overwrite it
        b.observe("messages", "claude-opus-5", 10_000, 15_000)
        await a.sync()
        await b.sync()
        await a.sync()
        assert a.ratio("messages", "claude-opus-5") == pytest.approx(
            b.ratio("messages", "claude-opus-5")
        )
    finally:
        await store.close()


def test_stats_bill_anthropic_cache_writes_and_reads_at_their_own_prices() -> None:
    from proxy.store.base import UsageRecord
    from proxy.telemetry.stats import compute_stats
    from proxy.tokens.budget import ModelTable

    counts = {"tokens_before": 9000, "tokens_after": 6000, "completion_tokens": 10_000}
    # The prompt is input + cache writes + cache reads.
    cache = {"prompt_tokens": 1_000_000, "cached_tokens": 600_000, "cache_write_tokens": 300_000}
    record = UsageRecord(
        "t",
        "default",
        "claude-sonnet-5",
        "2026-11-30",
        "replayed",
        **counts,
        **cache,
        api="messages",
    )  # type: ignore[arg-type]
    (row,) = compute_stats([record], by="api", model_table=ModelTable.load())
    assert row.key == "messages"
    # 100k uncached at $2, 300k written at $2.50, 600k read at $0.20, 10k out at $10 per 1M
    assert row.cost_usd == pytest.approx(0.2 + 0.75 + 0.12 + 0.1)
