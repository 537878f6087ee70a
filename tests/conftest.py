"""Shared test fixtures. Area-specific helpers live in their own modules under tests/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _offline_tiktoken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test loads encodings from the packaged copy, never the network."""
    cache = tmp_path_factory.mktemp("tiktoken")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return cache
