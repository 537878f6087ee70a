"""Stored checkpoints decoded once per process: the same bytes give the same value, other bytes
(a rewritten or corrupted checkpoint, another tenant's) are decoded, and checked, afresh."""

from __future__ import annotations

import time

import orjson
import pytest

from proxy.errors import TenantMismatchError, UnreadableValueError
from proxy.store import codec
from proxy.store.base import Checkpoint
from proxy.store.decoded import DecodedCheckpoints

A, B = "a" * 24, "b" * 24


def stored(label: str = "summary", tenant: str = A, digest: str = "d" * 32) -> bytes:
    return codec.dump_checkpoint(
        Checkpoint(
            tenant=tenant,
            conversation="c" * 24,
            source_digest=digest,
            covered_through=4,
            messages=[{"role": "user", "content": f"[compactd:ref=abc … {label}]"}],
            providers=["engine"],
            created_at=time.time(),
            ends=[5],
            parts=[["abc"]],
        )
    )


def test_the_same_bytes_give_the_same_value_and_equal_bytes_count_as_the_same() -> None:
    cache = DecodedCheckpoints()
    raw = stored()

    first = cache.load(raw, A)
    again = cache.load(bytes(bytearray(raw)), A)  # equal bytes, another object (a new read)

    assert again is first
    assert first == codec.load_checkpoint(raw, A)
    assert (cache.hits, cache.misses) == (1, 1)


def test_other_bytes_under_the_same_checkpoint_key_are_decoded_afresh() -> None:
    cache = DecodedCheckpoints()
    first = cache.load(stored("first"), A)
    rewritten = stored("second")  # same tenant, conversation and source digest

    second = cache.load(rewritten, A)

    assert second is not first
    assert "second" in second.messages[0]["content"]
    assert cache.load(rewritten, A) is second


def test_bytes_decoded_for_one_tenant_are_checked_again_for_another() -> None:
    cache = DecodedCheckpoints()
    raw = stored(tenant=B)
    cache.load(raw, B)

    with pytest.raises(TenantMismatchError):
        cache.load(raw, A)


def test_a_value_that_does_not_decode_is_never_remembered() -> None:
    cache = DecodedCheckpoints()
    broken = orjson.dumps({"t": A, "c": "c" * 24, "d": "d" * 32})

    for _ in range(2):
        with pytest.raises(UnreadableValueError):
            cache.load(broken, A)
    assert cache.hits == 0


def test_memory_is_bounded_by_the_bytes_kept_oldest_out_first() -> None:
    raws = [stored(digest=f"{i:032x}") for i in range(4)]
    cache = DecodedCheckpoints(max_bytes=2 * len(raws[0]) + 10)
    values = [cache.load(raw, A) for raw in raws]

    assert cache.load(raws[3], A) is values[3]
    assert cache.load(raws[2], A) is values[2]
    assert cache.load(raws[0], A) is not values[0]  # dropped: decoded again
    assert cache.load(raws[0], A) == values[0]
