"""The dashboard's JSON (/compactd/v1/me, savings, inspect) and pages, with the API's tenant rules."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.app.ui import SECURITY_HEADERS
from proxy.runtime.digest import message_digest
from proxy.store.base import UsageRecord
from proxy.store.sqlite.store import SqliteStore
from proxy.telemetry.stats import SERIES_METRICS, compute_stats, fail_open_reason
from proxy.wire.tenant import key_fingerprint, tenant_id
from tests import dashboard_data as dd
from tests.inprocess import Proxy, running

STATIC = Path(__file__).resolve().parents[2] / "proxy" / "app" / "ui" / "static"


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def settled(proxy: Proxy, requests: int) -> None:
    """Usage is recorded off the request path: wait until the store has every request."""
    for _ in range(200):
        body = (await proxy.client.get("/compactd/v1/savings", headers=auth(dd.ADMIN))).json()
        if body["total"]["requests"] >= requests:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("usage was not recorded")


@pytest.fixture
async def traffic(tmp_path: Path) -> AsyncIterator[tuple[Proxy, dict[str, int]]]:
    async with running(
        tmp_path, dd.upstream(), registry=dd.registry(), **dd.config(tmp_path / "data")
    ) as proxy:
        made = await dd.drive(proxy.client)
        await settled(proxy, sum(made.values()))
        yield proxy, made


async def test_me_tells_the_admin_from_a_client_key_and_refuses_no_key(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, _ = traffic
    admin = (await proxy.client.get("/compactd/v1/me", headers=auth(dd.ADMIN))).json()
    assert admin == {"admin": True, "tenant": None, "key_id": None}
    alpha = (await proxy.client.get("/compactd/v1/me", headers=auth(dd.ALPHA))).json()
    secret = dd.SECRET.encode()
    assert alpha == {
        "admin": False,
        "tenant": tenant_id(secret, dd.ALPHA),
        "key_id": key_fingerprint(secret, dd.ALPHA),
    }
    assert (await proxy.client.get("/compactd/v1/me")).status_code == 401


async def test_savings_equal_the_stats_endpoint_and_the_days_add_up(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, made = traffic
    savings = (
        await proxy.client.get("/compactd/v1/savings?since=7d", headers=auth(dd.ADMIN))
    ).json()
    stats = (await proxy.client.get("/compactd/v1/stats?since=7d", headers=auth(dd.ADMIN))).json()
    assert savings["total"] == stats["total"]
    assert savings["rows"] == stats["rows"]
    assert len(savings["days"]) == 8  # 7 days ago through today
    total = savings["total"]
    assert total["requests"] == sum(made.values())
    assert total["compactions"] >= 1
    for metric in ("requests", "compactions", "tokens_without", "tokens_sent", "fail_opens"):
        assert sum(savings["series"]["total"][metric]) == total[metric], metric
        by_group = sum(sum(savings["series"][r["key"]][metric]) for r in savings["rows"])
        assert by_group == total[metric], metric
    assert set(savings["series"]["total"]) == set(SERIES_METRICS)


async def test_a_fail_open_is_counted_with_its_reason_per_policy(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, made = traffic
    body = (await proxy.client.get("/compactd/v1/savings?by=policy", headers=auth(dd.ADMIN))).json()
    rows = {r["key"]: r for r in body["rows"]}
    assert rows["experimental"]["fail_opens"] == made["lab"]
    assert rows["experimental"]["fail_open_reasons"] == {"provider": made["lab"]}
    assert body["total"]["fail_open_reasons"] == {"provider": made["lab"]}
    assert rows["search-shadow"]["shadow_requests"] == made["gamma"]
    assert rows["search-shadow"]["shadow_tokens_would_save"] > 0
    modes = {p["name"]: p["mode"] for p in body["policies"]}
    assert modes == {"search-shadow": "shadow", "experimental": "enforce", "default": "enforce"}


async def test_a_client_key_sees_only_its_own_savings_and_policies(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, made = traffic
    body = (await proxy.client.get("/compactd/v1/savings?by=tenant", headers=auth(dd.ALPHA))).json()
    alpha = tenant_id(dd.SECRET.encode(), dd.ALPHA)
    assert [r["key"] for r in body["rows"]] == [alpha]
    assert body["total"]["requests"] == made["alpha"]
    assert [p["name"] for p in body["policies"]] == ["default"]
    assert (await proxy.client.get("/compactd/v1/savings")).status_code == 401


async def test_savings_by_api_name_the_chat_completions_api(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, made = traffic
    body = (await proxy.client.get("/compactd/v1/savings?by=api", headers=auth(dd.ADMIN))).json()
    assert [(r["key"], r["requests"]) for r in body["rows"]] == [
        ("chat.completions", sum(made.values()))
    ]
    bad = await proxy.client.get("/compactd/v1/savings?by=day", headers=auth(dd.ADMIN))
    assert bad.status_code == 400
    bad = await proxy.client.get("/compactd/v1/savings?since=yesterday", headers=auth(dd.ADMIN))
    assert bad.status_code == 400


async def _alpha_conversation(proxy: Proxy, key: str = dd.ALPHA) -> str:
    listed = (await proxy.client.get("/compactd/v1/conversations", headers=auth(key))).json()
    alpha = tenant_id(dd.SECRET.encode(), dd.ALPHA)
    (conv,) = [c["conversation"] for c in listed["data"] if c["tenant"] == alpha]
    return str(conv)


def restored(view: dict[str, Any], checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """What the inspector's download holds: every original the checkpoint stands for, in order."""
    out = []
    for row in checkpoint["rows"]:
        if not row["refs"]:
            out.append(row["message"])
        for group in row["stands_for"]:
            out.extend(view["originals"][d]["message"] for d in group["digests"])
    return out


async def test_the_inspector_shows_what_each_checkpoint_replaced_and_restores_the_originals(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, _ = traffic
    conv = await _alpha_conversation(proxy)
    response = await proxy.client.get(
        f"/compactd/v1/conversations/{conv}/inspect", headers=auth(dd.ALPHA)
    )
    view = response.json()
    assert view["conversation"] == conv
    assert view["encoding"] == "o200k_base"
    counter = proxy.services.tokenizers.counter("o200k_base")
    assert len(view["checkpoints"]) == view["checkpoint_count"] >= 2
    sent = [dd.agent_history("alpha", turns) for turns in range(1, 9)]
    for cp in view["checkpoints"]:
        originals = restored(view, cp)
        # The originals are the client's first covered_through + 1 messages (as digested: a
        # message kept as it was is stored in canonical form, `"content": null` dropped) ...
        assert len(originals) == cp["covered_through"] + 1
        digests = [message_digest(m) for m in originals]
        assert any([message_digest(m) for m in req[: len(originals)]] == digests for req in sent)
        # ... each forwarded message says which span it stands for, and marks its refs.
        assert cp["rows"][-1]["last"] == cp["covered_through"]
        rewritten = [r for r in cp["rows"] if r["refs"]]
        assert rewritten
        for row in rewritten:
            text = str(row["message"].get("content"))
            assert all(f"[compactd:ref={ref}" in text for ref in row["refs"])
            assert row["tokens"] == counter.count_message(row["message"])
    for original in view["originals"].values():
        assert original["tokens"] == counter.count_message(original["message"])
    # The admin key inspects any tenant's conversation too.
    assert (
        await proxy.client.get(f"/compactd/v1/conversations/{conv}/inspect", headers=auth(dd.ADMIN))
    ).json() == view


async def test_a_client_key_cannot_list_or_inspect_another_tenants_conversation(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, _ = traffic
    conv = await _alpha_conversation(proxy, dd.ADMIN)
    listed = (await proxy.client.get("/compactd/v1/conversations", headers=auth(dd.BETA))).json()
    assert conv not in [c["conversation"] for c in listed["data"]]
    assert len(listed["data"]) == 1
    for key in (dd.BETA, None):
        response = await proxy.client.get(
            f"/compactd/v1/conversations/{conv}/inspect", headers=auth(key) if key else {}
        )
        assert response.status_code == (404 if key else 401)
        assert "ALPHA" not in response.text


async def test_the_pages_are_served_offline_with_a_strict_policy(tmp_path: Path) -> None:
    async with running(tmp_path) as proxy:
        page = await proxy.client.get("/compactd/ui/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for name, value in SECURITY_HEADERS.items():
            assert page.headers[name] == value
        assert "script-src 'self'" in page.headers["content-security-policy"]
        bare = await proxy.client.get("/compactd/ui")
        assert (bare.status_code, bare.headers["location"]) == (308, "/compactd/ui/")
        # Everything the page loads is one of the packaged files, by a relative path.
        html = page.text
        linked = re.findall(r'(?:src|href)="([^"#]+)"', html)
        assert linked
        assert all(not re.match(r"[a-z]+:", u) or u == "data:," for u in linked)
        for name in [u for u in linked if u != "data:,"]:
            asset = await proxy.client.get(f"/compactd/ui/{name}")
            assert asset.status_code == 200, name
            again = await proxy.client.get(
                f"/compactd/ui/{name}", headers={"if-none-match": asset.headers["etag"]}
            )
            assert again.status_code == 304
        for outside in ("/compactd/ui/..%2Fapi.py", "/compactd/ui/nothing.js", "/compactd/ui/a/b"):
            assert (await proxy.client.get(outside)).status_code == 404
    # No asset fetches anything from another origin (no CDN): only this origin's API.
    for path in STATIC.glob("*.js"):
        code = path.read_text()
        assert not re.search(r"fetch\(\s*['\"`]https?:", code), path.name
    assert (STATIC / "uplot-LICENSE.txt").read_text().startswith("The MIT License")


async def test_usage_keeps_apis_and_fail_open_reasons_apart(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "u.db")
    base = {"tenant": "t", "policy": "p", "model": "gpt-4o", "day": "2026-11-20"}
    try:
        await store.record_usage(
            UsageRecord(**base, action="compacted", tokens_before=900, tokens_after=300)
        )
        await store.record_usage(
            UsageRecord(
                **base, action="error", tokens_before=500, tokens_after=500, fail_open="store"
            )
        )
        await store.record_usage(
            UsageRecord(
                **base, action="passthrough", tokens_before=70, tokens_after=70, api="responses"
            )
        )
        rows = await store.usage(None, "2026-11-19")
    finally:
        await store.close()
    (row,) = rows
    assert row["apis"]["responses"]["requests"] == 1
    by_api = {r.key: r for r in compute_stats(rows, by="api", model_table=proxy_models())}
    assert by_api["chat.completions"].requests == 2
    assert by_api["chat.completions"].tokens_saved == 600
    assert by_api["chat.completions"].fail_open_reasons == (("store", 1),)
    assert by_api["responses"].tokens_without == 70
    # Rows stored before reasons were recorded still count their fail-opens.
    old = {**base, "requests": 2, "actions": {"error": 2}, "tokens_before": 10, "tokens_after": 10}
    (stats,) = compute_stats([old], by="policy", model_table=proxy_models())
    assert (stats.fail_opens, stats.fail_open_reasons) == (2, (("unrecorded", 2),))


def proxy_models() -> Any:
    from proxy.tokens.budget import ModelTable

    return ModelTable.load()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("provider trim raised ValueError: boom", "provider"),
        ("providers trim+engine: invalid", "provider"),
        ("store", "store"),
        ("timeout", "timeout"),
        ("KeyError", "KeyError"),
        ("something: with text", "other"),
        (None, "unrecorded"),
    ],
)
def test_fail_open_reasons_are_a_bounded_set(error: str | None, reason: str) -> None:
    assert fail_open_reason(error) == reason


async def test_the_conversation_list_carries_api_model_tokens_and_can_show_the_uncompacted(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, made = traffic

    async def listing(key: str, query: str = "") -> list[dict[str, Any]]:
        response = await proxy.client.get(f"/compactd/v1/conversations{query}", headers=auth(key))
        assert response.status_code == 200
        data: list[dict[str, Any]] = response.json()["data"]
        return data

    compacted = await listing(dd.ADMIN)
    every = await listing(dd.ADMIN, "?all=true")
    assert all(c["compacted"] for c in compacted)
    assert {c["conversation"] for c in compacted} < {c["conversation"] for c in every}
    never = [c for c in every if not c["compacted"]]
    # The lab team's one request failed open: its conversation never compacted.
    assert [c["requests"] for c in never] == [made["lab"]]
    assert never[0]["checkpoint_count"] == 0
    # Every request of every conversation is counted once, with what it sent and saved.
    assert sum(c["requests"] for c in every) == sum(made.values())
    for c in every:
        assert c["api"] == "chat.completions"
        assert c["model"] == "gpt-4o"
        assert c["tokens_saved"] == c["tokens_before"] - c["tokens_after"] >= 0
    alpha = tenant_id(dd.SECRET.encode(), dd.ALPHA)
    (mine,) = [c for c in every if c["tenant"] == alpha]
    assert mine["requests"] == made["alpha"]
    assert mine["tokens_saved"] > 0
    assert mine["compactions"] == mine["checkpoint_count"]
    # A client sees its own conversations only, with or without the uncompacted ones.
    beta = tenant_id(dd.SECRET.encode(), dd.BETA)
    assert {c["tenant"] for c in await listing(dd.BETA, "?all=true")} == {beta}
    # Purged, a conversation leaves the list, activity and all.
    gone = await proxy.client.delete(
        f"/compactd/v1/conversations/{mine['conversation']}", headers=auth(dd.ALPHA)
    )
    assert gone.status_code == 200
    assert alpha not in {c["tenant"] for c in await listing(dd.ADMIN, "?all=true")}


async def test_savings_per_policy_and_model_state_the_cache_rule(
    traffic: tuple[Proxy, dict[str, int]],
) -> None:
    proxy, made = traffic
    url = "/compactd/v1/savings?by=policy-model"
    body = (await proxy.client.get(url, headers=auth(dd.ADMIN))).json()
    assert all(" / " in r["key"] for r in body["rows"])
    assert sum(r["requests"] for r in body["rows"]) == sum(made.values())
    assert "cache rule" in body["assumptions"]
    assert body["total"]["cache_rules"]
    by_policy = await proxy.client.get("/compactd/v1/savings?by=policy", headers=auth(dd.ADMIN))
    assert by_policy.json()["total"]["saved_usd"] == body["total"]["saved_usd"]
