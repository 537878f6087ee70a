"""Providers bound to a policy's options: the chain passes one config to every provider."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.providers.base import CompactionResult, CompressionConfig, ContextProvider, Message
from proxy.providers.chain import RunSync, call_provider


class BoundProvider(ContextProvider):
    """A provider bound to its policy options (the chain passes one config to every provider)."""

    def __init__(
        self,
        inner: ContextProvider,
        options: Mapping[str, Any],
        run_sync: RunSync = asyncio.to_thread,
    ) -> None:
        self.inner = inner
        self.options = dict(options)
        self.run_sync = run_sync
        """Where a sync provider's `compress` runs (a thread, never the event loop)."""

    @property
    def name(self) -> str:
        """The wrapped provider's name."""
        return self.inner.name

    def should_compress(self, messages: list[Message], config: CompressionConfig) -> bool:
        """Delegates to the wrapped provider with its own options."""
        return self.inner.should_compress(messages, self._config(config))

    async def compress(
        self, messages: list[Message], config: CompressionConfig
    ) -> CompactionResult:
        """Async providers are awaited; sync ones run in a thread (never on the event loop)."""
        # An async one awaited here, not made in a thread: a chain past its deadline cancelled
        # in that thread hop would leave its coroutine never awaited.
        return await call_provider(self.inner, messages, self._config(config), self.run_sync)

    def _config(self, config: CompressionConfig) -> CompressionConfig:
        return dataclasses.replace(config, extra_config=self.options)


def bound_chain(
    names: Sequence[str],
    providers: Mapping[str, ContextProvider],
    options: Mapping[str, Mapping[str, Any]],
    run_sync: RunSync = asyncio.to_thread,
) -> tuple[ContextProvider, ...]:
    """The providers of a chain, each bound to its options (a policy's `options` table), sync
    ones run through `run_sync`."""
    return tuple(BoundProvider(providers[n], options.get(n, {}), run_sync) for n in names)
