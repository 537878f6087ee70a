"""The `compactd` command: serve, check-config, and the inspection commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from proxy import __version__
from proxy.config import ConfigError, Settings, load_settings


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
    if s.workers > 1:
        # Each worker process rebuilds the app from the same config through the factory.
        import os  # noqa: PLC0415

        os.environ["COMPACTD_CONFIG_FILE"] = args.config or ""
        for k, v in server.items():
            os.environ[f"COMPACTD_SERVER_{k.upper()}"] = str(v)
        if args.upstream:
            os.environ["COMPACTD_UPSTREAM_URL"] = args.upstream
        uvicorn.run(
            "proxy.factory:app_from_env",
            factory=True,
            host=s.host,
            port=s.port,
            workers=s.workers,
            log_level=s.log_level,
            access_log=False,
            lifespan="on",
        )
        return 0
    from proxy.app import create_app  # noqa: PLC0415

    uvicorn.run(
        create_app(settings),
        host=s.host,
        port=s.port,
        log_level=s.log_level,
        access_log=False,
        lifespan="on",
    )
    return 0


def _check_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    print(
        f"ok: {args.config or '(defaults)'} — upstream {settings.upstream.url}, "
        f"{len(settings.policies) + 1} policies"
    )
    return 0


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
