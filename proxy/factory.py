"""Builds the app in each worker process from the environment the CLI prepared."""

from __future__ import annotations

import os

from proxy.app import CompactdApp, create_app
from proxy.config import load_settings


def app_from_env() -> CompactdApp:
    """uvicorn factory for `--workers N`: same config as the parent process."""
    path = os.environ.get("COMPACTD_CONFIG_FILE") or None
    return create_app(load_settings(path))
