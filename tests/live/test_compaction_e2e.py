"""Compaction through the running proxy, with the real openai SDK as the client."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from tests.store.redis_server import RedisServer
from tests.tiny_model import tiny_model
from tests.upstream import respond, sse_chunks, stream

SMALL = {"default_policy": {"budget_tokens": 600}}
# Requests without a credential are never compacted: every client here has a key.
ALPHA = {"authorization": "Bearer sk-alpha"}


def history(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for t in range(turns):
        msgs.append(
            {
                "role": "user",
                "content": f"Turn {t}: look at src/mod{t}.py " + "lorem ipsum dolor " * 25,
            }
        )
        msgs.append(
            {"role": "assistant", "content": f"Answer {t}: " + "noted and understood " * 15}
        )
    msgs.append({"role": "user", "content": "What did we decide about src/mod0.py?"})
    return msgs


def overflow_error(message: str) -> dict[str, Any]:
    """An OpenAI context-length 400 body with this message."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def sdk(url: str, key: str = "sk-alpha") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def chat(
    client: openai.AsyncOpenAI, messages: list[dict[str, Any]], **kw: Any
) -> httpx.Headers:
    kw.setdefault("model", "gpt-4o")
    raw = await client.chat.completions.with_raw_response.create(messages=messages, **kw)
    raw.parse()
    return raw.headers


async def test_over_budget_request_is_compacted_and_restorable(upstream, make_proxy) -> None:
    fake, base = upstream
    original = history(6)
    async with make_proxy(base, **SMALL) as url:
        client = sdk(url)
        h = await chat(client, original)
        sent = fake.last.json()["messages"]
        assert h["x-compactd-action"] == "compacted"
        assert int(h["x-compactd-tokens-after"]) < int(h["x-compactd-tokens-before"])
        assert int(h["x-compactd-tokens-after"]) <= 600
        assert sent[0] == original[0]  # system message untouched
        assert sent[-1] == original[-1]  # last user message untouched
        async with httpx.AsyncClient(headers=ALPHA) as http:
            r = await http.post(
                f"{url}/compactd/v1/uncompress",
                json={"messages": sent, "recursive": True},
                headers={"authorization": "Bearer sk-alpha"},
            )
        await client.close()
    assert r.status_code == 200
    assert r.json()["missing_ids"] == []
    assert r.json()["messages"] == original


async def test_next_turn_replays_the_same_bytes_for_the_compacted_prefix(
    upstream, make_proxy
) -> None:
    fake, base = upstream
    msgs = history(6)
    async with make_proxy(base, **SMALL) as url:
        client = sdk(url)
        h1 = await chat(client, msgs)
        first = fake.last.json()["messages"]
        # The client resends its original history plus a new exchange, cosmetically changed:
        # a null field added and keys reordered, as SDKs do.
        resent = [dict(reversed(list(m.items()))) for m in msgs]
        resent[-1]["name"] = None
        resent += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and next?"}]
        h2 = await chat(client, resent)
        second = fake.last.json()["messages"]
        async with httpx.AsyncClient() as http:
            stored = await http.get(
                f"{url}/compactd/v1/conversations/{h1['x-compactd-conversation']}",
                headers={"authorization": "Bearer sk-alpha"},
            )
        await client.close()
    assert h1["x-compactd-action"] == "compacted"
    assert h2["x-compactd-action"] == "replayed"
    assert h1["x-compactd-conversation"] == h2["x-compactd-conversation"]
    (checkpoint,) = stored.json()["checkpoints"]
    n, covered = len(checkpoint["messages"]), checkpoint["covered_through"]
    # Byte level: the compacted prefix goes out as the same bytes, whatever the client changed.
    prefix = json.dumps(first[:n], separators=(",", ":"), ensure_ascii=False).encode()
    assert prefix[1:-1] in fake.last.body
    assert second[:n] == first[:n]
    # Everything after it is the client's own, as sent this time (its key order, its nulls).
    assert json.dumps(second[n:]) == json.dumps(resent[covered + 1 :])


async def test_tenants_are_isolated_through_api_and_replay(upstream, make_proxy) -> None:
    fake, base = upstream
    msgs = history(6)
    async with make_proxy(base, **SMALL) as url:
        alpha, beta = sdk(url, "sk-alpha"), sdk(url, "sk-beta")
        ha = await chat(alpha, msgs)
        conv = ha["x-compactd-conversation"]
        sent_alpha = fake.last.json()["messages"]
        async with httpx.AsyncClient(headers=ALPHA) as http:
            mine = await http.get(
                f"{url}/compactd/v1/conversations/{conv}",
                headers={"authorization": "Bearer sk-alpha"},
            )
            theirs = await http.get(
                f"{url}/compactd/v1/conversations/{conv}",
                headers={"authorization": "Bearer sk-beta"},
            )
            restore = await http.post(
                f"{url}/compactd/v1/uncompress",
                json={"messages": sent_alpha},
                headers={"authorization": "Bearer sk-beta"},
            )
            purge = await http.delete(
                f"{url}/compactd/v1/conversations/{conv}",
                headers={"authorization": "Bearer sk-beta"},
            )
            listed = await http.get(
                f"{url}/compactd/v1/conversations", headers={"authorization": "Bearer sk-beta"}
            )
        # Beta then sends the very same conversation: it must not replay alpha's checkpoint.
        hb = await chat(
            beta, [*msgs, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
        )
        await alpha.close()
        await beta.close()
    assert ha["x-compactd-action"] == "compacted"
    assert hb["x-compactd-action"] == "compacted"  # its own compaction, not alpha's replay
    assert mine.status_code == 200
    assert mine.json()["checkpoint_count"] >= 1
    assert theirs.status_code == 404
    assert restore.json()["messages_expanded"] == 0
    assert len(restore.json()["missing_ids"]) >= 1
    assert purge.status_code == 404
    assert listed.json()["data"] == []


async def test_store_down_forwards_original_bytes_and_recovers(
    upstream, make_proxy, tmp_path
) -> None:
    fake, base = upstream
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis", appendonly=True)
    redis.start()
    body = json.dumps({"model": "gpt-4o", "messages": history(6)}).encode()
    try:
        async with make_proxy(base, store={"url": redis.url, "timeout_ms": 300}, **SMALL) as url:
            async with httpx.AsyncClient(headers=ALPHA) as http:
                redis.stop(signal.SIGKILL)
                down = await http.post(f"{url}/v1/chat/completions", content=body)
                forwarded_while_down = fake.last.body
                redis.start()
                back = await http.post(f"{url}/v1/chat/completions", content=body)
                metrics = (await http.get(f"{url}/metrics")).text
    finally:
        redis.stop(signal.SIGKILL)
    assert down.status_code == 200
    assert down.headers["x-compactd-action"] == "error"
    assert forwarded_while_down == body  # the original request, unchanged
    assert back.headers["x-compactd-action"] == "compacted"
    assert 'compactd_fail_open_total{reason="store"}' in metrics


async def test_shadow_mode_forwards_original_bytes_and_reports(upstream, make_proxy) -> None:
    fake, base = upstream
    body = json.dumps({"model": "gpt-4o", "messages": history(6)}).encode()
    async with make_proxy(base, default_policy={"budget_tokens": 600, "mode": "shadow"}) as url:
        async with httpx.AsyncClient(headers=ALPHA) as http:
            r = await http.post(f"{url}/v1/chat/completions", content=body)
    assert fake.last.body == body
    assert r.headers["x-compactd-action"] == "shadow"
    assert r.headers["x-compactd-shadow-action"] == "compacted"
    assert int(r.headers["x-compactd-tokens-after"]) < int(r.headers["x-compactd-tokens-before"])


@pytest.mark.parametrize("allowed", [True, False])
async def test_bypass_is_honoured_only_when_the_policy_allows_it(
    upstream, make_proxy, allowed
) -> None:
    fake, base = upstream
    body = json.dumps({"model": "gpt-4o", "messages": history(6)}).encode()
    policy = {"budget_tokens": 600, "allow_bypass": allowed}
    async with make_proxy(base, default_policy=policy) as url:
        async with httpx.AsyncClient(headers=ALPHA) as http:
            r = await http.post(
                f"{url}/v1/chat/completions", content=body, headers={"x-compactd-bypass": "1"}
            )
    assert r.headers["x-compactd-action"] == ("bypass" if allowed else "compacted")
    assert (fake.last.body == body) is allowed


@asynccontextmanager
async def uncapped_client(make_proxy: Any, base: str, tmp_path: Any) -> AsyncIterator[Any]:
    """An SDK client of compactd in front of `base`: the tiny model, a budget no request reaches."""
    async with make_proxy(
        base, default_policy={"budget_tokens": 100000}, tokens=tiny_model(tmp_path)
    ) as url:
        client = sdk(url)
        try:
            yield client
        finally:
            await client.close()


async def refused_once(
    fake: Any, client: Any, msgs: list[dict[str, Any]], limit: int, theirs: Any
) -> tuple[httpx.Headers, httpx.Headers]:
    """Send `msgs` once, then again with the upstream refusing it once as longer than `limit`,
    stating `theirs(sent)` tokens: the two answers' headers."""
    first = await chat(client, msgs, model="tiny-1")
    sent = int(first["x-compactd-tokens-before"])
    fake.then(
        respond(
            400,
            overflow_error(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"messages resulted in {theirs(sent)} tokens."
            ),
        )
    )
    return first, await chat(client, msgs, model="tiny-1")


async def test_context_length_error_is_retried_once_compacted(
    upstream, make_proxy, tmp_path
) -> None:
    fake, base = upstream
    msgs = history(8)
    async with uncapped_client(make_proxy, base, tmp_path) as client:
        _, h = await refused_once(fake, client, msgs, 1100, lambda sent: sent)
        # The window is remembered: the next request is compacted before it is sent.
        h2 = await chat(
            client,
            [*msgs, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
            model="tiny-1",
        )
    assert len(fake.received) == 4
    assert h["x-compactd-retried"] == "context-length"
    assert h["x-compactd-action"] == "compacted"
    assert int(h["x-compactd-tokens-after"]) < 1100
    assert h2["x-compactd-action"] in ("compacted", "replayed")


async def test_a_retry_targets_the_stated_window_in_our_units(
    upstream, make_proxy, tmp_path
) -> None:
    # The upstream counts more than we do: its window (the table's) in our units is smaller,
    # so the request that fitted ours is compacted on the retry rather than the 400 relayed.
    fake, base = upstream
    msgs = history(24)
    async with uncapped_client(make_proxy, base, tmp_path) as client:
        first, h = await refused_once(fake, client, msgs, 4000, lambda sent: sent * 6 // 5)
    sent = int(first["x-compactd-tokens-before"])
    theirs = sent * 6 // 5
    assert first["x-compactd-action"] == "passthrough"
    assert 4000 * sent // theirs < sent
    assert h["x-compactd-retried"] == "context-length"
    assert int(h["x-compactd-tokens-after"]) < 4000 * sent // theirs


async def test_a_gzip_encoded_context_length_error_is_retried_too(
    upstream, make_proxy, tmp_path
) -> None:
    # The SDK accepts gzip, so an upstream's edge may well compress its 400: it must be read
    # decoded, and relayed as sent when it is not retried.
    fake, base = upstream
    msgs = history(8)
    overflow = {
        "error": {
            "message": "This model's maximum context length is 1100 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    packed = gzip.compress(json.dumps(overflow).encode())
    fake.then(respond(400, packed, headers=[(b"content-encoding", b"gzip")]))
    async with make_proxy(
        base, default_policy={"budget_tokens": 100000}, tokens=tiny_model(tmp_path)
    ) as url:
        client = sdk(url)
        h = await chat(client, msgs, model="tiny-1")
        await client.close()
    assert fake.received[0].header("accept-encoding") is not None
    assert len(fake.received) == 2
    assert h["x-compactd-retried"] == "context-length"
    assert h["x-compactd-action"] == "compacted"


async def test_upstream_key_mode_admits_listed_keys_only(
    upstream, make_proxy, tmp_path, caplog
) -> None:
    import logging

    from proxy.wire.tenant import key_fingerprint, load_or_create_secret

    caplog.set_level(logging.DEBUG)

    fake, base = upstream
    data = tmp_path / "data"
    secret = load_or_create_secret("s3cret", data)
    allowed = key_fingerprint(secret, "sk-team-a")
    async with make_proxy(
        base,
        server={"secret": "s3cret", "data_dir": str(data)},
        upstream={"api_key": "sk-REAL-UPSTREAM", "allowed_keys": [allowed]},
    ) as url:
        ok = sdk(url, "sk-team-a")
        h = await chat(ok, history(1))
        with pytest.raises(openai.AuthenticationError):
            await chat(sdk(url, "sk-intruder"), history(1))
        models = await ok.models.with_raw_response.list()
        await ok.close()
    assert h["x-compactd-action"] == "passthrough"
    assert all(r.header("authorization") == "Bearer sk-REAL-UPSTREAM" for r in fake.received)
    assert len(fake.received) == 2  # the intruder never reached the upstream
    assert "sk-REAL-UPSTREAM" not in str(dict(h))
    assert "sk-REAL-UPSTREAM" not in str(dict(models.headers))
    assert caplog.records  # the request lines were logged ...
    assert "sk-REAL-UPSTREAM" not in caplog.text  # ... without the real key
    assert "sk-team-a" not in caplog.text
    assert "sk-intruder" not in caplog.text


async def test_usage_is_read_from_json_and_sse_and_metrics_move(upstream, make_proxy) -> None:
    fake, base = upstream
    fake.then(respond(), stream(sse_chunks(["a", "b"], usage=True)))
    async with make_proxy(base) as url:
        client = sdk(url)
        await chat(client, history(1))
        async for _ in await client.chat.completions.create(
            model="gpt-4o", messages=history(1), stream=True, stream_options={"include_usage": True}
        ):
            pass
        await client.close()
        async with httpx.AsyncClient(headers=ALPHA) as http:
            metrics = (await http.get(f"{url}/metrics")).text
    assert (
        'compactd_requests_total{action="passthrough",api="chat.completions",model="gpt-4o",policy="default"} 2.0'
        in metrics
    )
    assert (
        'compactd_upstream_usage_tokens_total{api="chat.completions",kind="prompt",model="gpt-4o"} 21.0'
        in metrics
    )


# An upstream (or a buffering proxy before it) may send a whole stream with Content-Length: relayed
# with it, the stripped stream fell short of its length and the client got a cut response.
@pytest.mark.parametrize("whole", [False, True], ids=["streamed", "content-length"])
async def test_injected_stream_usage_is_read_and_stripped_byte_exactly(
    upstream, make_proxy, whole
) -> None:
    fake, base = upstream
    events = sse_chunks(["Hi", " there"], usage=True)
    # What the client would have received without the usage it never asked for.
    expected = b"".join(e for e in events if b'"usage"' not in e)
    sse = b"text/event-stream"
    fake.then(respond(body=b"".join(events), content_type=sse) if whole else stream(events))
    body = b'{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    async with make_proxy(base, accounting={"request_stream_usage": True}) as url:
        async with httpx.AsyncClient(headers=ALPHA) as http:
            r = await http.post(f"{url}/v1/chat/completions", content=body)
            metrics = (await http.get(f"{url}/metrics")).text
    assert fake.last.json()["stream_options"] == {"include_usage": True}
    assert fake.last.header("accept-encoding") == "identity"
    assert r.status_code == 200
    assert r.content == expected
    assert r.headers.get("content-length") in (None, str(len(expected)))
    assert (
        'compactd_upstream_usage_tokens_total{api="chat.completions",kind="completion",model="gpt-4o"} 2.0'
        in metrics
    )


async def test_compact_unstored_policy_forwards_compacted_and_says_so(
    upstream, make_proxy, tmp_path
) -> None:
    fake, base = upstream
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    body = json.dumps({"model": "gpt-4o", "messages": history(6)}).encode()
    store = {"url": redis.url, "timeout_ms": 300, "on_store_error": "compact-unstored"}
    try:
        async with make_proxy(base, store=store, **SMALL) as url:
            redis.stop(signal.SIGKILL)
            async with httpx.AsyncClient(headers=ALPHA) as http:
                r = await http.post(f"{url}/v1/chat/completions", content=body)
    finally:
        redis.stop(signal.SIGKILL)
    assert r.headers["x-compactd-action"] == "compacted"
    assert r.headers["x-compactd-store"] == "unstored"
    assert fake.last.body != body


async def test_stats_endpoint_adds_up_a_scripted_sequence(upstream, make_proxy) -> None:
    fake, base = upstream
    admin = {"authorization": "Bearer admin-key"}
    async with make_proxy(base, server={"admin_key": "admin-key"}, **SMALL) as url:
        client = sdk(url)
        await chat(client, history(1))  # passthrough
        await chat(client, history(6))  # compacted
        await client.close()
        async with httpx.AsyncClient(headers=ALPHA) as http:
            for _ in range(100):  # accounting is written off the request path
                stats = (await http.get(f"{url}/compactd/v1/stats?by=policy", headers=admin)).json()
                if stats["total"]["requests"] == 2:
                    break
                await asyncio.sleep(0.05)
            refused = await http.get(
                f"{url}/compactd/v1/stats", headers={"authorization": "Bearer sk-alpha"}
            )
            bad = await http.get(f"{url}/compactd/v1/stats?since=yesterday-ish", headers=admin)
    sent = [json.loads(r.body) for r in fake.received]
    total = stats["total"]
    assert total["requests"] == 2
    assert total["compactions"] == 1
    assert total["tokens_sent"] < total["tokens_without"]
    assert total["prompt_tokens"] == 24  # the fake upstream's usage: 12 per response
    assert [r["key"] for r in stats["rows"]] == ["default"]
    assert len(sent) == 2
    assert refused.status_code == 401
    assert bad.status_code == 400


async def test_context_length_retry_can_be_turned_off(upstream, make_proxy) -> None:
    fake, base = upstream
    overflow = {
        "error": {
            "message": "maximum context length is 500 tokens",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }
    fake.then(respond(400, overflow))
    async with make_proxy(base, upstream={"retry_context_errors": False}) as url:
        async with httpx.AsyncClient(headers=ALPHA) as http:
            r = await http.post(
                f"{url}/v1/chat/completions", json={"model": "gpt-4o", "messages": history(5)}
            )
    assert r.status_code == 400
    assert r.json() == overflow  # the upstream's own answer, untouched
    assert len(fake.received) == 1


async def test_concurrent_requests_of_one_conversation_agree_on_one_checkpoint(
    upstream, make_proxy
) -> None:
    fake, base = upstream
    body = json.dumps({"model": "gpt-4o", "messages": history(6)}).encode()
    async with make_proxy(base, **SMALL) as url:
        async with httpx.AsyncClient(headers=ALPHA) as http:
            first = await asyncio.gather(
                *(http.post(f"{url}/v1/chat/completions", content=body) for _ in range(4))
            )
            conv = first[0].headers["x-compactd-conversation"]
            info = (await http.get(f"{url}/compactd/v1/conversations/{conv}")).json()
    assert {r.headers["x-compactd-action"] for r in first} <= {"compacted", "replayed"}
    assert len({r.body for r in fake.received}) == 1  # every request forwarded the same bytes
    assert info["checkpoint_count"] == 1


async def test_context_length_retry_keeps_the_requests_policy_and_conversation(
    upstream, make_proxy, tmp_path
) -> None:
    fake, base = upstream
    overflow = {
        "error": {
            "message": "This model's maximum context length is 500 tokens.",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }
    fake.then(respond(400, overflow))
    team = {
        "name": "team",
        "match_header": "x-team",
        "match_header_values": ["blue"],
        "budget_tokens": 100000,
    }
    headers = {
        "x-team": "blue",
        "x-compactd-conversation-id": "my-conv",
        "authorization": "Bearer sk-alpha",
    }
    # The default policy is off: a retry that lost the header match would not compact.
    async with make_proxy(
        base, default_policy={"mode": "off"}, policies=[team], tokens=tiny_model(tmp_path)
    ) as url:
        async with httpx.AsyncClient(headers=ALPHA) as http:
            r = await http.post(
                f"{url}/v1/chat/completions",
                json={"model": "tiny-1", "messages": history(8)},
                headers=headers,
            )
            info = await http.get(
                f"{url}/compactd/v1/conversations/my-conv",
                headers={"authorization": "Bearer sk-alpha"},
            )
    assert r.status_code == 200
    assert r.headers["x-compactd-retried"] == "context-length"
    assert r.headers["x-compactd-action"] == "compacted"
    assert r.headers["x-compactd-policy"] == "team"
    assert r.headers["x-compactd-conversation"] == "my-conv"
    assert info.status_code == 200
    assert info.json()["checkpoint_count"] == 1
