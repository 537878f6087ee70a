"""Issue 32, row 9: a body that cannot be compacted anyway (no credential, more messages than
compactd compacts) is forwarded without being parsed: a 30 MB body of 1M tiny messages cost a
GB of RSS and the event loop's time, eight at once, before either was known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.chat.bodycache import BodyCache
from proxy.chat.request import MAX_MESSAGES
from tests.inprocess import running


def _spy_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    real = BodyCache.parse

    def spied(self: BodyCache, raw: bytes) -> Any:
        sizes.append(len(raw))
        return real(self, raw)

    monkeypatch.setattr(BodyCache, "parse", spied)
    return sizes


def _tiny(n: int) -> bytes:
    return json.dumps(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}] * n}
    ).encode()


async def test_a_body_without_a_credential_is_forwarded_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = _spy_parses(monkeypatch)
    raw, small = _tiny(40_000), _tiny(3)  # 1.2 MB, over the 1 MiB default; and 0.1 kB
    headers = {"content-type": "application/json"}
    async with running(tmp_path, default_policy={"budget_tokens": 600}) as proxy:
        r = await proxy.client.post("/v1/chat/completions", content=raw, headers=headers)
        counted = await proxy.client.post("/v1/chat/completions", content=small, headers=headers)
    assert r.status_code == 200
    assert r.headers["x-compactd-action"] == "passthrough"
    assert r.headers["x-compactd-store"] == "no-credential"
    assert "x-compactd-tokens-before" not in r.headers  # not even counted
    assert proxy.upstream.received[0].content == raw  # the client's own bytes
    assert parsed == [len(small)]
    assert "x-compactd-tokens-before" in counted.headers  # a small one is still counted


async def test_a_body_over_the_message_cap_fails_open_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = _spy_parses(monkeypatch)
    raw = _tiny(MAX_MESSAGES + 1)
    async with running(tmp_path, default_policy={"budget_tokens": 600}) as proxy:
        r = await proxy.chat(raw)
        small = await proxy.chat(_tiny(3))
    assert r.headers["x-compactd-error"] == "too_many_messages"
    assert proxy.upstream.received[0].content == raw
    assert parsed == [len(_tiny(3))]  # only the small one was parsed
    assert small.headers["x-compactd-action"] == "passthrough"


async def test_a_role_key_quoted_inside_a_string_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = _spy_parses(monkeypatch)
    quoted = json.dumps({"role": "x"}) * (MAX_MESSAGES + 1)  # escaped inside the content
    raw = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": quoted}]})
    async with running(tmp_path) as proxy:
        r = await proxy.chat(raw.encode())
    assert "x-compactd-error" not in r.headers
    assert len(parsed) == 1
