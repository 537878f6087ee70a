"""A model table with a tiny model, for tests of context windows learned from upstream errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_TABLE = """
[default]
context_window = 32768
max_output = 4096
encoding = "o200k_base"
input_price = 0.0
cached_input_price = 0.0
output_price = 0.0

[[models]]
pattern = "tiny-*"
context_window = 4000
max_output = 100
encoding = "o200k_base"
input_price = 0.0
cached_input_price = 0.0
output_price = 0.0
"""


def tiny_model(tmp_path: Path) -> dict[str, Any]:
    """`tokens` settings with a 4,000-token model "tiny-*" whose windows may be learned down to
    1,024 (the default floor, 8,192, is above a tiny model's whole window)."""
    path = tmp_path / "models.toml"
    path.write_text(TINY_TABLE)
    return {"models_file": str(path), "min_learned_window": 1024}
