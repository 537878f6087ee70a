"""Issue 32, rows 1 and 1b: a savings or stats answer is bounded in days, groups, work and time,
and its heavy part runs off the event loop."""

from __future__ import annotations

import builtins
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.store.base import UsageDelta
from proxy.telemetry import stats
from proxy.tokens.budget import ModelTable
from tests.inprocess import running

ADMIN = "admin-key-of-the-attack-suite"
TODAY = datetime.now(UTC).date()


def _deltas(models: int, days: int = 1) -> list[UsageDelta]:
    """Usage of `models` distinct (unpriced) model names on each of the last `days` days."""
    out = []
    for d in range(days):
        day = (TODAY - timedelta(days=d)).isoformat()
        for m in range(models):
            counters = {"requests": 1, "action:passthrough": 1, "tokens_before": 10 + m}
            out.append(UsageDelta("t1", "default", f"made-up-{m}", day, counters))
    return out


async def test_a_period_reaching_back_to_the_year_1_is_refused_with_a_400(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, server={"admin_key": ADMIN}) as proxy:
        for path in ("/compactd/v1/savings", "/compactd/v1/stats"):
            r = await proxy.client.get(
                path,
                params={"since": "0001-01-01"},
                headers={"authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 400
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert "stats_max_days" in r.json()["error"]["message"]


async def test_the_longest_allowed_period_gives_one_value_per_day_and_no_more(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, server={"admin_key": ADMIN}, limits={"stats_max_days": 30}) as p:
        headers = {"authorization": f"Bearer {ADMIN}"}
        ok = await p.client.get("/compactd/v1/savings", params={"since": "30d"}, headers=headers)
        over = await p.client.get("/compactd/v1/savings", params={"since": "31d"}, headers=headers)
    assert ok.status_code == 200
    assert len(ok.json()["days"]) == 31
    assert over.status_code == 400


async def test_twenty_thousand_model_names_make_at_most_the_configured_groups(
    tmp_path: Path,
) -> None:
    # A deadline no loaded machine reaches: this test is about the answer's size.
    limits = {"stats_max_groups": 10, "api_work_timeout_ms": 600_000}
    async with running(tmp_path, server={"admin_key": ADMIN}, limits=limits) as proxy:
        await proxy.services.store.add_usage(_deltas(20_000))
        headers = {"authorization": f"Bearer {ADMIN}"}
        savings = await proxy.client.get(
            "/compactd/v1/savings", params={"by": "model", "since": "1d"}, headers=headers
        )
        table = await proxy.client.get(
            "/compactd/v1/stats", params={"by": "model", "since": "1d"}, headers=headers
        )
    for r in (savings, table):
        assert r.status_code == 200
        body = r.json()
        assert len(body["rows"]) == 11  # the ten largest and (other)
        assert body["rows"][0]["key"] == stats.OTHER
        assert body["total"]["requests"] == 20_000  # nothing is lost, only added up
        assert len(body["total"]["unpriced_models"]) == 20_000
    assert set(savings.json()["series"]) == {*(r["key"] for r in savings.json()["rows"]), "total"}


def test_adding_up_unpriced_rows_sorts_each_name_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sorted_items = 0

    def counting(items: Any, **kwargs: Any) -> list[Any]:
        nonlocal sorted_items
        out = builtins.sorted(items, **kwargs)
        sorted_items += len(out)
        return out

    monkeypatch.setattr(stats, "sorted", counting, raising=False)
    rows = [
        {"tenant": "t", "policy": "p", "model": f"m{i}", "day": "2026-12-01", "requests": 1}
        for i in range(5_000)
    ]
    table = stats.compute_stats(rows, by="policy", model_table=ModelTable.load(None))
    assert len(table[0].unpriced_models) == 5_000
    # Linear: each name is sorted a few times (group, then total), not once per row merged.
    assert sorted_items <= 4 * 5_000


async def test_savings_are_computed_in_a_thread_not_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    real = stats.series_json

    def spied(*args: Any, **kwargs: Any) -> dict[str, Any]:
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr("proxy.app.dashboard_api.series_json", spied)
    async with running(tmp_path, server={"admin_key": ADMIN}) as proxy:
        r = await proxy.client.get(
            "/compactd/v1/savings", headers={"authorization": f"Bearer {ADMIN}"}
        )
    assert r.status_code == 200
    assert threads
    assert threads[0] is not threading.main_thread()


async def test_savings_past_their_deadline_are_an_openai_shaped_503(tmp_path: Path) -> None:
    limits = {"api_work_timeout_ms": 1, "stats_max_days": 400}
    async with running(tmp_path, server={"admin_key": ADMIN}, limits=limits) as proxy:
        await proxy.services.store.add_usage(_deltas(2_000, days=3))
        r = await proxy.client.get(
            "/compactd/v1/savings",
            params={"since": "400d", "by": "model"},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "timeout"
