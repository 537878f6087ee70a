"""The OpenAPI document: valid OpenAPI 3.1 (openapi-spec-validator), served by a running app, and
exactly the app's own routes (every route documented, every documented path answered)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from openapi_spec_validator import validate
from starlette.routing import Route

from proxy.app.application import create_app
from proxy.app.openapi import PATH, document
from proxy.app.ui import PREFIX
from proxy.config import load_settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def app_routes() -> dict[str, set[str]]:
    """Every route compactd itself answers (the dashboard's static files aside): methods."""
    settings = load_settings(None, env={}, overrides={})
    app = create_app(settings)
    found: dict[str, set[str]] = {}
    for route in app.router.routes:
        assert isinstance(route, Route)
        if route.path.startswith(PREFIX):
            continue
        path = re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", route.path)
        methods = {m.lower() for m in route.methods or ()} - {"head"}
        found.setdefault(path, set()).update(methods)
    return found


def test_the_document_is_valid_openapi_3_1() -> None:
    spec = document()
    assert spec["openapi"].startswith("3.1")
    validate(spec)  # raises on any schema violation


def test_every_route_is_documented_and_every_documented_path_exists() -> None:
    documented = {
        path: {m for m in ops if m in ("get", "post", "delete", "put", "patch")}
        for path, ops in document()["paths"].items()
    }
    assert documented == app_routes()


async def test_a_running_app_serves_it_and_sends_a_browser_to_the_dashboard(
    tmp_path, make_proxy
) -> None:
    async with make_proxy("http://127.0.0.1:9/v1") as url, httpx.AsyncClient() as http:
        served = await http.get(f"{url}{PATH}")
        assert served.status_code == 200
        assert served.headers["content-type"] == "application/json"
        assert served.json() == document()
        validate(served.json())
        home = await http.get(f"{url}/")
        assert home.status_code == 307
        assert home.headers["location"] == "/compactd/ui/"
        page = await http.get(f"{url}/", follow_redirects=True)
        assert page.status_code == 200
        assert "<html" in page.text.lower()


def test_the_docs_page_renders_the_document() -> None:
    text = DOCS.read_text()
    assert PATH in text
    for path in document()["paths"]:
        assert f"`{path}`" in text, f"docs/api.md does not list {path}"


def test_the_docs_copy_is_the_served_document() -> None:
    copy = json.loads((DOCS.parent / "openapi.json").read_text())
    assert copy == document(), "regenerate: python -m proxy.app.openapi > docs/openapi.json"
