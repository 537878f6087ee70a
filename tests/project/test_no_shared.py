"""Tests never read the benchmark corpora (see `tests/conftest.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import locations, quality, session


def test_every_bench_loader_fails_under_the_suite_for_want_of_a_corpora_directory() -> None:
    assert locations.ENV not in os.environ
    with pytest.raises(locations.CorporaUnsetError, match=locations.ENV):
        locations.corpora()
    with pytest.raises(locations.CorporaUnsetError):
        quality.load_tau(None)
    with pytest.raises(locations.CorporaUnsetError):
        quality.load_aider(None)
    with pytest.raises(locations.CorporaUnsetError):
        quality.load_new("swe-agent", None)
    with pytest.raises(locations.CorporaUnsetError):
        session.load_corpora(1, 1)


def test_a_subprocess_a_test_starts_has_no_corpora_directory_either() -> None:
    code = (
        "from bench import locations, quality\n"
        "try:\n    quality.load_tau(None)\n"
        "except locations.CorporaUnsetError:\n    print('unset')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert out.stdout.strip() == "unset"


@pytest.mark.parametrize("folder", locations.FOLDERS)
def test_reading_a_corpus_folder_fails_wherever_it_lies(tmp_path: Path, folder: str) -> None:
    where = tmp_path / folder
    where.mkdir()
    try:
        with pytest.raises(PermissionError, match="must not need the corpora"):
            (where / "conversations.jsonl").write_text("{}")
        with pytest.raises(PermissionError, match="must not need the corpora"):
            list(where.iterdir())
        assert not (where / "conversations.jsonl").exists()  # refused before it was created
    finally:
        where.rmdir()  # pytest's clean-up lists tmp_path: it must hold no corpus folder


def test_the_setting_moves_every_corpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(locations.ENV, str(tmp_path))
    assert locations.corpora() == tmp_path
    assert locations.corpus(locations.TAU) == tmp_path / locations.TAU
    assert locations.corpus(locations.AIDER_SESSIONS).parent == tmp_path / locations.AIDER


def test_files_elsewhere_are_read_as_usual(tmp_path: Path) -> None:
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "x.txt").write_text("ok")
    assert (tmp_path / "corpora" / "x.txt").read_text() == "ok"
