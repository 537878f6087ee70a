"""`POST /v1/messages/count_tokens`: the count of what compactd would forward.

Claude Code asks the upstream how large its conversation is and decides from the answer when to
compact on its own. Forwarded untouched, the count would be of the client's history, not of the
(replayed or compacted) history compactd actually sends, so the client would compact a
conversation that no longer needs it. The count request is therefore decided as a Messages
request is (replay, and compaction over the trigger, stored as any other: the message that
follows replays it), and the upstream counts the messages that decision forwards. The client's
own fields (`system`, `tools`, `context_management`, …) go as they came; the answer comes back
byte for byte with the `x-compactd-*` headers of that decision.
"""

from __future__ import annotations

import dataclasses

from starlette.types import Receive, Scope, Send

from proxy.chat.compactor import Compactor
from proxy.dialects.anthropic_count import PATH
from proxy.dialects.errors import stream_end
from proxy.dialects.messages import MESSAGES
from proxy.wire.asgi import content_length, read_body, until_disconnect
from proxy.wire.forward import Upstream, relay
from proxy.wire.headers import compactd_headers
from proxy.wire.rewrite import upstream_headers
from proxy.wire.upstream_keys import Gate

__all__ = ["PATH", "count_tokens"]


async def count_tokens(
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    compactor: Compactor,
    upstream: Upstream,
    gate: Gate,
    max_body: int,
) -> None:
    """Answer a `count_tokens` request with the upstream's count of what compactd would send."""
    raw = await read_body(receive, max_body, content_length(scope))
    headers = gate.authorize(list(scope["headers"]))
    request = await compactor.read(raw, scope["headers"], MESSAGES)
    # Summaries are asked of `upstream.url`: an Anthropic key is never sent there.
    keyless = dataclasses.replace(request.identity, api_key=None)
    outcome = await compactor.decide(dataclasses.replace(request, identity=keyless))
    values = outcome.headers()
    values["api"] = "messages"
    url = upstream.url(PATH, scope.get("query_string", b""))

    async def exchange() -> None:
        response = await upstream.send(
            "POST", url, upstream_headers(headers, injected_usage=False), outcome.content
        )
        end = stream_end(responses=False, anthropic=True)
        await relay(send, response, compactd_headers(values), error_event=end.event)

    await until_disconnect(exchange(), receive)
