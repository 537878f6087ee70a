from __future__ import annotations

from proxy.providers.base import Message, make_ref_id, ref_marker
from proxy.providers.trim import TrimProvider
from proxy.providers.uncompress import uncompress, uncompress_async
from tests.providers.build import agent_run, assistant, user
from tests.providers.tokens import count_tokens, make_config


def stand_in(originals: list[Message], role: str = "user") -> tuple[str, Message]:
    ref = make_ref_id(originals)
    return ref, {"role": role, "content": ref_marker(ref, len(originals), 10, "dropped")}


def test_a_ref_message_is_replaced_by_all_its_originals_in_order() -> None:
    originals = [user("a"), assistant("b"), user("c")]
    ref, msg = stand_in(originals)
    out = uncompress([msg, user("d")], {ref: originals})
    assert out.messages == [*originals, user("d")]
    assert (out.messages_expanded, out.messages_passthrough, out.missing_ids) == (1, 1, ())


def test_missing_ids_are_reported_and_the_message_kept() -> None:
    _, msg = stand_in([user("gone")])
    out = uncompress([msg], {})
    assert out.messages == [msg]
    assert out.messages_expanded == 0
    assert out.missing_ids == (make_ref_id([user("gone")]),)


def test_partly_found_refs_expand_what_exists_and_report_the_rest() -> None:
    a = [user("a")]
    ref_a, _ = stand_in(a)
    ref_b, _ = stand_in([user("b")])
    msg = user(f"{ref_marker(ref_a, 1, 1)} {ref_marker(ref_b, 1, 1)}")
    out = uncompress([msg], {ref_a: a})
    assert out.messages == a
    assert out.missing_ids == (ref_b,)


def test_one_layer_unless_recursive() -> None:
    inner_orig = [user("deep")]
    inner, inner_msg = stand_in(inner_orig)
    outer, outer_msg = stand_in([inner_msg, assistant("x")])
    verbatim = {inner: inner_orig, outer: [inner_msg, assistant("x")]}
    assert uncompress([outer_msg], verbatim).messages == [inner_msg, assistant("x")]
    deep = uncompress([outer_msg], verbatim, recursive=True)
    assert deep.messages == [*inner_orig, assistant("x")]
    assert deep.messages_expanded == 2


def test_circular_refs_end_when_a_ref_recurs_and_say_so() -> None:
    a, b = "aaaaaa0001", "bbbbbb0002"
    to_a, to_b = user(ref_marker(a, 1, 1)), user(ref_marker(b, 1, 1))
    out = uncompress([to_a], {a: [to_b], b: [to_a]}, recursive=True)
    assert out.messages == [to_a]
    assert out.messages_expanded == 2
    assert out.missing_ids == (a,)


def test_a_ref_standing_for_itself_is_left_alone_and_reported() -> None:
    loop = user(ref_marker("abcdef0123", 1, 1))
    out = uncompress([loop], {"abcdef0123": [loop]}, recursive=True)
    assert (out.messages, out.messages_expanded) == ([loop], 0)
    assert out.missing_ids == ("abcdef0123",)


def test_recursion_has_no_depth_limit() -> None:
    # 60 layers, each a summary of the previous one and one new message (what 60 compactions
    # of a conversation stored before refs were resolved to originals).
    verbatim: dict[str, list[Message]] = {}
    layer, originals = user("first"), [user("first")]
    for k in range(60):
        group = [layer, assistant(f"answer {k}")]
        originals.append(assistant(f"answer {k}"))
        ref, layer = stand_in(group)
        verbatim[ref] = group
    out = uncompress([layer], verbatim, recursive=True)
    assert out.messages == originals
    assert out.missing_ids == ()
    assert out.messages_expanded == 60


def test_a_quoted_marker_whose_originals_are_inside_another_refs_is_not_expanded_twice() -> None:
    # A store maps every ref to original messages, so a summary quoting an older marker carries
    # two known refs; the older one's originals are a run of the newer one's.
    older, newer = [user("a"), assistant("b")], [user("a"), assistant("b"), user("c")]
    old_ref, new_ref = make_ref_id(older), make_ref_id(newer)
    text = f"{ref_marker(new_ref, 3, 9)}\nSummary: earlier, {ref_marker(old_ref, 2, 5)}"
    same = f"{ref_marker(new_ref, 2, 9)} quoting {ref_marker(old_ref, 2, 5)}"
    found = {old_ref: older, new_ref: newer, "abcdef0011": older}
    assert uncompress([user(text)], found).messages == newer
    both = uncompress([user(same)], {old_ref: older, new_ref: older})
    assert both.messages == older
    # Two refs for different runs are both restored, in order.
    pair = user(f"{ref_marker(old_ref, 2, 5)} {ref_marker('abcdef0022', 1, 1)}")
    out = uncompress([pair], {old_ref: older, "abcdef0022": [user("z")]})
    assert out.messages == [*older, user("z")]


def test_a_lookup_function_is_called_once_per_round_with_every_id() -> None:
    originals = {f"{i:010x}": [user(f"m{i}")] for i in range(3)}
    msgs = [user(ref_marker(r, 1, 1)) for r in originals]
    calls: list[list[str]] = []

    def lookup(ids: list[str]) -> dict[str, list[Message]]:
        calls.append(ids)
        return {i: originals[i] for i in ids}

    out = uncompress(msgs, lookup)
    assert calls == [list(originals)]
    assert out.messages == [user("m0"), user("m1"), user("m2")]


async def test_async_lookup_restores_a_trimmed_agent_run_exactly() -> None:
    msgs = agent_run(15)
    result = TrimProvider().compress(msgs, make_config(limit=count_tokens(msgs) // 4))
    assert result.messages != msgs

    async def lookup(ids: list[str]) -> dict[str, list[Message]]:
        return {i: result.verbatim[i] for i in ids if i in result.verbatim}

    out = await uncompress_async(result.messages, lookup, recursive=True)
    assert out.messages == msgs
    assert out.missing_ids == ()
