"""Upstream-key mode: one real key behind the gateway, a key per team in front of it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import UpstreamSettings
from proxy.errors import UnauthorizedError
from proxy.wire.headers import RawHeaders
from proxy.wire.tenant import Tenancy, credential, key_fingerprint, raw_header_map


@dataclass
class Gate:
    """Upstream-key mode: one real key behind the gateway, listed client keys in front of it."""

    tenancy: Tenancy
    upstream_key: str
    allowed: frozenset[str]
    key_header: str = "authorization"
    """How the upstream key is sent: `Authorization: Bearer <key>`, or the key as the value of
    another header (`x-api-key` for Anthropic)."""

    def authorize(self, headers: RawHeaders) -> RawHeaders:
        """Swap the client's credential for the upstream key, or raise 401 if not admitted."""
        if not self.upstream_key:
            return headers
        found = credential(raw_header_map(headers), self.tenancy.headers)
        if found is None or key_fingerprint(self.tenancy.secret, found) not in self.allowed:
            raise UnauthorizedError("This API key is not admitted by the gateway.")
        kept = self.tenancy.without_credentials(headers)
        key = self.upstream_key.encode()
        if self.key_header == "authorization":
            return [*kept, (b"authorization", b"Bearer " + key)]
        return [*kept, (self.key_header.encode(), key)]


def admitted(upstream: UpstreamSettings, secret: bytes, found: str | None) -> bool:
    """Whether a credential may use compactd's own API: any, unless the gateway runs in
    upstream-key mode (for either upstream), where only the listed key ids are admitted."""
    if not (upstream.api_key or upstream.anthropic_api_key):
        return True
    allowed = {k.strip().lower() for k in upstream.allowed_keys}
    return found is not None and key_fingerprint(secret, found) in allowed
