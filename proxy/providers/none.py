"""`none`: the provider that changes nothing (a policy that only measures, or a chain's floor)."""

from __future__ import annotations

from proxy.providers import canonical
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
)


class NoneProvider(ContextProvider):
    """Returns its input unchanged."""

    name = "none"

    def should_compress(self, messages: list[Message], config: CompressionConfig) -> bool:
        """Never: there is nothing this provider could do."""
        return False

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        """The input, as it is."""
        return CompactionResult(
            messages=list(messages), source_digest=canonical.source_digest(messages)
        )
