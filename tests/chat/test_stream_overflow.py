"""A Responses stream's opening is read the same however the upstream cuts its bytes.

`read_opening` parses SSE as it arrives: events split across chunks anywhere (inside a line
end, a field name, a UTF-8 character), CRLF or LF line ends, comment lines, `event:` lines or
none. Whatever the cuts, it must find the same verdict as a reading of the whole, and hand on
exactly the upstream's bytes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import httpx
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.chat.stream_overflow import read_opening

OVERFLOW = "Your input exceeds the context window of this model. Please adjust your input."
RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}


def event(kind: str, data: dict[str, object], named: bool, eol: str) -> str:
    lines = ([f"event: {kind}"] if named else []) + [f"data: {json.dumps(data)}"]
    return eol.join(lines) + eol + eol


def stream(ending: str, named: bool, eol: str, comment: bool) -> tuple[str, bool]:
    """The opening of a stream ending as `ending` says, and whether it reports an overflow."""
    parts = [
        event("response.created", {"type": "response.created", "response": RESPONSE}, named, eol),
        event("response.in_progress", {"type": "response.in_progress"}, named, eol),
    ]
    if comment:
        parts.insert(1, f": keep-alive{eol}")
    error = {"code": "context_length_exceeded", "message": OVERFLOW, "param": "input"}
    failed = {**RESPONSE, "status": "failed", "error": error}
    endings = {
        "error": [event("error", {"type": "error", **error}, named, eol)],
        "nested-error": [event("error", {"type": "error", "error": error}, named, eol)],
        "failed": [
            event("response.failed", {"type": "response.failed", "response": failed}, named, eol)
        ],
        "other-error": [
            event("error", {"type": "error", "code": "server_error", "message": "é"}, named, eol)
        ],
        "output": [
            event(
                "response.output_text.delta",
                {"type": "response.output_text.delta", "delta": "héllo"},
                named,
                eol,
            ),
            event(
                "response.completed",
                {"type": "response.completed", "response": RESPONSE},
                named,
                eol,
            ),
        ],
    }
    return "".join(parts + endings[ending]), ending in ("error", "nested-error", "failed")


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


@settings(max_examples=200, deadline=None)
@given(
    ending=st.sampled_from(["error", "nested-error", "failed", "other-error", "output"]),
    named=st.booleans(),
    eol=st.sampled_from(["\n", "\r\n"]),
    comment=st.booleans(),
    points=st.lists(st.integers(min_value=0), max_size=12),
)
@example(ending="error", named=True, eol="\r\n", comment=False, points=[1, 2, 3]).via("crlf cut")
async def test_the_verdict_and_the_bytes_do_not_depend_on_how_the_stream_is_cut(
    ending: str, named: bool, eol: str, comment: bool, points: list[int]
) -> None:
    text, overflows = stream(ending, named, eol, comment)
    data = text.encode()
    response = httpx.Response(200, stream=Chunks(cut(data, points)))
    opening = await read_opening(response, seconds=30.0, limit=1 << 20)
    assert (opening.overflow == OVERFLOW) is overflows
    assert opening.overflow is None or overflows
    assert b"".join([chunk async for chunk in opening.body]) == data


async def test_an_opening_past_the_byte_limit_is_handed_on_undecided() -> None:
    text, _ = stream("error", True, "\n", False)
    data = b": pad\n" * 200 + text.encode()  # comment lines alone tell nothing
    response = httpx.Response(200, stream=Chunks(cut(data, list(range(0, len(data), 100)))))
    opening = await read_opening(response, seconds=30.0, limit=500)
    assert opening.overflow is None
    assert b"".join([chunk async for chunk in opening.body]) == data


async def test_a_stream_sent_a_byte_at_a_time_is_read_as_a_whole() -> None:
    text, overflows = stream("failed", True, "\r\n", True)
    data = text.encode()
    response = httpx.Response(200, stream=Chunks([data[i : i + 1] for i in range(len(data))]))
    opening = await read_opening(response, seconds=30.0, limit=1 << 20)
    assert overflows
    assert opening.overflow == OVERFLOW
    assert b"".join([chunk async for chunk in opening.body]) == data
