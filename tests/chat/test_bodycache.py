"""The body cache parses every body exactly as orjson.loads does, reusing what it can."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from proxy.chat import bodycache
from proxy.chat.bodycache import BodyCache
from proxy.runtime.digest import RollingPrefixes, prefix_digests

TRICKY = ['"messages": [', "]", '],"model":"x"}', ",{", "\\", '"', "é", "\u2028", "}]}"]


def text(i: int, size: int = 3000) -> str:
    return (f"line {i} " + TRICKY[i % len(TRICKY)] + " ") * (size // 20)


def conversation(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(n):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text(i)})
    return msgs


DUMPERS = {
    "compact": lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False).encode(),
    "spaced": lambda b: json.dumps(b).encode(),
    "indented": lambda b: json.dumps(b, indent=2).encode(),
    "orjson": orjson.dumps,
}


@pytest.mark.parametrize("dump", DUMPERS.values(), ids=DUMPERS.keys())
@pytest.mark.parametrize("order", ["messages-first", "messages-last", "messages-middle"])
def test_a_growing_conversation_parses_as_a_whole_parse_would_and_reuses_its_past(
    dump: Any, order: str
) -> None:
    cache = BodyCache()
    fields = {"model": "gpt-4.1", "tools": [{"type": "function", "function": {"name": "f"}}]}
    for turn in range(30, 60):
        msgs = conversation(turn)
        if order == "messages-first":
            body = {"messages": msgs, **fields}
        elif order == "messages-last":
            body = {**fields, "messages": msgs}
        else:
            body = {"model": "gpt-4.1", "messages": msgs, "max_tokens": turn}  # tail changes
        raw = dump(body)
        parsed = cache.parse(raw)
        assert parsed == orjson.loads(raw)
        assert list(parsed) == list(body)  # key order kept (a rewrite re-serializes it)
    assert cache.misses == 1  # the first turn only
    assert cache.hits == 29


def test_reused_messages_are_the_same_objects_as_last_turn() -> None:
    cache = BodyCache()
    first = cache.parse(orjson.dumps({"model": "m", "messages": conversation(40)}))
    second = cache.parse(orjson.dumps({"model": "m", "messages": conversation(41)}))

    assert all(a is b for a, b in zip(first["messages"], second["messages"], strict=False))
    assert second["messages"] is not first["messages"]


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.__setitem__(5, {"role": "user", "content": "edited"}),  # an edit
        lambda m: m.pop(),  # a regenerate: one message fewer
        lambda m: m.__setitem__(-1, {**m[-1], "content": m[-1]["content"] + "!"}),
        lambda m: m.insert(1, {"role": "user", "content": "inserted"}),
    ],
)
def test_an_edited_history_is_parsed_whole(change: Any) -> None:
    cache = BodyCache()
    msgs = conversation(40)
    cache.parse(orjson.dumps({"model": "m", "messages": msgs}))
    changed = list(msgs)
    change(changed)
    raw = orjson.dumps({"model": "m", "messages": changed})

    assert cache.parse(raw) == orjson.loads(raw)


def test_bodies_that_are_not_what_they_seem_are_parsed_whole() -> None:
    cache = BodyCache()
    base = orjson.dumps({"model": "m", "messages": conversation(40)})
    cache.parse(base)
    # Same prefix, then something that is not a next message; then a duplicate messages key.
    for raw in (
        base[:-2] + b',"x"]}',
        base[:-2] + b",{}]",
        base[:-1] + b',"messages":[]}',
        base[:-2] + b',{"role":"user","content":"a"}],"messages":[]}',
    ):
        try:
            expected = orjson.loads(raw)
        except orjson.JSONDecodeError:
            with pytest.raises(orjson.JSONDecodeError):
                cache.parse(raw)
            continue
        assert cache.parse(raw) == expected


def test_small_bodies_skip_the_cache_and_memory_is_bounded() -> None:
    cache = BodyCache(max_bytes=300_000)
    small = orjson.dumps({"model": "m", "messages": conversation(2)})
    assert len(small) < bodycache.MIN_BYTES
    cache.parse(small)
    for c in range(10):  # ten conversations of ~100 KB, each seen once
        cache.parse(orjson.dumps({"model": f"m{c}", "messages": conversation(35)}))

    assert cache.hits == 0
    assert cache._bytes <= 300_000


@given(
    turns=st.lists(
        st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=40)}
            ),
            max_size=3,
        ),
        min_size=1,
        max_size=8,
    ),
    dump=st.sampled_from(list(DUMPERS.values())),
    tail=st.dictionaries(st.sampled_from(["model", "n", "stop"]), st.text(max_size=5), max_size=2),
)
@example(turns=[[{"role": "user", "content": "]"}]], dump=orjson.dumps, tail={})
def test_any_sequence_of_growing_bodies_parses_exactly(
    turns: list[list[dict[str, str]]], dump: Any, tail: dict[str, str]
) -> None:
    cache = BodyCache()
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "x" * bodycache.MIN_BYTES}]
    for added in turns:
        msgs = msgs + added
        raw = dump({"messages": msgs, **tail})
        assert cache.parse(raw) == orjson.loads(raw)


def test_digests_and_prefix_digests_are_computed_once_per_message_across_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = BodyCache()
    computed: list[object] = []
    real = bodycache.message_digest
    extend = RollingPrefixes.extend
    prefixed: list[int] = []

    def counting(message: Any) -> str:
        computed.append(message)
        return real(message)

    def counting_prefixes(self: RollingPrefixes, digests: Any) -> None:
        digests = list(digests)
        prefixed.append(len(digests))
        extend(self, digests)

    monkeypatch.setattr(bodycache, "message_digest", counting)
    monkeypatch.setattr(RollingPrefixes, "extend", counting_prefixes)
    per_turn = []
    # A conversation growing, a turn resent as is, then a branch from an earlier turn.
    for turn in (40, 41, 41, 42, 38):
        msgs = cache.parse(orjson.dumps({"model": "m", "messages": conversation(turn)}))["messages"]
        digests = cache.digests(msgs)
        assert digests == [real(m) for m in msgs]
        got = cache.prefixes(msgs, digests)
        per_turn.append(sum(prefixed))
        assert got == prefix_digests(digests)
        prefixed.clear()
    unrelated = conversation(3)
    digests = cache.digests(unrelated)
    assert digests == [real(m) for m in unrelated]
    assert cache.prefixes(unrelated, digests) == prefix_digests(digests)

    # Each message of the conversation once, the branch (the first messages of the body it
    # was cut back from) not at all, then the others; each new message's prefix once likewise.
    assert len(computed) == 43 + 4
    assert per_turn == [41, 1, 0, 1, 0]


async def test_long_conversations_through_the_proxy_compact_replay_and_restore_exactly(
    upstream: Any, make_proxy: Any
) -> None:
    """Bodies over MIN_BYTES take the cache's path turn after turn; a provider that changed a
    shared message would show as a wrong forward or restore on a later turn."""
    import httpx

    fake, base = upstream
    key = {"authorization": "Bearer sk-long"}
    sent: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    store = {"timeout_ms": 3000}  # a busy machine must not make every turn fail open
    async with make_proxy(base, store=store, default_policy={"budget_tokens": 6000}) as url:
        async with httpx.AsyncClient() as http:
            for turn in range(34, 44):
                msgs = conversation(turn)
                raw = orjson.dumps({"model": "gpt-4o", "messages": msgs})
                assert len(raw) > bodycache.MIN_BYTES
                r = await http.post(f"{url}/v1/chat/completions", content=raw, headers=key)
                assert r.status_code == 200
                sent.append((msgs, fake.last.json()["messages"]))
            restored = [
                (
                    await http.post(
                        f"{url}/compactd/v1/uncompress",
                        json={"messages": fwd, "recursive": True},
                        headers=key,
                    )
                ).json()
                for _, fwd in sent
            ]

    assert any(fwd != msgs for msgs, fwd in sent)  # compacted
    for (msgs, _), back in zip(sent, restored, strict=True):
        assert back["missing_ids"] == []
        assert back["messages"] == msgs


async def test_counts_of_a_growing_conversation_count_only_new_messages() -> None:
    from proxy.tokens.counter import TokenCounter
    from proxy.tokens.encodings import load_encoding

    cache = BodyCache()
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=0)  # no per-message cache
    fresh = TokenCounter(load_encoding("o200k_base"), cache_size=0)
    counted: list[object] = []
    real = counter._message

    def spy(message: Any) -> int:
        counted.append(message)
        return real(message)

    counter._message = spy  # type: ignore[method-assign]
    totals = []
    for turn in (40, 41, 41, 43):
        msgs = cache.parse(orjson.dumps({"model": "m", "messages": conversation(turn)}))["messages"]
        totals.append(
            (await cache.count(msgs, counter, in_thread=True), fresh.count_messages(msgs))
        )

    assert all(got == expected for got, expected in totals)
    assert len(counted) == 41 + 1 + 0 + 2  # each message once over the four turns


async def test_what_the_messages_after_a_point_cost_comes_from_the_running_totals() -> None:
    from proxy.tokens.counter import REPLY_PRIMING, TokenCounter
    from proxy.tokens.encodings import load_encoding

    cache = BodyCache()
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=1000)
    fresh = TokenCounter(load_encoding("o200k_base"), cache_size=0)
    for turn, resent in ((40, False), (43, False), (43, True)):
        msgs = cache.parse(orjson.dumps({"model": "m", "messages": conversation(turn)}))["messages"]
        # Known before counting only for a body sent again (its totals are carried over).
        assert (cache.tokens_from(msgs, "o200k_base", 0) is not None) is resent
        total = await cache.count(msgs, counter, in_thread=False)

        assert total == fresh.count_messages(msgs)
        for start in (0, 1, 17, len(msgs)):
            expected = fresh.count_messages(msgs[start:]) - REPLY_PRIMING
            assert cache.tokens_from(msgs, "o200k_base", start) == expected
        assert cache.tokens_from(msgs, "cl100k_base", 1) is None  # counted with o200k only
        assert cache.tokens_from(list(msgs), "o200k_base", 1) is None  # another list


WIDE = 2**64
"""The first integer orjson reads as a float."""


# (orjson cannot write such an integer: a client's JSON library can.)
@pytest.mark.parametrize("dump", [DUMPERS[k] for k in ("compact", "spaced", "indented")])
@pytest.mark.parametrize("where", ["new-message", "field-after-the-array", "field-before"])
def test_a_wide_integer_is_found_in_the_bytes_a_turn_adds_as_in_a_whole_body(
    dump: Any, where: str
) -> None:
    cache = BodyCache()
    wide_turn = 45
    for turn in range(40, 50):
        msgs = conversation(turn)
        tail: dict[str, Any] = {"max_tokens": 100}
        head: dict[str, Any] = {"model": "gpt-4.1", "seed": 7}
        if turn >= wide_turn and where == "new-message":
            # The message the wide turn added (then kept by every later turn).
            msgs[wide_turn] = {**msgs[wide_turn], "n": [WIDE, -(2**63) - 1]}
        if turn == wide_turn and where == "field-after-the-array":
            tail["seed"] = WIDE
        if turn >= wide_turn and where == "field-before":
            head["seed"] = WIDE
        raw = dump({**head, "messages": msgs, **tail})
        parsed = cache.parse(raw)
        assert cache.holds_wide_int(parsed["messages"], raw) is (
            turn == wide_turn if where == "field-after-the-array" else turn >= wide_turn
        )
    if where == "new-message":  # found in the bytes the turn added: every turn extended
        assert cache.hits == 9


def test_a_long_run_of_digits_in_a_string_is_no_wide_integer_turn_after_turn() -> None:
    cache = BodyCache()
    for turn in range(40, 45):
        msgs = conversation(turn)
        msgs[1] = {**msgs[1], "content": "order 123456789012345678901234567890 shipped"}
        raw = orjson.dumps({"model": "gpt-4.1", "messages": msgs})
        assert cache.holds_wide_int(cache.parse(raw)["messages"], raw) is False


def test_a_turn_extending_a_checked_body_is_known_narrow_when_it_is_read() -> None:
    cache = BodyCache()
    raws = [orjson.dumps({"model": "gpt-4.1", "messages": conversation(t)}) for t in (40, 41)]
    first = cache.parse(raws[0])
    assert not cache.narrow(first["messages"], raws[0])  # never looked at yet
    assert cache.holds_wide_int(first["messages"], raws[0]) is False
    second = cache.parse(raws[1])
    # Known at once, from the bytes the turn added: a concurrent turn that supersedes this
    # entry before the request's decision cannot make it scan the whole body.
    assert cache.narrow(second["messages"], raws[1])
    digits = {**conversation(42)[-1], "content": "id 123456789012345678901234567890"}
    third_raw = orjson.dumps({"model": "gpt-4.1", "messages": [*conversation(41), digits]})
    third = cache.parse(third_raw)
    assert not cache.narrow(third["messages"], third_raw)  # a long run of digits is new
    assert cache.holds_wide_int(third["messages"], third_raw) is False  # in a string


@given(
    marked=st.integers(0, 4),
    dump=st.sampled_from(list(DUMPERS)),
    growth=st.lists(st.integers(0, 3), min_size=2, max_size=6),
)
def test_a_history_whose_newest_messages_change_reuses_the_ones_before(
    marked: int, dump: str, growth: list[int]
) -> None:
    """A client that moves its cache breakpoints onto its newest messages every turn (Claude
    Code marks the last two) changes the previous body's last messages: the body still parses
    as orjson.loads does, and the messages before them are last turn's objects."""
    cache = BodyCache()
    msgs = conversation(30)
    previous = None
    for added in growth:
        msgs = [*msgs, *conversation(len(msgs) + added)[len(msgs) :]]
        sent = [dict(m) for m in msgs]
        for m in sent[len(sent) - marked :] if marked else []:
            m["content"] = [{"type": "text", "text": m["content"], "cache_control": {"t": 1}}]
        raw = DUMPERS[dump]({"model": "m", "messages": sent, "tools": [{"name": "f"}]})
        parsed = cache.parse(raw)
        assert parsed == orjson.loads(raw)
        if previous is not None:
            shared = len(previous) - marked
            assert all(a is b for a, b in zip(parsed["messages"][:shared], previous, strict=False))
        previous = parsed["messages"]
    assert cache.misses == 1
