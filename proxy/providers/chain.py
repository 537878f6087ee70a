"""Runs a policy's provider chain: each provider only if the previous one missed the target.

Every provider's output is validated against that provider's input; a result that breaks an
invariant, or a provider that raises, is discarded and the next provider starts from the last good
messages. The chain's result is expressed against the ORIGINAL input, so the caller can store it
as one checkpoint.

With a `deadline`, a chain still running past it raises `ChainTimeoutError` and is abandoned: async
providers are cancelled; a sync provider's thread cannot be stopped, so it runs on and whatever
it returns goes to a task nobody awaits (never used, never stored).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.errors import ChainTimeoutError
from proxy.providers import canonical
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
)
from proxy.providers.units import common_suffix
from proxy.providers.validate import check_result

log = logging.getLogger(__name__)

LONG_HISTORY = 1000
"""More messages than this are also counted through `run_sync`: a count costs per message even
when every message's count is cached (~40 ms of the event loop's time at 50,000)."""

RunSync = Callable[..., Awaitable[Any]]
Check = Callable[[Sequence[Message], CompactionResult], list[str]]
"""Extra invariants a result must keep (an API adapter's), on top of `check_result`."""
Repair = Callable[[Sequence[Message], CompactionResult], CompactionResult]
"""Puts back what a result must not change (an API adapter's), before it is validated."""


@dataclass(frozen=True)
class ProviderFailure:
    """One provider whose work was thrown away."""

    provider: str
    kind: Literal["raised", "invalid"]
    detail: str
    """The exception (`TypeError: …`) or the first broken invariant."""

    def describe(self) -> str:
        """A short sentence for a header or a log line (no message contents)."""
        verb = "raised" if self.kind == "raised" else "returned an invalid result:"
        return f"provider {self.provider} {verb} {self.detail}"[:200]


@dataclass(frozen=True)
class ChainOutcome:
    """What a chain run produced and why."""

    result: CompactionResult | None
    """The compacted request against the original input; None when nothing valid changed."""
    providers: tuple[str, ...]
    """Providers whose (valid) output contributed, in order."""
    tokens_before: int
    tokens_after: int
    reached_target: bool
    fits_budget: bool
    violations: tuple[str, ...] = ()
    """`provider: problem` for every discarded result."""
    errors: tuple[str, ...] = ()
    """`provider: ExceptionType: message` for every provider that raised."""
    failures: tuple[ProviderFailure, ...] = ()
    """Every provider that raised or whose result was discarded, in order."""


@dataclass
class _Progress:
    provider: str = ""


async def run_chain(
    messages: list[Message],
    providers: Sequence[ContextProvider],
    config: CompressionConfig,
    *,
    run_sync: RunSync = asyncio.to_thread,
    run_provider: RunSync | None = None,
    check: Check | None = None,
    repair: Repair | None = None,
    deadline: float | None = None,
) -> ChainOutcome:
    """Run `providers` in order on `messages` until the request costs at most `config.limit`;
    a result that breaks `check_result` (or `check`, if given, after `repair`) is discarded.
    `deadline`: seconds after which it raises `ChainTimeoutError` without waiting for the chain.
    Sync provider code runs through `run_provider` (default `run_sync`), the chain's own
    per-message work through `run_sync`."""
    progress = _Progress()
    work = _run(
        messages,
        providers,
        config,
        run_sync=run_sync,
        run_provider=run_provider or run_sync,
        check=check,
        repair=repair,
        progress=progress,
    )
    if deadline is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        # Not asyncio.timeout: it waits for the cancelled work to finish, and a provider that
        # swallows the cancellation would hang the request again.
        done, _ = await asyncio.wait((task,), timeout=deadline)
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(_abandoned)
    if not done:
        raise ChainTimeoutError(progress.provider, deadline)
    return task.result()


def _abandoned(task: asyncio.Future[ChainOutcome]) -> None:
    """A chain past its deadline ended after all: its outcome is nobody's (retrieved so asyncio
    does not log it as unhandled)."""
    if not task.cancelled():
        task.exception()


async def _run(
    messages: list[Message],
    providers: Sequence[ContextProvider],
    config: CompressionConfig,
    *,
    run_sync: RunSync,
    run_provider: RunSync,
    check: Check | None,
    repair: Repair | None,
    progress: _Progress,
) -> ChainOutcome:
    long = len(messages) > LONG_HISTORY

    async def sync(fn: Callable[..., Any], *args: Any) -> Any:
        """Per-message work: through `run_sync` for a long history, here for a short one."""
        return await run_sync(fn, *args) if long else fn(*args)

    tokens_before: int = await sync(config.count_tokens, messages)
    current, tokens = messages, tokens_before
    verbatim: dict[str, list[Message]] = {}
    limitations: list[str] = []
    used: list[str] = []
    violations: list[str] = []
    errors: list[str] = []
    failures: list[ProviderFailure] = []
    for provider in providers:
        if tokens <= config.limit:
            break
        name = progress.provider = provider.name
        try:
            # A copy of its own: a provider that edits what it was given in place must not
            # change the input its result is validated against (nor the request's messages).
            # should_compress is plugin code too: in the thread, where the deadline can leave it.
            given, wanted = await run_provider(_prepare, provider, current, config)
            if not wanted:
                continue
            result = await call_provider(provider, given, config, run_provider)
        except Exception as exc:  # a plugin's failure must not fail the request
            # The traceback only at debug: an exception's text may quote the messages.
            debug = log.isEnabledFor(logging.DEBUG)
            log.warning("provider %s raised %s", name, type(exc).__name__, exc_info=debug)
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            failures.append(ProviderFailure(name, "raised", type(exc).__name__))
            continue
        # Validation is linear but not free on a long history: off the event loop like compress.
        try:
            if repair is not None:
                result = await run_sync(repair, current, result)
            problems = await run_sync(
                functools.partial(check_result, check_budget=False), current, result, config
            )
            if not problems and check is not None:
                problems = await run_sync(check, current, result)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:  # malformed output
            problems = [f"result could not be validated: {type(exc).__name__}: {exc}"]
        if problems:
            log.warning("provider %s broke %d invariant(s): %s", name, len(problems), problems[0])
            violations.extend(f"{name}: {p}" for p in problems)
            failures.append(ProviderFailure(name, "invalid", problems[0]))
            continue
        if result.messages == current:
            continue
        current = result.messages
        tokens = await sync(config.count_tokens, current)
        verbatim.update(result.verbatim)
        limitations.extend(x for x in result.limitations if x not in limitations)
        used.append(name)
    final = await run_sync(_final, messages, current, verbatim, limitations) if used else None
    return ChainOutcome(
        result=final,
        providers=tuple(used),
        tokens_before=tokens_before,
        tokens_after=tokens,
        reached_target=tokens <= config.limit,
        fits_budget=tokens <= config.budget,
        violations=tuple(violations),
        errors=tuple(errors),
        failures=tuple(failures),
    )


def _prepare(
    provider: ContextProvider, messages: list[Message], config: CompressionConfig
) -> tuple[list[Message], bool]:
    """The provider's own copy of `messages`, and whether it wants to compress them."""
    given = copy.deepcopy(messages)
    return given, bool(provider.should_compress(given, config))


async def call_provider(
    provider: ContextProvider, messages: list[Message], config: CompressionConfig, run_sync: RunSync
) -> CompactionResult:
    """Await async providers; run sync ones off the event loop."""
    if inspect.iscoroutinefunction(provider.compress):
        out: Any = await provider.compress(messages, config)
    else:
        out = await run_sync(provider.compress, messages, config)
        if inspect.isawaitable(out):
            out = await out
    if not isinstance(out, CompactionResult):
        raise TypeError(f"compress returned {type(out).__name__}, not CompactionResult")
    return out


def _final(
    original: list[Message],
    messages: list[Message],
    verbatim: dict[str, list[Message]],
    limitations: list[str],
) -> CompactionResult:
    """The chain's result against the original input: what changed ends at `covered_through`."""
    return CompactionResult(
        messages=messages,
        source_digest=canonical.source_digest(original),
        covered_through=len(original) - 1 - common_suffix(original, messages),
        verbatim=verbatim,
        limitations=limitations,
    )
