"""Issue 32, row 11: the admin key has a minimum strength, each tenant has a request rate and a
storage quota, and listings come a page at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import admin_key_weakness
from proxy.wire.ratelimit import RateLimiter
from tests.cli.test_cli import run
from tests.inprocess import running
from tests.security.conftest import history

STRONG = "f3b1c9e07a5d42c8b6e1d0a9f7c3b5e2"


@pytest.mark.parametrize("key", ["a", "admin", "aaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababab"])
def test_check_config_refuses_a_weak_admin_key(tmp_path: Path, key: str) -> None:
    config = tmp_path / "compactd.toml"
    config.write_text(f'[server]\nadmin_key = "{key}"\n')
    result = run("check-config", str(config), data=tmp_path)
    assert result.returncode != 0
    assert b"server.admin_key" in result.stderr
    if len(key) > 5:
        assert key.encode() not in result.stderr  # never echoed


def test_a_strong_admin_key_passes() -> None:
    assert admin_key_weakness(STRONG) is None
    assert admin_key_weakness("") is None  # no admin at all


def test_a_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    rate = RateLimiter(60, clock=lambda: now[0])
    assert [rate.wait("t") for _ in range(60)] == [0.0] * 60
    assert rate.wait("t") == pytest.approx(1.0)
    assert rate.wait("u") == 0.0  # another tenant's bucket is its own
    now[0] = 2.0
    assert rate.wait("t") == 0.0


def test_the_buckets_kept_are_bounded() -> None:
    rate = RateLimiter(1, max_tenants=100)
    for i in range(10_000):
        rate.wait(f"made-up-{i}")
    assert len(rate._buckets) == 100


async def test_a_tenant_past_its_api_rate_gets_an_openai_429(tmp_path: Path) -> None:
    async with running(tmp_path, limits={"api_rate_per_minute": 5}) as proxy:
        key = {"authorization": "Bearer sk-greedy"}
        answers = [await proxy.client.get("/compactd/v1/me", headers=key) for _ in range(7)]
        other = await proxy.client.get("/compactd/v1/me", headers={"authorization": "Bearer b"})
        counted = proxy.metric("compactd_rate_limited_total", route="api")
    assert [r.status_code for r in answers] == [200] * 5 + [429] * 2
    error = answers[-1].json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert int(answers[-1].headers["retry-after"]) >= 1
    assert other.status_code == 200
    assert counted == 2


async def test_a_tenant_past_its_chat_rate_gets_429_in_each_apis_shape(tmp_path: Path) -> None:
    async with running(tmp_path, limits={"chat_rate_per_minute": 2}) as proxy:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        chats = [await proxy.chat(body) for _ in range(3)]
        anthropic = await proxy.client.post(
            "/v1/messages",
            json={"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": []},
            headers={"x-api-key": "sk-alpha"},
        )
        counted = proxy.metric("compactd_rate_limited_total", route="chat")
    assert [r.status_code for r in chats] == [200, 200, 429]
    assert chats[-1].json()["error"]["code"] == "rate_limit_exceeded"
    assert "retry-after" in chats[-1].headers
    assert anthropic.status_code == 429
    assert anthropic.json()["type"] == "error"  # Anthropic's shape on its API
    assert counted == 2
    assert len(proxy.upstream.received) == 2  # a refused request never went upstream


async def test_a_listing_comes_a_page_at_a_time(tmp_path: Path) -> None:
    policy = {"default_policy": {"budget_tokens": 600}}
    async with running(tmp_path, limits={"list_page_size": 2}, **policy) as proxy:
        for n in range(5):
            r = await proxy.chat({"model": "gpt-4o", "messages": history(6, tag=f" #{n}")})
            assert r.headers["x-compactd-action"] == "compacted"
        key = {"authorization": "Bearer sk-alpha"}
        seen: list[str] = []
        pages, after = 0, None
        while True:
            params = {"after": after} if after else {}
            page = (
                await proxy.client.get("/compactd/v1/conversations", params=params, headers=key)
            ).json()
            seen += [c["conversation"] for c in page["data"]]
            pages += 1
            assert len(page["data"]) <= 2
            if not page["has_more"]:
                break
            after = page["next"]
        too_many = await proxy.client.get("/compactd/v1/conversations?limit=3", headers=key)
    assert pages == 3
    assert sorted(seen) == sorted(set(proxy.conversations))
    assert too_many.status_code == 400


async def test_a_tenant_over_its_quota_stores_no_more(tmp_path: Path) -> None:
    policy = {"default_policy": {"budget_tokens": 600}}
    async with running(tmp_path, limits={"tenant_quota_mb": 1}, **policy) as proxy:
        quota = proxy.services.compactor.quota
        assert quota is not None
        quota.limit_bytes = 1  # a quota the first compaction fills
        first = await proxy.chat({"model": "gpt-4o", "messages": history(6, tag=" one")})
        await quota.aclose()
        alpha = proxy.services.tenancy.identify({"authorization": "Bearer sk-alpha"}).tenant
        assert alpha is not None
        await quota.refresh(alpha)  # what the next periodic read would find
        second = await proxy.chat({"model": "gpt-4o", "messages": history(6, tag=" two")})
        other = await proxy.chat({"model": "gpt-4o", "messages": history(6)}, key="sk-beta")
        stored = await proxy.services.store.list_conversations(None)
    assert first.headers["x-compactd-action"] == "compacted"
    assert second.headers["x-compactd-action"] == "error"
    assert second.headers["x-compactd-error"] == "quota"
    assert other.headers["x-compactd-action"] == "compacted"  # another tenant is not held
    assert len(stored) == 2
