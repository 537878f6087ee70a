"""The one module that rewrites requests: messages, the include_usage splice, upstream headers."""

from __future__ import annotations

import orjson
import pytest

from proxy.wire.rewrite import (
    inject_include_usage,
    upstream_headers,
    with_include_usage,
    with_messages,
)


def test_inject_include_usage_adds_option_to_streaming_request() -> None:
    body = {"model": "m", "messages": [], "stream": True}
    assert inject_include_usage(body)
    assert body["stream_options"] == {"include_usage": True}


def test_inject_include_usage_keeps_other_stream_options() -> None:
    body = {"stream": True, "stream_options": {"include_obfuscation": False}}
    assert inject_include_usage(body)
    assert body["stream_options"] == {"include_obfuscation": False, "include_usage": True}


def test_inject_include_usage_leaves_client_choice_alone() -> None:
    body = {"stream": True, "stream_options": {"include_usage": True}}
    assert not inject_include_usage(body)
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("body", [{"messages": []}, {"stream": False}, {"stream": "yes"}])
def test_inject_include_usage_ignores_non_streaming_requests(body: dict[str, object]) -> None:
    before = dict(body)
    assert not inject_include_usage(body)
    assert body == before


def test_with_include_usage_keeps_every_other_byte() -> None:
    raw = b' {"model": "gpt-4o",\n "stream": true, "messages": [{"role":"user","content":"hi"}]}'
    out = with_include_usage(raw, orjson.loads(raw))
    assert out is not None
    assert out.replace(b'"stream_options":{"include_usage":true},', b"") == raw
    assert orjson.loads(out)["stream_options"] == {"include_usage": True}


def test_with_include_usage_only_when_needed() -> None:
    raw = b'{"stream":true,"stream_options":{"include_usage":false}}'
    assert with_include_usage(raw, orjson.loads(raw)) is None
    raw = b'{"stream":false}'
    assert with_include_usage(raw, orjson.loads(raw)) is None


def test_with_messages_replaces_only_messages_and_keeps_key_order() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "long"}], "temperature": 0}
    out = with_messages(body, [{"content": "short", "role": "user"}])
    assert out == b'{"model":"m","messages":[{"content":"short","role":"user"}],"temperature":0}'
    assert body["messages"] == [{"role": "user", "content": "long"}]


def test_upstream_headers_drop_length_and_ask_identity_only_for_injected_usage() -> None:
    headers = [(b"content-length", b"9"), (b"accept-encoding", b"gzip"), (b"x-compactd-a", b"1")]
    assert upstream_headers(headers, injected_usage=False) == [(b"accept-encoding", b"gzip")]
    assert upstream_headers(headers, injected_usage=True) == [(b"accept-encoding", b"identity")]
