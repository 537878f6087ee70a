"""The docs cover every setting, command and header: a key nobody can find does not exist."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from proxy.cli import build_parser
from proxy.config import PolicySettings, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLE = ROOT / "config" / "compactd.toml"


def _sections() -> list[tuple[str, type]]:
    return [
        (f.name, f.default_factory().__class__)
        for f in dataclasses.fields(Settings)
        if f.name != "policies"
    ]  # type: ignore[misc]


def test_example_config_loads_and_equals_the_defaults() -> None:
    assert load_settings(EXAMPLE, env={}) == Settings()


@pytest.mark.parametrize(("section", "cls"), _sections())
def test_every_key_is_in_the_example_config_and_readme(section: str, cls: type) -> None:
    table = tomllib.loads(EXAMPLE.read_text())[section]
    text = EXAMPLE.read_text()
    for f in dataclasses.fields(cls):
        if section == "default_policy" and f.name.startswith("match_"):
            assert f"# {f.name} =" in text, f"{f.name} is not shown in the [[policies]] example"
        elif f.name == "options":
            assert f"options.{'trim'}" in text
        else:
            assert f.name in table, f"{section}.{f.name} is missing from config/compactd.toml"
        assert f"`{f.name}`" in README, f"{section}.{f.name} is not in the README"


def test_policy_keys_are_all_documented() -> None:
    for f in dataclasses.fields(PolicySettings):
        assert f"`{f.name}`" in README


def _table_row(section: str) -> str:
    """The Configuration table's row for `section` (`[tokens]`, or both policy headings)."""
    heading = (
        "| `[default_policy]`, `[[policies]]` |"
        if section == "default_policy"
        else (f"| `[{section}]` |")
    )
    rows = [line for line in README.splitlines() if line.startswith(heading)]
    assert len(rows) == 1, f"no single row for [{section}] in the README's Configuration table"
    return rows[0]


@pytest.mark.parametrize(("section", "cls"), _sections())
def test_every_key_is_in_its_sections_row_of_the_configuration_table(
    section: str, cls: type
) -> None:
    # A mention anywhere in the README is not enough: the table is where a reader looks.
    row = _table_row(section)
    missing = [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in row]
    assert not missing, f"[{section}] row of the README's Configuration table lacks {missing}"


def test_every_cli_command_is_in_the_readme() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # type: ignore[union-attr]
        assert re.search(rf"compactd {name}\b", README), f"`compactd {name}` is not in the README"


@pytest.mark.parametrize(
    "header",
    [
        "action",
        "tokens-before",
        "tokens-after",
        "provider",
        "policy",
        "conversation",
        "overhead-ms",
    ],
)
def test_every_response_header_is_documented(header: str) -> None:
    assert f"`x-compactd-{header}`" in README
