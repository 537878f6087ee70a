"""Who a request belongs to: an HMAC of its credential under the server secret, never the key.

A credential is whatever the client authenticates with: the key of `Authorization: Bearer <key>`,
the whole value of any other `Authorization` scheme (`Basic …`, `Token …`), or the value of
`api-key` (Azure) or `x-api-key` (Anthropic); the first configured header that carries one wins.
A request without a credential has no tenant: nothing of it is stored and compactd's own API
refuses it, unless the operator turns on the shared anonymous tenant (one bucket for every
client without a credential, each able to read and purge what the others stored).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

ANONYMOUS = "anonymous"
TENANT_HEX_CHARS = 24
FINGERPRINT_HEX_CHARS = 12
SECRET_FILE = "secret"  # noqa: S105 - a file name, not a secret
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")
_SCHEME_AND_TOKEN = re.compile(r"([^ \t]*)[ \t]*(.*)", re.DOTALL)


def load_or_create_secret(settings_secret: str, data_dir: Path) -> bytes:
    """The configured secret, else the one kept in `<data_dir>/secret` (created 0600 if absent)."""
    if settings_secret:
        return settings_secret.encode()
    path = data_dir / SECRET_FILE
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fresh = secrets.token_hex(32)
    try:
        # O_EXCL: when several workers start at once, exactly one writes and the rest read it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_secret(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(fresh + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return fresh.encode()


def _read_secret(path: Path) -> bytes:
    # A worker that lost the O_EXCL race may see the file before the winner has written it.
    for _ in range(100):
        value = path.read_text().strip()
        if value:
            return value.encode()
        time.sleep(0.01)
    raise ValueError(f"{path} is empty; delete it or set COMPACTD_SECRET")


def _mac(secret: bytes, api_key: str) -> str:  # a credential of any kind
    return hmac.new(secret, api_key.encode(), hashlib.sha256).hexdigest()


def tenant_id(secret: bytes, api_key: str | None) -> str:
    """The tenant of a credential: truncated HMAC-SHA256 hex; none -> "anonymous"."""
    if not api_key:
        return ANONYMOUS
    return _mac(secret, api_key)[:TENANT_HEX_CHARS]


def key_fingerprint(secret: bytes, api_key: str | None) -> str:
    """Short public id of a credential (first 12 hex of the same HMAC), for policies and
    `key-id`."""
    if not api_key:
        return ANONYMOUS
    return _mac(secret, api_key)[:FINGERPRINT_HEX_CHARS]


def bearer_key(authorization_header: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (scheme case-insensitive)."""
    scheme, key = _scheme_and_token(authorization_header or "")
    if scheme.lower() != "bearer" or not key:
        return None
    return key


def credential(headers: Mapping[str, str], names: Iterable[str] = CREDENTIAL_HEADERS) -> str | None:
    """The client's credential: the first of `names` (lower case) that carries one, else None.

    `Authorization: Bearer <key>` gives the key, so a key sent as `api-key` or `x-api-key` is
    the same tenant; any other `Authorization` scheme gives `Scheme token` (`Basic dXNlcg==`),
    however the client spelled the scheme. `headers` maps lower-case names to values
    (starlette's `Headers` or a plain dict).
    """
    for name in names:
        value = (headers.get(name) or "").strip()
        if value and name == "authorization":
            value = _authorization_credential(value)
        if value:
            return value
    return None


def _authorization_credential(value: str) -> str:
    scheme, token = _scheme_and_token(value)
    if scheme.lower() == "bearer":
        return token
    if not token:
        return scheme  # a bare key, no scheme
    # The scheme is case-insensitive (RFC 9110 11.1); `Basic`, the usual spelling, keeps the
    # tenant and key id it had before case was ignored.
    return f"{scheme.capitalize()} {token}"


def _scheme_and_token(value: str) -> tuple[str, str]:
    # Any run of spaces or tabs separates them: the grammar says spaces, clients send tabs too,
    # and one credential must stay one tenant. Only those two: a latin-1 header value holds
    # U+00A0 and U+0085, halves of a UTF-8 key, that str.split would take for whitespace.
    found = _SCHEME_AND_TOKEN.fullmatch(value.strip(" \t"))
    return (found[1], found[2]) if found else ("", "")


class ClientKey(str):
    """A client's own key, which a call made on its behalf to the same upstream (a summary)
    may present, in the header the client sent it in; never logged."""

    header: str
    """`authorization` (sent as `Bearer <key>`) or `api-key` (Azure OpenAI)."""

    def __new__(cls, key: str, header: str = "authorization") -> Self:
        """`key` as read from the client's `header` (latin-1, `header_text`)."""
        self = super().__new__(cls, key)
        self.header = header
        return self

    def as_header(self) -> tuple[bytes, bytes]:
        """The header presenting this key as the client did, with the client's own bytes."""
        raw = self.encode("latin-1")
        if self.header == "authorization":
            return (b"authorization", b"Bearer " + raw)
        return (self.header.encode(), raw)


def client_key(headers: Mapping[str, str]) -> ClientKey | None:
    """The key a client lends to summaries: its bearer key, else its Azure `api-key`."""
    bearer = bearer_key(headers.get("authorization"))
    if bearer:
        return ClientKey(bearer)
    azure = (headers.get("api-key") or "").strip(" \t")
    return ClientKey(azure, "api-key") if azure else None


@dataclass(frozen=True)
class Identity:
    """Who sent a request, as far as compactd stores and scopes things."""

    tenant: str | None
    """Where its data lives; None: no credential (and no shared anonymous tenant), store nothing."""
    fingerprint: str
    """The credential's public id (policies' match_keys, logs); "anonymous" without one."""
    api_key: ClientKey | None
    """The client's key, for calls made on its behalf (summaries); never logged."""


@dataclass(frozen=True)
class Tenancy:
    """The server secret and the rules that turn a request's headers into an Identity."""

    secret: bytes
    headers: tuple[str, ...] = CREDENTIAL_HEADERS
    shared_anonymous: bool = False
    anonymous_hosts: frozenset[str] | None = None
    """The `Host` names the shared anonymous tenant answers to (None: any)."""

    def identify(self, headers: Mapping[str, str]) -> Identity:
        """The identity behind a request's headers (lower-case names)."""
        found = credential(headers, self.headers)
        if found is None:
            shared = self.shared_anonymous and self._anonymous_host(headers.get("host"))
            return Identity(
                tenant=ANONYMOUS if shared else None, fingerprint=ANONYMOUS, api_key=None
            )
        return Identity(
            tenant=tenant_id(self.secret, found),
            fingerprint=key_fingerprint(self.secret, found),
            api_key=client_key(headers),
        )

    def _anonymous_host(self, host: str | None) -> bool:
        """Whether a request's `Host` is one the shared anonymous tenant answers to: a page of
        another name that resolves to 127.0.0.1 (DNS rebinding) must not read it."""
        if self.anonymous_hosts is None:
            return True
        return host_name(host or "") in self.anonymous_hosts

    def without_credentials(
        self, headers: Iterable[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """Raw headers minus every credential header (upstream-key mode swaps them)."""
        drop = {name.encode() for name in (*self.headers, *CREDENTIAL_HEADERS)}
        return [(k, v) for k, v in headers if k.lower() not in drop]


def host_name(host: str) -> str:
    """A `Host` header's name, lower case, without its port (`[::1]:8787` -> `[::1]`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rpartition(":")[0] if ":" in host else host


def header_text(raw: bytes) -> str:
    """A header's bytes as the server reads them: latin-1, one character a byte (as starlette)."""
    return raw.decode("latin-1")


def raw_header_map(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Raw ASGI headers as {lower-case name: first value}, decoded as latin-1."""
    out: dict[str, str] = {}
    for k, v in headers:
        out.setdefault(header_text(k).lower(), header_text(v))
    return out
