"""Builds the app in each worker process from the environment the CLI prepared."""

from __future__ import annotations

import os

from proxy.app.application import CompactdApp, create_app
from proxy.config import load_settings
from proxy.telemetry.logs import configure_logging, mute_uvicorn_access


def app_from_env() -> CompactdApp:
    """uvicorn factory for `--workers N`: same config as the parent process."""
    path = os.environ.get("COMPACTD_CONFIG_FILE") or None
    settings = load_settings(path)
    # Workers are fresh processes: their logging must be JSON and redacting too.
    configure_logging(settings.server.log_level)
    mute_uvicorn_access()  # the CLI runs uvicorn with access_log=False; keep it so
    return create_app(settings)
