"""Every change compactd makes to a request on its way upstream, and nothing else.

A request is forwarded as the client's own bytes unless one of these applies:

- `with_messages`: a compaction or a replayed checkpoint replaced the messages. Only the message
  list changes; every message the client sent and compactd kept keeps its keys, their order and
  its null fields (a restore gives back exactly what was sent), the other keys of the body keep
  their order, and the output is compact UTF-8 (orjson): a checkpoint's bytes are stored, so a
  replay sends the same bytes for the same prefix on every turn.
- `with_include_usage`: `accounting.request_stream_usage` asks a streaming request for its usage
  chunk, spliced into the bytes (never re-serialized), with `upstream_headers` asking for an
  uncompressed answer so the relay can strip that chunk again.

The headers sent upstream are the client's minus hop-by-hop and our own (`upstream_headers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.wire.headers import RawHeaders, request_headers

Message = dict[str, Any]

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true}'


def with_messages(body: Mapping[str, Any], messages: Sequence[Message]) -> bytes:
    """The request with only `messages` replaced: the client's own messages, as parsed, where
    they are kept, the stored checkpoint's where it is replayed, a provider's where it rewrote."""
    out = dict(body)
    out["messages"] = list(messages)
    return orjson.dumps(out)


def with_include_usage(raw: bytes, body: Mapping[str, Any]) -> bytes | None:
    """`raw` with include_usage inserted as its first key, every other byte kept; else None.

    Inserting beats re-serializing, which would change the bytes of everything else. Only done
    for a streaming request without `stream_options` (a client's own choice is left alone).
    """
    if body.get("stream") is not True or "stream_options" in body:
        return None
    start = raw.find(b"{")
    if start < 0 or raw[:start].strip():
        return None
    rest = raw[start + 1 :]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return raw[: start + 1] + _INCLUDE_USAGE + sep + rest


def inject_include_usage(body: dict[str, Any]) -> bool:
    """Ask a streaming request (a dict we build ourselves) for usage; True if added."""
    if body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if options is None:
        body["stream_options"] = {"include_usage": True}
        return True
    if isinstance(options, dict) and options.get("include_usage") is not True:
        body["stream_options"] = {**options, "include_usage": True}
        return True
    return False


def upstream_headers(headers: RawHeaders, *, injected_usage: bool) -> RawHeaders:
    """The client's headers for a chat request we send as whole bytes (no Content-Length: the
    transport sets it); identity encoding when we must strip the usage chunk we asked for."""
    out = request_headers(headers, keep_length=False)
    if injected_usage:
        out = [(k, v) for k, v in out if k.lower() != b"accept-encoding"]
        out.append((b"accept-encoding", b"identity"))
    return out
