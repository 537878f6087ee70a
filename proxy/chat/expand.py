"""The expand tool (policy `expand_tool = true`): the model may ask for what compaction removed.

A compacted or replayed Chat Completions request of such a policy carries one more function tool,
`compactd_expand(ref)`, appended to `tools` as the constant bytes of `TOOL`: the same in every
request of every conversation, so it never moves the prompt cache. (Requests under the trigger
never carry it; the first compaction event of a conversation changes its prefix anyway.)

When the model's answer calls only `compactd_expand`, compactd resolves each ref (from the
request's own lossless forms, else from the store, under the request's tenant only: another
tenant's ref is "unknown"), appends the model's message and one `tool` result per call to the
request and sends the continuation upstream, up to `expand_max_calls` times per client request;
the last continuation goes without the tool, so the model has to answer. The client receives one
answer, streamed as it arrives: content streams through at once, tool-call deltas are held until
the stream ends (only then is it known whether they were all ours). Choices:

- called together with the client's own tools: compactd does not run its own (it cannot send the
  client's results), it removes its calls from the answer and relays the client's, renumbered;
  the model can ask again on the next turn (`outcome="mixed"`);
- an expansion is cut at `expand_max_tokens` tokens, saying how much was left out;
- a ref nobody stored (or another tenant's) gets a tool result saying so (`"unknown"`).

The usage the client sees is the final call's; compactd's accounting adds every continuation's
(continuations ask for the stream's usage chunk, which the client gets only if it asked for it).
Metrics: `compactd_expand_calls_total{outcome}` (expanded, unknown, mixed, limit) and
`compactd_expand_tokens_total`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy.errors import ProxyError
from proxy.providers.base import Message
from proxy.providers.markers import expanded_marker
from proxy.providers.units import message_text
from proxy.wire.forward import peek
from proxy.wire.usage import Usage, chat_usage

TOOL_NAME = "compactd_expand"
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Bring back the original text that a [compactd:ref=<id> ...] marker in this "
            "conversation stands for. Call it only when you need the exact details."
        ),
        "parameters": {
            "type": "object",
            "properties": {"ref": {"type": "string", "description": "the id after ref="}},
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}
JSON_LIMIT = 8 * 1024 * 1024
"""Largest non-streaming answer read to look for the tool's calls (larger: relayed as is)."""
MAX_REFS_PER_CALL = 8


def with_tool(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The body with the tool appended to `tools`; None where it must not be offered (several
    choices, legacy `functions`, a client tool of the same name)."""
    n = body.get("n")
    if (n not in (None, 1)) or "functions" in body:
        return None
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        return None
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == TOOL_NAME:
            return None
    return {**body, "tools": [*tools, TOOL]}


def without_tool(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body with the tool taken out again (the last continuation: the model must answer)."""
    out = dict(body)
    tools = [t for t in out.get("tools") or [] if t is not TOOL and t != TOOL]
    if tools:
        out["tools"] = tools
    else:
        out.pop("tools", None)
        out.pop("tool_choice", None)
        out.pop("parallel_tool_calls", None)
    return out


@dataclass(frozen=True)
class ExpandPlan:
    """What the response side needs to continue a request whose answer calls the tool."""

    tenant: str
    body: dict[str, Any]
    """The request as forwarded (the tool included), as a value."""
    count: Callable[[str], int]
    """Tokens of a text, as the request's model counts them."""
    local: Mapping[str, list[Message]] = field(default_factory=dict)
    """Refs this request resolves by itself (its lossless forms' originals)."""
    max_calls: int = 3
    max_tokens: int = 4000
    tool_tokens: int = 0
    """What offering the tool adds to the request."""
    conversation: str = ""
    """Where its refs resolve (a ref of another conversation does not)."""


Resolve = Callable[[str, list[str]], Awaitable[dict[str, list[Message]]]]
Send = Callable[[bytes], Awaitable[httpx.Response]]
Observe = Callable[[str, int], None]
"""(outcome, tokens) for the metrics."""


def render(ref: str, originals: Sequence[Message]) -> str:
    """The originals of a ref as the tool's result text."""
    lines = [expanded_marker(ref, len(originals))]
    for m in originals:
        role = str(m.get("role", "?"))
        who = f"{role} ({m['tool_call_id']})" if m.get("tool_call_id") else role
        text = message_text(m)
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    text += f"\n(called {fn.get('name')}({fn.get('arguments')}))"
        lines.append(f"{who}: {text}")
    return "\n".join(lines)


def cut(text: str, tokens: int, limit: int) -> str:
    """`text` cut to about `limit` tokens, saying how much was left out."""
    if tokens <= limit:
        return text
    keep = max(0, int(len(text) * limit / tokens) - 80)
    return f"{text[:keep]}\n[… cut by compactd: {limit:,} of {tokens:,} tokens shown]"


@dataclass
class _Calls:
    """The tool calls of one answer, assembled from a message or from stream deltas."""

    names: dict[int, str] = field(default_factory=dict)
    ids: dict[int, str] = field(default_factory=dict)
    args: dict[int, str] = field(default_factory=dict)

    def feed(self, deltas: Any) -> None:
        for d in deltas if isinstance(deltas, list) else []:
            if not isinstance(d, dict):
                continue
            i = d.get("index", len(self.names))
            i = i if isinstance(i, int) else len(self.names)
            fn: dict[str, Any] = d["function"] if isinstance(d.get("function"), dict) else {}
            if isinstance(fn.get("name"), str):
                self.names[i] = self.names.get(i, "") + fn["name"]
            if isinstance(d.get("id"), str):
                self.ids[i] = d["id"]
            if isinstance(fn.get("arguments"), str):
                self.args[i] = self.args.get(i, "") + fn["arguments"]

    @property
    def ours(self) -> list[int]:
        return [i for i in sorted(self.names) if self.names[i] == TOOL_NAME]

    @property
    def theirs(self) -> list[int]:
        return [i for i in sorted(self.names) if self.names[i] != TOOL_NAME]

    def message(self, content: str | None) -> Message:
        calls = [
            {
                "id": self.ids.get(i, f"call_compactd_{i}"),
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": self.args.get(i, "")},
            }
            for i in self.ours
        ]
        return {"role": "assistant", "content": content or None, "tool_calls": calls}

    def refs(self) -> list[tuple[str, str]]:
        """(call id, ref) for each of our calls."""
        out = []
        for i in self.ours:
            try:
                ref = orjson.loads(self.args.get(i) or "{}").get("ref", "")
            except (orjson.JSONDecodeError, AttributeError):
                ref = ""
            out.append((self.ids.get(i, f"call_compactd_{i}"), str(ref).strip()))
        return out


def add_usage(a: Usage | None, b: Usage) -> Usage:
    """Two calls' usage together."""
    if a is None:
        return b
    return Usage(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cached_tokens=a.cached_tokens + b.cached_tokens,
        cache_write_tokens=a.cache_write_tokens + b.cache_write_tokens,
    )


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk


def _with_body(
    response: httpx.Response, chunks: AsyncIterator[bytes], size: int | None
) -> httpx.Response:
    headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
    if size is not None:
        headers.append((b"content-length", str(size).encode()))
    return httpx.Response(response.status_code, headers=headers, stream=_Body(chunks))


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


@dataclass
class Expander:
    """Runs one client request's continuations; `respond` gives the response to relay."""

    plan: ExpandPlan
    send: Send
    resolve: Resolve
    observe: Observe
    stream: bool
    client_wants_usage: bool
    """The relayed stream keeps its usage chunk (the client asked, or the relay strips it)."""
    rounds: int = 0
    usage: Usage | None = None
    """What the continuations' earlier calls billed (the relayed call's is read as usual)."""

    added: list[Message] = field(default_factory=list)
    """The messages the continuations appended so far (calls and results)."""

    def _add_usage(self, usage: Usage | None) -> None:
        if usage is not None:
            self.usage = add_usage(self.usage, usage)

    async def respond(self, response: httpx.Response) -> httpx.Response:
        """The response to relay to the client for the upstream's first answer."""
        if response.status_code != 200 or response.headers.get("content-encoding"):
            return response
        if self.stream:
            return _with_body(response, self._events(response), None)
        return await self._json(response)

    # ---- continuations ------------------------------------------------------------------

    async def _results(self, calls: _Calls) -> list[Message]:
        pairs = calls.refs()
        wanted = [ref for _, ref in pairs[:MAX_REFS_PER_CALL] if ref]
        found = {r: self.plan.local[r] for r in wanted if r in self.plan.local}
        missing = [r for r in wanted if r not in found]
        if missing:
            found.update(await self.resolve(self.plan.tenant, missing))
        out = []
        for n, (call_id, ref) in enumerate(pairs):
            originals = found.get(ref)
            if n >= MAX_REFS_PER_CALL:
                text, outcome, tokens = "Too many expansions at once.", "limit", 0
            elif originals is None:
                text = f"Unknown reference {ref[:40]!r}: nothing is stored for it."
                outcome, tokens = "unknown", 0
            else:
                full = render(ref, originals)
                tokens = self.plan.count(full)
                text = cut(full, tokens, self.plan.max_tokens)
                outcome = "expanded"
            self.observe(outcome, min(tokens, self.plan.max_tokens))
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        return out

    async def _continue(self, calls: _Calls, content: str | None) -> httpx.Response:
        self.added += [calls.message(content), *await self._results(calls)]
        self.rounds += 1
        body = {**self.plan.body, "messages": [*self.plan.body["messages"], *self.added]}
        if self.rounds >= self.plan.max_calls:
            body = without_tool(body)
        if self.stream:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return await self.send(orjson.dumps(body))

    # ---- non-streaming ------------------------------------------------------------------

    async def _json(self, response: httpx.Response) -> httpx.Response:
        while True:
            raw, longer = await peek(response, JSON_LIMIT)
            if longer is not None:  # too long to be a tool call: relayed as it is
                return _with_body(response, longer, None)
            try:
                answer = orjson.loads(raw)
                message = answer["choices"][0]["message"]
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
                return _with_body(response, _once(raw), len(raw))
            calls = _Calls()
            calls.feed([{**c, "index": i} for i, c in enumerate(message.get("tool_calls") or [])])
            if not calls.ours or response.status_code != 200:
                return _with_body(response, _once(raw), len(raw))
            if calls.theirs:
                self.observe("mixed", 0)
                kept = [c for i, c in enumerate(message["tool_calls"]) if i in calls.theirs]
                answer["choices"][0]["message"] = {**message, "tool_calls": kept}
                out = orjson.dumps(answer)
                return _with_body(response, _once(out), len(out))
            self._add_usage(chat_usage(answer, None))
            content = message.get("content")
            response = await self._continue(calls, content if isinstance(content, str) else None)

    # ---- streaming ----------------------------------------------------------------------

    async def _events(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The client's stream: every answer's content as it comes, tool calls at the end."""
        sent_role = False
        while True:
            calls = _Calls()
            held: list[tuple[Any, bytes]] = []  # (parsed chunk, event) held back
            content: list[str] = []
            usage: Usage | None = None
            try:
                async for event in _sse_events(response.aiter_raw()):
                    chunk = _parse(event)
                    if chunk is None:  # comments pass, [DONE] is ours to send at the very end
                        if event.strip() != b"data: [DONE]":
                            yield event
                        continue
                    choices = chunk.get("choices") or []
                    delta = choices[0].get("delta") or {} if choices else {}
                    if chunk.get("usage"):
                        usage = chat_usage(chunk, usage)
                        if self.rounds and not self.client_wants_usage:
                            continue  # asked for by us: counted, not shown
                    if delta.get("tool_calls") or (choices and choices[0].get("finish_reason")):
                        calls.feed(delta.get("tool_calls"))
                        held.append((chunk, event))
                        continue
                    if not choices:
                        held.append((chunk, event))  # the usage chunk
                        continue
                    if isinstance(delta.get("content"), str):
                        content.append(delta["content"])
                    yield _without_role(chunk) if sent_role and "role" in delta else event
                    sent_role = sent_role or "role" in delta
            finally:
                await response.aclose()
            if not calls.ours:
                if self.rounds and not self.client_wants_usage:
                    self._add_usage(usage)
                for _, event in held:
                    yield event
                yield b"data: [DONE]\n\n"
                return
            if calls.theirs:
                self.observe("mixed", 0)
                if self.rounds and not self.client_wants_usage:
                    self._add_usage(usage)
                for chunk, event in held:
                    if out := _renumbered(chunk, event, calls):
                        yield out
                yield b"data: [DONE]\n\n"
                return
            self._add_usage(usage)
            try:
                response = await self._continue(calls, "".join(content) or None)
            except ProxyError as exc:  # headers are out: the relay ends the stream with an error
                raise httpx.HTTPError(f"continuation failed: {exc.message}") from exc
            if response.status_code != 200:
                await response.aclose()
                raise httpx.HTTPError(f"continuation answered {response.status_code}")


def _without_role(chunk: dict[str, Any]) -> bytes:
    """A later answer's first chunk without its `role`: the client has had one already."""
    choices = [
        {**c, "delta": {k: v for k, v in (c.get("delta") or {}).items() if k != "role"}}
        for c in chunk["choices"]
    ]
    return b"data: " + orjson.dumps({**chunk, "choices": choices}) + b"\n\n"


def _renumbered(chunk: Any, event: bytes, calls: _Calls) -> bytes:
    """A held event without our calls, the client's renumbered from 0; the usage chunk and
    finish chunk as they were."""
    if chunk is None:
        return event
    choices = chunk.get("choices") or []
    if not choices or not (choices[0].get("delta") or {}).get("tool_calls"):
        return event
    index = {old: new for new, old in enumerate(calls.theirs)}
    delta = choices[0]["delta"]
    kept = [
        {**d, "index": index[d.get("index", 0)]}
        for d in delta["tool_calls"]
        if d.get("index", 0) in index
    ]
    if not kept and not delta.get("content"):
        return b""
    new = {**chunk, "choices": [{**choices[0], "delta": {**delta, "tool_calls": kept}}]}
    return b"data: " + orjson.dumps(new) + b"\n\n"


def _parse(event: bytes) -> dict[str, Any] | None:
    data = b"".join(
        line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")
    ).strip()
    if not data or data == b"[DONE]":
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Whole events (each ending with a blank line), whatever the chunking."""
    buf = b""
    async for chunk in chunks:
        buf += chunk.replace(b"\r\n", b"\n")
        while (end := buf.find(b"\n\n")) >= 0:
            yield buf[: end + 2]
            buf = buf[end + 2 :]
    if buf.strip():
        yield buf + b"\n\n"
