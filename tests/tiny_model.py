"""A model table with a tiny model, for tests of context windows learned from upstream errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def table_entry(section: str, context_window: int, max_output: int, pattern: str = "") -> str:
    """One entry of a model table (`[default]` or `[[models]]`), free and in o200k_base."""
    match = f'pattern = "{pattern}"\n' if pattern else ""
    return (
        f"[{section}]\n{match}context_window = {context_window}\nmax_output = {max_output}\n"
        'encoding = "o200k_base"\ninput_price = 0.0\ncached_input_price = 0.0\n'
        "output_price = 0.0\n"
    )


TINY_TABLE = table_entry("default", 32768, 4096) + table_entry("[models]", 4000, 100, "tiny-*")


def tiny_model(tmp_path: Path) -> dict[str, Any]:
    """`tokens` settings with a 4,000-token model "tiny-*" whose windows may be learned down to
    1,024 (the default floor, 8,192, is above a tiny model's whole window)."""
    path = tmp_path / "models.toml"
    path.write_text(TINY_TABLE)
    return {"models_file": str(path), "min_learned_window": 1024}
