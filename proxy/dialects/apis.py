"""The three APIs compactd compacts, and which upstream every other /v1 path goes to.

| API | path | upstream | errors | usage |
|---|---|---|---|---|
| `chat.completions` | `POST /v1/chat/completions` | `upstream.url` | OpenAI's | `usage` (+ chunk) |
| `responses` | `POST /v1/responses` | `upstream.url` | OpenAI's | `response.completed` |
| `messages` | `POST /v1/messages` | `upstream.anthropic_url` | Anthropic's | `message_*` |

Everything else under /v1 is forwarded unchanged: to Anthropic if it is one of its paths
(`/v1/messages/…`, `/v1/complete`) or the client speaks Anthropic (an `anthropic-version`
header, as every Anthropic SDK sends: `/v1/models`, `/v1/files` exist on both), else to
`upstream.url`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.dialects.chat import CHAT, Dialect
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES
from proxy.dialects.usage import messages_usage, responses_usage
from proxy.wire.usage import UsageReader, chat_usage


@dataclass(frozen=True)
class Api:
    """One compacted API: its name (the `api` label everywhere), adapter, upstream and shapes."""

    name: str
    dialect: Dialect
    anthropic: bool
    """Sent to `upstream.anthropic_url`; compactd's own errors in Anthropic's shape."""
    read_usage: UsageReader


CHAT_API = Api(CHAT.name, CHAT, anthropic=False, read_usage=chat_usage)
RESPONSES_API = Api(RESPONSES.name, RESPONSES, anthropic=False, read_usage=responses_usage)
MESSAGES_API = Api(MESSAGES.name, MESSAGES, anthropic=True, read_usage=messages_usage)
APIS: tuple[Api, ...] = (CHAT_API, RESPONSES_API, MESSAGES_API)
API_NAMES: tuple[str, ...] = tuple(a.name for a in APIS)

_COMPACTED = {
    b"/chat/completions": CHAT_API,
    b"/responses": RESPONSES_API,
    b"/messages": MESSAGES_API,
}
_ANTHROPIC_PATHS = (b"/messages", b"/complete")


def compacted_api(method: str, sub_path: bytes) -> Api | None:
    """The API whose requests this is (a POST to its path), or None: forwarded unchanged."""
    return _COMPACTED.get(sub_path) if method == "POST" else None


def is_anthropic(sub_path: bytes, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a /v1 path (below /v1) goes to the Anthropic upstream."""
    for prefix in _ANTHROPIC_PATHS:
        if sub_path == prefix or sub_path.startswith(prefix + b"/"):
            return True
    return any(k.lower() == b"anthropic-version" for k, _ in headers)
