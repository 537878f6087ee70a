"""No module of proxy/ passes 500 lines (issue 31; STYLE.md: "500 is a bug").

A module that long holds more than one concept: split it by what its parts are for.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500


def test_no_module_of_proxy_passes_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in (ROOT / "proxy").rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert long == {}
