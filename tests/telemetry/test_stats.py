"""Stats figures against a scripted sequence of requests, computed by hand."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from proxy.store.base import UsageRecord
from proxy.store.sqlite.store import SqliteStore
from proxy.telemetry.stats import (
    StatsRow,
    compute_stats,
    format_table,
    parse_since,
    stats_json,
    total,
)
from proxy.tokens.budget import ModelTable

# Round prices so the expectations can be worked out on paper (USD per 1M tokens).
TABLE = ModelTable.from_mapping(
    {
        "default": {
            "context_window": 32768,
            "max_output": 4096,
            "encoding": "o200k_base",
            "input_price": 0.0,
            "cached_input_price": 0.0,
            "output_price": 0.0,
        },
        "models": [
            {
                "pattern": "gpt-x*",
                "context_window": 128000,
                "max_output": 16384,
                "encoding": "o200k_base",
                "input_price": 2.0,
                "cached_input_price": 0.5,
                "output_price": 8.0,
            }
        ],
    }
)


def rec(
    tenant: str,
    policy: str,
    model: str,
    action: str,
    before: int,
    after: int,
    cached: int,
    completion: int,
    *,
    prompt: int | None = None,
    day: str = "2026-11-20",
) -> UsageRecord:
    return UsageRecord(
        tenant=tenant,
        policy=policy,
        model=model,
        day=day,
        action=action,
        tokens_before=before,
        tokens_after=after,
        prompt_tokens=after if prompt is None else prompt,
        cached_tokens=cached,
        completion_tokens=completion,
    )


# One conversation of t1 growing past its budget: two passthroughs, a compaction, two replays.
# Sums: before 12400, after 7900 (= prompt), cached 3950 (h = 0.5), completion 600.
T1_GPT = [
    rec("t1", "default", "gpt-x", "passthrough", 1000, 1000, 0, 100),
    rec("t1", "default", "gpt-x", "passthrough", 1200, 1200, 1000, 100),
    rec("t1", "default", "gpt-x", "compacted", 3000, 1500, 0, 200, day="2026-11-21"),
    rec("t1", "default", "gpt-x", "replayed", 3400, 1900, 1400, 100, day="2026-11-21"),
    rec("t1", "default", "gpt-x", "replayed", 3800, 2300, 1550, 100, day="2026-11-21"),
]
# t1 on a model without a price: tokens count, money does not.
T1_LOCAL = [rec("t1", "default", "local-llm", "compacted", 9000, 4000, 0, 10)]
# t2 under a shadow policy: originals forwarded (prompt = before), h = 4400 / 5500 = 0.8.
T2_SHADOW = [
    rec("t2", "shadow-team", "gpt-x", "shadow", 5000, 3000, 4400, 50, prompt=5000),
    rec("t2", "shadow-team", "gpt-x", "passthrough", 500, 500, 0, 50),
]
SCRIPT = T1_GPT + T1_LOCAL + T2_SHADOW

# t1/gpt-x: saved 4500 tokens at the blended 0.5*0.5 + 0.5*2.0 = 1.25 $/M -> 0.005625 gross;
# the compaction's new 1500-token prefix loses the cache discount once at share 0.5:
# 0.5 * 1500 * (2.0 - 0.5) / 1e6 = 0.001125; net 0.0045.
# cost: (7900 - 3950) * 2.0 + 3950 * 0.5 + 600 * 8.0 = 14675 -> 0.014675.
# t2: would save 2000 tokens at 0.8*0.5 + 0.2*2.0 = 0.8 $/M -> 0.0016; saved nothing for real.
# cost: (5500 - 4400) * 2.0 + 4400 * 0.5 + 100 * 8.0 = 5200 -> 0.0052.


def by_key(rows: list[StatsRow]) -> dict[str, StatsRow]:
    return {r.key: r for r in rows}


def test_stats_by_tenant_match_hand_computed_figures() -> None:
    rows = by_key(compute_stats(SCRIPT, by="tenant", model_table=TABLE))
    t1, t2 = rows["t1"], rows["t2"]
    assert (t1.requests, t1.compactions) == (6, 2)
    assert (t1.tokens_without, t1.tokens_sent, t1.tokens_saved) == (21400, 11900, 9500)
    assert t1.saved_usd == pytest.approx(0.0045)
    assert t1.gross_saved_usd == pytest.approx(0.005625)
    assert t1.cache_loss_usd == pytest.approx(0.001125)
    assert t1.cost_usd == pytest.approx(0.014675)
    assert t1.unpriced_models == ("local-llm",)
    assert t1.cache_hit_share == pytest.approx(3950 / 11900)

    assert (t2.requests, t2.compactions, t2.shadow_requests) == (2, 0, 1)
    assert (t2.tokens_without, t2.tokens_sent, t2.tokens_saved) == (5500, 5500, 0)
    assert t2.shadow_tokens_would_save == 2000
    assert t2.saved_usd == 0
    assert t2.shadow_would_save_usd == pytest.approx(0.0016)
    assert t2.cost_usd == pytest.approx(0.0052)
    assert t2.cache_hit_share == pytest.approx(0.8)


def test_stats_by_model_and_policy_group_the_same_requests() -> None:
    models = by_key(compute_stats(SCRIPT, by="model", model_table=TABLE))
    assert sorted(models) == ["gpt-x", "local-llm"]
    assert models["gpt-x"].requests == 7
    assert models["gpt-x"].saved_usd == pytest.approx(0.0045)
    assert models["local-llm"].tokens_saved == 5000
    assert models["local-llm"].saved_usd == 0
    policies = by_key(compute_stats(SCRIPT, by="policy", model_table=TABLE))
    assert policies["default"].tokens_saved == 9500
    assert policies["shadow-team"].shadow_tokens_would_save == 2000


def test_total_adds_up_rows_and_recomputes_shares() -> None:
    t = total(compute_stats(SCRIPT, by="tenant", model_table=TABLE))
    assert (t.requests, t.compactions, t.tokens_saved) == (8, 2, 9500)
    assert t.tokens_without == 26900
    assert t.saved_share == pytest.approx(9500 / 26900)
    assert t.cost_usd == pytest.approx(0.019875)
    assert t.cache_hit_share == pytest.approx((3950 + 4400) / (11900 + 5500))


def test_compaction_that_saves_little_on_a_cached_prefix_can_cost_money() -> None:
    # 1000 tokens removed, 9000-token prefix re-sent uncached where 90 % would have been cached.
    rows = [
        rec("t", "p", "gpt-x", "compacted", 10000, 9000, 0, 0),
        rec("t", "p", "gpt-x", "passthrough", 9000, 9000, 9000, 0),
    ]
    (row,) = compute_stats(rows, by="tenant", model_table=TABLE)
    assert row.saved_usd < 0


async def test_stats_from_the_sqlite_store_aggregates(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "c.db")
    try:
        for r in SCRIPT:
            await store.record_usage(r)
        rows = await store.usage(None, "2026-11-19")
    finally:
        await store.close()
    stats = by_key(compute_stats(rows, by="tenant", model_table=TABLE))
    t1 = stats["t1"]
    assert (t1.requests, t1.compactions, t1.tokens_saved) == (6, 2, 9500)
    assert t1.cost_usd == pytest.approx(0.014675)
    # The store keeps no per-event prefix size: it is estimated as the mean request size,
    # 7900 / 5 = 1580 for gpt-x -> loss 0.5 * 1580 * 1.5 / 1e6.
    assert t1.cache_loss_usd == pytest.approx(0.001185)
    assert t1.saved_usd == pytest.approx(0.005625 - 0.001185)
    assert stats["t2"].shadow_tokens_would_save == 2000


def test_stats_from_store_rows_with_prefix_sizes_are_exact() -> None:
    row = {
        "tenant": "t1",
        "policy": "default",
        "model": "gpt-x",
        "day": "2026-11-21",
        "requests": 5,
        "actions": {"passthrough": 2, "compacted": 1, "replayed": 2},
        "tokens_before": 12400,
        "tokens_after": 7900,
        "prompt_tokens": 7900,
        "cached_tokens": 3950,
        "completion_tokens": 600,
        "compacted_tokens_after": 1500,
    }
    (stats,) = compute_stats([row], by="tenant", model_table=TABLE)
    assert stats.saved_usd == pytest.approx(0.0045)


def test_unknown_group_by_is_rejected() -> None:
    with pytest.raises(ValueError, match="by must be"):
        compute_stats([], by="day", model_table=TABLE)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", date(2026, 11, 22)),
        ("0d", date(2026, 11, 29)),
        ("2w", date(2026, 11, 15)),
        (" 30D ", date(2026, 10, 30)),
        ("2026-11-01", date(2026, 11, 1)),
    ],
)
def test_parse_since(text: str, expected: date) -> None:
    assert parse_since(text, today=date(2026, 11, 29)) == expected


@pytest.mark.parametrize("text", ["", "7", "d7", "7 days", "2026-13-01", "-3d"])
def test_parse_since_rejects_other_forms(text: str) -> None:
    with pytest.raises(ValueError, match="since must"):
        parse_since(text, today=date(2026, 11, 29))


def test_stats_json_has_rows_and_total() -> None:
    rows = compute_stats(SCRIPT, by="policy", model_table=TABLE)
    body = stats_json(rows, by="policy", since=date(2026, 11, 19))
    assert body["by"] == "policy"
    assert body["since"] == "2026-11-19"
    assert [r["key"] for r in body["rows"]] == ["default", "shadow-team"]
    assert body["rows"][0]["saved_usd"] == pytest.approx(0.0045)
    assert body["rows"][0]["unpriced_models"] == ["local-llm"]
    assert body["total"]["requests"] == 8
    assert body["total"]["saved_share"] == pytest.approx(round(9500 / 26900, 4))


def test_format_table_lists_each_row_and_the_total() -> None:
    text = format_table(compute_stats(SCRIPT, by="tenant", model_table=TABLE))
    lines = text.splitlines()
    assert lines[0].split()[0] == "requests"
    assert lines[2].startswith("t1 ")
    assert lines[3].startswith("t2 ")
    assert lines[5].startswith("total ")
    assert "21,400" in lines[2]
    assert "local-llm" in lines[-1]


def test_format_table_of_nothing_is_just_a_zero_total() -> None:
    text = format_table([])
    assert "total" in text


def test_every_grouping_adds_up_to_the_same_total() -> None:
    totals = [
        total(compute_stats(SCRIPT, by=by, model_table=TABLE))
        for by in ("tenant", "policy", "model")
    ]
    assert totals[0] == totals[1] == totals[2]


def test_a_compaction_costs_the_cache_at_the_rules_write_price() -> None:
    # The same 1500-token prefix rewritten at cache-hit share 0.5: under OpenAI's older rule
    # (writes free) it loses the read discount, 0.5 * 1500 * (2.0 - 0.5) / 1e6; on the Messages
    # API (Anthropic, 5-minute writes at 1.25x) it is written at 2.5 instead of read at 0.5.
    compacted = [
        rec("t", "p", "gpt-x", "compacted", 3000, 1500, 0, 0),
        rec("t", "p", "gpt-x", "replayed", 3000, 1500, 1500, 0),
    ]
    (chat,) = compute_stats(compacted, by="tenant", model_table=TABLE)
    assert chat.cache_loss_usd == pytest.approx(0.5 * 1500 * 1.5 / 1e6)
    assert chat.cache_rules == ("openai",)
    messages = [UsageRecord(**{**r.__dict__, "api": "messages"}) for r in compacted]
    (anthropic,) = compute_stats(messages, by="tenant", model_table=TABLE)
    assert anthropic.cache_loss_usd == pytest.approx(0.5 * 1500 * (2.5 - 0.5) / 1e6)
    assert anthropic.cache_rules == ("anthropic",)
    assert anthropic.saved_usd < chat.saved_usd


def test_savings_per_policy_and_model_state_their_assumptions() -> None:
    rows = compute_stats(SCRIPT, by="policy-model", model_table=TABLE)
    assert [r.key for r in rows] == [
        "default / gpt-x",
        "default / local-llm",
        "shadow-team / gpt-x",
    ]
    assert total(rows) == total(compute_stats(SCRIPT, by="policy", model_table=TABLE))
    answer = stats_json(rows, by="policy-model")
    assert "cache rule" in answer["assumptions"]
    assert answer["total"]["cache_rules"] == ["openai"]
    assert "cache rules: openai;" in format_table(rows)
