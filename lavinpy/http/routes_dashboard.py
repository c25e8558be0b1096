"""The web dashboard: static HTML, CSS and JavaScript served at ``/`` and ``/static/{file}``.

The page logs in with HTTP basic credentials and calls the ``/api/...`` endpoints like any other
client; these routes only serve files and need no authentication. The file set is fixed when the
module loads, so a request can name nothing outside the static directory.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent / "static"

_CONTENT_TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
}

# The page loads nothing from elsewhere and runs no inline script or style; say so to the browser.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

STATIC_FILES = {p.name: p for p in STATIC_DIR.iterdir() if p.suffix in _CONTENT_TYPES}


def _file_response(path: Path) -> web.Response:
    return web.Response(body=path.read_bytes(), content_type=_CONTENT_TYPES[path.suffix],
                        charset="utf-8", headers=SECURITY_HEADERS)


async def index(request: web.Request) -> web.Response:
    return _file_response(STATIC_FILES["index.html"])


async def static_file(request: web.Request) -> web.Response:
    path = STATIC_FILES.get(request.match_info["file"])
    if path is None:
        raise web.HTTPNotFound()
    return _file_response(path)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{file}", static_file)
