"""What one chat request turned into: read by the handler for headers, retries and accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ChatState:
    """What one chat request turned into; read by the app for headers, retries and accounting."""

    started: float
    action: str = "passthrough"
    tenant: str | None = None
    """None: the client sent no credential, so nothing of this request is stored."""
    fingerprint: str | None = None
    api_key: str | None = None
    model: str = ""
    policy: str = ""
    conversation: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None
    provider: str = ""
    error: str | None = None
    parsed: dict[str, Any] | None = None
    shadow_action: str = ""
    unstored: bool = False
    no_credential: bool = False
    retried: bool = False

    def headers(self) -> dict[str, str]:
        """Values for our `x-compactd-*` response headers."""
        return {
            "action": self.action,
            "tokens-before": "" if self.tokens_before is None else str(self.tokens_before),
            "tokens-after": "" if self.tokens_after is None else str(self.tokens_after),
            "provider": self.provider,
            "policy": self.policy,
            "conversation": self.conversation,
            "shadow-action": self.shadow_action,
            "store": "unstored" if self.unstored else "no-credential" if self.no_credential else "",
            "error": self.error or "",
        }


@dataclass
class Decision:
    """The bytes to forward and the state behind them."""

    content: bytes
    state: ChatState
    injected_usage: bool = False
    """compactd added stream_options.include_usage, so it strips the usage chunk again."""
