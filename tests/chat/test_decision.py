"""The chat decision in-process, one test per action: what is sent upstream, and what is said."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.chat import bodycache
from proxy.chat import planner as planner_module
from proxy.chat import request as request_module
from proxy.chat.request import MAX_MESSAGES, Outcome
from proxy.errors import CompactionError
from proxy.providers.base import CompactionResult, CompressionConfig, ContextProvider, Message
from proxy.providers.chain import LONG_HISTORY
from proxy.providers.registry import ProviderRegistry
from tests.dialects.harness import harness
from tests.inprocess import MockUpstream, context_length_error, reply, running
from tests.tiny_model import tiny_model

SMALL = {"default_policy": {"budget_tokens": 600}}


def history(turns: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are a careful assistant."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Turn {t}: src/mod{t}.py " + "lorem ipsum " * 40})
        msgs.append({"role": "assistant", "content": f"Answer {t}: " + "noted and fine " * 25})
    msgs.append({"role": "user", "content": "What did we decide about src/mod0.py?"})
    return msgs


def body(messages: list[Message], **extra: Any) -> bytes:
    # Spaces and key order of our own choosing: anything not rewritten must arrive as it is.
    return json.dumps({"messages": messages, "model": "gpt-4o", **extra}, indent=1).encode()


class Boom(ContextProvider):
    """A provider that always raises."""

    name = "boom"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        raise RuntimeError("the model is down")


class Vandal(ContextProvider):
    """A provider whose result drops the last user message (an invariant it must keep)."""

    name = "vandal"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        return CompactionResult(messages=messages[:-1], source_digest="x", covered_through=0)


@dataclass
class Gate:
    """What a hanging provider waits on (set by the test)."""

    release: threading.Event = field(default_factory=threading.Event)


def hanging(gate: Gate) -> type[ContextProvider]:
    """A sync provider that blocks its thread until `gate.release`, then compacts validly."""

    class Hang(ContextProvider):
        name = "hang"

        def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
            gate.release.wait()
            kept = [messages[0], *messages[3:]]  # the oldest turn dropped
            return CompactionResult(messages=kept, source_digest="x", covered_through=2)

    return Hang


def hanging_async(gate: Gate) -> type[ContextProvider]:
    """An async provider that waits (without blocking the loop) until `gate.release`."""

    class AsyncHang(ContextProvider):
        name = "async-hang"

        async def compress(
            self, messages: list[Message], config: CompressionConfig
        ) -> CompactionResult:
            await asyncio.to_thread(gate.release.wait)
            return CompactionResult(messages=messages[1:], source_digest="x", covered_through=0)

    return AsyncHang


def registry(*extra: type[ContextProvider]) -> ProviderRegistry:
    found = ProviderRegistry()
    found.register("boom", Boom)
    found.register("vandal", Vandal)
    for cls in extra:
        found.register(str(cls.name), cls)
    return found


async def test_a_request_under_its_trigger_is_forwarded_byte_for_byte(tmp_path: Path) -> None:
    raw = body(history(1))
    async with running(tmp_path) as proxy:
        r = await proxy.chat(raw)
    assert r.headers["x-compactd-action"] == "passthrough"
    assert proxy.upstream.last.content == raw
    assert int(r.headers["x-compactd-tokens-before"]) == int(r.headers["x-compactd-tokens-after"])


async def test_an_unparseable_body_is_the_upstreams_to_answer(tmp_path: Path) -> None:
    async with running(tmp_path) as proxy:
        r = await proxy.chat(b'{"model": "gpt-4o", "messages": [')
    assert r.headers["x-compactd-action"] == "passthrough"
    assert proxy.upstream.last.content == b'{"model": "gpt-4o", "messages": ['


# orjson parses 1,024 levels but serializes 254, and the canonical form recurses: a deeper value
# in the conversation's root made digesting it raise before any decision, a plain-text 500.
@pytest.mark.parametrize("depth", [300, 800])
async def test_a_message_too_deep_to_digest_is_the_upstreams_to_answer(
    tmp_path: Path, depth: int
) -> None:
    msgs = history(6)
    msgs[1]["deep"] = json.loads("[" * depth + "]" * depth)
    raw = body(msgs)
    async with running(tmp_path, **SMALL) as proxy:
        r = await proxy.chat(raw)
    assert r.status_code == 200
    assert r.headers["x-compactd-action"] == "passthrough"
    assert proxy.upstream.last.content == raw


class Spy(ContextProvider):
    """A provider that records every call (and changes nothing)."""

    name = "spy"
    calls = 0

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        Spy.calls += 1
        return CompactionResult(messages=messages, source_digest="x", covered_through=0)


# A body of ~900k tiny messages (32 MB) held the event loop for seconds and compacted for ~17 s
# before failing open on a store timeout; past the limit nothing per message is done at all.
async def test_a_request_with_too_many_messages_fails_open_before_any_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    msgs: list[Message] = [{"role": "assistant", "content": "x"}] * (MAX_MESSAGES + 1)
    raw = body(msgs)
    found = registry()
    found.register("spy", Spy)
    caplog.set_level(logging.WARNING, logger="compactd")
    policy = {"budget_tokens": 600, "providers": ["spy"]}
    async with running(tmp_path, registry=found, default_policy=policy) as proxy:
        r = await proxy.chat(raw)
        fail_open = proxy.metric("compactd_fail_open_total", reason="too_many_messages")
    assert r.headers["x-compactd-action"] == "error"
    assert r.headers["x-compactd-error"] == "too_many_messages"
    assert "x-compactd-tokens-before" not in r.headers  # not even counted
    assert "x-compactd-conversation" not in r.headers  # nor digested
    assert proxy.upstream.last.content == raw
    assert (fail_open, Spy.calls) == (1, 0)
    assert any(getattr(rec, "reason", "") == "too_many_messages" for rec in caplog.records)


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_too_many_items_fail_open_on_every_api_before_they_are_projected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    module = importlib.import_module(f"proxy.dialects.{api}")
    projected: list[Any] = []
    real = module._project
    monkeypatch.setattr(module, "_project", lambda *a: projected.append(a) or real(*a))
    one: Message = {"type": "message", "role": "user", "content": "x"}
    field = "input" if api == "responses" else "messages"
    if api == "messages":
        del one["type"]
    request = {"model": "gpt-4o", "max_tokens": 16, field: [one] * (MAX_MESSAGES + 1)}
    async with harness(tmp_path) as h:
        r = await (h.create if api == "responses" else h.message)(request)
        fail_open = h.metric("compactd_fail_open_total", reason="too_many_messages")
        fake = h.responses if api == "responses" else h.messages
        received = fake.last.json()[field]
    assert r.headers["x-compactd-action"] == "error"
    assert r.headers["x-compactd-error"] == "too_many_messages"
    assert len(received) == MAX_MESSAGES + 1
    assert (fail_open, projected) == (1, [])


@pytest.mark.parametrize(("turns", "where"), [(40, "loop"), (LONG_HISTORY + 1, "thread")])
async def test_a_long_history_is_digested_and_recorded_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turns: int, where: str
) -> None:
    # Digests cost per message: at 50,000 they held the event loop ~150 ms at a time.
    loop = threading.current_thread()
    seen: dict[str, set[str]] = {"root": set(), "messages": set(), "record": set()}

    def spied(name: str, real: Any) -> Any:
        def work(*args: Any, **kw: Any) -> Any:
            seen[name].add("loop" if threading.current_thread() is loop else "thread")
            return real(*args, **kw)

        return work

    monkeypatch.setattr(
        request_module, "conversation_id", spied("root", request_module.conversation_id)
    )
    monkeypatch.setattr(bodycache, "message_digest", spied("messages", bodycache.message_digest))
    monkeypatch.setattr(
        planner_module, "compaction_for", spied("record", planner_module.compaction_for)
    )
    # No user message: the conversation's root is the whole history.
    msgs: list[Message] = [{"role": "assistant", "content": f"step {i} " * 9} for i in range(turns)]
    async with running(tmp_path, **SMALL) as proxy:
        r = await proxy.chat(body(msgs))
    assert r.headers["x-compactd-action"] == "compacted"
    assert seen == {"root": {where}, "messages": {where}, "record": {where}}


@pytest.mark.parametrize(("turns", "where"), [(20, "loop"), (LONG_HISTORY // 2 + 1, "thread")])
async def test_a_long_messages_history_is_projected_and_goes_back_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turns: int, where: str
) -> None:
    loop = threading.current_thread()
    seen: dict[str, set[str]] = {"_project": set(), "emit_all": set()}
    module = importlib.import_module("proxy.dialects.messages")

    def spied(name: str, real: Any) -> Any:
        def work(*args: Any) -> Any:
            seen[name].add("loop" if threading.current_thread() is loop else "thread")
            return real(*args)

        return work

    for name in seen:
        monkeypatch.setattr(module, name, spied(name, getattr(module, name)))
    history = [
        {"role": role, "content": f"turn {t} " + "lorem ipsum " * 12}
        for t in range(turns)
        for role in ("user", "assistant")
    ]
    request = {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [*history[:-1]]}
    async with harness(tmp_path, default_policy={"budget_tokens": 600}) as h:
        r = await h.message(request)
    assert r.headers["x-compactd-action"] == "compacted"
    assert seen == {"_project": {where}, "emit_all": {where}}


async def test_over_budget_is_compacted_and_restores_exactly(tmp_path: Path) -> None:
    original = history(6)
    async with running(tmp_path, **SMALL) as proxy:
        r = await proxy.chat(body(original))
        sent = proxy.upstream.last_json()["messages"]
        restored = await proxy.uncompress(sent)
    assert r.headers["x-compactd-action"] == "compacted"
    assert int(r.headers["x-compactd-tokens-after"]) <= 600
    assert r.headers["x-compactd-provider"] == "engine"
    assert restored.json()["messages"] == original
    assert restored.json()["missing_ids"] == []


async def test_the_next_turn_replays_the_stored_prefix(tmp_path: Path) -> None:
    msgs = history(6)
    async with running(tmp_path, **SMALL) as proxy:
        await proxy.chat(body(msgs))
        first = proxy.upstream.last_json()["messages"]
        turn = [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
        r = await proxy.chat(body(turn))
        second = proxy.upstream.last_json()["messages"]
    assert r.headers["x-compactd-action"] == "replayed"
    assert second[: len(first) - 1] == first[:-1]
    assert second[-3:] == turn[-3:]


async def test_bypass_sends_the_clients_bytes(tmp_path: Path) -> None:
    raw = body(history(6))
    async with running(tmp_path, **SMALL) as proxy:
        r = await proxy.chat(raw, x_compactd_bypass="1")
    assert r.headers["x-compactd-action"] == "bypass"
    assert proxy.upstream.last.content == raw


async def test_shadow_sends_the_clients_bytes_and_says_what_it_would_do(tmp_path: Path) -> None:
    raw = body(history(6))
    async with running(tmp_path, default_policy={"budget_tokens": 600, "mode": "shadow"}) as proxy:
        r = await proxy.chat(raw)
    assert proxy.upstream.last.content == raw
    assert r.headers["x-compactd-action"] == "shadow"
    assert r.headers["x-compactd-shadow-action"] == "compacted"
    assert int(r.headers["x-compactd-tokens-after"]) < int(r.headers["x-compactd-tokens-before"])


@pytest.mark.parametrize(("provider", "metric"), [("boom", "provider_errors"), ("vandal", "")])
async def test_a_failing_provider_forwards_the_original_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, provider: str, metric: str
) -> None:
    raw = body(history(6))
    policy = {"budget_tokens": 600, "providers": [provider]}
    caplog.set_level(logging.WARNING, logger="compactd")
    async with running(tmp_path, registry=registry(), default_policy=policy) as proxy:
        r = await proxy.chat(raw)
        fail_open = proxy.metric("compactd_fail_open_total", reason="provider")
        failed = proxy.metric(
            f"compactd_{metric or 'invariant_violations'}_total", provider=provider
        )
    assert r.headers["x-compactd-action"] == "error"
    assert provider in r.headers["x-compactd-error"]
    assert proxy.upstream.last.content == raw
    assert (fail_open, failed) == (1, 1)
    lines = [rec for rec in caplog.records if getattr(rec, "provider", None) == provider]
    assert lines
    assert lines[0].levelno == logging.WARNING


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_provider_past_the_deadline_forwards_the_original_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    gate = Gate()
    provider = hanging(gate) if kind == "sync" else hanging_async(gate)
    raw = body(history(6))
    # The provider blocks until released, so any deadline passes first: 1 ms keeps the test fast.
    policy = {"budget_tokens": 600, "providers": [provider.name], "compaction_timeout_ms": 1}
    caplog.set_level(logging.WARNING, logger="compactd")
    async with running(tmp_path, registry=registry(provider), default_policy=policy) as proxy:
        try:
            r = await proxy.chat(raw)
        finally:
            gate.release.set()  # a sync provider's thread cannot be killed: it finishes late
        stored = await proxy.services.store.list_conversations(None)
        fail_open = proxy.metric("compactd_fail_open_total", reason="timeout")
    assert (r.headers["x-compactd-action"], r.headers["x-compactd-error"]) == ("error", "timeout")
    assert [req.content for req in proxy.upstream.received] == [raw]
    assert fail_open == 1
    assert stored == []
    named = [rec for rec in caplog.records if getattr(rec, "provider", None) == provider.name]
    assert [getattr(rec, "failure", None) for rec in named] == ["timeout"]
    assert any(getattr(rec, "reason", None) == "timeout" for rec in caplog.records)


async def test_hung_sync_providers_leave_long_requests_the_threads_they_are_counted_on(
    tmp_path: Path,
) -> None:
    gate = Gate()
    provider = hanging(gate)
    policy = {"budget_tokens": 600, "providers": [provider.name], "compaction_timeout_ms": 1}
    # More hung compactions than the default executor has threads (min(32, cpus + 4)): a sync
    # provider's thread cannot be killed, so on that executor they used up every thread.
    default_threads = min(32, (os.cpu_count() or 1) + 4)
    # A body long enough that its root, digests and count are taken in a thread.
    long = [{"role": "user", "content": f"note {i}"} for i in range(LONG_HISTORY + 1)]
    async with running(tmp_path, registry=registry(provider), default_policy=policy) as proxy:
        try:
            for i in range(default_threads + 2):
                r = await proxy.chat(body(history(6), user=f"u{i}"))
                assert r.headers["x-compactd-error"] == "timeout"
            answered = await asyncio.wait_for(proxy.chat(body(long)), 30)
        finally:
            gate.release.set()
    assert answered.status_code == 200
    assert answered.headers["x-compactd-error"] == "timeout"  # it waited for a provider thread
    assert proxy.upstream.last.content == body(long)


async def test_a_result_that_cannot_be_recorded_fails_open_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A valid result that cannot stand as a checkpoint is not forwarded either (a defensive
    # check behind the validator; reached here by a stand-in).
    def unrecordable(**kw: Any) -> Any:
        raise CompactionError("the chain's result does not align with its input")

    monkeypatch.setattr(planner_module, "compaction_for", unrecordable)
    raw = body(history(6))
    caplog.set_level(logging.WARNING, logger="compactd")
    async with running(tmp_path, **SMALL) as proxy:
        r = await proxy.chat(raw)
        violations = proxy.metric("compactd_invariant_violations_total", provider="engine")
        fail_open = proxy.metric("compactd_fail_open_total", reason="provider")
    assert r.headers["x-compactd-action"] == "error"
    assert "engine" in r.headers["x-compactd-error"]
    assert proxy.upstream.last.content == raw
    assert (violations, fail_open) == (1, 1)
    assert any(getattr(rec, "provider", None) == "engine" for rec in caplog.records)


async def test_a_later_provider_reaching_the_target_makes_good_a_failure(tmp_path: Path) -> None:
    policy = {"budget_tokens": 600, "providers": ["boom", "trim"]}
    async with running(tmp_path, registry=registry(), default_policy=policy) as proxy:
        r = await proxy.chat(body(history(6)))
        errors = proxy.metric("compactd_provider_errors_total", provider="boom")
        fail_open = proxy.metric("compactd_fail_open_total", reason="provider")
    assert r.headers["x-compactd-action"] == "compacted"
    assert r.headers["x-compactd-provider"] == "trim"
    assert "x-compactd-error" not in r.headers
    assert (errors, fail_open) == (1, 0)


async def test_a_context_length_error_is_retried_with_the_learned_window(tmp_path: Path) -> None:
    upstream = MockUpstream().then(context_length_error(1100))
    raw = body(history(8), model="tiny-1")
    policy = {"budget_tokens": 100000}
    async with running(
        tmp_path, upstream, default_policy=policy, tokens=tiny_model(tmp_path)
    ) as proxy:
        r = await proxy.chat(raw)
    first, retried = proxy.upstream.received
    assert first.content == raw
    assert r.status_code == 200
    assert r.headers["x-compactd-retried"] == "context-length"
    assert r.headers["x-compactd-action"] == "compacted"
    assert 0 < int(r.headers["x-compactd-tokens-after"]) < 1100
    assert json.loads(retried.content)["messages"][-1] == history(8)[-1]


async def test_shadow_relays_a_context_length_error_as_it_is(tmp_path: Path) -> None:
    upstream = MockUpstream().then(context_length_error(500))
    raw = body(history(5))
    policy = {"budget_tokens": 100000, "mode": "shadow"}
    async with running(tmp_path, upstream, default_policy=policy) as proxy:
        r = await proxy.chat(raw)
    # Regression: the retry used to send a 0-byte body in shadow mode.
    assert [req.content for req in proxy.upstream.received] == [raw]
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.headers["x-compactd-policy"] == "default"
    assert "x-compactd-retried" not in r.headers


async def test_shadow_learns_a_window_from_the_length_of_what_it_sent(tmp_path: Path) -> None:
    # Shadow forwards the client's bytes: the upstream's figure is for those, not for the
    # compacted form shadow reports in x-compactd-tokens-after.
    raw = body(history(8), model="tiny-1")
    policy = {"budget_tokens": 600, "mode": "shadow"}
    upstream = MockUpstream()
    async with running(
        tmp_path, upstream, default_policy=policy, tokens=tiny_model(tmp_path)
    ) as proxy:
        first = await proxy.chat(raw)
        sent = int(first.headers["x-compactd-tokens-before"])
        assert int(first.headers["x-compactd-tokens-after"]) < sent * 0.75
        message = (
            f"This model's maximum context length is {sent - 200} tokens. However, your "
            f"messages resulted in {sent} tokens."
        )
        error = {"message": message, "type": "invalid_request_error"}
        upstream.then(reply(400, {"error": {**error, "code": "context_length_exceeded"}}))
        r = await proxy.chat(raw)
        learned = proxy.services.compactor.windows
    assert r.status_code == 400
    assert [req.content for req in upstream.received] == [raw, raw]
    assert learned is not None
    assert learned.get("tiny-1") == sent - 200


async def test_bypass_relays_a_context_length_error_as_it_is(tmp_path: Path) -> None:
    upstream = MockUpstream().then(context_length_error(500))
    raw = body(history(5))
    async with running(tmp_path, upstream) as proxy:
        r = await proxy.chat(raw, x_compactd_bypass="1")
    assert [req.content for req in proxy.upstream.received] == [raw]
    assert r.status_code == 400


async def test_the_usage_splice_is_the_decisions_and_skips_bypass(tmp_path: Path) -> None:
    raw = body(history(1), stream=True)
    accounting = {"request_stream_usage": True}
    async with running(tmp_path, accounting=accounting) as proxy:
        proxy.upstream.default = reply()
        await proxy.chat(raw)
        spliced = proxy.upstream.last
        await proxy.chat(raw, x_compactd_bypass="1")
        bypassed = proxy.upstream.last
    assert spliced.content == raw.replace(b"{", b'{"stream_options":{"include_usage":true},', 1)
    assert spliced.headers["accept-encoding"] == "identity"
    assert bypassed.content == raw


async def test_decide_is_a_pure_function_of_the_request_value(tmp_path: Path) -> None:
    """The decision itself, without the handler: the same request value, the same outcome."""
    raw = body(history(6))
    headers = [(b"authorization", b"Bearer sk-alpha")]
    async with running(tmp_path, **SMALL) as proxy:
        compactor = proxy.services.compactor
        request = await compactor.read(raw, headers)
        first = await compactor.decide(request)
        again = await compactor.decide(request)
        forced = await compactor.decide(request, window=2000)
    assert isinstance(first, Outcome)
    assert first.action == "compacted"
    assert again.action == "replayed"
    assert again.content == first.content
    assert request.raw == raw  # the request value is never changed by a decision
    assert forced.tokens_after is not None
    assert forced.tokens_after <= 2000


def test_a_dot_segment_conversation_id_is_hashed_as_ids_no_path_can_name_are() -> None:
    # "." and ".." are URL dot-segments: /compactd/v1/conversations/.. never reaches such an id,
    # so the API and the dashboard could not find the conversation again.
    for header in (".", "..", " .. "):
        conversation = request_module.conversation_of(header, [], b"")
        assert conversation.startswith("h-"), header
    assert request_module.conversation_of("...", [], b"") == "..."
    assert request_module.conversation_of("my.conv", [], b"") == "my.conv"
