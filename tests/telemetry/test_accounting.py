"""Usage accounting: aggregated in memory, written in batches, bounded, drops counted as drops."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from proxy.errors import StoreError
from proxy.store.base import UsageDelta, UsageRecord
from proxy.store.sqlite.store import SqliteStore
from proxy.telemetry.accounting import Accountant, usage_model
from proxy.telemetry.metrics import Metrics

DAY = "2026-12-01"


def record(tenant: str = "t1", model: str = "gpt-4o", action: str = "passthrough") -> UsageRecord:
    return UsageRecord(tenant, "default", model, DAY, action, 100, 60, 90, 10, 5)


class Sink:
    """Collects batches; raises StoreError while `down`."""

    def __init__(self) -> None:
        self.batches: list[list[UsageDelta]] = []
        self.down = False

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        if self.down:
            raise StoreError("down")
        self.batches.append(list(deltas))


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics._registry.get_sample_value(name, labels)
    return value or 0.0


async def test_many_requests_become_one_aggregate_in_one_batch() -> None:
    sink = Sink()
    acc = Accountant(sink, Metrics(multiprocess=""))
    for _ in range(1000):
        acc.add(record())
    acc.add(record(action="compacted"))

    await acc.flush()

    assert len(sink.batches) == 1
    (delta,) = sink.batches[0]
    assert delta.counters["requests"] == 1001
    assert delta.counters["action:compacted"] == 1
    assert delta.counters["tokens_before"] == 100_100
    assert acc.pending == 0


async def test_a_full_table_drops_new_aggregates_and_counts_them_as_drops() -> None:
    metrics = Metrics(multiprocess="")
    acc = Accountant(Sink(), metrics, max_pending=2)
    acc.add(record("a"))
    acc.add(record("b"))
    for _ in range(5):
        acc.add(record("c"))  # would be a third aggregate
    acc.add(record("a"))  # an existing one still counts

    assert acc.pending == 2
    assert sample(metrics, "compactd_usage_dropped_total", reason="full") == 5
    assert sample(metrics, "compactd_fail_open_total", reason="accounting") == 0


async def test_a_refused_batch_is_kept_and_written_by_the_next_flush() -> None:
    sink, metrics = Sink(), Metrics(multiprocess="")
    acc = Accountant(sink, metrics)
    acc.add(record())
    sink.down = True
    await acc.flush()
    acc.add(record())
    sink.down = False
    await acc.flush()

    assert [d.counters["requests"] for d in sink.batches[0]] == [2]
    assert sample(metrics, "compactd_usage_flushes_total", result="error") == 1
    assert sample(metrics, "compactd_usage_flushes_total", result="ok") == 1


async def test_closing_writes_what_is_pending_and_counts_what_it_could_not() -> None:
    sink, metrics = Sink(), Metrics(multiprocess="")
    acc = Accountant(sink, metrics, flush_seconds=3600)
    acc.start()
    acc.add(record())
    await acc.aclose()
    sink.down = True
    lost = Accountant(sink, metrics)
    lost.add(record())
    lost.add(record())
    await lost.aclose()

    assert sink.batches[0][0].counters["requests"] == 1
    assert sample(metrics, "compactd_usage_dropped_total", reason="shutdown") == 2


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o", "gpt-4o"),
        ("ft:gpt-4o:org::abc", "ft:gpt-4o:org::abc"),
        ("bad\nname\x00", "bad?name?"),
        ("", "unknown"),
    ],
)
def test_model_names_are_kept_printable(model: str, expected: str) -> None:
    assert usage_model(model, 128) == expected


def test_long_model_names_are_bounded_but_stay_distinct() -> None:
    a, b = usage_model("m" * 2_000_000 + "a", 128), usage_model("m" * 2_000_000 + "b", 128)

    assert len(a) == len(b) == 128
    assert a != b
    assert a == usage_model("m" * 2_000_000 + "a", 128)


async def test_batches_reach_sqlite_in_a_file_of_their_own(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "compactd.db")
    acc = Accountant(store, Metrics(multiprocess=""))
    try:
        for tenant in ("t1", "t2", "t1"):
            acc.add(record(tenant))
        await acc.flush()
        rows = await store.usage(None, DAY)
    finally:
        await store.close()

    assert [(r["tenant"], r["requests"]) for r in rows] == [("t1", 2), ("t2", 1)]
    assert (tmp_path / "compactd-usage.db").exists()


def test_today_is_the_utc_date() -> None:
    import time

    acc = Accountant(Sink(), Metrics(multiprocess=""))

    assert acc.today() == time.strftime("%Y-%m-%d", time.gmtime())
    assert acc.today() is acc.today()  # formatted once
