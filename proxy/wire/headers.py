"""Header filtering between client and upstream (RFC 9110 §7.6.1 hop-by-hop rules)."""

from __future__ import annotations

from collections.abc import Iterable

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
OUR_PREFIX = b"x-compactd-"
# `Expect: 100-continue` is answered by our own server when the app reads the body; passed on,
# it makes the upstream leg wait for a 100 an upstream may never send, on a body already read.
NOT_FORWARDED = frozenset({b"host", b"expect"})

RawHeaders = list[tuple[bytes, bytes]]


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    named: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            named.update(t.strip().lower() for t in v.split(b",") if t.strip())
    return named


def request_headers(headers: Iterable[tuple[bytes, bytes]], *, keep_length: bool) -> RawHeaders:
    """Client headers to send upstream: no hop-by-hop, no Host or Expect, no x-compactd-*.

    Content-Length is kept only when the body is relayed unchanged as a stream (file uploads), so
    the upstream sees the same framing; otherwise the transport sets it for the bytes we send.
    """
    headers = list(headers)
    drop = HOP_BY_HOP | _connection_named(headers) | NOT_FORWARDED
    if not keep_length:
        drop = drop | {b"content-length"}
    out: RawHeaders = []
    for k, v in headers:
        lk = k.lower()
        if lk in drop or lk.startswith(OUR_PREFIX):
            continue
        out.append((k, v))
    return out


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> RawHeaders:
    """Upstream headers to send to the client: everything but hop-by-hop ones."""
    headers = list(headers)
    drop = HOP_BY_HOP | _connection_named(headers)
    return [(k, v) for k, v in headers if k.lower() not in drop]


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of a header (name in lower case), or None."""
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def compactd_headers(values: dict[str, str]) -> RawHeaders:
    """Our `x-compactd-*` response headers, in a stable order."""
    return [(b"x-compactd-" + k.encode(), v.encode()) for k, v in values.items() if v != ""]
