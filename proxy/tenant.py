"""Who a request belongs to: an HMAC of its bearer key under the server secret, never the key."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

ANONYMOUS = "anonymous"
TENANT_HEX_CHARS = 24
FINGERPRINT_HEX_CHARS = 12
SECRET_FILE = "secret"  # noqa: S105 - a file name, not a secret


def load_or_create_secret(settings_secret: str, data_dir: Path) -> bytes:
    """The configured secret, else the one kept in `<data_dir>/secret` (created 0600 if absent)."""
    if settings_secret:
        return settings_secret.encode()
    path = data_dir / SECRET_FILE
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
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


def _mac(secret: bytes, api_key: str) -> str:
    return hmac.new(secret, api_key.encode(), hashlib.sha256).hexdigest()


def tenant_id(secret: bytes, api_key: str | None) -> str:
    """The tenant of a bearer key: truncated HMAC-SHA256 hex; no key -> "anonymous"."""
    if not api_key:
        return ANONYMOUS
    return _mac(secret, api_key)[:TENANT_HEX_CHARS]


def key_fingerprint(secret: bytes, api_key: str | None) -> str:
    """Short public id of a key (first 12 hex of the same HMAC), for policies and `key-id`."""
    if not api_key:
        return ANONYMOUS
    return _mac(secret, api_key)[:FINGERPRINT_HEX_CHARS]


def bearer_key(authorization_header: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (scheme case-insensitive)."""
    if not authorization_header:
        return None
    scheme, _, key = authorization_header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return key
