"""The lossless tier: information-preserving forms, the same bytes on every turn, exact restores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.session_replay import message_spans as message_spans_of
from proxy.chat.checkpoint import restore
from proxy.chat.lossless import LosslessTier, clean_text, collapse_runs, minify_json
from proxy.errors import StoreError
from proxy.runtime.digest import message_digest
from tests.inprocess import running

Message = dict[str, Any]
PRETTY = json.dumps({"flights": [{"id": f"HAT{i:03}", "seats": i} for i in range(40)]}, indent=2)


def forms(messages: list[Message]) -> list[Message]:
    return LosslessTier().apply(messages, [message_digest(m) for m in messages]).messages


def test_pretty_json_is_minified_to_the_same_value() -> None:
    out = minify_json(PRETTY)
    assert out is not None
    assert json.loads(out) == json.loads(PRETTY)
    assert len(out) < len(PRETTY)
    assert minify_json(out) is None  # already minified: left as it is


def test_json_that_would_not_read_back_the_same_is_left_alone() -> None:
    assert minify_json('{\n  "a": 1,\n  "a": 2\n}') is None  # duplicate keys
    assert minify_json('{\n  "x": NaN\n}') is None
    assert minify_json("[1, 2, oops]") is None
    assert minify_json("plain text, with commas") is None


def test_ansi_trailing_whitespace_and_runs() -> None:
    text = "\x1b[31mERROR\x1b[0m   \nok\t\nsame\nsame\nsame\nsame\nend\n\n\n"
    assert clean_text(text) == "ERROR\nok\nsame\n[the line above repeated 3 more times]\nend\n\n\n"
    assert collapse_runs("a\na\nb") == "a\na\nb"  # two in a row stay


def test_only_tool_results_and_call_arguments_are_rewritten() -> None:
    pretty_args = json.dumps({"q": "x", "n": 1}, indent=2)
    messages: list[Message] = [
        {"role": "system", "content": PRETTY},
        {"role": "user", "content": PRETTY + "   "},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": pretty_args},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": PRETTY},
        {"role": "tool", "tool_call_id": "c2", "content": PRETTY},
    ]
    out = forms(messages)
    assert out[:2] == messages[:2]
    assert out[2]["tool_calls"][0]["function"]["arguments"] == '{"q":"x","n":1}'
    assert out[3]["content"] == minify_json(PRETTY)
    assert out[4]["content"].startswith("[compactd:ref=")
    assert out[4]["content"].endswith("identical to the output of c1]")
    assert out[4]["tool_call_id"] == "c2"


_LINE = st.sampled_from(["same", "same  ", "\x1b[1mbold\x1b[0m", "", '{"a": 1}', "x"])
_TEXT = st.one_of(
    st.lists(_LINE, max_size=8).map("\n".join),
    st.just(PRETTY),
    st.just(PRETTY.replace("  ", "    ")),
)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "agent"}]
    for k in range(draw(st.integers(1, 6))):
        messages.append({"role": "user", "content": draw(_TEXT)})
        call = {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": draw(_TEXT)})
    return messages


@settings(max_examples=60, deadline=None)
@given(conversations(), st.data())
def test_a_message_has_the_same_form_on_every_turn(messages: list[Message], data: Any) -> None:
    """Forms depend only on the message and those before it: a later turn keeps every form."""
    tier = LosslessTier()
    cut = data.draw(st.integers(1, len(messages)))
    digests = [message_digest(m) for m in messages]
    full = tier.apply(messages, digests)
    early = LosslessTier().apply(messages[:cut], digests[:cut])
    assert early.messages == full.messages[:cut]
    assert json.dumps(early.messages) == json.dumps(full.messages[:cut])
    # Every rewrite maps back to exactly the client's message.
    for form, ref, original in zip(full.messages, full.refs, messages, strict=True):
        if ref is None:
            assert form is original
        else:
            assert full.originals[ref] == original


def agent_turn(k: int) -> list[Message]:
    call = f"call_{k}"
    args = json.dumps({"path": f"src/mod{k}.py"}, indent=2)
    return [
        {"role": "user", "content": f"Step {k}: read src/mod{k}.py " + "please now " * 20},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "read", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": PRETTY if k % 2 else f"out {k}  \n" * 60},
        {"role": "assistant", "content": f"Done with step {k}. " + "all good " * 20},
    ]


async def test_lossless_under_the_trigger_saves_tokens_and_keeps_the_cache(tmp_path: Path) -> None:
    async with running(tmp_path, default_policy={"lossless": True}) as proxy:
        messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
        previous: list[bytes] = []
        for k in range(6):
            messages += agent_turn(k)
            r = await proxy.chat({"model": "gpt-4o", "messages": messages})
            assert r.headers["x-compactd-action"] == "lossless"
            assert r.headers["x-compactd-provider"] == "lossless"
            assert int(r.headers["x-compactd-tokens-after"]) < int(
                r.headers["x-compactd-tokens-before"]
            )
            spans = message_spans_of(proxy.upstream.last.content)
            assert spans[: len(previous)] == previous  # byte-identical prefix, turn after turn
            previous = spans
        sent = proxy.upstream.last_json()["messages"]
    assert sent[3]["content"] == "out 0\n[the line above repeated 59 more times]\n"
    assert sent[7]["content"] == minify_json(PRETTY)


async def test_forms_inside_compactions_restore_exactly_and_keep_their_bytes(
    tmp_path: Path,
) -> None:
    """Over the trigger the chain works on the forms: a form it keeps goes out as before, and
    a restore gives back the client's own messages, whatever happened to their forms."""
    policy = {"default_policy": {"lossless": True, "budget_tokens": 1200}}
    async with running(tmp_path, **policy) as proxy:
        messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
        actions = []
        sent_forms: dict[str, bytes] = {}
        for k in range(14):
            messages += agent_turn(k)
            r = await proxy.chat({"model": "gpt-4o", "messages": messages})
            actions.append(r.headers["x-compactd-action"])
            assert "lossless" in r.headers["x-compactd-provider"]
            for span in message_spans_of(proxy.upstream.last.content):
                m = json.loads(span)
                if m.get("role") == "tool":  # a form goes out in one form only, ever
                    assert sent_forms.setdefault(m["tool_call_id"], span) == span or (
                        "[compactd:ref=" in m["content"]
                    )
        info = await proxy.services.store.get_conversation(None, proxy.conversations[-1])
    assert "compacted" in actions
    restored = restore(info) if info is not None else None
    assert restored is not None
    exact = json.dumps(messages[: restored.checkpoint.covered_through + 1])
    assert (restored.missing_ids, json.dumps(restored.messages)) == ([], exact)


async def test_off_by_default_and_never_for_keyless_requests(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "s"}, *agent_turn(1)]
    async with running(tmp_path) as proxy:
        r = await proxy.chat({"model": "gpt-4o", "messages": messages})
        assert r.headers["x-compactd-action"] == "passthrough"
    async with running(tmp_path / "b", default_policy={"lossless": True}) as proxy:
        raw = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
        r = await proxy.client.post("/v1/chat/completions", content=raw)
        assert r.headers["x-compactd-action"] == "passthrough"
        assert proxy.upstream.last.content == raw


async def test_every_form_sent_is_stored_first_and_its_refs_resolve(tmp_path: Path) -> None:
    """Under the trigger no checkpoint is made, yet the originals of the forms are stored
    before they go out (once per form): a repeated output's ref resolves through uncompress,
    and the conversation holds every rewritten message as the client sent it."""
    repeated = "\n".join(f"row {i}: ok" for i in range(40))
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    async with running(tmp_path, default_policy={"lossless": True}) as proxy:
        for k in range(3):
            messages += agent_turn(k)
            messages.append({"role": "user", "content": f"and again {k}"})
            call = f"again_{k}"
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": "ls", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call, "content": repeated},
            ]
            r = await proxy.chat({"model": "gpt-4o", "messages": messages})
            assert r.headers["x-compactd-action"] == "lossless"
        writes = proxy.metric("compactd_store_seconds_count", op="save_originals")
        sent = proxy.upstream.last_json()["messages"]
        assert "[compactd:ref=" in sent[-1]["content"]
        restored = await proxy.uncompress(sent)
        info = await proxy.services.store.get_conversation(None, proxy.conversations[-1])
    assert restored.json()["missing_ids"] == []
    assert restored.json()["messages"][-1] == messages[-1]
    assert writes == 3  # one write per turn: only the forms that were new
    assert info is not None
    assert info.checkpoints == []
    rewritten = [m for m, f in zip(messages, sent, strict=True) if m != f]
    assert sorted(map(json.dumps, info.originals.values())) == sorted(map(json.dumps, rewritten))


async def test_a_form_is_not_sent_when_its_original_cannot_be_stored(tmp_path: Path) -> None:
    messages: list[Message] = [{"role": "system", "content": "s"}, *agent_turn(1)]
    async with running(tmp_path, default_policy={"lossless": True}) as proxy:
        store = proxy.services.store

        async def down(*_: object, **__: object) -> None:
            raise StoreError("down")

        store.save_originals = down  # type: ignore[method-assign]
        raw = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
        r = await proxy.client.post(
            "/v1/chat/completions", content=raw, headers={"authorization": "Bearer sk-a"}
        )
    assert r.headers["x-compactd-action"] == "error"
    assert proxy.upstream.last.content == raw
