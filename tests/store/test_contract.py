"""The Store contract, run against Redis and SQLite alike."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.errors import StoreError, TenantMismatchError, UnreadableValueError
from proxy.providers import canonical
from proxy.runtime.digest import message_digest, prefix_digests
from proxy.store.base import Checkpoint, Compaction, UsageDelta, UsageRecord
from proxy.store.summary_cache import TenantSummaryCache
from tests.store.backends import Backend

TTL = 1000
A, B = "aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb"


def history(n: int, tag: str = "") -> list[dict[str, object]]:
    """n alternating user/assistant messages."""
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"message {i}{tag}"} for i in range(n)]


def compaction(
    tenant: str, conv: str, messages: list[dict[str, object]], k: int, label: str = "summary"
) -> Compaction:
    """A compaction of messages[0..k] into one summary message referring to them."""
    digests = [message_digest(m) for m in messages]
    ref = f"{k:04x}abcdef"
    cp = Checkpoint(
        tenant=tenant,
        conversation=conv,
        source_digest=prefix_digests(digests)[k],
        covered_through=k,
        messages=[{"role": "user", "content": f"[compactd:ref={ref} … {label}]"}],
        providers=["trim"],
        created_at=time.time(),
        tokens_before=1000,
        tokens_after=100,
    )
    originals = dict(zip(digests[: k + 1], messages[: k + 1], strict=True))
    return Compaction(cp, originals, {ref: digests[: k + 1]})


def prefixes(messages: list[dict[str, object]]) -> list[str]:
    return prefix_digests([message_digest(m) for m in messages])


async def test_find_returns_the_longest_matching_checkpoint(backend: Backend) -> None:
    msgs = history(12)
    for k in (3, 7, 5):
        await backend.store.save_compaction(compaction(A, "c1", msgs, k), TTL)

    found = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    shorter = await backend.store.find_checkpoint(A, "c1", prefixes(msgs[:7]))

    assert found is not None
    assert found.covered_through == 7
    assert shorter is not None
    assert shorter.covered_through == 5


async def test_a_fork_falls_back_to_the_checkpoint_before_the_first_changed_message(
    backend: Backend,
) -> None:
    msgs = history(12)
    for k in (3, 7):
        await backend.store.save_compaction(compaction(A, "c1", msgs, k), TTL)
    forked = [*msgs[:6], {"role": "assistant", "content": "edited"}, *msgs[7:]]

    found = await backend.store.find_checkpoint(A, "c1", prefixes(forked))
    edited_first = await backend.store.find_checkpoint(A, "c1", prefixes(history(12, "x")))

    assert found is not None
    assert found.covered_through == 3
    assert edited_first is None


async def test_find_in_an_unknown_conversation_returns_none(backend: Backend) -> None:
    assert await backend.store.find_checkpoint(A, "nobody", prefixes(history(3))) is None
    assert await backend.store.find_checkpoint(A, "nobody", []) is None


async def test_a_save_cut_short_half_way_leaves_nothing(backend: Backend) -> None:
    msgs = history(10)
    async with backend.failing_saves() as failing:
        with pytest.raises(StoreError):
            await failing.save_compaction(compaction(A, "c1", msgs, 6), TTL)

    assert await backend.store.find_checkpoint(A, "c1", prefixes(msgs)) is None
    assert await backend.store.get_conversation(A, "c1") is None
    assert await backend.store.resolve_refs(A, ["0006abcdef"]) == {}


async def test_a_save_returns_the_checkpoint_and_the_first_writer_wins(backend: Backend) -> None:
    msgs = history(10)
    first = compaction(A, "c1", msgs, 4, "first")
    second = compaction(A, "c1", msgs, 4, "second")
    second = Compaction(second.checkpoint, second.originals, {"ffffffffff": list(second.originals)})

    stored_first = await backend.store.save_compaction(first, TTL)
    stored_second = await backend.store.save_compaction(second, TTL)
    found = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))

    assert stored_first == first.checkpoint
    assert stored_second == first.checkpoint
    assert found == first.checkpoint
    assert set(await backend.store.resolve_refs(A, ["ffffffffff"])) == {"ffffffffff"}


async def test_a_checkpoint_found_again_is_decoded_again_only_if_its_stored_bytes_changed(
    backend: Backend,
) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5, "first"), TTL)
    first = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    again = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    # Purged, then compacted anew: another checkpoint under the same source digest.
    await backend.store.purge(A, "c1")
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5, "second"), TTL)
    rewritten = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    await backend.corrupt(A, "c1", "checkpoints", prefixes(msgs)[5])

    assert first is not None
    assert again is first  # the same bytes: the same (read-only) value, not decoded again
    assert rewritten is not None
    assert "second" in rewritten.messages[0]["content"]
    assert "first" in first.messages[0]["content"]
    with pytest.raises(UnreadableValueError):
        await backend.store.find_checkpoint(A, "c1", prefixes(msgs))


async def test_a_checkpoint_another_instance_writes_is_found_at_once(backend: Backend) -> None:
    msgs = history(12)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 3, "mine"), TTL)
    before = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    async with backend.another() as other:
        theirs = await other.save_compaction(compaction(A, "c1", msgs, 3, "theirs"), TTL)
        await other.save_compaction(compaction(A, "c1", msgs, 7, "longer"), TTL)
    after = await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    shorter = await backend.store.find_checkpoint(A, "c1", prefixes(msgs[:7]))

    assert before is not None
    assert "mine" in theirs.messages[0]["content"]  # first writer wins across instances
    assert after is not None
    assert after.covered_through == 7
    assert shorter is before


async def test_a_tenant_reading_bytes_another_tenant_decoded_still_raises(
    backend: Backend,
) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(B, "c1", msgs, 5), TTL)
    assert await backend.store.find_checkpoint(B, "c1", prefixes(msgs)) is not None
    await backend.graft(B, A, "c1")

    with pytest.raises(TenantMismatchError):
        await backend.store.find_checkpoint(A, "c1", prefixes(msgs))


async def test_a_message_sent_on_many_turns_is_stored_once(backend: Backend) -> None:
    msgs = history(30)
    for k in range(3, 30, 3):
        await backend.store.save_compaction(compaction(A, "c1", msgs, k), TTL)

    info = await backend.store.get_conversation(A, "c1")

    assert info is not None
    assert info.original_count == 28  # messages 0..27, each once
    assert len(info.originals) == 28
    assert info.checkpoint_count == 9
    one_copy = sum(len(str(m)) for m in msgs)
    assert info.size_bytes < 9 * one_copy  # not one copy of the history per checkpoint


async def test_refs_resolve_to_their_originals_in_order(backend: Backend) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5), TTL)

    resolved = await backend.store.resolve_refs(A, ["0005abcdef", "0123456789"])

    assert resolved == {"0005abcdef": msgs[:6]}


async def test_a_ref_names_the_tenants_live_conversations_that_store_it(
    backend: Backend,
) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5), TTL)
    await backend.store.save_compaction(compaction(A, "c2", msgs, 5), TTL)
    await backend.store.save_compaction(compaction(A, "c3", msgs, 3), TTL)

    owners = await backend.store.ref_conversations(A, ["0005abcdef", "0123456789"])

    assert {ref: sorted(convs) for ref, convs in owners.items()} == {"0005abcdef": ["c1", "c2"]}
    assert await backend.store.ref_conversations(B, ["0005abcdef"]) == {}
    assert await backend.store.ref_conversations(A, []) == {}


async def test_originals_saved_without_a_checkpoint_resolve_for_their_tenant_only(
    backend: Backend,
) -> None:
    """What the lossless tier forwards outside every checkpoint: refs resolve, nothing replays."""
    msgs = history(6)
    digests = [message_digest(m) for m in msgs]
    originals = {digests[4]: msgs[4], digests[5]: msgs[5]}
    refs = {"00aa000004": [digests[4]], "00aa000005": [digests[5]]}
    store = backend.store
    await store.save_originals(A, "c1", originals, refs, TTL)
    await store.save_originals(A, "c1", originals, refs, TTL)  # idempotent

    assert await store.resolve_refs(A, ["00aa000004", "00aa000005"]) == {
        "00aa000004": [msgs[4]],
        "00aa000005": [msgs[5]],
    }
    assert await store.resolve_refs(B, ["00aa000004"]) == {}
    assert await store.find_checkpoint(A, "c1", prefixes(msgs)) is None
    info = await store.get_conversation(A, "c1")
    assert info is not None
    assert (info.checkpoints, info.originals) == ([], originals)
    # A later compaction of the same conversation keeps them.
    await store.save_compaction(compaction(A, "c1", msgs, 3), TTL)
    assert (await store.resolve_refs(A, ["00aa000005"]))["00aa000005"] == [msgs[5]]
    assert [i.conversation for i in await store.list_conversations(A)] == ["c1"]


async def test_a_tenant_cannot_see_another_tenants_data_even_with_its_conversation_id(
    backend: Backend,
) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(B, "c1", msgs, 5), TTL)
    store = backend.store

    assert await store.find_checkpoint(A, "c1", prefixes(msgs)) is None
    assert await store.get_conversation(A, "c1") is None
    assert await store.resolve_refs(A, ["0005abcdef"]) == {}
    assert await store.list_conversations(A) == []
    assert await store.purge(A, "c1") is False
    assert await store.find_checkpoint(B, "c1", prefixes(msgs)) is not None


async def test_a_value_belonging_to_another_tenant_raises_instead_of_being_returned(
    backend: Backend,
) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(B, "c1", msgs, 5), TTL)
    await backend.graft(B, A, "c1")

    with pytest.raises(TenantMismatchError):
        await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    with pytest.raises(TenantMismatchError):
        await backend.store.get_conversation(A, "c1")


async def test_a_value_that_does_not_decode_costs_only_itself(backend: Backend) -> None:
    msgs = history(12)
    for k in (3, 7):
        await backend.store.save_compaction(compaction(A, "c1", msgs, k), TTL)
    await backend.corrupt(A, "c1", "checkpoints", prefixes(msgs)[7])
    await backend.corrupt(A, "c1", "originals", message_digest(msgs[0]))
    await backend.corrupt(A, "c1", "refs", "0003abcdef")

    info = await backend.store.get_conversation(A, "c1")

    assert info is not None
    assert [cp.covered_through for cp in info.checkpoints] == [3]
    assert message_digest(msgs[0]) not in info.originals
    assert message_digest(msgs[1]) in info.originals
    assert list(info.refs) == ["0007abcdef"]
    assert sorted(info.unreadable) == [
        ("checkpoint", prefixes(msgs)[7]),
        ("original", message_digest(msgs[0])),
        ("ref", "0003abcdef"),
    ]
    assert info.checkpoint_count == 2


async def test_retention_is_set_by_save_and_refreshed_when_the_checkpoint_is_used(
    backend: Backend,
) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5), TTL)
    saved = await backend.store.get_conversation(A, "c1")
    await backend.age(A, "c1", 10)
    aged = await backend.store.get_conversation(A, "c1")

    await backend.store.find_checkpoint(A, "c1", prefixes(msgs))
    refreshed = await backend.store.get_conversation(A, "c1")

    assert saved is not None
    assert aged is not None
    assert refreshed is not None
    assert TTL - 60 < saved.expires_at - time.time() <= TTL
    assert aged.expires_at - time.time() <= 10
    assert TTL - 60 < refreshed.expires_at - time.time() <= TTL
    assert refreshed.original_count == 6  # originals live exactly as long as the checkpoint


async def test_an_expired_conversation_is_gone(backend: Backend) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5), TTL)
    await backend.age(A, "c1", 0)

    assert await backend.store.find_checkpoint(A, "c1", prefixes(msgs)) is None
    assert await backend.store.get_conversation(A, "c1") is None
    assert await backend.store.list_conversations(A) == []
    assert await backend.store.resolve_refs(A, ["0005abcdef"]) == {}


async def test_purge_deletes_the_conversation_its_originals_and_refs(backend: Backend) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "c1", msgs, 5), TTL)
    await backend.store.save_compaction(compaction(A, "c2", msgs, 5), TTL)

    assert await backend.store.purge(A, "c1") is True
    assert await backend.store.purge(A, "c1") is False
    assert await backend.store.get_conversation(A, "c1") is None
    assert await backend.store.find_checkpoint(A, "c1", prefixes(msgs)) is None
    assert [i.conversation for i in await backend.store.list_conversations(A)] == ["c2"]


def summarized(tenant: str, conv: str, messages: list[dict[str, object]]) -> Compaction:
    """A compaction of all of `messages` into one summary, under the ref id `summarize` gives
    it (the start of the digest its LLM summary is cached under)."""
    digests = [message_digest(m) for m in messages]
    ref = canonical.ref_id(messages)
    cp = Checkpoint(
        tenant=tenant,
        conversation=conv,
        source_digest=prefix_digests(digests)[-1],
        covered_through=len(messages) - 1,
        messages=[{"role": "user", "content": f"[compactd:ref={ref} … summarized]"}],
        providers=["summarize"],
        created_at=time.time(),
    )
    return Compaction(cp, dict(zip(digests, messages, strict=True)), {ref: digests})


@pytest.mark.parametrize("admin", [False, True])
async def test_purge_deletes_the_llm_summaries_of_the_conversations_originals(
    backend: Backend, admin: bool
) -> None:
    mine, other = history(6, " mine"), history(6, " other")
    await backend.store.save_compaction(summarized(A, "c1", mine), TTL)
    await backend.store.save_compaction(summarized(A, "c2", other), TTL)
    await backend.store.save_compaction(summarized(B, "c1", other), TTL)
    for tenant in (A, B):
        cache = TenantSummaryCache(backend.store, tenant, TTL)
        await cache.put(canonical.source_digest(mine), f"what {tenant} said")
        await cache.put(canonical.source_digest(other), f"what else {tenant} said")

    assert await backend.store.purge(None if admin else A, "c1") is True

    assert await backend.store.get_summary(A, canonical.source_digest(mine)) is None
    # Another conversation's summary stays, and so does another tenant's unless it was purged.
    assert (
        await backend.store.get_summary(A, canonical.source_digest(other)) == f"what else {A} said"
    )
    left = await backend.store.get_summary(B, canonical.source_digest(other))
    assert left == (None if admin else f"what else {B} said")
    assert await backend.store.get_summary(B, canonical.source_digest(mine)) == f"what {B} said"


async def test_the_admin_sees_lists_and_purges_every_tenant(backend: Backend) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "shared", msgs, 5), TTL)
    await backend.store.save_compaction(compaction(B, "shared", msgs, 3), TTL)
    await backend.store.save_compaction(compaction(B, "only-b", msgs, 3), TTL)

    listed = {(i.tenant, i.conversation) for i in await backend.store.list_conversations(None)}
    latest = await backend.store.get_conversation(None, "shared")

    assert listed == {(A, "shared"), (B, "shared"), (B, "only-b")}
    assert latest is not None
    assert latest.tenant == B  # the most recently used of that id
    assert await backend.store.purge(None, "shared") is True
    remaining = await backend.store.list_conversations(None)
    assert [(i.tenant, i.conversation) for i in remaining] == [(B, "only-b")]


async def test_list_reports_sizes_and_counts_newest_first(backend: Backend) -> None:
    msgs = history(10)
    await backend.store.save_compaction(compaction(A, "small", msgs, 1), TTL)
    await backend.store.save_compaction(compaction(A, "big", msgs, 8), TTL)
    await backend.store.save_compaction(compaction(A, "big", msgs, 4), TTL)

    listed = await backend.store.list_conversations(A)
    full = await backend.store.get_conversation(A, "big")

    assert [i.conversation for i in listed] == ["big", "small"]
    big, small = listed
    assert (big.checkpoint_count, big.original_count) == (2, 9)
    assert (small.checkpoint_count, small.original_count) == (1, 2)
    assert big.size_bytes > small.size_bytes > 0
    assert full is not None
    assert big.size_bytes == full.size_bytes
    assert big.originals == {}


async def test_summaries_are_cached_per_tenant(backend: Backend) -> None:
    await backend.store.put_summary(A, "d1", "the summary", TTL)

    assert await backend.store.get_summary(A, "d1") == "the summary"
    assert await backend.store.get_summary(B, "d1") is None
    assert await backend.store.get_summary(A, "d2") is None


async def test_usage_is_aggregated_per_tenant_policy_model_and_day(backend: Backend) -> None:
    day = time.strftime("%Y-%m-%d", time.gmtime())
    for action, before, after in (("compacted", 1000, 300), ("replayed", 900, 350)):
        await backend.store.record_usage(
            UsageRecord(A, "default", "gpt-4o", day, action, before, after, 340, 200, 20)
        )
    await backend.store.record_usage(UsageRecord(B, "default", "gpt-4o", day, "passthrough", 5, 5))

    mine = await backend.store.usage(A, day)
    everyone = await backend.store.usage(None, day)

    assert mine == [
        {
            "tenant": A,
            "policy": "default",
            "model": "gpt-4o",
            "day": day,
            "requests": 2,
            "actions": {"compacted": 1, "replayed": 1},
            "tokens_before": 1900,
            "tokens_after": 650,
            "prompt_tokens": 680,
            "cached_tokens": 400,
            "completion_tokens": 40,
        }
    ]
    assert {r["tenant"] for r in everyone} == {A, B}


async def test_a_usage_batch_adds_to_the_same_aggregates_as_single_records(
    backend: Backend,
) -> None:
    today = time.strftime("%Y-%m-%d", time.gmtime())
    yesterday = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400))
    await backend.store.record_usage(UsageRecord(A, "p", "m", today, "passthrough", 10, 10))
    batch = [
        UsageDelta(A, "p", "m", today, {"requests": 3, "action:compacted": 3, "tokens_before": 9}),
        UsageDelta(B, "p", "m", today, {"requests": 1, "action:passthrough": 1}),
        UsageDelta(A, "p", "m", yesterday, {"requests": 2, "action:replayed": 2}),
    ]
    await backend.store.add_usage(batch)
    await backend.store.add_usage([])

    rows = {(r["tenant"], r["day"]): r for r in await backend.store.usage(None, yesterday)}

    assert rows[(A, today)]["requests"] == 4
    assert rows[(A, today)]["actions"] == {"compacted": 3, "passthrough": 1}
    assert rows[(A, today)]["tokens_before"] == 19
    assert rows[(B, today)]["requests"] == 1
    assert rows[(A, yesterday)]["actions"] == {"replayed": 2}


async def test_learned_windows_are_per_scope_latest_wins_and_expire(backend: Backend) -> None:
    await backend.store.put_window("up1", "gpt-4o", 64_000, 1000)
    await backend.store.put_window("up1", "gpt-4o", 32_000, 1000)
    await backend.store.put_window("up1", "o3", 100_000, 1)
    await backend.store.put_window("up2", "gpt-4o", 8_000, 1000)

    both = await backend.store.windows("up1")
    await asyncio.sleep(1.2)  # o3's entry expires
    later = await backend.store.windows("up1")

    assert both == {"gpt-4o": 32_000, "o3": 100_000}
    assert later == {"gpt-4o": 32_000}
    assert await backend.store.windows("up2") == {"gpt-4o": 8_000}
    assert await backend.store.windows("nowhere") == {}


async def test_calibration_ratios_are_per_api_and_apart_from_windows(backend: Backend) -> None:
    await backend.store.put_calibration("messages", "claude-sonnet-5", 1.2345, 1000)
    await backend.store.put_calibration("messages", "claude-sonnet-5", 1.25, 1000)
    await backend.store.put_calibration("responses", "gpt-5", 0.9, 1000)
    await backend.store.put_window("up1", "claude-sonnet-5", 64_000, 1000)

    assert await backend.store.calibrations("messages") == {"claude-sonnet-5": 1.25}
    assert await backend.store.calibrations("responses") == {"gpt-5": 0.9}
    assert await backend.store.calibrations("chat.completions") == {}
    assert await backend.store.windows("up1") == {"claude-sonnet-5": 64_000}


async def test_ids_that_would_break_the_key_layout_are_rejected(backend: Backend) -> None:
    with pytest.raises(ValueError, match="conversation"):
        await backend.store.find_checkpoint(A, "x}:{t:b", ["d"])
    with pytest.raises(ValueError, match="conversation"):
        await backend.store.get_conversation(A, "has space")


async def test_ping_and_config_check_answer(backend: Backend) -> None:
    await backend.store.ping()
    warnings = await backend.store.check_config()

    assert all(isinstance(w, str) for w in warnings)


async def test_the_summary_cache_adapter_is_bound_to_its_tenant(backend: Backend) -> None:
    mine = TenantSummaryCache(backend.store, A, TTL)
    theirs = TenantSummaryCache(backend.store, B, TTL)
    await mine.put("d1", "kept")

    assert await mine.get("d1") == "kept"
    assert await theirs.get("d1") is None
