"""Restore in each API's own shape: `POST /compactd/v1/uncompress` with an `api`.

`{"messages": [...]}` restores chat messages (as ever). `{"api": "responses", "input": [...]}`
and `{"api": "messages", "messages": [...]}` take what was forwarded in that API's shape (the
stand-ins and rewrites compactd made among the client's own items), project it, expand every
reference from the store, and give back the API's own items: the originals exactly as the
client sent them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.dialects.messages import MESSAGES
from proxy.dialects.projection import native
from proxy.dialects.responses import RESPONSES

Message = dict[str, Any]
_FIELDS = {"responses": "input", "messages": "messages"}
USAGE = 'Body must be {"messages": [...]} or {"api": "responses"|"messages", ...}.'


def read(body: Any) -> tuple[str, list[Message]]:
    """(api, the chat messages to expand) of an uncompress body; TypeError if malformed."""
    if not isinstance(body, Mapping):
        raise TypeError(USAGE)
    api = body.get("api", "chat.completions")
    if api == "chat.completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(USAGE)
        return api, messages
    if api not in _FIELDS or not isinstance(body.get(_FIELDS[api]), list):
        raise TypeError(USAGE)
    dialect = RESPONSES if api == "responses" else MESSAGES
    projected = dialect.messages({_FIELDS[api]: body[_FIELDS[api]]})
    if projected is None:
        raise TypeError(USAGE)
    return api, projected


def write(
    api: str, messages: list[Message], body: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The restored messages under the API's own key, in its own shape; the items of `body`
    (the uncompress request, if any) that come back as they were keep their cache breakpoints."""
    if api == "responses":
        return {"input": RESPONSES.emitted({"input": body["input"]} if body else {}, messages)}
    if api == "messages":
        return {
            "messages": MESSAGES.emitted({"messages": body["messages"]} if body else {}, messages)
        }
    return {"messages": messages}


def api_of(messages: Sequence[Message]) -> str:
    """The API whose projection these (stored) messages are, by the items they carry: a
    Responses projection carries `{"kind", "items"}`, a Messages one a message's own fields."""
    for message in messages:
        items = native(message)
        if isinstance(items, Mapping):
            return "responses" if "items" in items else "messages"
    return "chat.completions"
