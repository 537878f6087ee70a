"""mkdocs hook: bench/README.md and the dated reports in bench/results/ become pages of the site.

They live beside the benchmarks they describe (and read well on a code host from there); the
site takes them as they are, under `bench/`. Links are written to work in the repository
(`../bench/…` from a page in docs/, `../../docs/…` from a report), and are mapped here to
where the same files sit in the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
_SITE_FILES = ("README.md", "results/*.md", "results/*.png")


def on_files(files: Any, config: Any) -> Any:
    """Add the benchmark pages (and their images) to the site, under bench/."""
    from mkdocs.structure.files import File  # noqa: PLC0415  (only inside mkdocs)

    for pattern in _SITE_FILES:
        for path in sorted(BENCH.glob(pattern)):
            uri = "bench/" + path.relative_to(BENCH).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def _depth(src_uri: str) -> int:
    return src_uri.count("/")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Map repository-relative links to the site's layout (docs/ is the site's root)."""
    uri = page.file.src_uri
    if uri.startswith("bench/"):
        up = "../" * _depth(uri)
        # from bench/X.md, ../docs/Y is ../Y in the site; from bench/results/X.md, ../../docs/Y
        return markdown.replace(f"]({up}docs/", f"]({up}")
    if _depth(uri) == 0:
        return re.sub(r"\]\(\.\./bench/", "](bench/", markdown)
    return markdown
