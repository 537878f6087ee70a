"""The `compactd` command: serve, check-config, and the inspection commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from proxy import __version__
from proxy.config import ConfigError, Settings, load_settings

if TYPE_CHECKING:
    from proxy.store.base import Store


def _settings(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Settings:
    return load_settings(getattr(args, "config", None), overrides=overrides)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415  (keeps `compactd --help` fast)

    server: dict[str, Any] = {}
    for key in ("host", "port", "workers"):
        if getattr(args, key) is not None:
            server[key] = getattr(args, key)
    overrides: dict[str, Any] = {"server": server} if server else {}
    if args.upstream:
        overrides["upstream"] = {"url": args.upstream}
    settings = _settings(args, overrides)
    s = settings.server
    from proxy.logs import configure_logging  # noqa: PLC0415

    configure_logging(s.log_level)
    common: dict[str, Any] = {
        "host": s.host,
        "port": s.port,
        "log_level": s.log_level,
        "log_config": None,  # keep our JSON, redacting handlers
        "access_log": False,  # one structured line per request is ours
        "lifespan": "on",
        "timeout_keep_alive": 75,
    }
    if s.workers > 1:
        import os  # noqa: PLC0415

        from proxy.metrics import multiprocess_dir  # noqa: PLC0415

        # Each worker process rebuilds the app from the same config through the factory.
        os.environ["COMPACTD_CONFIG_FILE"] = args.config or ""
        for k, v in server.items():
            os.environ[f"COMPACTD_SERVER_{k.upper()}"] = str(v)
        if args.upstream:
            os.environ["COMPACTD_UPSTREAM_URL"] = args.upstream
        with multiprocess_dir():
            uvicorn.run("proxy.factory:app_from_env", factory=True, workers=s.workers, **common)
        return 0
    from proxy.app import create_app  # noqa: PLC0415

    uvicorn.run(create_app(settings), **common)
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from proxy.budget import ModelTable  # noqa: PLC0415
    from proxy.policy import PolicyResolver  # noqa: PLC0415
    from proxy.providers.registry import ProviderLoadError, ProviderRegistry  # noqa: PLC0415
    from proxy.services import check_provider_options  # noqa: PLC0415

    settings = _settings(args)
    # Everything start-up would build from the config, so check-config fails where serve would.
    PolicyResolver(settings)
    ModelTable.load(Path(settings.tokens.models_file) if settings.tokens.models_file else None)
    try:
        providers = ProviderRegistry().load_enabled(
            sorted({n for p in settings.all_policies() for n in p.providers})
        )
    except ProviderLoadError as exc:
        raise ConfigError(f"providers: {exc}") from None
    check_provider_options(settings, providers)
    print(
        f"ok: {args.config or '(defaults)'} — upstream {settings.upstream.url}, "
        f"{len(settings.policies) + 1} policies"
    )
    return 0


def _compress(args: argparse.Namespace) -> int:
    from proxy import offline  # noqa: PLC0415

    defaults = offline.Defaults(
        model=args.model,
        provider=args.provider or "",
        budget=args.budget,
        target_ratio=args.target_ratio,
    )
    return offline.main(_settings(args), defaults, sys.stdin.buffer, sys.stdout.buffer)


def _providers(args: argparse.Namespace) -> int:
    from proxy.providers.registry import ProviderRegistry  # noqa: PLC0415

    for info in ProviderRegistry().describe():
        status = f"BROKEN: {info.error}" if info.error else "ok"
        print(f"{info.name:<14} {info.source:<50} {status}")
    del args
    return 0


def _key_id(args: argparse.Namespace) -> int:
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.tenant import key_fingerprint, load_or_create_secret  # noqa: PLC0415

    settings = _settings(args)
    secret = load_or_create_secret(settings.server.secret, data_dir(settings))
    print(key_fingerprint(secret, _credential(args.key)))
    return 0


def _with_store(args: argparse.Namespace, work: Callable[[Store, Settings], Awaitable[int]]) -> int:
    """Open the configured store, run `work`, close it."""
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.store.factory import open_store  # noqa: PLC0415

    settings = _settings(args)

    async def go() -> int:
        store = await open_store(settings.store, data_dir(settings))
        try:
            return await work(store, settings)
        finally:
            await store.close()

    return asyncio.run(go())


def _tenant(args: argparse.Namespace, settings: Settings) -> str | None:
    """None (every tenant) unless --key scopes the command to one tenant."""
    if not getattr(args, "key", None):
        return None
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.tenant import load_or_create_secret, tenant_id  # noqa: PLC0415

    secret = load_or_create_secret(settings.server.secret, data_dir(settings))
    return tenant_id(secret, _credential(args.key))


def _credential(text: str) -> str | None:
    """A key as typed (`sk-…`, `Bearer sk-…`, `Basic …`): the credential a request would carry."""
    from proxy.tenant import credential  # noqa: PLC0415

    return credential({"authorization": text})


def _conversations(args: argparse.Namespace) -> int:
    async def work(store: Store, settings: Settings) -> int:
        infos = await store.list_conversations(_tenant(args, settings))
        if args.json:
            print(orjson.dumps([dataclasses.asdict(i) for i in infos]).decode())
            return 0
        head = ("conversation", "tenant", "checkpoints", "originals", "bytes")
        print(f"{head[0]:<28} {head[1]:<26} {head[2]:>11} {head[3]:>9} {head[4]:>10}")
        for i in infos:
            print(
                f"{i.conversation:<28} {i.tenant:<26} {i.checkpoint_count:>11} "
                f"{i.original_count:>9} {i.size_bytes:>10}"
            )
        return 0

    return _with_store(args, work)


def _restore(args: argparse.Namespace) -> int:
    from proxy.providers.uncompress import uncompress_async  # noqa: PLC0415

    async def work(store: Store, settings: Settings) -> int:
        info = await store.get_conversation(_tenant(args, settings), args.conversation)
        if info is None or not info.checkpoints:
            print(f"compactd: no compacted conversation {args.conversation!r}", file=sys.stderr)
            return 1
        latest = max(info.checkpoints, key=lambda c: c.covered_through)

        async def lookup(ids: list[str]) -> dict[str, list[dict[str, Any]]]:
            return await store.resolve_refs(info.tenant, ids)

        result = await uncompress_async(latest.messages, lookup, recursive=True)
        out = {
            "conversation": info.conversation,
            "covered_through": latest.covered_through,
            "messages": result.messages,
            "missing_ids": list(result.missing_ids),
        }
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return 0 if not result.missing_ids else 1

    return _with_store(args, work)


def _purge(args: argparse.Namespace) -> int:
    async def work(store: Store, settings: Settings) -> int:
        deleted = await store.purge(_tenant(args, settings), args.conversation)
        print("deleted" if deleted else "not found")
        return 0 if deleted else 1

    return _with_store(args, work)


def _stats(args: argparse.Namespace) -> int:
    from proxy.budget import ModelTable  # noqa: PLC0415
    from proxy.stats import compute_stats, format_table, parse_since, stats_json  # noqa: PLC0415

    async def work(store: Store, settings: Settings) -> int:
        since = parse_since(args.since)
        rows = await store.usage(_tenant(args, settings), since.isoformat())
        models_file = settings.tokens.models_file
        table = compute_stats(
            rows,
            by=args.by,
            model_table=ModelTable.load(Path(models_file) if models_file else None),
        )
        if args.json:
            print(orjson.dumps(stats_json(table, by=args.by, since=since)).decode())
        else:
            print(format_table(table))
        return 0

    return _with_store(args, work)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed so the docs test can list every command)."""
    parser = argparse.ArgumentParser(prog="compactd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"compactd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="TOML config file (see config/compactd.toml)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)
    serve.add_argument("--upstream", help="upstream base URL (default https://api.openai.com/v1)")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("config", nargs="?")
    check.set_defaults(func=_check_config)

    comp = sub.add_parser("compress", help="compress JSONL conversations from stdin to stdout")
    comp.add_argument("--config")
    comp.add_argument("--budget", type=float, default=0.5, help="tokens, or a fraction <= 1")
    comp.add_argument("--model", default="gpt-4o")
    comp.add_argument(
        "--provider", help="provider for lines that name none (default: policy chain)"
    )
    comp.add_argument("--target-ratio", type=float, default=1.0)
    comp.set_defaults(func=_compress)

    prov = sub.add_parser("providers", help="list installed compression providers")
    prov.set_defaults(func=_providers)

    kid = sub.add_parser("key-id", help="print a key's fingerprint for policy matching")
    kid.add_argument("key")
    kid.add_argument("--config")
    kid.set_defaults(func=_key_id)

    for name, func, text in (
        ("conversations", _conversations, "list stored conversations with sizes"),
        ("restore", _restore, "print a conversation's original messages"),
        ("purge", _purge, "delete a conversation's stored data"),
        ("stats", _stats, "requests, tokens and money saved"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--config")
        cmd.add_argument("--key", help="scope to the tenant of this API key (default: all)")
        if name in ("restore", "purge"):
            cmd.add_argument("conversation")
        if name in ("conversations", "stats"):
            cmd.add_argument("--json", action="store_true")
        if name == "stats":
            cmd.add_argument("--since", default="7d")
            cmd.add_argument("--by", choices=("tenant", "policy", "model"), default="policy")
        cmd.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `compactd` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except ConfigError as exc:
        print(f"compactd: configuration error: {exc}", file=sys.stderr)
        return 2
    return result
