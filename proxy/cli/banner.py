"""The start-up banner: what this compactd is about to run with, and what to worry about.

Written once by `compactd serve` before the workers start: one structured log record
(`compactd.startup`) for log collectors and, when stderr is a terminal, a readable block.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

from proxy import __version__
from proxy.config import (
    DEFAULT_ANTHROPIC_UPSTREAM,
    DEFAULT_UPSTREAM,
    PolicySettings,
    Settings,
    admin_key_weakness,
    data_dir,
)
from proxy.wire.tenant import SECRET_FILE

log = logging.getLogger("compactd.startup")

UI_PATH = "/compactd/ui/"


def masked_url(url: str) -> str:
    """`url` without its password (redis://:pw@host -> redis://:***@host)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def store_location(settings: Settings) -> tuple[str, str]:
    """The store's kind (`sqlite` or `redis`) and where it is (path, or URL without password)."""
    from proxy.store.factory import sqlite_path  # noqa: PLC0415 (the factory imports redis)

    url = settings.store.url
    if url.startswith(("redis://", "rediss://", "unix://")):
        return "redis", masked_url(url)
    return "sqlite", str(sqlite_path(url, data_dir(settings)))


def secret_source(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """Where the tenant secret comes from, the way `serve` resolves it (never its value)."""
    env = os.environ if env is None else env
    if settings.server.secret:
        for name in ("COMPACTD_SECRET", "COMPACTD_SERVER_SECRET"):
            if env.get(name):
                return f"environment variable {name}"
        return "server.secret in the config file"
    path = data_dir(settings) / SECRET_FILE
    return f"file {path}" + ("" if path.exists() else " (new: generated at start-up)")


@dataclass
class Banner:
    """Everything the banner says, as plain values (also the structured record's fields)."""

    version: str
    listen: str
    workers: int
    upstreams: dict[str, str]
    """Where each API goes: `openai` (chat completions, Responses, the rest of /v1) and
    `anthropic` (Messages and Anthropic's other paths)."""
    upstream_key_mode: bool
    anthropic_key_mode: bool
    store: str
    store_location: str
    data_dir: str
    config_file: str
    secret: str
    policies: list[dict[str, Any]]
    dashboard: str
    admin_key: bool
    warnings: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The fields of the structured start-up record."""
        return dict(self.__dict__)


def describe(
    settings: Settings,
    config_file: str | None,
    store_warnings: list[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Banner:
    """The banner for these settings; `store_warnings` come from the store's own check."""
    s, up = settings.server, settings.upstream
    kind, where = store_location(settings)
    listen = f"http://{s.host}:{s.port}"
    policies = [
        {
            "name": p.name,
            "mode": p.mode,
            "providers": list(p.providers),
            "matches": _criteria(p.match_keys, p.match_models, p.match_header),
        }
        for p in settings.all_policies()
    ]
    return Banner(
        version=__version__,
        listen=listen,
        workers=s.workers,
        upstreams={"openai": masked_url(up.url), "anthropic": masked_url(up.anthropic_url)},
        upstream_key_mode=bool(up.api_key),
        anthropic_key_mode=bool(up.anthropic_api_key),
        store=kind,
        store_location=where,
        data_dir=str(data_dir(settings)),
        config_file=str(Path(config_file).resolve()) if config_file else "",
        secret=secret_source(settings, env),
        policies=policies,
        dashboard=listen + UI_PATH,
        admin_key=bool(s.admin_key),
        warnings=[*warnings(settings), *(store_warnings or [])],
    )


def _criteria(keys: tuple[str, ...], models: tuple[str, ...], header: str) -> str:
    parts = []
    if keys:
        parts.append(f"{len(keys)} key id{'s' if len(keys) > 1 else ''}")
    if models:
        parts.append("models " + ", ".join(models))
    if header:
        parts.append(f"header {header}")
    return "; ".join(parts)


def warnings(settings: Settings) -> list[str]:
    """What an operator should know before traffic arrives (the store's own checks aside)."""
    up = settings.upstream
    out = []
    if not up.api_key and up.url.rstrip("/") == DEFAULT_UPSTREAM:
        out.append(
            f"upstream.url is the default ({DEFAULT_UPSTREAM}) and no upstream.api_key is set, "
            "so every client must send its own OpenAI key"
        )
    if up.url.rstrip("/") != DEFAULT_UPSTREAM and up.anthropic_url.rstrip("/") == (
        DEFAULT_ANTHROPIC_UPSTREAM
    ):
        out.append(
            f"upstream.url is {masked_url(up.url)} but Anthropic traffic (/v1/messages, Claude "
            f"Code) still goes to {DEFAULT_ANTHROPIC_UPSTREAM}: set upstream.anthropic_url "
            "(COMPACTD_UPSTREAM_ANTHROPIC_URL) to send it elsewhere too"
        )
    if settings.server.shared_anonymous_tenant:
        out.append(
            "anonymous mode (server.shared_anonymous_tenant): requests without a credential all "
            "belong to one tenant, 'anonymous', and every such client can read and purge what "
            "the others stored"
        )
    for key, policy in settings.policy_keys():
        # A cap other than the built-in one, on a policy that only covers uncapped APIs.
        built_in = PolicySettings()
        capped = (policy.budget_tokens, policy.budget_fraction) != (
            built_in.budget_tokens,
            built_in.budget_fraction,
        )
        apis = set(policy.match_apis)
        if capped and apis and not apis & set(policy.cap_apis):
            out.append(
                f"{key} ({policy.name}): budget_tokens / budget_fraction never apply, none of "
                "its match_apis is in its cap_apis"
            )
    weakness = admin_key_weakness(settings.server.admin_key)
    if weakness:
        out.append(f"{weakness}; `compactd check-config` refuses it")
    if up.api_key and not up.allowed_keys:
        out.append(
            "upstream.api_key is set but upstream.allowed_keys is empty, so every request gets 401"
        )
    return out


def render(banner: Banner) -> str:
    """The readable block for a terminal."""
    workers = f"{banner.workers} worker{'s' if banner.workers > 1 else ''}"
    keys = {True: " (upstream-key mode)", False: " (clients' own keys)"}
    rows = [
        ("upstream", banner.upstreams["openai"] + keys[banner.upstream_key_mode]),
        ("anthropic", banner.upstreams["anthropic"] + keys[banner.anthropic_key_mode]),
        ("store", f"{banner.store} {banner.store_location}"),
        ("data dir", banner.data_dir),
        ("secret", banner.secret),
        ("config", banner.config_file or "(none: defaults and environment)"),
    ]
    for p in banner.policies:
        providers = "+".join(p["providers"]) or "none"
        where = f", {p['matches']}" if p["matches"] else ""
        rows.append(("policy", f"{p['name']}: {p['mode']}, {providers}{where}"))
    who = "the admin key or a client key" if banner.admin_key else "a client key; no admin_key set"
    rows.append(("dashboard", f"{banner.dashboard} (sign in with {who})"))
    lines = [f"compactd {banner.version} on {banner.listen} ({workers})"]
    lines += [f"  {name:<10} {value}" for name, value in rows]
    lines += [f"  warning    {w}" for w in banner.warnings]
    return "\n".join(lines) + "\n"


def emit(banner: Banner, stream: TextIO) -> None:
    """Log the structured record; also write the readable block when `stream` is a terminal."""
    level = logging.WARNING if banner.warnings else logging.INFO
    log.log(level, "compactd starting", extra=banner.record())
    if stream.isatty():
        stream.write(render(banner))
        stream.flush()
