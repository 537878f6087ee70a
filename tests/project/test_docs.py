"""The docs cover every setting, command, header and metric: a key nobody can find does not exist.

The documentation is the mkdocs site in docs/ (its configuration reference generated from the
schema by docs/_hooks/config_reference.py) and the README, its front door.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from proxy.cli.main import build_parser
from proxy.config import PolicySettings, Settings, load_settings
from proxy.providers.base import ContextProvider
from proxy.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
EXAMPLE = ROOT / "config" / "compactd.toml"
DOCS = ROOT / "docs"
PAGES = {p.name: p.read_text() for p in sorted(DOCS.glob("*.md"))}
SITE = "\n".join(PAGES.values())
README_MAX_LINES = 300


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"docs_hook_{name}", DOCS / "_hooks" / f"{name}.py"
    )
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CONFIG_HOOK = _hook("config_reference")
REFERENCE = CONFIG_HOOK.render()
NOTES = CONFIG_HOOK.descriptions()


def _sections() -> list[tuple[str, type]]:
    return [
        (f.name, f.default_factory().__class__)
        for f in dataclasses.fields(Settings)
        if f.name != "policies"
    ]  # type: ignore[misc]


def _reference_table(section: str) -> list[str]:
    """The generated reference's rows for `section` (from its heading to the next one)."""
    title = (
        "`[default_policy]` and `[[policies]]`" if section == "default_policy" else f"`[{section}]`"
    )
    block = REFERENCE.split(f"## {title}\n", 1)
    assert len(block) == 2, f"no [{section}] table in the generated configuration reference"
    return [line for line in block[1].split("\n## ", 1)[0].splitlines() if line.startswith("| `")]


def test_example_config_loads_and_equals_the_defaults() -> None:
    assert load_settings(EXAMPLE, env={}) == Settings()


@pytest.mark.parametrize(("section", "cls"), _sections())
def test_every_key_is_in_the_example_config_with_a_description(section: str, cls: type) -> None:
    table = tomllib.loads(EXAMPLE.read_text())[section]
    text = EXAMPLE.read_text()
    for f in dataclasses.fields(cls):
        if section == "default_policy" and f.name.startswith("match_"):
            assert f"# {f.name} =" in text, f"{f.name} is not shown in the [[policies]] example"
        elif f.name == "options":
            assert f"options.{'trim'}" in text
        else:
            assert f.name in table, f"{section}.{f.name} is missing from config/compactd.toml"
        # The reference's description is the comment above the key: none, and the row says nothing.
        assert NOTES.get((section, f.name)), f"{section}.{f.name} has no comment above it"


def test_policy_keys_are_all_documented() -> None:
    rows = "\n".join(_reference_table("default_policy"))
    for f in dataclasses.fields(PolicySettings):
        assert f"| `{f.name}` |" in rows


@pytest.mark.parametrize(("section", "cls"), _sections())
def test_every_key_is_in_its_sections_table_of_the_configuration_reference(
    section: str, cls: type
) -> None:
    # A mention anywhere is not enough: the section's table is where a reader looks.
    keys = [row.split("`")[1] for row in _reference_table(section)]
    assert keys == [f.name for f in dataclasses.fields(cls)]


def test_the_configuration_page_has_the_marker_the_reference_goes_in() -> None:
    assert CONFIG_HOOK.MARKER in PAGES["configuration.md"]


def test_a_key_without_a_comment_gets_no_description() -> None:
    # The parser must not hand a key the comment of a key in another section or block.
    notes = CONFIG_HOOK.descriptions("[server]\n# Listen here.\nhost = 1\n\nport = 2\n")
    assert notes == {("server", "host"): "Listen here."}


def test_every_cli_command_is_in_the_docs() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # type: ignore[union-attr]
        assert re.search(rf"compactd {name}\b", SITE), f"`compactd {name}` is not in docs/"


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
    assert f"`x-compactd-{header}`" in PAGES["request-path.md"]
    assert f"`x-compactd-{header}`" in README


def _header_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| `x-compactd-")]


def test_the_readme_and_the_request_page_have_the_same_header_table() -> None:
    assert _header_rows(README) == _header_rows(PAGES["request-path.md"])
    assert len(_header_rows(README)) >= 10


def test_every_metric_is_documented() -> None:
    page = PAGES["observability.md"]
    for family in Metrics()._registry.collect():
        total = "_total" if family.type == "counter" else ""
        short = family.name.removeprefix("compactd")
        forms = (f"`{family.name}{total}`", f"`{short}{total}`")
        assert any(f in page for f in forms), f"{family.name}{total} is not in observability.md"


def test_every_plugin_hook_is_documented() -> None:
    page = PAGES["writing-a-provider.md"]
    hooks = [n for n in vars(ContextProvider) if not n.startswith("_")]
    assert {"compress", "should_compress", "option_schema", "check_options"} <= set(hooks)
    for name in hooks:
        assert f"`{name}`" in page, f"ContextProvider.{name} is not in writing-a-provider.md"


def test_the_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES
    for command in ("make run", "make test"):
        assert command in README


def test_the_readmes_links_point_at_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_benchmark_report_is_dated_and_listed() -> None:
    index = (ROOT / "bench" / "README.md").read_text()
    for report in sorted((ROOT / "bench" / "results").glob("*.md")):
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", report.name), report.name
        assert f"(results/{report.name})" in index, f"{report.name} is not in bench/README.md"


def test_no_report_or_page_names_a_local_path() -> None:
    texts = {**PAGES, **{p.name: p.read_text() for p in (ROOT / "bench" / "results").glob("*.md")}}
    for name, text in texts.items():
        assert not re.search(r"/work/|/tmp/|/home/(?!me/)", text), f"{name} names a local path"
