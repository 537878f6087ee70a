"""Reading the upstream's usage from JSON and SSE; stripping the chunk compactd asked for."""

from __future__ import annotations

import base64
import gzip
import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.usage import responses_usage
from proxy.wire.usage import SSEUsageTap, Usage, usage_from_json

HEAD = (
    b'{"id":"chatcmpl-AY1Jtq3yFGx9kQp0sSgXm3lZ8bC2d","object":"chat.completion.chunk",'
    b'"created":1732870412,"model":"gpt-4o-mini-2024-07-18","service_tier":"default",'
    b'"system_fingerprint":"fp_0705bf87c0",'
)


def chunk(choices: bytes, usage: bytes | None) -> bytes:
    tail = b"}" if usage is None else b',"usage":' + usage + b"}"
    return b"data: " + HEAD + b'"choices":' + choices + tail + b"\n\n"


USAGE = (
    b'{"prompt_tokens":1117,"completion_tokens":3,"total_tokens":1120,'
    b'"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},'
    b'"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,'
    b'"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}'
)
EXPECTED = Usage(prompt_tokens=1117, completion_tokens=3, cached_tokens=1024)

DELTAS = [
    b'[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
    b'"logprobs":null,"finish_reason":null}]',
    b'[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]',
    b'[{"index":0,"delta":{"content":" \\"usage\\": there"},"logprobs":null,"finish_reason":null}]',
    b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]',
]
DONE = b"data: [DONE]\n\n"


def stream(*, include_usage: bool) -> tuple[bytes, bytes]:
    """(what the upstream sends, the usage-only chunk inside it) in OpenAI's recorded shape."""
    null = b"null" if include_usage else None
    body = b"".join(chunk(d, null) for d in DELTAS)
    usage_chunk = chunk(b"[]", USAGE) if include_usage else b""
    return body + usage_chunk + DONE, usage_chunk


def stream_without_usage() -> bytes:
    """What the upstream would have sent had include_usage not been set."""
    return b"".join(chunk(d, None) for d in DELTAS) + DONE


def run(tap: SSEUsageTap, pieces: list[bytes]) -> bytes:
    return b"".join(tap.feed(p) for p in pieces) + tap.close()


def test_usage_from_json_reads_cached_tokens() -> None:
    body = b'{"id":"x","choices":[],"usage":' + USAGE + b"}"
    assert usage_from_json(body) == EXPECTED


def test_usage_from_json_without_details_has_zero_cached() -> None:
    body = b'{"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}'
    assert usage_from_json(body) == Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=0)


def test_usage_from_json_of_gzip_body() -> None:
    body = gzip.compress(b'{"usage":' + USAGE + b"}")
    assert usage_from_json(body, "gzip") == EXPECTED


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"[1,2]", b'{"usage":null}', b'{"error":{"message":"usage"}}']
)
def test_usage_from_json_without_usage_is_none(body: bytes) -> None:
    assert usage_from_json(body) is None


def test_tap_without_stripping_returns_every_chunk_unchanged() -> None:
    raw, _ = stream(include_usage=True)
    tap = SSEUsageTap()
    pieces = [raw[i : i + 7] for i in range(0, len(raw), 7)]
    assert [tap.feed(p) for p in pieces] == pieces
    assert tap.close() == b""
    assert tap.usage == EXPECTED
    assert not tap.stripped


def test_tap_reads_usage_split_at_every_byte_boundary() -> None:
    raw, _ = stream(include_usage=True)
    for cut in range(len(raw) + 1):
        tap = SSEUsageTap()
        assert run(tap, [raw[:cut], raw[cut:]]) == raw
        assert tap.usage == EXPECTED, cut


def test_tap_reads_usage_fed_one_byte_at_a_time_with_crlf() -> None:
    raw, _ = stream(include_usage=True)
    raw = raw.replace(b"\n", b"\r\n")
    tap = SSEUsageTap()
    run(tap, [raw[i : i + 1] for i in range(len(raw))])
    assert tap.usage == EXPECTED


@pytest.mark.parametrize("sep", [b"\n", b"\r\n", b"\r"])
def test_tap_reads_data_without_space_and_any_line_ending(sep: bytes) -> None:
    raw = (
        b"data:" + b'{"choices":[],"usage":' + USAGE + b"}" + sep + sep + b"data:[DONE]" + sep + sep
    )
    tap = SSEUsageTap()
    run(tap, [raw])
    assert tap.usage == EXPECTED


def test_tap_without_include_usage_finds_none() -> None:
    tap = SSEUsageTap()
    run(tap, [stream(include_usage=False)[0]])
    assert tap.usage is None


def test_tap_reads_gzip_stream_copy() -> None:
    raw, _ = stream(include_usage=True)
    packed = gzip.compress(raw)
    tap = SSEUsageTap(content_encoding="gzip")
    pieces = [packed[i : i + 10] for i in range(0, len(packed), 10)]
    assert [tap.feed(p) for p in pieces] == pieces
    tap.close()
    assert tap.usage == EXPECTED


def test_strip_removes_exactly_the_usage_chunk_at_every_split() -> None:
    raw, usage_chunk = stream(include_usage=True)
    expected = raw.replace(usage_chunk, b"")
    assert len(expected) == len(raw) - len(usage_chunk)
    for cut in range(len(raw) + 1):
        tap = SSEUsageTap(strip_usage_chunk=True)
        assert run(tap, [raw[:cut], raw[cut:]]) == expected, cut
        assert tap.usage == EXPECTED
        assert tap.stripped


def test_strip_is_byte_exact_fed_byte_by_byte_with_crlf() -> None:
    raw, usage_chunk = stream(include_usage=True)
    raw, usage_chunk = raw.replace(b"\n", b"\r\n"), usage_chunk.replace(b"\n", b"\r\n")
    tap = SSEUsageTap(strip_usage_chunk=True)
    out = run(tap, [raw[i : i + 1] for i in range(len(raw))])
    assert out == raw.replace(usage_chunk, b"")
    assert tap.usage == EXPECTED


def test_strip_releases_each_complete_event_immediately() -> None:
    raw, _ = stream(include_usage=True)
    first_end = raw.index(b"\n\n") + 2
    tap = SSEUsageTap(strip_usage_chunk=True)
    assert tap.feed(raw[: first_end + 5]) == raw[:first_end]
    assert tap.feed(b"") == b""


def test_strip_keeps_usage_on_a_chunk_that_also_has_choices() -> None:
    # Some OpenAI-compatible servers put usage on the last content chunk: never drop content.
    event = chunk(DELTAS[3], USAGE)
    raw = event + DONE
    tap = SSEUsageTap(strip_usage_chunk=True)
    assert run(tap, [raw]) == raw
    assert tap.usage == EXPECTED
    assert not tap.stripped


def test_strip_keeps_comments_and_other_events() -> None:
    raw = b": ping\n\nevent: message\nid: 4\ndata: {}\n\n" + chunk(b"[]", USAGE) + DONE
    tap = SSEUsageTap(strip_usage_chunk=True)
    assert run(tap, [raw]) == b": ping\n\nevent: message\nid: 4\ndata: {}\n\n" + DONE


def test_strip_flushes_an_unterminated_tail_on_close() -> None:
    raw = b"data: {}\n\n" + b'data: {"choices":[],"usage":' + USAGE + b"}"
    tap = SSEUsageTap(strip_usage_chunk=True)
    assert tap.feed(raw) == b"data: {}\n\n"
    assert tap.close() == raw[len(b"data: {}\n\n") :]
    assert tap.usage == EXPECTED


def test_strip_usage_null_restores_the_stream_without_include_usage() -> None:
    raw, _ = stream(include_usage=True)
    tap = SSEUsageTap(strip_usage_chunk=True, strip_usage_null=True)
    out = run(tap, [raw[i : i + 13] for i in range(0, len(raw), 13)])
    assert out == stream_without_usage()
    assert tap.usage == EXPECTED


def test_tap_passes_through_encodings_it_cannot_read() -> None:
    tap = SSEUsageTap(content_encoding="br")
    assert tap.feed(b"\x8b\x01\x80") == b"\x8b\x01\x80"
    assert tap.close() == b""
    assert tap.usage is None


def test_strip_refuses_compressed_streams() -> None:
    with pytest.raises(ValueError, match="identity"):
        SSEUsageTap(strip_usage_chunk=True, content_encoding="gzip")


def test_strip_keeps_an_extra_blank_line_before_the_usage_chunk() -> None:
    usage_chunk = chunk(b"[]", USAGE)
    raw = b"data: {}\n\n\n" + usage_chunk + DONE
    for cut in range(len(raw) + 1):
        tap = SSEUsageTap(strip_usage_chunk=True)
        assert run(tap, [raw[:cut], raw[cut:]]) == b"data: {}\n\n\n" + DONE, cut


def test_strip_handles_a_stream_that_switches_to_crlf_midway() -> None:
    usage_chunk = chunk(b"[]", USAGE).replace(b"\n", b"\r\n")
    head = chunk(DELTAS[1], b"null")
    raw = head + usage_chunk + DONE.replace(b"\n", b"\r\n")
    for cut in range(len(raw) + 1):
        tap = SSEUsageTap(strip_usage_chunk=True)
        assert run(tap, [raw[:cut], raw[cut:]]) == raw.replace(usage_chunk, b""), cut
        assert tap.usage == EXPECTED


@given(
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=40),
    crlf=st.booleans(),
)
def test_strip_is_byte_exact_for_any_partition(cuts: list[int], crlf: bool) -> None:
    raw, usage_chunk = stream(include_usage=True)
    if crlf:
        raw, usage_chunk = raw.replace(b"\n", b"\r\n"), usage_chunk.replace(b"\n", b"\r\n")
    bounds = sorted({0, len(raw), *(c % (len(raw) + 1) for c in cuts)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    tap = SSEUsageTap(strip_usage_chunk=True)
    assert run(tap, pieces) == raw.replace(usage_chunk, b"")
    assert tap.usage == EXPECTED


def _image_generation_stream(b64: str) -> bytes:
    """A Responses image generation stream as the API sends it: a partial image, the finished
    item, then `response.completed` with the image again and the usage after it."""
    item = {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": b64}
    usage = {
        "input_tokens": 1200,
        "input_tokens_details": {"cached_tokens": 1024},
        "output_tokens": 1800,
        "total_tokens": 3000,
    }
    response = {"id": "resp_1", "status": "completed", "output": [item], "usage": usage}
    events = [
        {"type": "response.created", "response": {**response, "output": [], "usage": None}},
        {"type": "response.image_generation_call.partial_image", "partial_image_b64": b64},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events
    )


@pytest.mark.parametrize("piece", [1000, 65536, 1 << 30])
@pytest.mark.parametrize("encoding", ["", "gzip"])
def test_usage_after_events_longer_than_the_limit_is_still_read(piece: int, encoding: str) -> None:
    # The image's base64 (and a text of escapes) is far over the limit, several times over.
    b64 = base64.b64encode(bytes(range(256)) * 160).decode()
    raw = _image_generation_stream(b64 + "\\n\\" * 2000)
    sent = gzip.compress(raw) if encoding else raw
    tap = SSEUsageTap(content_encoding=encoding, max_event_bytes=4096, read=responses_usage)
    pieces = [sent[i : i + piece] for i in range(0, len(sent), piece)]
    assert b"".join(tap.feed(p) for p in pieces) == sent  # relayed as they came
    assert tap.close() == b""
    assert tap.usage == Usage(prompt_tokens=1200, completion_tokens=1800, cached_tokens=1024)


def test_an_event_too_long_even_without_its_strings_is_passed_over() -> None:
    # An event whose structure alone is over the limit is not read; the stream still is.
    long = b"data: " + json.dumps({"values": list(range(5000))}).encode() + b"\n\n"
    tap = SSEUsageTap(max_event_bytes=4096)
    raw = long + chunk(b"[]", USAGE) + DONE
    assert run(tap, [raw[i : i + 700] for i in range(0, len(raw), 700)]) == raw
    assert tap.usage == EXPECTED


@given(st.lists(st.integers(min_value=0), max_size=40))
def test_usage_after_long_events_is_read_for_any_partition(cuts: list[int]) -> None:
    raw = _image_generation_stream("QUJD" * 1500 + '\\"usage\\": {' * 300 + "\\u00e9\\\\")
    bounds = sorted({0, len(raw), *(c % (len(raw) + 1) for c in cuts)})
    tap = SSEUsageTap(max_event_bytes=4096, read=responses_usage)
    run(tap, [raw[a:b] for a, b in itertools.pairwise(bounds)])
    assert tap.usage == Usage(prompt_tokens=1200, completion_tokens=1800, cached_tokens=1024)
