"""A replayed Responses or Messages turn takes the fast path (the items new since the last turn
projected, the body spliced from the checkpoint's kept bytes) and sends exactly what the slow
path sends: the projection of the whole body, and `with_messages` rebuilding it, byte for byte.

Sessions grow as Claude Code's and Codex's do: tool calls and their results, thinking and
reasoning with encrypted content, unpaired calls, compaction blocks, cache breakpoints that
move onto the newest messages every turn, tools after the history; checkpoints are made of
stand-ins, rewritten messages and originals kept as they are.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from proxy.chat.bodycache import MIN_BYTES, BodyCache
from proxy.chat.splice import Splicer
from proxy.dialects.adapter import Adapter
from proxy.dialects.messages import MESSAGES
from proxy.dialects.projection import NATIVE
from proxy.dialects.responses import RESPONSES
from proxy.store.base import Checkpoint
from proxy.telemetry.metrics import Metrics
from tests.api_fakes import sign
from tests.dialects.harness import harness

Json = dict[str, Any]
TOOLS = [
    {
        "name": f"tool_{i}",
        "description": f"Run step {i} of the workflow [raw] on a path: " + "details " * 220,
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for i in range(40)
]


def _text(n: int, what: str) -> str:
    return f"{what} {n}: " + "output line from a tool, é \u2028 [x] " * 12


class Session(RuleBasedStateMachine):
    """One conversation of an API, sent turn after turn through one body cache."""

    api: Adapter = MESSAGES

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Json] = []
        self.n = 0
        self.bodies = BodyCache()
        self.splicer = Splicer(self.bodies, 1 << 24, Metrics())
        self.cp: Checkpoint | None = None
        self.marks_on_last = 2
        self.spliced = 0

    # --- what the client sends -----------------------------------------------------------

    def body(self) -> Json:
        raise NotImplementedError

    def _next(self) -> int:
        self.n += 1
        return self.n

    @initialize()
    def start(self) -> None:
        self.add_user_text()

    @rule(marks=st.integers(0, 3))
    def move_breakpoints(self, marks: int) -> None:
        self.marks_on_last = marks

    @rule(k=st.integers(1, 40), rewrite=st.booleans(), stand_in=st.booleans())
    def compact(self, k: int, rewrite: bool, stand_in: bool) -> None:
        """A checkpoint of the first projected messages: a stand-in for the oldest, maybe a
        rewritten one, the rest kept as they are."""
        current = self.api.messages(self.body())
        assert current is not None
        k = min(k, len(current) - 2)
        if k < 1:
            return
        kept = [dict(m) for m in current[: k + 1]]  # a store hands back copies
        start = 1 if stand_in else 0
        if rewrite:
            at = (start + k) // 2
            if NATIVE in kept[at] and isinstance(kept[at].get("content"), str):
                kept[at] = {**kept[at], "content": "shortened by a provider"}
        made = [{"role": "user", "content": f"[compacted ref r{self.n}]"}] if stand_in else []
        messages = [*made, *kept[start:]]
        self.cp = Checkpoint(
            "t", "c", "d", k, messages, ["trim"], 0.0, version=f"v{self._next()}:1"
        )

    @invariant()
    def replays_as_the_slow_path_does(self) -> None:
        body = self.body()
        raw = orjson.dumps(body)
        assert len(raw) > MIN_BYTES
        parsed = self.bodies.parse(raw)
        projected = asyncio.run(self.api.reader.read(parsed, self.bodies))
        whole = self.api.project(orjson.loads(raw))
        assert projected is not None
        assert whole is not None
        assert projected.messages == whole[0]
        assert projected.marks.per_message == whole[1].per_message
        if self.cp is None or self.cp.covered_through >= len(projected.messages) - 1:
            return
        rest = projected.messages[self.cp.covered_through + 1 :]
        sent = [*self.cp.messages, *rest]
        before = self.splicer.prefixes.hits + self.splicer.prefixes.misses
        fast = asyncio.run(self.splicer.native_body(self.api, parsed, sent, self.cp))
        self.spliced += self.splicer.prefixes.hits + self.splicer.prefixes.misses - before
        fresh = orjson.loads(raw)
        assert fast == self.api.with_messages(fresh, sent)

    def add_user_text(self) -> None:
        raise NotImplementedError


class MessagesSession(Session):
    """Claude Code's `/v1/messages` bodies: system blocks and tools with cache_control, the
    newest messages marked, tool results (with a reminder after them) answering tool_use."""

    api = MESSAGES

    def body(self) -> Json:
        messages = [dict(m) for m in self.items]
        for m in messages[-self.marks_on_last :] if self.marks_on_last else []:
            blocks = m["content"]
            if isinstance(blocks, list) and blocks and blocks[-1].get("type") != "thinking":
                m["content"] = [
                    *blocks[:-1],
                    {**blocks[-1], "cache_control": {"type": "ephemeral"}},
                ]
        tools = [*TOOLS[:-1], {**TOOLS[-1], "cache_control": {"type": "ephemeral"}}]
        system = [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ]
        return {"model": "claude-sonnet-4-5", "messages": messages, "system": system,
                "tools": tools, "metadata": {"user_id": "u"}, "max_tokens": 32000,
                "stream": True}  # fmt: skip

    @rule()
    def add_user_text(self) -> None:
        n = self._next()
        self.items.append({"role": "user", "content": [{"type": "text", "text": _text(n, "ask")}]})

    @rule(text=st.booleans())
    def add_assistant_text(self, text: bool) -> None:
        n = self._next()
        content: Any = _text(n, "answer") if text else [{"type": "text", "text": _text(n, "ok")}]
        self.items.append({"role": "assistant", "content": content})

    @rule(calls=st.integers(1, 3), answered=st.integers(0, 3), thinking=st.booleans(),
          reminder=st.booleans())  # fmt: skip
    def add_tool_turn(self, calls: int, answered: int, thinking: bool, reminder: bool) -> None:
        n = self._next()
        blocks: list[Json] = []
        if thinking:
            thought = _text(n, "think")
            blocks.append({"type": "thinking", "thinking": thought, "signature": sign(thought)})
        blocks.append({"type": "text", "text": f"Running {calls} tools ({n})."})
        ids = [f"toolu_{n}_{j}" for j in range(calls)]
        blocks += [
            {"type": "tool_use", "id": i, "name": "Bash", "input": {"command": f"ls {i}"}}
            for i in ids
        ]
        self.items.append({"role": "assistant", "content": blocks})
        results: list[Json] = [
            {"type": "tool_result", "tool_use_id": i, "content": _text(n, "result")}
            for i in ids[: min(answered, calls)]
        ]
        if reminder or not results:
            results.append({"type": "text", "text": f"<system-reminder>{n}</system-reminder>"})
        self.items.append({"role": "user", "content": results})

    @rule()
    def add_compaction_block(self) -> None:
        n = self._next()
        block = {"type": "compaction", "content": _text(n, "summary")}
        self.items.append({"role": "assistant", "content": [block]})


class ResponsesSession(Session):
    """Codex CLI's `/v1/responses` bodies: reasoning with encrypted content, function and
    custom tool calls with their outputs, assistant messages, references, compaction items."""

    api = RESPONSES

    def body(self) -> Json:
        items = [dict(i) for i in self.items]
        for item in items[-self.marks_on_last :] if self.marks_on_last else []:
            parts = item.get("content")
            if item.get("role") == "user" and isinstance(parts, list) and parts:
                mark = {"prompt_cache_breakpoint": {"type": "ephemeral"}}
                item["content"] = [*parts[:-1], {**parts[-1], **mark}]
        tools = [{"type": "function", "name": t["name"], "description": t["description"],
                  "strict": False, "parameters": t["input_schema"]} for t in TOOLS]  # fmt: skip
        return {"model": "gpt-5-codex", "instructions": "You are Codex.", "input": items,
                "tools": tools, "tool_choice": "auto", "parallel_tool_calls": False,
                "reasoning": {"effort": "medium"}, "store": False, "stream": True,
                "include": ["reasoning.encrypted_content"]}  # fmt: skip

    @rule()
    def add_user_text(self) -> None:
        n = self._next()
        part = {"type": "input_text", "text": _text(n, "ask")}
        self.items.append({"type": "message", "role": "user", "content": [part]})

    @rule()
    def add_assistant_text(self) -> None:
        n = self._next()
        part = {"type": "output_text", "text": _text(n, "answer"), "annotations": []}
        self.items.append({"type": "message", "role": "assistant", "content": [part]})

    @rule(reasoning=st.booleans(), custom=st.booleans(), answered=st.booleans())
    def add_tool_turn(self, reasoning: bool, custom: bool, answered: bool) -> None:
        n = self._next()
        if reasoning:
            self.items.append({"type": "reasoning", "id": f"rs_{n}",
                               "summary": [{"type": "summary_text", "text": f"plan {n}"}],
                               "encrypted_content": "gAAAAB" + "x" * 200})  # fmt: skip
        call = f"call_{n}"
        if custom:
            self.items.append({"type": "custom_tool_call", "call_id": call,
                               "name": "apply_patch", "input": f"*** patch {n}"})  # fmt: skip
            output = {"type": "custom_tool_call_output", "call_id": call}
        else:
            self.items.append({"type": "function_call", "call_id": call, "name": "shell",
                               "arguments": json.dumps({"command": ["ls", str(n)]})})  # fmt: skip
            output = {"type": "function_call_output", "call_id": call}
        if answered:
            self.items.append({**output, "output": _text(n, "result")})

    @rule()
    def add_reference(self) -> None:
        n = self._next()
        self.items.append({"type": "item_reference", "id": f"rs_ref{n}"})

    @rule()
    def add_compaction_item(self) -> None:
        n = self._next()
        self.items.append({"type": "compaction", "encrypted_content": f"gAAAA{n}" + "y" * 100})


SETTINGS = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)  # fmt: skip
TestMessagesReplays = SETTINGS(MessagesSession).TestCase
TestResponsesReplays = SETTINGS(ResponsesSession).TestCase


def _grown(session: Session, turns: int) -> list[Json]:
    """The bodies of `turns` turns of a session: a tool turn each, a question every fifth."""
    bodies = []
    for t in range(turns):
        if t % 5 == 0:
            session.add_user_text()
        if isinstance(session, MessagesSession):
            session.add_tool_turn(2, 2, t % 2 == 0, True)
        else:
            assert isinstance(session, ResponsesSession)
            session.add_tool_turn(True, t % 3 == 0, True)
        bodies.append(session.body())
    return bodies


def test_a_growing_session_projects_its_new_items_and_splices_every_replay() -> None:
    for session in (MessagesSession(), ResponsesSession()):
        session.start()
        previous = None
        for t, body in enumerate(_grown(session, 24)):
            if t == 8:
                session.compact(10, True, True)
            parsed = session.bodies.parse(orjson.dumps(body))
            projected = asyncio.run(session.api.reader.read(parsed, session.bodies))
            assert projected is not None
            if previous is not None:  # the first messages are last turn's: not projected again
                assert projected.messages[0] is previous.messages[0]
            previous = projected
            session.replays_as_the_slow_path_does()
        assert session.spliced >= 15, session.api.name


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_replayed_turns_through_the_proxy_send_what_the_slow_path_sends(
    tmp_path: Path, api: str
) -> None:
    """The same session through two proxies, one with the body and prefix caches off (every
    turn parsed, projected and rebuilt whole): the same bytes reach the upstream, turn after
    turn, and the fast one spliced its replays."""
    session: Session = MessagesSession() if api == "messages" else ResponsesSession()
    session.start()
    bodies = _grown(session, 40)
    sent: dict[str, list[bytes]] = {}
    actions: list[str] = []
    for name, caches in (("fast", {}), ("slow", {"body_cache_mb": 0, "prefix_cache_mb": 0})):
        policy = {"budget_tokens": 30_000 if api == "messages" else 12_000}
        async with harness(tmp_path / name, default_policy=policy, tokens=caches) as h:
            post = h.message if api == "messages" else h.create
            fake = h.messages if api == "messages" else h.responses
            sent[name] = []
            # Codex sends back the reasoning and compaction items the upstream issued.
            h.responses.issued |= {
                i["encrypted_content"] for b in bodies for i in b.get("input", []) if
                i.get("type") in ("reasoning", "compaction")
            }  # fmt: skip
            for body in bodies:
                r = await post(body, x_compactd_conversation_id="agent")
                assert r.status_code == 200, r.text
                sent[name].append(fake.last.body)
                if name == "fast":
                    actions.append(r.headers["x-compactd-action"])
            if name == "fast":
                assert h.metric("compactd_replay_prefix_total", result="hit") >= 10, actions
    assert actions.count("replayed") >= 15, actions
    assert sent["fast"] == sent["slow"]
