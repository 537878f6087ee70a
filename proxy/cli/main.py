"""The `compactd` command: serve, check-config, and the inspection commands."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from proxy import __version__
from proxy.config import CONFIG_FILE_ENV, Settings, load_settings
from proxy.errors import CommandError, ConfigError
from proxy.telemetry.stats import GROUP_BY

if TYPE_CHECKING:
    from proxy.store.base import Store


CONFIG_HELP = (
    "TOML config file (default: $COMPACTD_CONFIG_FILE, else defaults and environment; "
    "example: config/compactd.toml)"
)


def _config_path(args: argparse.Namespace) -> str | None:
    """--config, else COMPACTD_CONFIG_FILE: the same resolution for every command."""
    return getattr(args, "config", None) or os.environ.get(CONFIG_FILE_ENV) or None


def _settings(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Settings:
    return load_settings(_config_path(args), overrides=overrides)


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
    if getattr(args, "own_process", False):
        from proxy.errors import AllocatorError  # noqa: PLC0415
        from proxy.runtime.allocator import restart_with_jemalloc  # noqa: PLC0415

        try:
            restart_with_jemalloc(s.allocator)  # returns only if it does not apply
        except AllocatorError as exc:
            raise ConfigError(str(exc)) from None
    from proxy.app.server import head_limits, protocol_options  # noqa: PLC0415
    from proxy.app.services import check_settings  # noqa: PLC0415
    from proxy.cli.banner import describe, emit  # noqa: PLC0415
    from proxy.telemetry.logs import configure_logging  # noqa: PLC0415

    configure_logging(s.log_level)
    check_settings(settings)  # a bad config stops here with one line, not in every worker
    config = _config_path(args)
    emit(describe(settings, config, asyncio.run(_store_warnings(settings))), sys.stderr)
    common: dict[str, Any] = {
        "host": s.host,
        "port": s.port,
        "log_level": s.log_level,
        "log_config": None,  # keep our JSON, redacting handlers
        "access_log": False,  # one structured line per request is ours
        "lifespan": "on",
        # The app sets one `date` (the upstream's, when relaying) and relays the upstream's
        # `server`; uvicorn's own would make a second of each.
        "date_header": False,
        "server_header": False,
        **protocol_options(head_limits(settings)),
    }
    if s.workers > 1:
        from proxy.cli.listeners import run_workers  # noqa: PLC0415
        from proxy.telemetry.metrics import multiprocess_dir  # noqa: PLC0415

        # Each worker process rebuilds the app from the same config through the factory.
        os.environ[CONFIG_FILE_ENV] = config or ""
        for k, v in server.items():
            os.environ[f"COMPACTD_SERVER_{k.upper()}"] = str(v)
        if args.upstream:
            os.environ["COMPACTD_UPSTREAM_URL"] = args.upstream
        with multiprocess_dir():
            # A listening socket per worker, so the kernel balances connections between them.
            app = "proxy.cli.factory:app_from_env"
            run_workers(uvicorn.Config(app, factory=True, workers=s.workers, **common))
        return 0
    from proxy.app.application import create_app  # noqa: PLC0415

    uvicorn.run(create_app(settings), **common)
    return 0


async def _store_warnings(settings: Settings) -> list[str]:
    """The store's own configuration warnings (an evicting Redis ...), for the banner."""
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.store.factory import open_store  # noqa: PLC0415

    try:
        store = await open_store(settings.store, data_dir(settings))
        try:
            warnings: list[str] = await store.check_config()
        finally:
            await store.close()
    except Exception as exc:  # noqa: BLE001 - the proxy fails open without its store
        return [
            f"store not reachable at start-up ({type(exc).__name__}): requests are forwarded "
            "uncompacted until it answers"
        ]
    return warnings


def _check_config(args: argparse.Namespace) -> int:
    from proxy.app.services import check_settings  # noqa: PLC0415
    from proxy.cli.banner import warnings  # noqa: PLC0415
    from proxy.config import admin_key_weakness  # noqa: PLC0415

    settings = _settings(args)
    # Everything start-up would build from the config, so check-config fails where serve would.
    check_settings(settings)
    weakness = admin_key_weakness(settings.server.admin_key)
    if weakness:
        raise CommandError(f"{weakness}: it reads every tenant's data (use `openssl rand -hex 32`)")
    for warning in warnings(settings):
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"ok: {_config_path(args) or '(defaults)'} — upstream {settings.upstream.url}, "
        f"{len(settings.policies) + 1} {'policy' if not settings.policies else 'policies'}"
    )
    return 0


def _compress(args: argparse.Namespace) -> int:
    from proxy.cli import compress  # noqa: PLC0415

    if args.budget <= 0 or not 0 < args.target_ratio <= 1:
        raise CommandError("--budget must be > 0 and --target-ratio in (0, 1]")
    defaults = compress.Defaults(
        model=args.model,
        provider=args.provider or "",
        budget=args.budget,
        target_ratio=args.target_ratio,
    )
    from proxy.app.services import check_settings  # noqa: PLC0415

    settings = _settings(args)
    check_settings(settings)
    progress = sys.stderr if sys.stderr.isatty() else None
    return compress.main(settings, defaults, sys.stdin.buffer, sys.stdout.buffer, progress)


def _providers(args: argparse.Namespace) -> int:
    from proxy.providers.registry import ProviderRegistry  # noqa: PLC0415

    for info in ProviderRegistry().describe():
        status = f"BROKEN: {info.error}" if info.error else "ok"
        print(f"{info.name:<14} {info.source:<50} {status}")
    del args
    return 0


def _key_id(args: argparse.Namespace) -> int:
    from proxy.cli.banner import secret_source  # noqa: PLC0415
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.wire.tenant import key_fingerprint, load_or_create_secret  # noqa: PLC0415

    key = sys.stdin.buffer.readline().strip() if args.key == "-" else args.key
    if not key:
        raise CommandError("no key given (pass it, or - to read it from stdin)")
    settings = _settings(args)
    before = secret_source(settings)
    secret = load_or_create_secret(settings.server.secret, data_dir(settings))
    source = secret_source(settings)
    if source != before:
        source += " (created now; `compactd serve` will use it)"
    print(key_fingerprint(secret, _credential(key)))
    config = _config_path(args) or "none"
    print(f"secret: {source}; config: {config} (the same as `compactd serve`)", file=sys.stderr)
    return 0


def _with_store(args: argparse.Namespace, work: Callable[[Store, Settings], Awaitable[int]]) -> int:
    """Open the configured store, say which one on stderr (a store other than the server's
    looks empty, not wrong), run `work`, close it."""
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.store.factory import open_store  # noqa: PLC0415

    settings = _settings(args)
    print(f"compactd: {_store_name(settings)}", file=sys.stderr)

    async def go() -> int:
        store = await open_store(settings.store, data_dir(settings))
        try:
            return await work(store, settings)
        finally:
            await store.close()

    return asyncio.run(go())


def _store_name(settings: Settings) -> str:
    """`store sqlite /path/compactd.db (data dir /path)`: what a store command reads."""
    from proxy.cli.banner import store_location  # noqa: PLC0415
    from proxy.config import data_dir  # noqa: PLC0415

    kind, where = store_location(settings)
    return f"store {kind} {where} (data dir {data_dir(settings)})"


def _terminal() -> Any:
    """stderr when it is a terminal (progress goes there), else None."""
    return sys.stderr if sys.stderr.isatty() else None


def _tenant(args: argparse.Namespace, settings: Settings) -> str | None:
    """None (every tenant) unless --key or --tenant scopes the command to one tenant."""
    chosen = getattr(args, "tenant", None)
    if chosen is not None:
        return str(chosen)
    if getattr(args, "key", None) is None:
        return None
    key = _credential(args.key)
    if key is None:
        # `--key "$KEY"` with $KEY unset: scoping to nobody must not widen to every tenant.
        raise CommandError("--key: the key is empty")
    from proxy.config import data_dir  # noqa: PLC0415
    from proxy.wire.tenant import load_or_create_secret, tenant_id  # noqa: PLC0415

    secret = load_or_create_secret(settings.server.secret, data_dir(settings))
    return tenant_id(secret, key)


def _credential(typed: str | bytes) -> str | None:
    """A key as typed (`sk-…`, `Bearer sk-…`, `Basic …`): the credential a request would carry."""
    from proxy.wire.tenant import credential, header_text  # noqa: PLC0415

    # The server reads a header's bytes, not text: a client sends the bytes typed here (argv's
    # own, as fsencode gives them back), so the key id is computed from those, as it reads them.
    raw = typed if isinstance(typed, bytes) else os.fsencode(typed)
    return credential({"authorization": header_text(raw)})


def _conversations(args: argparse.Namespace) -> int:
    from proxy.app.views import conversation_summary  # noqa: PLC0415
    from proxy.cli.progress import waiting  # noqa: PLC0415

    async def work(store: Store, settings: Settings) -> int:
        infos = await waiting(
            store.list_conversations(_tenant(args, settings)), _terminal(), "listing"
        )
        if not infos:
            print(f"compactd: no conversations in {_store_name(settings)}", file=sys.stderr)
        if args.json:
            print(orjson.dumps([conversation_summary(i) for i in infos]).decode())
            return 0
        head = ("conversation", "tenant", "events", "originals", "bytes", "last used (UTC)")
        print(f"{head[0]:<28} {head[1]:<26} {head[2]:>6} {head[3]:>9} {head[4]:>10}  {head[5]}")
        for i in infos:
            used = time.strftime("%Y-%m-%d %H:%M", time.gmtime(i.updated_at))
            print(
                f"{i.conversation:<28} {i.tenant:<26} {i.checkpoint_count:>6} "
                f"{i.original_count:>9} {i.size_bytes:>10}  {used}"
            )
        return 0

    return _with_store(args, work)


def _conversation_id(args: argparse.Namespace) -> str:
    """The conversation argument (and --tenant), refused as a bad argument if no conversation
    can have it."""
    from proxy.store.base import check_ids  # noqa: PLC0415

    if args.tenant is not None and args.key is not None:
        raise CommandError("--key and --tenant both name a tenant: give one")
    try:
        check_ids(args.tenant, args.conversation)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    return str(args.conversation)


def _restore(args: argparse.Namespace) -> int:
    from proxy.app.views import restored_json  # noqa: PLC0415
    from proxy.chat.checkpoint import restore  # noqa: PLC0415

    conversation = _conversation_id(args)

    async def work(store: Store, settings: Settings) -> int:
        info = await store.get_conversation(_tenant(args, settings), conversation)
        restored = restore(info) if info is not None else None
        if info is None or (restored is None and not info.unreadable):
            print(
                f"compactd: no compacted conversation {conversation!r} in {_store_name(settings)}",
                file=sys.stderr,
            )
            return 1
        # A Responses or Messages conversation is stored as chat projections of its items:
        # what goes back is the client's own items, in that API's shape.
        out = {"conversation": info.conversation, **restored_json(info, restored)}
        missing = out["missing_ids"]
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        if missing:
            shown = ", ".join(missing[:5])
            print(f"compactd: incomplete restore, missing {shown}", file=sys.stderr)
            return 1
        return 0

    return _with_store(args, work)


def _purge(args: argparse.Namespace) -> int:
    conversation = _conversation_id(args)

    async def work(store: Store, settings: Settings) -> int:
        deleted = await store.purge(_tenant(args, settings), conversation)
        print("deleted" if deleted else "not found")
        if not deleted:
            where = _store_name(settings)
            print(f"compactd: no conversation {conversation!r} in {where}", file=sys.stderr)
        return 0 if deleted else 1

    return _with_store(args, work)


def _stats(args: argparse.Namespace) -> int:
    from proxy.cli.progress import waiting  # noqa: PLC0415
    from proxy.telemetry.stats import compute_stats, format_table, parse_since, stats_json  # noqa: PLC0415
    from proxy.tokens.budget import ModelTable  # noqa: PLC0415

    try:
        since = parse_since(args.since)
    except ValueError as exc:
        raise CommandError(f"--since: {exc}") from None

    async def work(store: Store, settings: Settings) -> int:
        reading = store.usage(_tenant(args, settings), since.isoformat())
        rows = await waiting(reading, _terminal(), "reading usage")
        if not rows:
            print(
                f"compactd: no usage since {since.isoformat()} in {_store_name(settings)}",
                file=sys.stderr,
            )
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
    serve.add_argument("--config", help=CONFIG_HELP)
    serve.add_argument("--host", help="address to listen on (server.host; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port; default 8787)")
    serve.add_argument("--workers", type=int, help="worker processes (server.workers; default 1)")
    serve.add_argument("--upstream", help="upstream base URL (default https://api.openai.com/v1)")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("config", nargs="?", help=CONFIG_HELP)
    check.set_defaults(func=_check_config)

    comp = sub.add_parser("compress", help="compress JSONL conversations from stdin to stdout")
    comp.add_argument("--config", help=CONFIG_HELP)
    comp.add_argument(
        "--budget",
        type=float,
        default=0.5,
        help="tokens each request must fit, or a fraction <= 1 of its own count "
        "(default 0.5: half of each line's tokens)",
    )
    comp.add_argument(
        "--model", default="gpt-4o", help="model for lines that name none (default gpt-4o)"
    )
    comp.add_argument(
        "--provider", help="provider for lines that name none (default: policy chain)"
    )
    comp.add_argument(
        "--target-ratio",
        type=float,
        default=1.0,
        help="aim at this share of the budget (default 1.0; the proxy uses the policy's 0.7)",
    )
    comp.set_defaults(func=_compress)

    prov = sub.add_parser("providers", help="list installed compression providers")
    prov.set_defaults(func=_providers)

    kid = sub.add_parser("key-id", help="print a key's fingerprint for policy matching")
    kid.add_argument("key", help="the API key, or - to read it from stdin (keeps it out of ps)")
    kid.add_argument("--config", help=CONFIG_HELP)
    kid.set_defaults(func=_key_id)

    for name, func, text in (
        ("conversations", _conversations, "list stored conversations with sizes"),
        ("restore", _restore, "print a conversation's original messages"),
        ("purge", _purge, "delete a conversation's stored data"),
        ("stats", _stats, "requests, tokens and money saved"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--config", help=CONFIG_HELP)
        cmd.add_argument("--key", help="scope to the tenant of this API key (default: all)")
        if name in ("restore", "purge"):
            cmd.add_argument("conversation", help="its id, as `conversations` lists it")
            # Two tenants can have the same conversation id (a digest of how it starts).
            cmd.add_argument(
                "--tenant", help="only this tenant's (its id, as `conversations` lists it)"
            )
        if name in ("conversations", "stats"):
            cmd.add_argument("--json", action="store_true", help="print JSON, not a table")
        if name == "stats":
            cmd.add_argument(
                "--since", default="7d", help="first UTC day: 7d, 2w, 0d (today) or YYYY-MM-DD"
            )
            cmd.add_argument(
                "--by", choices=GROUP_BY, default="policy", help="group rows by (default policy)"
            )
        cmd.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `compactd` command: errors are one line and an exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Only a command run as its own program may start itself again (`serve`, with jemalloc).
    args.own_process = argv is None
    from proxy.errors import StoreError  # noqa: PLC0415

    try:
        result: int = args.func(args)
        sys.stdout.flush()  # a reader that has gone is found here, not at exit
    except ConfigError as exc:
        problems = exc.problems
        if len(problems) > 1:
            return _fail("configuration errors:\n  " + "\n  ".join(problems), 2)
        return _fail(f"configuration error: {exc}", 2)
    except CommandError as exc:
        return _fail(str(exc), 2)
    except BrokenPipeError:
        return _reader_gone()
    except (StoreError, OSError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}", 1)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a command never ends in a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc}", 1)
    return result


def _reader_gone() -> int:
    """`compactd restore … | head`: stop quietly, with the status of a Unix tool that SIGPIPE
    ended (Python ignores the signal, so a write raises instead). Nothing more can reach the
    reader, so stdout goes to /dev/null, or the interpreter's own flush at exit would fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _fail(message: str, code: int) -> int:
    print(f"compactd: {message}", file=sys.stderr)
    return code
