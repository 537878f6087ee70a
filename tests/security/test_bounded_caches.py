"""Issue 32, row 6: every in-memory cache is bounded, and what each holds is a metric
(`compactd_cache_entries{cache}`), so memory that grows under load can be told apart."""

from __future__ import annotations

from pathlib import Path

from tests.inprocess import running
from tests.security.conftest import history

CACHES = (
    "bodies",
    "lossless_forms",
    "stored_forms",
    "precompute",
    "replay_checks",
    "native_counts",
    "token_counts",
)


async def test_each_cache_reports_its_entries_and_token_counts_stay_within_their_size(
    tmp_path: Path,
) -> None:
    policy = {"budget_tokens": 600}
    async with running(tmp_path, default_policy=policy, tokens={"cache_size": 20}) as proxy:
        for n in range(5):
            r = await proxy.chat({"model": "gpt-4o", "messages": history(6, tag=f" #{n}")})
            assert r.status_code == 200
        scrape = (await proxy.client.get("/metrics")).text
        held = {cache: proxy.metric("compactd_cache_entries", cache=cache) for cache in CACHES}
    for cache in CACHES:
        assert f'compactd_cache_entries{{cache="{cache}"}}' in scrape
    assert 0 < held["token_counts"] <= 20  # 5 x 14 distinct messages were counted
