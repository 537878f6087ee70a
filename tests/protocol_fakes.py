"""The fake upstreams with the agents' newest protocol items, as each API documents them.

Responses (OpenAI):
- a `compaction_trigger` item "compacts the current context" and "must be the final input
  item": anywhere else, or twice, is a 400; the answer's output is exactly one `compaction`
  item (opaque `encrypted_content`, refused later unless resent exactly as issued);
- `context_management: [{"type": "compaction", "compact_threshold": N}]`: over N input tokens
  the output starts with a `compaction` item.

Messages (Anthropic, beta `compact-2026-01-12`):
- `context_management.edits` needs its beta header (else a 400);
- a `compact_20260112` edit whose `trigger` the input exceeds answers with a `compaction` block
  first (a summary and a signature over it, to be sent back verbatim: a changed one is a 400),
  then the reply (`stop_reason: "compaction"` with `pause_after_compaction`);
- every block before the last compaction block is dropped before the count and the model;
- `count_tokens` counts what the model would read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.api_fakes import FakeMessages, FakeResponses, InvalidRequestError, sign, true_tokens

Json = dict[str, Any]
TRIGGER = "compaction_trigger"


@dataclass
class CompactingResponses(FakeResponses):
    """The Responses fake with `compaction_trigger` and server-side `context_management`."""

    compactions: list[Json] = field(default_factory=list)
    """Every compaction item issued, in order."""

    def validate(self, body: Json) -> None:
        super().validate(body)
        items = body.get("input")
        if not isinstance(items, list):
            return
        triggers = [i for i, it in enumerate(items) if it.get("type") == TRIGGER]
        if triggers and triggers != [len(items) - 1]:
            raise InvalidRequestError("compaction_trigger must be the final input item.")
        for entry in body.get("context_management") or []:
            if entry.get("type") != "compaction":
                raise InvalidRequestError(f"unknown context_management type {entry.get('type')}")

    def output(self, body: Json) -> list[Json]:
        items = body.get("input")
        if isinstance(items, list) and items and items[-1].get("type") == TRIGGER:
            self.counter += 1
            return [self.issue()]
        threshold = next(
            (
                e.get("compact_threshold")
                for e in body.get("context_management") or []
                if e.get("type") == "compaction"
            ),
            None,
        )
        out = super().output(body)
        if isinstance(threshold, int) and true_tokens(items) > threshold:
            return [self.issue(), *out]
        return out

    def issue(self) -> Json:
        item = self.compaction()
        self.compactions.append(item)
        return item


COMPACT_BETA = "compact-2026-01-12"


def compaction_block(summary: str) -> Json:
    """A compaction block as the API issues it: the summary and its signature."""
    return {"type": "compaction", "content": summary, "signature": sign("compaction:" + summary)}


def _after_last_compaction(messages: list[Json]) -> list[Json]:
    """The messages the model reads: the API drops every block before the last compaction."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if not isinstance(content, list):
            continue
        for k in range(len(content) - 1, -1, -1):
            if content[k].get("type") == "compaction":
                return [{**messages[i], "content": content[k:]}, *messages[i + 1 :]]
    return messages


@dataclass
class CompactingMessages(FakeMessages):
    """The Messages fake with `context_management` and compaction blocks."""

    compactions: list[Json] = field(default_factory=list)
    """Every compaction block issued, in order."""
    applied: list[Json] = field(default_factory=list)
    """The `context_management` of every request that carried one, as received."""

    def answer(self, req: Any) -> tuple[int, bytes, bool]:
        body = req.json() if req.method == "POST" and req.path.startswith("/v1/messages") else {}
        if body.get("context_management"):
            betas = (req.header("anthropic-beta") or "").split(",")
            if COMPACT_BETA not in [b.strip() for b in betas]:
                error = {"type": "invalid_request_error", "message": "context_management: beta"}
                self.refused.append(error["message"])
                return 400, json.dumps({"type": "error", "error": error}).encode(), False
            self.applied.append(body["context_management"])
        return super().answer(req)

    def validate(self, body: Json) -> None:
        super().validate(body)
        for m in body.get("messages") or []:
            for b in m["content"] if isinstance(m["content"], list) else []:
                if b.get("type") == "compaction" and b.get("signature") != sign(
                    "compaction:" + str(b.get("content"))
                ):
                    raise InvalidRequestError("Invalid signature in compaction block")

    def blocks(self, body: Json) -> list[Json]:
        return super().blocks({**body, "messages": _after_last_compaction(body["messages"])})

    def output(self, body: Json) -> list[Json]:
        edit = _compact_edit(body)
        content = super().output(body)
        if edit is None:
            return content
        trigger = (edit.get("trigger") or {}).get("value", 150_000)
        if self.prompt_tokens(body) <= trigger:
            return content
        block = compaction_block(f"Summary {len(self.compactions)}: fixed the tests in src/.")
        self.compactions.append(block)
        return [block] if edit.get("pause_after_compaction") else [block, *content]

    def reply(self, body: Json, reply: Json) -> tuple[int, bytes, bool]:
        if body.get("context_management"):
            reply = {**reply, "context_management": {"applied_edits": []}}
            if reply["content"] and reply["content"][-1].get("type") == "compaction":
                reply["stop_reason"] = "compaction"
        return super().reply(body, reply)


def _compact_edit(body: Json) -> Json | None:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, dict) else None
    return next((e for e in edits or [] if e.get("type") == "compact_20260112"), None)
