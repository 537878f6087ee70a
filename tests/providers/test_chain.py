from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable
from typing import Any

import pytest

from proxy.errors import ChainTimeoutError
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
    compute_source_digest,
)
from proxy.providers.chain import LONG_HISTORY, run_chain
from proxy.providers.middle_out import MiddleOutProvider
from proxy.providers.none import NoneProvider
from proxy.providers.trim import TrimProvider
from proxy.providers.uncompress import uncompress
from tests.providers.build import agent_run, assistant, system, user, words
from tests.providers.tokens import count_tokens, make_config


class Recording(ContextProvider):
    """Wraps another provider and records the inputs it was given."""

    def __init__(self, inner: ContextProvider, name: str = "") -> None:
        self.inner = inner
        self._name = name or inner.name
        self.seen: list[list[Message]] = []

    @property
    def name(self) -> str:
        return self._name

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        self.seen.append(messages)
        out = self.inner.compress(messages, config)
        assert isinstance(out, CompactionResult)
        return out


class Raising(ContextProvider):
    name = "raising"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        raise RuntimeError("model unavailable")


class Vandal(ContextProvider):
    """Rewrites the system prompt: the validator must throw this result away."""

    name = "vandal"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        out = [{"role": "system", "content": "x"}, *messages[1:]]
        return CompactionResult(messages=out, source_digest="", covered_through=0)


class InPlace(ContextProvider):
    """Rewrites the system prompt in the list it was given, then trims that list."""

    name = "in-place"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        messages[0]["content"] = "x"
        return TrimProvider().compress(messages, config)


class Garbage(ContextProvider):
    """Returns something that is not a list of message dicts."""

    name = "garbage"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        return CompactionResult(messages=["not a message"], source_digest="")  # type: ignore[list-item]


class AsyncTrim(ContextProvider):
    name = "async-trim"

    async def compress(
        self, messages: list[Message], config: CompressionConfig
    ) -> CompactionResult:
        await asyncio.sleep(0)
        return TrimProvider().compress(messages, config)


def half(messages: list[Message], **kw: Any) -> CompressionConfig:
    total = count_tokens(messages)
    return make_config(limit=total // 2, budget=total * 3 // 4, **kw)


async def test_a_provider_that_reaches_the_target_ends_the_chain() -> None:
    msgs = agent_run(12)
    second = Recording(MiddleOutProvider())
    outcome = await run_chain(msgs, [TrimProvider(), second], half(msgs))
    assert outcome.providers == ("trim",)
    assert outcome.reached_target
    assert outcome.fits_budget
    assert second.seen == []


async def test_the_next_provider_starts_from_the_previous_output_and_verbatims_merge() -> None:
    msgs = agent_run(12)
    # A first step that leaves work for the next provider (large previews keep it over target).
    weak = make_config(limit=count_tokens(msgs) // 3, extra_config={"preview_chars": 1500})
    first = Recording(NoneProvider(), "noop")
    trimmed = TrimProvider().compress(msgs, weak)
    second = Recording(MiddleOutProvider())

    class Fixed(ContextProvider):
        name = "fixed"

        def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
            return trimmed

    config = make_config(limit=count_tokens(trimmed.messages) - 200)
    outcome = await run_chain(msgs, [first, Fixed(), second], config)
    assert outcome.providers == ("fixed", "middle-out")
    assert second.seen == [trimmed.messages]
    assert outcome.result is not None
    assert set(trimmed.verbatim) <= set(outcome.result.verbatim)
    restored = uncompress(outcome.result.messages, outcome.result.verbatim, recursive=True)
    assert restored.messages == msgs


class Stubborn(ContextProvider):
    """Ignores being cancelled and waits on until released (a badly behaved plugin)."""

    name = "stubborn"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancellations = 0

    async def compress(
        self, messages: list[Message], config: CompressionConfig
    ) -> CompactionResult:
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancellations += 1
        return CompactionResult(messages=messages[1:], source_digest="", covered_through=0)


class Blocking(ContextProvider):
    """A sync provider that blocks its thread until released, then returns a valid result."""

    name = "blocking"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        self.release.wait()
        out = TrimProvider().compress(messages, config)
        self.returned.set()
        return out


async def inline(fn: Callable[..., Any], *args: Any) -> Any:
    """run_sync without a thread: the chain reaches its provider before anything can time out."""
    return fn(*args)


class CompressInThread:
    """run_sync that runs the provider's compress in a thread of its own (which, unlike an
    executor's queued job, cannot be cancelled before it starts) and the rest inline, so the
    provider surely runs, and returns late."""

    def __init__(self, provider: ContextProvider) -> None:
        self.provider = provider
        self.threads: list[threading.Thread] = []

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if fn != self.provider.compress:
            return fn(*args)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def work() -> None:
            out = fn(*args)
            loop.call_soon_threadsafe(lambda: done.cancelled() or done.set_result(out))

        self.threads.append(threading.Thread(target=work, daemon=True))
        self.threads[-1].start()
        return await done


async def test_a_chain_past_its_deadline_is_left_even_when_its_provider_ignores_cancellation() -> (
    None
):
    msgs = agent_run(8)
    stubborn = Stubborn()
    with pytest.raises(ChainTimeoutError) as raised:
        await run_chain(msgs, [stubborn], half(msgs), run_sync=inline, deadline=0.001)
    assert raised.value.provider == "stubborn"
    await asyncio.sleep(0)  # the abandoned chain receives its cancellation
    assert stubborn.cancellations == 1  # asked to stop, and not waited for
    stubborn.release.set()
    for _ in range(3):
        await asyncio.sleep(0)  # it finishes; its result goes nowhere


async def test_a_sync_providers_late_result_is_dropped_without_an_error() -> None:
    msgs = agent_run(8)
    blocking = Blocking()
    run_sync = CompressInThread(blocking)
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        with pytest.raises(ChainTimeoutError):
            await run_chain(msgs, [blocking], half(msgs), run_sync=run_sync, deadline=0.001)
        blocking.release.set()
        for thread in run_sync.threads:
            await asyncio.to_thread(thread.join)
        for _ in range(3):
            await asyncio.sleep(0)  # the late result reaches the loop and is dropped
    finally:
        loop.set_exception_handler(None)
    assert blocking.returned.is_set()
    assert unhandled == []


async def test_a_raising_provider_is_recorded_and_skipped() -> None:
    msgs = agent_run(8)
    trim = Recording(TrimProvider())
    outcome = await run_chain(msgs, [Raising(), trim], half(msgs))
    assert outcome.errors == ("raising: RuntimeError: model unavailable",)
    assert trim.seen == [msgs]
    assert outcome.providers == ("trim",)


async def test_a_result_that_breaks_an_invariant_is_discarded_with_the_provider_named() -> None:
    msgs = agent_run(8)
    trim = Recording(TrimProvider())
    outcome = await run_chain(msgs, [Vandal(), trim], half(msgs))
    assert outcome.violations
    assert all(v.startswith("vandal: ") for v in outcome.violations)
    assert trim.seen == [msgs]
    assert outcome.result is not None
    assert outcome.result.messages[0] == msgs[0]


async def test_a_provider_editing_its_input_in_place_changes_nothing_it_was_not_given() -> None:
    # The validator compares a result with the input: an input the provider rewrote itself
    # would let the rewrite through, and the request's own messages are the originals stored.
    msgs = agent_run(8)
    before = copy.deepcopy(msgs)
    outcome = await run_chain(msgs, [InPlace(), Recording(TrimProvider())], half(msgs))
    assert msgs == before
    assert [f.provider for f in outcome.failures] == ["in-place"]
    assert outcome.result is not None
    assert outcome.result.messages[0] == before[0]


async def test_malformed_output_is_a_violation_not_a_crash() -> None:
    msgs = agent_run(4)
    outcome = await run_chain(msgs, [Garbage()], half(msgs))
    assert outcome.result is None
    assert outcome.violations
    assert outcome.violations[0].startswith("garbage: ")


async def test_nothing_valid_changed_means_no_result() -> None:
    msgs = agent_run(8)
    outcome = await run_chain(msgs, [Vandal(), NoneProvider()], half(msgs))
    assert outcome.result is None
    assert outcome.providers == ()
    assert outcome.tokens_after == outcome.tokens_before
    assert not outcome.reached_target


async def test_under_target_runs_no_provider() -> None:
    msgs = [system(), user("hi")]
    trim = Recording(TrimProvider())
    outcome = await run_chain(msgs, [trim], make_config(limit=10_000))
    assert trim.seen == []
    assert outcome.result is None
    assert outcome.reached_target


async def test_async_providers_are_awaited_and_sync_work_goes_through_run_sync() -> None:
    msgs = agent_run(8)
    calls: list[Callable[..., Any]] = []

    async def run_sync(fn: Callable[..., Any], *args: Any) -> Any:
        calls.append(fn)
        return fn(*args)

    outcome = await run_chain(msgs, [AsyncTrim()], half(msgs), run_sync=run_sync)
    assert outcome.providers == ("async-trim",)
    assert "compress" not in [getattr(fn, "__name__", "") for fn in calls]
    calls.clear()
    await run_chain(msgs, [TrimProvider()], half(msgs), run_sync=run_sync)
    assert [getattr(fn, "__name__", "") for fn in calls].count("compress") == 1


@pytest.mark.parametrize(("size", "counted_through_run_sync"), [(8, False), (LONG_HISTORY, True)])
async def test_a_long_history_is_counted_through_run_sync(
    size: int, counted_through_run_sync: bool
) -> None:
    # Counting costs per message, cached or not: a long history's counts leave the event loop.
    msgs = [system(), *([user("q"), assistant(words(20))] * (size // 2))]
    calls: list[Any] = []

    async def run_sync(fn: Callable[..., Any], *args: Any) -> Any:
        calls.append(fn)
        return fn(*args)

    config = half(msgs)
    await run_chain(msgs, [TrimProvider()], config, run_sync=run_sync)
    assert (config.count_tokens in calls) is counted_through_run_sync
    # should_compress runs with the provider's copy of its input, off the loop, at any length.
    assert [getattr(fn, "__name__", "") for fn in calls].count("_prepare") == 1


async def test_covered_through_and_digest_refer_to_the_original_input() -> None:
    msgs = [
        system(),
        user(words(800)),
        assistant(words(800)),
        user("q2"),
        assistant("a2"),
        user("q3"),
    ]
    outcome = await run_chain(msgs, [TrimProvider()], make_config(limit=400, recency_turns=2))
    assert outcome.result is not None
    assert outcome.result.source_digest == compute_source_digest(msgs)
    assert outcome.result.covered_through == 2
    assert outcome.result.messages[-3:] == msgs[-3:]


async def test_over_budget_after_every_provider_is_reported_not_hidden() -> None:
    msgs = [system(words(500)), user(words(500))]
    outcome = await run_chain(msgs, [TrimProvider()], make_config(limit=100, budget=200))
    assert not outcome.fits_budget
    assert not outcome.reached_target
    assert outcome.tokens_after == count_tokens(msgs)
