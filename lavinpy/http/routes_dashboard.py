"""The web dashboard: static HTML, CSS and JavaScript served at ``/`` and ``/static/{file}``.

The page logs in with HTTP basic credentials, or with single sign-on (``management_oauth_enabled``:
the authorization code flow with PKCE against the OpenID provider, dashboard_sso.js) whose access token
it sends as Bearer; it calls the ``/api/...`` endpoints like any other client. These routes only serve
files and the sign-on settings (``/api/auth``, RabbitMQ's, public as in RabbitMQ: nothing secret) and
need no authentication. The file set is fixed when the module loads, so a request can name nothing
outside the static directory. With sign-on on, the page may also talk to the provider (its discovery
document and token endpoint): the Content-Security-Policy names the provider's origin for that.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from .context import broker_of, json_reply

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
AUTH_SETTINGS_PATH = "/api/auth"


def _provider_url(request: web.Request) -> str:
    config = broker_of(request).config
    if not config.management_oauth_enabled:
        return ""
    return (config.management_oauth_provider_url or config.auth_oauth2_issuer).rstrip("/")


def _file_response(request: web.Request, path: Path) -> web.Response:
    headers = SECURITY_HEADERS
    provider = _provider_url(request)
    if provider:  # the page fetches the provider's discovery document and token endpoint
        parts = urlsplit(provider)
        headers = {**headers, "Content-Security-Policy": headers["Content-Security-Policy"]
                   + f"; connect-src 'self' {parts.scheme}://{parts.netloc}"}
    return web.Response(body=path.read_bytes(), content_type=_CONTENT_TYPES[path.suffix],
                        charset="utf-8", headers=headers)


async def index(request: web.Request) -> web.Response:
    return _file_response(request, STATIC_FILES["index.html"])


async def static_file(request: web.Request) -> web.Response:
    path = STATIC_FILES.get(request.match_info["file"])
    if path is None:
        raise web.HTTPNotFound()
    return _file_response(request, path)


async def auth_settings(request: web.Request) -> web.Response:
    """RabbitMQ's ``/api/auth``: what the login page needs for single sign-on."""
    config = broker_of(request).config
    provider = _provider_url(request)
    if not provider:
        return json_reply({"oauth_enabled": False})
    return json_reply({"oauth_enabled": True, "oauth_client_id": config.management_oauth_client_id,
                       "oauth_provider_url": provider, "oauth_scopes": config.management_oauth_scopes,
                       "oauth_resource_id": config.auth_oauth2_resource_server_id})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{file}", static_file)
    app.router.add_get(AUTH_SETTINGS_PATH, auth_settings)
