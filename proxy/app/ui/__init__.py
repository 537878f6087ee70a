"""The dashboard and conversation inspector, served by compactd itself at /compactd/ui/.

Static files only (no build step, nothing from a CDN): the page signs in with a key the operator
types, keeps it in the tab's sessionStorage and sends it as an `Authorization` header to the
JSON API (/compactd/v1/*), which applies the same tenant rules as for any client. No cookie is
ever set, so no other site can make the browser send a request with the key (no CSRF), and the
key never appears in a URL. Every page is served with a strict Content-Security-Policy (scripts
and styles from this origin only, no framing), so injected markup could not run or exfiltrate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from proxy.errors import NotFoundError
from proxy.wire.asgi import error_body

PREFIX = "/compactd/ui"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}


@dataclass(frozen=True)
class _Asset:
    body: bytes
    content_type: str
    etag: str


def _load() -> dict[str, _Asset]:
    assets = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            assets[entry.name] = _Asset(body, _TYPES[suffix], etag)
    return assets


class Assets:
    """The packaged files, read once when the first page is asked for."""

    def __init__(self) -> None:
        self._assets: dict[str, _Asset] | None = None

    def get(self, name: str) -> _Asset | None:
        """The file called `name` in the static folder (no paths: nothing else is reachable)."""
        if self._assets is None:
            self._assets = _load()
        return self._assets.get(name)

    async def serve(self, request: Request) -> Response:
        """One asset, with the security headers and an ETag."""
        asset = self.get(request.path_params.get("name") or "index.html")
        if asset is None:
            err = NotFoundError(f"Unknown path {request.url.path}.")
            return Response(error_body(err.message, err.type, err.code), 404,
                            media_type="application/json")  # fmt: skip
        headers = {**SECURITY_HEADERS, "etag": asset.etag}
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, headers=headers, media_type=asset.content_type)


async def _to_index(request: Request) -> Response:
    del request
    return RedirectResponse(PREFIX + "/", status_code=308)


async def _to_dashboard(request: Request) -> Response:
    """The server's own address, opened in a browser, leads to the dashboard."""
    del request
    return RedirectResponse(PREFIX + "/", status_code=307)


def routes() -> list[Route]:
    """The dashboard's routes (its data comes from /compactd/v1, see `proxy.app.dashboard_api`)."""
    assets = Assets()
    return [
        Route("/", _to_dashboard, methods=["GET", "HEAD"]),
        Route(PREFIX, _to_index, methods=["GET", "HEAD"]),
        Route(PREFIX + "/", assets.serve, methods=["GET", "HEAD"]),
        Route(PREFIX + "/{name}", assets.serve, methods=["GET", "HEAD"]),
    ]
