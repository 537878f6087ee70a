"""bench/quality in the Responses and Messages shapes: each case converted as bench/session_apis
converts a session (reasoning items, signed thinking, tool_result blocks), then projected by the
API's adapter, so the providers compact exactly what the proxy gives them on that API, counted
with the adapter's counter (reasoning and thinking included). Facts are looked for in the text
of the projection, which is the text of the API's own items."""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.api_shapes import Convert
from bench.session import Session
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES
from proxy.tokens.counter import TokenCounter
from tests.api_fakes import FakeMessages, FakeResponses

ADAPTERS = {"responses": RESPONSES, "messages": MESSAGES}


def as_api(case: Any, api: str) -> Any:
    """The case with its messages as the adapter's projection of the API-shaped request."""
    if api == "chat":
        return case
    convert = Convert(api, FakeResponses(), FakeMessages())
    session = Session(case.corpus, case.id, case.messages, case.tools, [len(case.messages)])
    body = convert.body(session, case.messages)
    projected = ADAPTERS[api].messages(body)
    if projected is None:
        raise ValueError(f"{case.id}: the {api} body did not project")
    if api == "messages":  # `system` is the body's there, never touched: counted as it is here
        projected = [m for m in case.messages if m["role"] in ("system", "developer")] + projected
    return dataclasses.replace(case, messages=projected)


def counting(api: str, counter: TokenCounter) -> Any:
    """The counter the proxy counts this API's projected messages with."""
    return counter if api == "chat" else ADAPTERS[api].counter(counter)
