"""mkdocs hook: the configuration reference, generated from proxy/config/ and the example config.

The settings' names, types and defaults come from the dataclasses in `proxy.config` (the schema
the loader enforces); each key's description is the comment above it in `config/compactd.toml`
(which must show every key anyway). The page `configuration.md` holds the marker below, and the
hook puts the tables in its place at build time, so the reference cannot drift from the code.
`tests/project/test_docs.py` imports this file to check that every key has a row and a description.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "compactd.toml"
MARKER = "<!-- config-reference -->"
PAGE = "configuration.md"

_HEADER = re.compile(r"^\[\[?([A-Za-z0-9_.]+)\]\]?$")
_KEY = re.compile(r"^([a-z_][a-z0-9_]*)\s*=")


class _Parser:
    """Walks the example config, remembering the comment block above each key."""

    def __init__(self) -> None:
        self.section = ""
        self.in_example = False  # inside a commented-out `# [[policies]]` example
        self.pending: list[str] = []
        self.group = ""  # the first key of the current run of keys (they share one comment)
        self.found: dict[tuple[str, str], str] = {}

    def key(self, name: str) -> None:
        section = "default_policy" if self.in_example else self.section
        if self.pending:
            text = " ".join(self.pending)
            self.group = name
        elif self.group:
            text = f"See `{self.group}`."
        else:
            return
        self.found.setdefault((section, name), text)
        self.pending = []

    def header(self, name: str, commented: bool) -> None:
        if ".options." in name:
            if self.pending:
                text = " ".join(self.pending).removesuffix(" e.g.:").rstrip(",")
                self.found.setdefault(("default_policy", "options"), text + ".")
        elif commented:
            self.in_example = name == "policies"
        else:
            self.section, self.in_example = name, False
        self.pending, self.group = [], ""

    def line(self, raw: str) -> None:
        line = raw.strip()
        if not line:
            self.pending, self.group = [], ""
            return
        commented = line.startswith("#")
        body = line.lstrip("#").strip() if commented else line
        if m := _HEADER.match(body):
            self.header(m.group(1), commented)
        elif not commented or (self.in_example and not line.startswith("# #")):
            if m := _KEY.match(body):
                self.key(m.group(1))
        elif self.in_example:
            self.pending.append(line[3:].strip())
        elif not _KEY.match(body):  # `# model = "…"`: an example value, not a description
            self.pending.append(body)


def descriptions(text: str | None = None) -> dict[tuple[str, str], str]:
    """Each (section, key) of the example config with the comment that describes it."""
    parser = _Parser()
    for raw in (text if text is not None else EXAMPLE.read_text()).splitlines():
        parser.line(raw)
    return parser.found


def _schema() -> tuple[Any, dict[str, str], dict[str, type]]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from proxy import config  # noqa: PLC0415  (the hook runs inside mkdocs, from the checkout)

    hints = get_type_hints(config.Settings)
    sections = {
        f.name: hints[f.name] for f in dataclasses.fields(config.Settings) if f.name != "policies"
    }
    return config, config.ENV_ALIASES, sections


def _type(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " or ".join(f'`"{v}"`' for v in get_args(tp))
    if origin is tuple:
        return "list of strings"
    if origin is dict:
        return "table"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp, str(tp))


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    # `<data_dir>` outside a code span would be read as an HTML tag; inside one it is shown as is.
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def sections() -> dict[str, list[str]]:
    """Every config section and its keys, in the schema's order."""
    _, _, secs = _schema()
    return {name: [f.name for f in dataclasses.fields(cls)] for name, cls in secs.items()}


def render(text: str | None = None) -> str:
    """The reference: one table per section, every key with type, default, variable and meaning."""
    config, aliases, secs = _schema()
    notes = descriptions(text)
    by_key: dict[str, list[str]] = {}
    for name, dotted in aliases.items():
        by_key.setdefault(dotted, []).append(name)
    out = []
    for section, cls in secs.items():
        policy = section == "default_policy"
        out += ["## `[default_policy]` and `[[policies]]`" if policy else f"## `[{section}]`", ""]
        out += ["| key | type | default | environment | what it does |", "|---|---|---|---|---|"]
        hints = get_type_hints(cls)
        defaults = cls()
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            env = [] if get_origin(tp) is dict else [f"COMPACTD_{section}_{f.name}".upper()]
            env += by_key.get(f"{section}.{f.name}", [])
            row = [
                f"`{f.name}`",
                _type(tp),
                _default(getattr(defaults, f.name)),
                "<br>".join(f"`{e}`" for e in env) or "—",
                _cell(notes.get((section, f.name), "")),
            ]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    out.append(f"`{config.CONFIG_FILE_ENV}` names the config file when no `--config` is given.")
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Put the generated reference where the configuration page has its marker."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} marker: the reference has nowhere to go")
    return markdown.replace(MARKER, render())
