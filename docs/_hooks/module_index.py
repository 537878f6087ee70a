"""mkdocs hook: the architecture page's module index, read from the source tree at build time.

Every module under proxy/ with the first line of its docstring (read with `ast`, nothing is
imported), grouped by folder, so the index lists what is there today, whatever moved.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "proxy"
MARKER = "<!-- module-index -->"
PAGE = "architecture.md"


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().split("\n\n")[0]
    return " ".join(first.split()).replace("|", "\\|")


def render() -> str:
    """One table per folder of proxy/: module, and what its docstring says it holds."""
    out = []
    folders = sorted({p.parent for p in PACKAGE.rglob("*.py")}, key=lambda p: p.relative_to(ROOT))
    for folder in folders:
        rel = folder.relative_to(ROOT).as_posix()
        modules = sorted(folder.glob("*.py"))
        count = f"{len(modules)} module{'s' if len(modules) != 1 else ''}"
        out += [f"### `{rel}/` ({count})", ""]
        out += ["| module | what it holds |", "|---|---|"]
        out += [f"| `{m.name}` | {_summary(m)} |" for m in modules]
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Put the module index where the architecture page has its marker."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} marker: the index has nowhere to go")
    return markdown.replace(MARKER, render())
