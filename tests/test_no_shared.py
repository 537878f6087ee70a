"""Tests never read the benchmark corpora (see `tests/conftest.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import locations, quality, session


def test_every_bench_loader_looks_in_an_empty_directory_under_the_suite() -> None:
    where = locations.corpora()
    assert where != locations.beside_checkout()
    assert where.is_dir()
    assert not any(where.iterdir())
    with pytest.raises(FileNotFoundError, match=str(where)):
        quality.load_tau(None)
    with pytest.raises(FileNotFoundError, match=str(where)):
        quality.load_aider(None)
    with pytest.raises(FileNotFoundError, match=str(where)):
        session.load_corpora(1, 1)
    assert quality.load_new("swe-agent", None) == []  # a missing converted corpus is skipped


def test_a_subprocess_a_test_starts_inherits_the_empty_directory() -> None:
    code = "from bench import locations; print(locations.corpora())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.stdout.strip() == os.environ[locations.ENV]


def test_reading_the_corpora_beside_the_checkout_fails_even_where_they_exist() -> None:
    beside = locations.beside_checkout()
    with pytest.raises(PermissionError, match="must not need the corpora"):
        (beside / "README.md").read_text()
    with pytest.raises(PermissionError, match="must not need the corpora"):
        list(beside.iterdir())


def test_the_setting_moves_every_corpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(locations.ENV, str(tmp_path))
    assert locations.corpus(locations.TAU) == tmp_path / locations.TAU
    monkeypatch.delenv(locations.ENV)
    assert locations.corpora() == locations.beside_checkout()


def test_files_elsewhere_are_read_as_usual(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.txt").write_text("ok")
    assert (tmp_path / "shared" / "x.txt").read_text() == "ok"
