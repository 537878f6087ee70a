"""Tests never read the benchmark corpora beside the checkout (see `tests/conftest.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import quality


def test_reading_the_corpora_from_a_test_fails_even_where_they_exist() -> None:
    with pytest.raises(PermissionError, match=r"must not need \.\./shared"):
        (quality.CORPORA / "README.md").read_text()
    with pytest.raises(PermissionError, match=r"must not need \.\./shared"):
        list(quality.CORPORA.iterdir())


def test_files_elsewhere_are_read_as_usual(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.txt").write_text("ok")
    assert (tmp_path / "shared" / "x.txt").read_text() == "ok"
