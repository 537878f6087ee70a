"""Fake Responses and Messages upstreams that enforce each API's validity rules.

Both are ASGI apps (served on a real socket with `tests.upstream.serve`, or in-process through
`httpx.ASGITransport`). They record every request and refuse, with the API's own 400, what the
real API refuses:

- Responses: a `reasoning` item (or an `item_reference` to one) not followed by the model
  output it belongs to (an assistant message, a call), or whose encrypted content this
  upstream never issued; a function/custom call without its output, an output answering no
  call; a `compaction` item it never issued.
- Messages: a `tool_use` not answered by `tool_result` blocks at the start of the next user
  turn (consecutive same-role messages are one turn, as the API combines them), a result
  answering no `tool_use` of the turn right before; a thinking block whose signature is not
  the one issued for its text, redacted thinking never issued; an assistant turn that a pending
  tool result continues not starting with its thinking; a `server_tool_use` without its result
  in the same turn; more than four `cache_control` breakpoints, one on a thinking block, or a
  longer TTL after a shorter one; with a `window`, input (or input + `max_tokens`) over it.

Answers carry usage with prompt caching simulated: OpenAI caches the longest common prefix of
items with an earlier request (in 128-token steps, from 1,024 tokens); Anthropic reads the
longest prefix cached at a breakpoint or up to 20 blocks before one, and writes one at each
breakpoint. Token counts are a deterministic stand-in (`true_tokens`), not tiktoken.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.upstream import Ctx, FakeUpstream, Received, respond

Scope = dict[str, Any]
Json = dict[str, Any]
_SECRET = b"fake-upstream"
_LOOKBACK = 20
_MIN_CACHE = 1024
_TTL = {"5m": 300, "1h": 3600}


def true_tokens(value: Any) -> int:
    """The fake upstreams' own count, not tiktoken's: ~1 token per 3.6 characters of every
    string in the value, plus 3 per object (its framing)."""
    if isinstance(value, str):
        return max(1, int(len(value) / 3.6))
    if isinstance(value, dict):
        return 3 + sum(true_tokens(v) for k, v in value.items() if k not in ("id", "signature"))
    if isinstance(value, list):
        return sum(true_tokens(v) for v in value)
    return 0 if value is None else 1


def sign(text: str) -> str:
    return "sig:" + hmac.new(_SECRET, text.encode(), hashlib.sha256).hexdigest()[:32]


class InvalidRequestError(Exception):
    pass


@dataclass
class _Base:
    received: list[Received] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    cache: dict[str, int] = field(default_factory=dict)
    replies: list[Callable[[Json], Json]] = field(default_factory=list)
    """Scripted outputs (one per request, then the default)."""
    answers: list[bytes] = field(default_factory=list)
    """Every response body sent, as sent."""

    @property
    def last(self) -> Received:
        return self.received[-1]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        # The recording and body reading of the scriptable fake; the answer is ours.
        async def behaviour(ctx: Ctx) -> None:
            status, body, sse = self.answer(ctx.request)
            self.answers.append(body)
            ctype = b"text/event-stream" if sse else b"application/json"
            await respond(status, body, content_type=ctype)(ctx)

        await FakeUpstream(received=self.received, default=behaviour)(scope, receive, send)

    def answer(self, req: Received) -> tuple[int, bytes, bool]:
        raise NotImplementedError

    def events(self, reply: Json) -> bytes:
        raise NotImplementedError

    def reply(self, body: Json, reply: Json) -> tuple[int, bytes, bool]:
        """A 200 with `reply`, as its events when the request streams."""
        if body.get("stream"):
            return 200, self.events(reply), True
        return 200, json.dumps(reply).encode(), False


# --- Responses ---------------------------------------------------------------------------------

OVERFLOW_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


def sse_event(kind: str, data: Json) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _model_output(item: Json) -> bool:
    """Whether an item is model output a reasoning item may belong to (not an input message,
    a tool's output or another reasoning item)."""
    kind = item.get("type")
    if kind in (None, "message"):
        return item.get("role") == "assistant"
    return kind != "reasoning" and not str(kind).endswith("_output")


def _reasoning_reference(item: Json) -> bool:
    """Whether an item is a reference to a stored reasoning item (which the API resolves to
    the item itself, with the same rule on what follows it)."""
    return item.get("type") == "item_reference" and str(item.get("id")).startswith("rs_")


@dataclass
class FakeResponses(_Base):
    """`POST /v1/responses` with reasoning, function calls and compaction items."""

    issued: set[str] = field(default_factory=set)
    """Encrypted contents this upstream gave out (reasoning and compaction items)."""
    counter: int = 0
    window: int | None = None
    """The model's context window: a request whose input exceeds it is refused, with a 400, or
    when it streams, as the API does, inside a 200 (`overflow_events`)."""

    def answer(self, req: Received) -> tuple[int, bytes, bool]:
        if req.method == "POST" and req.path == "/v1/chat/completions":
            return self.chat(req.json())
        if req.method != "POST" or req.path != "/v1/responses":
            return 200, json.dumps({"object": "other", "path": req.path}).encode(), False
        body = req.json()
        try:
            self.validate(body)
        except InvalidRequestError as exc:
            self.refused.append(str(exc))
            error = {"message": str(exc), "type": "invalid_request_error", "param": "input"}
            return 400, json.dumps({"error": {**error, "code": None}}).encode(), False
        if self.window is not None and true_tokens(body.get("input")) > self.window:
            self.refused.append(OVERFLOW_MESSAGE)
            if body.get("stream"):
                return 200, self.overflow_events(body), True
            error = {"message": OVERFLOW_MESSAGE, "type": "invalid_request_error"}
            error.update(param="input", code="context_length_exceeded")
            return 400, json.dumps({"error": error}).encode(), False
        output = self.output(body)
        usage = self.usage(body, output)
        response = {
            "id": f"resp_{self.counter}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "usage": usage,
        }
        return self.reply(body, response)

    def validate(self, body: Json) -> None:
        items = body.get("input")
        if isinstance(items, str):
            return
        if not isinstance(items, list):
            raise InvalidRequestError("input must be a string or a list")
        calls: dict[str, str] = {}
        answered: set[str] = set()
        for i, item in enumerate(items):
            kind = item.get("type")
            if kind == "reasoning" and item.get("encrypted_content") not in self.issued:
                raise InvalidRequestError(f"reasoning item {i} was altered or never issued")
            if kind == "reasoning" or _reasoning_reference(item):
                if i + 1 >= len(items) or not _model_output(items[i + 1]):
                    raise InvalidRequestError(
                        f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                        "required following item."
                    )
            elif kind == "compaction":
                if item.get("encrypted_content") not in self.issued:
                    raise InvalidRequestError(f"compaction item {i} was altered or never issued")
            elif kind in ("function_call", "custom_tool_call"):
                calls[item["call_id"]] = kind
            elif kind in ("function_call_output", "custom_tool_call_output"):
                if item.get("call_id") not in calls:
                    raise InvalidRequestError(
                        f"No tool call found for output {item.get('call_id')}"
                    )
                answered.add(item["call_id"])
        missing = set(calls) - answered
        if missing:
            raise InvalidRequestError(
                f"No tool output found for function call {sorted(missing)[0]}."
            )

    def chat(self, body: Json) -> tuple[int, bytes, bool]:
        """Chat completions on the same upstream: tool pairing enforced, prefix caching simulated
        over messages as over Responses items."""
        pending: set[str] = set()
        problem = ""
        for m in body.get("messages", []):
            if m.get("role") == "tool":
                if m.get("tool_call_id") not in pending:
                    problem = "a tool message answers no tool call"
                pending.discard(m.get("tool_call_id"))
                continue
            if pending:
                problem = "tool_calls must be followed by their tool messages"
            pending = {c["id"] for c in m.get("tool_calls") or []}
        if problem:
            self.refused.append(problem)
            error = {"message": problem, "type": "invalid_request_error", "code": None}
            return 400, json.dumps({"error": error}).encode(), False
        usage = self.usage({"input": body.get("messages", []), "tools": body.get("tools")}, [])
        message = {"role": "assistant", "content": "Done."}
        reply = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": usage["input_tokens"],
                "completion_tokens": 2,
                "prompt_tokens_details": usage["input_tokens_details"],
            },
        }
        return 200, json.dumps(reply).encode(), False

    def output(self, body: Json) -> list[Json]:
        self.counter += 1
        if self.replies:
            return self.replies.pop(0)(body)["output"]
        return [self.reasoning("thought"), self.message("Done.")]

    def reasoning(self, text: str) -> Json:
        encrypted = f"enc-{self.counter}-{hashlib.sha256(text.encode()).hexdigest()[:40]}"
        self.issued.add(encrypted)
        return {
            "type": "reasoning",
            "id": f"rs_{self.counter}_{len(self.issued)}",
            "summary": [{"type": "summary_text", "text": text}],
            "encrypted_content": encrypted,
        }

    def compaction(self) -> Json:
        encrypted = f"cmp-{self.counter}-{len(self.issued)}"
        self.issued.add(encrypted)
        return {
            "type": "compaction",
            "id": f"cmp_{len(self.issued)}",
            "encrypted_content": encrypted,
        }

    def message(self, text: str) -> Json:
        return {
            "type": "message",
            "id": f"msg_{self.counter}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

    def usage(self, body: Json, output: list[Json]) -> Json:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        head = [body.get("instructions"), body.get("tools")]
        sizes = [true_tokens(head)] + [true_tokens(it) for it in items]
        cached = 0
        digest = hashlib.sha256()
        total = 0
        for n, size in enumerate(sizes):
            digest.update(json.dumps([head, *items][n], sort_keys=True).encode())
            total += size
            key = digest.hexdigest()
            if key in self.cache:
                cached = total
            self.cache[key] = total
        cached = cached // 128 * 128 if cached >= _MIN_CACHE else 0
        return {
            "input_tokens": total,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": sum(true_tokens(o) for o in output),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total,
        }

    def overflow_events(self, body: Json) -> bytes:
        """The stream the API answers a streamed request over its window with: announced, then
        an `error` event and `response.failed`."""
        response = {
            "id": f"resp_{self.counter}",
            "object": "response",
            "created_at": 1700000000,
            "status": "in_progress",
            "model": body.get("model"),
            "output": [],
            "usage": None,
            "error": None,
        }
        error = {"code": "context_length_exceeded", "message": OVERFLOW_MESSAGE, "param": "input"}
        failed = {**response, "status": "failed", "error": {"code": error["code"]}}
        failed["error"] = {"code": error["code"], "message": OVERFLOW_MESSAGE}
        return b"".join(
            sse_event(kind, {"type": kind, "sequence_number": seq, **data})
            for seq, (kind, data) in enumerate(
                [
                    ("response.created", {"response": response}),
                    ("response.in_progress", {"response": response}),
                    ("error", error),
                    ("response.failed", {"response": failed}),
                ]
            )
        )

    def events(self, response: Json) -> bytes:
        out = []
        seq = 0

        def event(kind: str, data: Json) -> None:
            nonlocal seq
            data = {"type": kind, "sequence_number": seq, **data}
            seq += 1
            out.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n")

        start = {**response, "status": "in_progress", "output": [], "usage": None}
        event("response.created", {"response": start})
        for index, item in enumerate(response["output"]):
            event("response.output_item.added", {"output_index": index, "item": item})
            if item.get("type") == "message":
                text = item["content"][0]["text"]
                event(
                    "response.output_text.delta",
                    {
                        "output_index": index,
                        "content_index": 0,
                        "item_id": item["id"],
                        "delta": text,
                    },
                )
            event("response.output_item.done", {"output_index": index, "item": item})
        event("response.completed", {"response": response})
        return "".join(out).encode()


# --- Messages (Anthropic) ----------------------------------------------------------------------


def _turns(messages: list[Json]) -> list[tuple[str, list[Json]]]:
    """Consecutive same-role messages combined, string content as one text block."""
    turns: list[tuple[str, list[Json]]] = []
    for m in messages:
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if turns and turns[-1][0] == m["role"]:
            turns[-1][1].extend(blocks)
        else:
            turns.append((m["role"], list(blocks)))
    return turns


@dataclass
class FakeMessages(_Base):
    """`POST /v1/messages` (and `/count_tokens`) with tools, thinking and prompt caching."""

    redacted: set[str] = field(default_factory=set)
    counter: int = 0
    thinking_replies: bool = True
    count_tokens_status: int = 200
    """Set to answer `/count_tokens` with this error status instead (529: overloaded)."""
    window: int | None = None
    """The model's context window: a request whose input (or input + `max_tokens`) exceeds it
    is refused with the API's own 400."""
    files: dict[str, str] = field(default_factory=dict)
    """Uploaded files (the Files API) by id: a block naming one is counted with its text."""

    def answer(self, req: Received) -> tuple[int, bytes, bool]:
        if req.method != "POST" or not req.path.startswith("/v1/messages"):
            return 200, json.dumps({"object": "other", "path": req.path}).encode(), False
        body = req.json()
        try:
            if not (req.header("x-api-key") or req.header("authorization")):
                raise InvalidRequestError("missing credential")
            if not req.header("anthropic-version"):
                raise InvalidRequestError("anthropic-version header is required")
            self.validate(body)
            overflow = self.overflow(body) if req.path == "/v1/messages" else None
            if overflow is not None:
                raise InvalidRequestError(overflow)
        except InvalidRequestError as exc:
            self.refused.append(str(exc))
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": str(exc)},
            }
            return 400, json.dumps(error).encode(), False
        if req.path == "/v1/messages/count_tokens" and self.count_tokens_status != 200:
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
            return self.count_tokens_status, json.dumps(error).encode(), False
        if req.path == "/v1/messages/count_tokens":
            return 200, json.dumps({"input_tokens": self.prompt_tokens(body)}).encode(), False
        content = self.output(body)
        usage = self.usage(body)
        usage["output_tokens"] = true_tokens(content)
        message = {
            "id": f"msg_{self.counter}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": "tool_use"
            if any(b["type"] == "tool_use" for b in content)
            else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        return self.reply(body, message)

    def overflow(self, body: Json) -> str | None:
        """The API's message for a request over the context window, if it is."""
        if self.window is None:
            return None
        prompt, output = self.prompt_tokens(body), int(body.get("max_tokens") or 0)
        if prompt > self.window:
            return f"prompt is too long: {prompt} tokens > {self.window} maximum"
        if prompt + output > self.window:
            return (
                f"input length and `max_tokens` exceed context limit: {prompt} + {output} > "
                f"{self.window}, decrease input length or `max_tokens` and try again"
            )
        return None

    def validate(self, body: Json) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages: at least one message is required")
        turns = _turns(messages)
        for t, (role, blocks) in enumerate(turns):
            if role not in ("user", "assistant"):
                raise InvalidRequestError(f"messages: unexpected role {role!r}")
            uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if role == "user" and results:
                prev = turns[t - 1][1] if t > 0 and turns[t - 1][0] == "assistant" else []
                prev_uses = {b["id"] for b in prev if b.get("type") == "tool_use"}
                for _k, b in enumerate(blocks[: len(results)]):
                    if b.get("type") != "tool_result":
                        raise InvalidRequestError(
                            "tool_result blocks must come first in the user turn"
                        )
                for r in results:
                    if r.get("tool_use_id") not in prev_uses:
                        raise InvalidRequestError(
                            f"unexpected tool_use_id {r.get('tool_use_id')} in tool_result blocks"
                        )
            if role == "assistant" and uses:
                nxt = turns[t + 1][1] if t + 1 < len(turns) else None
                if nxt is not None:
                    got = {b.get("tool_use_id") for b in nxt if b.get("type") == "tool_result"}
                    if set(uses) - got:
                        raise InvalidRequestError(
                            f"tool_use ids were found without tool_result blocks: {sorted(set(uses) - got)}"
                        )
            if role == "assistant":
                self.check_server_tools(blocks)
            for b in blocks:
                if b.get("type") == "thinking" and b.get("signature") != sign(
                    b.get("thinking", "")
                ):
                    raise InvalidRequestError("Invalid signature in thinking block")
                if b.get("type") == "redacted_thinking" and b.get("data") not in self.redacted:
                    raise InvalidRequestError("Invalid redacted_thinking block")
        last_role, last_blocks = turns[-1]
        thinking = body.get("thinking", {}).get("type") in ("enabled", "adaptive")
        pending = last_role == "user" and any(b.get("type") == "tool_result" for b in last_blocks)
        prev = turns[-2][1] if thinking and pending and len(turns) >= 2 else []
        has = any(b.get("type") in ("thinking", "redacted_thinking") for b in prev)
        if has and prev[0].get("type") not in ("thinking", "redacted_thinking"):
            raise InvalidRequestError(
                "Expected `thinking` or `redacted_thinking`, but found `text`. When "
                "thinking is enabled, a final assistant message must start with a thinking block"
            )
        self.check_breakpoints(body)

    @staticmethod
    def check_server_tools(blocks: list[Json]) -> None:
        """A `server_tool_use` is answered by its result later in the same assistant turn."""
        for k, b in enumerate(blocks):
            if b.get("type") != "server_tool_use":
                continue
            later = blocks[k + 1 :]
            if not any(
                x.get("type", "").endswith("_tool_result") and x.get("tool_use_id") == b.get("id")
                for x in later
            ):
                raise InvalidRequestError(
                    f"server_tool_use {b.get('id')} was found without its result block"
                )
        for k, b in enumerate(blocks):
            kind = b.get("type", "")
            if kind.endswith("_tool_result") and kind != "tool_result":
                earlier = {x.get("id") for x in blocks[:k] if x.get("type") == "server_tool_use"}
                if b.get("tool_use_id") not in earlier:
                    raise InvalidRequestError(f"{kind} answers no server_tool_use before it")

    def check_breakpoints(self, body: Json) -> None:
        marks = [ttl for _, ttl in self.breakpoints(body)]
        if body.get("cache_control"):
            marks.append(_TTL.get(body["cache_control"].get("ttl", "5m"), 300))
        if len(marks) > 4:
            raise InvalidRequestError(
                f"A maximum of 4 blocks with cache_control may be provided. Found {len(marks)}."
            )
        if any(a < b for a, b in itertools.pairwise(marks)):
            raise InvalidRequestError(
                "a ttl='1h' cache_control block must not come after a ttl='5m' one"
            )
        for m in body["messages"]:
            content = m["content"] if isinstance(m["content"], list) else []
            for b in content:
                if b.get("type") in ("thinking", "redacted_thinking") and "cache_control" in b:
                    raise InvalidRequestError("thinking blocks cannot carry cache_control")

    def blocks(self, body: Json) -> list[Json]:
        """Every block in render order (tools, system, messages), without cache_control."""
        out: list[Json] = []
        out.extend(body.get("tools") or [])
        system = body.get("system")
        if isinstance(system, str):
            out.append({"type": "text", "text": system})
        elif isinstance(system, list):
            out.extend(system)
        for m in body["messages"]:
            content = m["content"]
            if isinstance(content, str):
                out.append({"role": m["role"], "type": "text", "text": content})
            else:
                out.extend({"role": m["role"], **b} for b in content)
        return out

    def breakpoints(self, body: Json) -> list[tuple[int, int]]:
        """(block index, ttl seconds) of every breakpoint, in render order."""
        found = []
        for i, b in enumerate(self.blocks(body)):
            marked = b.get("cache_control")
            if isinstance(b.get("content"), list):
                marked = marked or next(
                    (x.get("cache_control") for x in b["content"] if x.get("cache_control")), None
                )
            if marked:
                found.append((i, _TTL.get(marked.get("ttl", "5m"), 300)))
        return found

    def prompt_tokens(self, body: Json) -> int:
        return sum(self.tokens(_clean(b)) for b in self.blocks(body))

    def tokens(self, block: Json) -> int:
        """A block's count, an uploaded file it names included (as the real API counts it)."""
        source = block.get("source")
        named = source.get("file_id") if isinstance(source, dict) else None
        return true_tokens(block) + true_tokens(self.files.get(str(named), None))

    def usage(self, body: Json) -> Json:
        blocks = [_clean(b) for b in self.blocks(body)]
        cum, keys, total = [], [], 0
        digest = hashlib.sha256()
        for b in blocks:
            digest.update(json.dumps(b, sort_keys=True).encode())
            total += self.tokens(b)
            cum.append(total)
            keys.append(digest.hexdigest())
        points = [i for i, _ in self.breakpoints(body)]
        if body.get("cache_control") and blocks:
            points.append(len(blocks) - 1)
        read = 0
        for p in points:
            for q in range(p, max(-1, p - _LOOKBACK), -1):
                if keys[q] in self.cache:
                    read = max(read, cum[q])
                    break
        written = 0
        for p in points:
            if cum[p] >= _MIN_CACHE:
                self.cache[keys[p]] = cum[p]
                written = max(written, cum[p])
        creation = max(0, written - read)
        return {
            "input_tokens": total - read - creation,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
            "output_tokens": 0,
        }

    def output(self, body: Json) -> list[Json]:
        self.counter += 1
        if self.replies:
            return self.replies.pop(0)(body)["content"]
        blocks = []
        if self.thinking_replies and body.get("thinking"):
            blocks.append(self.thinking(f"thinking {self.counter}"))
        blocks.append({"type": "text", "text": "Done."})
        return blocks

    def thinking(self, text: str) -> Json:
        return {"type": "thinking", "thinking": text, "signature": sign(text)}

    def redacted_thinking(self) -> Json:
        data = f"redacted-{self.counter}-{len(self.redacted)}"
        self.redacted.add(data)
        return {"type": "redacted_thinking", "data": data}

    def events(self, message: Json) -> bytes:
        out = []

        def event(kind: str, data: Json) -> None:
            out.append(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n")

        usage = message["usage"]
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        event("message_start", {"message": start})
        for index, block in enumerate(message["content"]):
            kind = block["type"]
            if kind == "text":
                event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
                event(
                    "content_block_delta",
                    {"index": index, "delta": {"type": "text_delta", "text": block["text"]}},
                )
            elif kind == "thinking":
                event(
                    "content_block_start",
                    {
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    },
                )
                event(
                    "content_block_delta",
                    {
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": block["thinking"]},
                    },
                )
                event(
                    "content_block_delta",
                    {
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]},
                    },
                )
            elif kind == "tool_use":
                event(
                    "content_block_start", {"index": index, "content_block": {**block, "input": {}}}
                )
                event(
                    "content_block_delta",
                    {
                        "index": index,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(block["input"]),
                        },
                    },
                )
            else:
                event("content_block_start", {"index": index, "content_block": block})
            event("content_block_stop", {"index": index})
        event(
            "message_delta",
            {
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        event("message_stop", {})
        return "".join(out).encode()


def _clean(block: Json) -> Json:
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(out.get("content"), list):
        out["content"] = [
            {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
            for b in out["content"]
        ]
    return out
