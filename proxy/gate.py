"""Upstream-key mode: one real key behind the gateway, a key per team in front of it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.errors import UnauthorizedError
from proxy.headers import RawHeaders, header
from proxy.tenant import bearer_key, key_fingerprint


@dataclass
class Gate:
    """Upstream-key mode: one real key behind the gateway, listed client keys in front of it."""

    secret: bytes
    upstream_key: str
    allowed: frozenset[str]

    def authorize(self, headers: RawHeaders) -> RawHeaders:
        """Swap the client's key for the upstream key, or raise 401 for keys not admitted."""
        if not self.upstream_key:
            return headers
        raw = header(headers, b"authorization")
        client_key = bearer_key(raw.decode("latin-1") if raw else None)
        if client_key is None or key_fingerprint(self.secret, client_key) not in self.allowed:
            raise UnauthorizedError("This API key is not admitted by the gateway.")
        kept = [(k, v) for k, v in headers if k.lower() not in (b"authorization", b"api-key")]
        return [*kept, (b"authorization", b"Bearer " + self.upstream_key.encode())]
