"""The sdist and wheel build from a clone and pass `twine check --strict`, as an upload would
need; they carry the licence, the metadata a package index shows, and what `compactd` reads at
run time. The build runs as a user's would (`python -m build`, isolated)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def test_both_artifacts_pass_twine_check_strict(dist: Path) -> None:
    artifacts = sorted(p.name for p in dist.iterdir())
    assert len(artifacts) == 2, artifacts
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_the_wheel_carries_the_licence_metadata_and_run_time_data(dist: Path) -> None:
    wheel = next(dist.glob("*.whl"))
    assert wheel.name.endswith("-py3-none-any.whl")  # pure Python: installing needs no compiler
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(info).decode())
        licence = zf.read(next(n for n in names if n.endswith("licenses/LICENSE"))).decode()
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "Apache License" in licence
    assert "Version 2.0, January 2004" in licence
    assert meta["License-Expression"] == "Apache-2.0"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) >= {"Homepage", "Repository", "Issues", "Changelog", "Documentation"}
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the expression says it
    assert meta["Requires-Python"] == ">=3.11"
    assert any(r.startswith("tqdm") for r in meta.get_all("Requires-Dist"))
    assert {
        "proxy/data/compactd.toml",
        "proxy/data/models.toml",
        "proxy/py.typed",
        "proxy/app/ui/static/index.html",
    } <= names
    assert "compactd = proxy.cli.main:main" in entry_points
    assert re.search(r"^engine = proxy\.providers\.engine:EngineProvider$", entry_points, re.M)


def test_the_sdist_carries_licence_changelog_and_tests(dist: Path) -> None:
    sdist = next(dist.glob("*.tar.gz"))
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= names
    assert "tests/project/test_packaging.py" in names
    assert not any(n.startswith((".venv/", "dist/")) for n in names)


def test_the_changelog_keeps_a_changelog_form() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    sections = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert sections[0] == "Unreleased"
    assert re.search(r"^\[Unreleased\]: https://", text, re.M)
    assert re.search(r"^### Added$", text, re.M)
