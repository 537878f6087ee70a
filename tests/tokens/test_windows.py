"""Context windows learned from upstream errors: validated, floored, scoped, shared, expiring."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.store.sqlite.store import SqliteStore
from proxy.tokens.budget import ModelInfo
from proxy.tokens.windows import (
    LearnedWindows,
    Overflow,
    counted_prompt,
    floor_for,
    parse_overflow,
    retry_window,
    upstream_scope,
    validated_window,
)

GPT4O = ModelInfo("gpt-4o*", 128_000, 16_384, "o200k_base", 2.5, 1.25, 10.0)
LLAMA = ModelInfo("llama*", 128_000, 2_048, "cl100k_base", 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("This model's maximum context length is 128000 tokens. However, your messages "
         "resulted in 130000 tokens. Please reduce the length of the messages.",
         Overflow(128_000, prompt=130_000)),
        ("This model's maximum context length is 4097 tokens. However, you requested 4200 tokens "
         "(3200 in the messages, 1000 in the completion).",
         Overflow(4097, prompt=3200, total=4200)),
        ("Input tokens exceed the configured limit of 272,000 tokens. Your messages resulted in "
         "300,512 tokens.", Overflow(272_000, prompt=300_512)),
        ("'max_tokens' is too large: 1000. This model's maximum context length is 4096 tokens "
         "and your request has 3500 input tokens (1000 > 4096 - 3500).",
         Overflow(4096, prompt=3500)),
        ("prompt is too long: 210000 tokens > 200000 maximum", Overflow(200_000, prompt=210_000)),
        ("input length and `max_tokens` exceed context limit: 188240 + 20000 > 200000, decrease "
         "input length or `max_tokens` and try again",
         Overflow(200_000, prompt=188_240, total=208_240)),
        ("This model's maximum context length is 64 tokens.", Overflow(64)),
        ("Rate limit reached", None),
    ],
)  # fmt: skip
def test_every_known_phrasing_is_read(message: str, expected: Overflow | None) -> None:
    assert parse_overflow(message) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("prompt is too long: 210000 tokens > 200000 maximum", 210_000),
        ("prompt is too long: 190000 tokens > 200000 maximum", None),
        ("messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: prompt "
         "is too long: 9000000 tokens > 200000 maximum. Each `tool_result` block must have a "
         "corresponding `tool_use` block in the previous message.", None),
        ("This model's maximum context length is 128000 tokens. However, your messages "
         "resulted in 130000 tokens.", None),
        ("input length and `max_tokens` exceed context limit: 188240 + 20000 > 200000, decrease "
         "input length or `max_tokens` and try again", 188_240),
        ("input length and `max_tokens` exceed context limit: 180000 + 20000 > 200000, decrease "
         "input length or `max_tokens` and try again", None),
        ("unexpected `tool_use_id` found: input length and `max_tokens` exceed context limit: "
         "9000000 + 1 > 200000, decrease input length or `max_tokens` and try again", None),
    ],
)  # fmt: skip
def test_only_the_upstreams_own_overflow_error_counts_for_calibration(
    message: str, expected: int | None
) -> None:
    assert counted_prompt(message) == expected


def test_a_consistent_overflow_below_the_table_is_learned() -> None:
    message = "maximum context length is 64000 tokens. However, your messages resulted in 70100"
    learned = validated_window(
        message + " tokens.", sent=70_000, requested_output=0, info=GPT4O, minimum=8192
    )

    assert learned == 64_000


@pytest.mark.parametrize(
    ("message", "sent", "why"),
    [
        ("This model's maximum context length is 64 tokens.", 40_000, "no stated length"),
        ("maximum context length is 64000 tokens. However, your messages resulted in 900 tokens.",
         41_000, "not the request we sent"),
        ("maximum context length is 64000 tokens. However, your messages resulted in 40000 tokens.",
         40_000, "the request would have fitted"),
        ("maximum context length is 200000 tokens. However, your messages resulted in 210000 "
         "tokens.", 210_000, "at or above the table's window"),
    ],
)  # fmt: skip
def test_untrustworthy_errors_teach_nothing(message: str, sent: int, why: str) -> None:
    learned = validated_window(message, sent=sent, requested_output=0, info=GPT4O, minimum=8192)
    assert learned is None, why


def test_the_models_own_input_limit_is_not_learned_as_its_window() -> None:
    # GPT-5 refuses input past 272k of its 400k: taken as the window, every request would then
    # reserve its output out of 272k (budget 144k) for a day.
    gpt5 = ModelInfo("gpt-5*", 400_000, 128_000, "o200k_base", 0, 0, 0, max_input=272_000)
    message = (
        "Input tokens exceed the configured limit of 272,000 tokens. Your messages resulted in "
        "300,512 tokens."
    )
    learned = validated_window(
        message, sent=300_000, requested_output=10_000, info=gpt5, minimum=8192
    )
    assert learned is None


def test_a_crafted_tiny_window_is_raised_to_the_floor() -> None:
    # An upstream echoing client input can state any figures consistent with the request.
    message = "maximum context length is 64 tokens. However, your messages resulted in 8792 tokens."
    learned = validated_window(message, sent=8792, requested_output=0, info=GPT4O, minimum=8192)

    assert learned == floor_for(GPT4O, 8192) == 2 * 16_384


def test_the_floor_follows_the_model_and_never_exceeds_its_window() -> None:
    assert floor_for(LLAMA, 8192) == 8192
    assert floor_for(GPT4O, 8192) == 32_768
    small = ModelInfo("s", 4096, 512, "cl100k_base", 0, 0, 0)
    assert floor_for(small, 8192) == 4096


def test_a_completion_overflow_counts_the_requested_output() -> None:
    message = (
        "This model's maximum context length is 16384 tokens and your request has 12000 input "
        "tokens (8000 > 16384 - 12000)."
    )
    learned = validated_window(
        message, sent=12_100, requested_output=8000, info=LLAMA, minimum=8192
    )

    assert learned == 16_384


def test_a_retry_without_a_lesson_is_bounded_the_same_way() -> None:
    assert retry_window("context length exceeded", sent=50_000, info=GPT4O, minimum=8192) == 35_000
    assert retry_window(
        "maximum context length is 10 tokens", sent=9, info=GPT4O, minimum=8192
    ) == (32_768)


def test_a_retry_is_targeted_in_our_units_when_the_upstream_counts_more() -> None:
    # Our count of what was sent is below the upstream's: its limit, in our units, is smaller.
    message = (
        "This model's maximum context length is 128000 tokens. However, your messages resulted "
        "in 130000 tokens."
    )
    assert retry_window(message, sent=120_000, info=GPT4O, minimum=8192) == 118_153
    # An implausible count (not about what we sent) is not scaled by.
    far = message.replace("130000", "400000")
    assert retry_window(far, sent=120_000, info=GPT4O, minimum=8192) == 128_000


def test_scopes_differ_per_upstream() -> None:
    assert upstream_scope("https://a.example/v1") == upstream_scope("https://a.example/v1/")
    assert upstream_scope("https://a.example/v1") != upstream_scope("https://b.example/v1")


async def test_a_window_learned_by_one_worker_reaches_another_through_the_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "compactd.db"
    one, two = await SqliteStore.open(path), await SqliteStore.open(path)
    a = LearnedWindows(one, "https://up.example/v1")
    b = LearnedWindows(two, "https://up.example/v1")
    other = LearnedWindows(two, "https://elsewhere.example/v1")
    try:
        a.learn("GPT-4o-2024-11-20", 64_000)
        await a.aclose()  # the share is written
        await b.refresh()
        await other.refresh()
        seen = b.apply("gpt-4o-2024-11-20", GPT4O).context_window
        elsewhere = other.apply("gpt-4o-2024-11-20", GPT4O).context_window
    finally:
        await one.close()
        await two.close()

    assert seen == 64_000
    assert elsewhere == 128_000
    assert b.apply("gpt-4o", GPT4O).context_window == 128_000


async def test_learned_windows_expire(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "compactd.db")
    windows = LearnedWindows(store, "https://up.example/v1")
    windows.ttl_seconds = 1  # below what the config allows, to see it expire
    try:
        windows.learn("gpt-4o", 64_000)
        await asyncio.sleep(1.2)
        await windows.refresh()
        after = windows.apply("gpt-4o", GPT4O).context_window
    finally:
        await windows.aclose()
        await store.close()

    assert after == 128_000
