"""One error tree in one module: every exception class compactd defines is in proxy/errors.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import proxy.errors
from proxy.errors import CompactdError

ROOT = Path(__file__).resolve().parents[2]
ERRORS = ROOT / "proxy" / "errors.py"


def _is_exception(node: ast.ClassDef) -> bool:
    names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    return any(n.endswith(("Error", "Exception", "Exit", "Interrupt")) for n in names)


def test_no_module_but_errors_defines_an_exception_class() -> None:
    elsewhere = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
        for path in sorted((ROOT / "proxy").rglob("*.py"))
        if path != ERRORS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and _is_exception(node)
    ]
    assert elsewhere == []


def test_every_class_of_the_tree_is_a_compactd_error_its_docstring_and_docs_page_draw() -> None:
    classes = [c for _, c in inspect.getmembers(proxy.errors, inspect.isclass)]
    page = (ROOT / "docs" / "errors.md").read_text()
    assert len(classes) > 30
    assert "```text\nCompactdError\n" in (proxy.errors.__doc__ or "")
    for cls in classes:
        assert issubclass(cls, CompactdError), cls
        if cls is not CompactdError:
            assert f"── {cls.__name__}" in (proxy.errors.__doc__ or ""), cls
            assert f"── {cls.__name__}" in page, cls


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    doc = proxy.errors.__doc__ or ""
    drawing = doc[doc.index("```text") : doc.index("```", doc.index("```text") + 3)]
    parents = ["CompactdError"]
    for line in drawing.splitlines()[2:]:
        depth = line.index("── ") // 4
        name = line[line.index("── ") + 3 :].split()[0]
        parents[depth + 1 :] = [name]
        cls = getattr(proxy.errors, name)
        branch = next(b for b in cls.__bases__ if issubclass(b, CompactdError))
        assert branch.__name__ == parents[depth], name
