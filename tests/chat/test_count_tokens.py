"""Near the trigger, Anthropic's own `count_tokens` decides (`tokens.count_tokens_band`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dialects.conversations import messages_history
from tests.dialects.harness import Harness, harness

Json = dict[str, Any]
PROSE = (
    "The migration keeps every table readable while the new index is built, and the old "
    "column stays until the last reader moved over. "
)


def history(h: Harness, kind: str) -> list[Json]:
    """A Claude Code-like run (tool output: the fake counts fewer tokens than tiktoken) or a
    conversation in prose (the fake counts more)."""
    if kind == "code":
        return messages_history(h.messages, 12)
    turns: list[Json] = []
    for t in range(30):
        turns.append({"role": "user", "content": f"Question {t}: " + PROSE * 6})
        turns.append({"role": "assistant", "content": f"Answer {t}: " + PROSE * 6})
    turns.append({"role": "user", "content": "And now?"})
    return turns


def request(h: Harness, kind: str) -> Json:
    return {
        "model": "claude-sonnet-5",
        "max_tokens": 1024,
        "stream": False,
        "system": "You are Claude Code.",
        "messages": history(h, kind),
    }


async def figures(tmp_path, kind: str) -> tuple[int, int]:
    """(compactd's estimate, the fake upstream's count) of the request."""
    async with harness(tmp_path / "probe") as h:
        response = await h.message(request(h, kind))
        estimate = int(response.headers["x-compactd-tokens-before"])
        usage = response.json()["usage"]
        actual = sum(
            usage[k]
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
    assert abs(actual - estimate) > 0.1 * estimate  # far enough apart for the test to mean it
    return estimate, actual


@pytest.mark.parametrize("band", [0.0, 0.3])
@pytest.mark.parametrize("kind", ["code", "prose"])
async def test_near_the_trigger_the_upstreams_count_decides(
    tmp_path, kind: str, band: float
) -> None:
    estimate, actual = await figures(tmp_path, kind)
    # The trigger between the two: the estimate and the upstream disagree on which side.
    sections: Any = {
        "default_policy": {"budget_tokens": (estimate + actual) // 2},
        "tokens": {"count_tokens_band": band},
    }
    async with harness(tmp_path / "run", **sections) as h:
        body = request(h, kind)
        response = await h.message(body)
        assert response.status_code == 200, response.text
        assert h.messages.refused == []
        counts = [r for r in h.messages.received if r.path == "/v1/messages/count_tokens"]
        confirmed = h.metric("compactd_count_tokens_confirms_total", result="confirmed")
        over = (actual if band else estimate) > (estimate + actual) // 2
        assert response.headers["x-compactd-action"] == ("compacted" if over else "passthrough")
        if band == 0:
            assert counts == []
            assert confirmed == 0
            return
        assert len(counts) == 1
        # What count_tokens takes, with the client's own credential and version.
        assert counts[0].json() == {k: body[k] for k in ("model", "system", "messages")}
        assert counts[0].header("x-api-key") == "sk-alpha"
        assert counts[0].header("anthropic-version") == "2023-06-01"
        assert confirmed == 1
        # The upstream's count also taught the calibration (then the response's usage did).
        ratio = h.services.calibration.ratio("messages", "claude-sonnet-5")
        assert ratio == pytest.approx(actual / estimate, rel=0.1)
        assert (ratio > 1) == (actual > estimate)


async def test_far_from_the_trigger_nothing_is_asked(tmp_path) -> None:
    sections: Any = {"tokens": {"count_tokens_band": 0.1}}
    async with harness(tmp_path, **sections) as h:
        response = await h.message(request(h, "code"))
        assert response.headers["x-compactd-action"] == "passthrough"
        assert [r.path for r in h.messages.received] == ["/v1/messages"]


async def test_a_failed_count_leaves_the_decision_to_the_estimate(tmp_path) -> None:
    estimate, actual = await figures(tmp_path, "prose")
    sections: Any = {
        "default_policy": {"budget_tokens": (estimate + actual) // 2},
        "tokens": {"count_tokens_band": 0.3},
    }
    async with harness(tmp_path / "run", **sections) as h:
        h.messages.count_tokens_status = 529
        response = await h.message(request(h, "prose"))
        assert response.status_code == 200
        assert response.headers["x-compactd-action"] == "passthrough"
        assert h.metric("compactd_count_tokens_confirms_total", result="failed") == 1
        assert h.messages.received[-1].path == "/v1/messages"
