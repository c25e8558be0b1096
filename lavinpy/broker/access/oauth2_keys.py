"""An identity provider's signing keys: its JWKS, found by OpenID discovery, fetched and cached.

The keys are fetched at the first token of the provider, again for a token whose key id (``kid``) is
not among them (the provider rotated its keys), and again once they are ``JWKS_TTL`` old (a key the
provider withdrew stops working). Unknown key ids cannot make the broker fetch without bound: at
most ``REFRESHES_PER_SECOND`` fetches happen, and fetches asked for at once share one request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import deque
from typing import Any

from ...wire.tls_keys import regular_file
from .oauth2_settings import ProviderSettings

log = logging.getLogger("lavinpy.login")

JWKS_TTL = 3600.0  # seconds a fetched key set is trusted before it is fetched again
FETCH_TIMEOUT = 10.0
REFRESHES_PER_SECOND = 5
MAX_DOCUMENT_BYTES = 1024 * 1024  # a discovery document or key set larger than this is refused


class KeyFetchError(Exception):
    """The provider's keys could not be fetched (the text says why)."""


class ProviderKeys:
    """One provider's public keys by key id (joserfc keys)."""

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings
        self.keys: dict[str | None, Any] = {}  # kid -> key; None -> the only key of a set without ids
        self.fetched_at = 0.0  # monotonic; 0 = never
        self.jwks_url = settings.jwks_url
        self._fetching: asyncio.Task[None] | None = None
        self._recent: deque[float] = deque()  # when the last fetches started
        self.static = static_keys(settings)

    def key(self, kid: str | None) -> Any | None:
        """The key for a token's ``kid`` when it is known and fresh, else None (then ``await refresh``).
        A static key (the settings' ``signing_keys``) is known for good; ``default_key`` is the key of a
        token without kid."""
        static = self.static.get(kid if kid is not None else self.settings.default_key or None)
        if static is not None:
            return static
        if not self.fetched_at or time.monotonic() - self.fetched_at > JWKS_TTL:
            return None
        return self.keys.get(kid)  # None: a token without kid, the only key of the set

    def may_refresh(self) -> bool:
        now = time.monotonic()
        while self._recent and now - self._recent[0] > 1.0:
            self._recent.popleft()
        return self._fetching is not None or len(self._recent) < REFRESHES_PER_SECOND

    async def refresh(self) -> None:
        """Fetch the key set (one fetch for every caller waiting at the time)."""
        if self._fetching is None:
            self._recent.append(time.monotonic())
            self._fetching = asyncio.ensure_future(self._fetch())
        task = self._fetching
        try:
            await asyncio.shield(task)
        finally:
            if self._fetching is task and task.done():
                self._fetching = None

    async def _fetch(self) -> None:
        import aiohttp
        from joserfc.jwk import JWKRegistry

        settings = self.settings
        try:  # read in the event loop: a FIFO would stall it (regular_file)
            context = ssl.create_default_context(cafile=regular_file(settings.https_cacertfile) or None)
        except (OSError, ssl.SSLError) as e:
            raise KeyFetchError(f"https_cacertfile {settings.https_cacertfile}: {e}") from None
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if not self.jwks_url:
                url = settings.issuer.rstrip("/") + "/" + settings.discovery_endpoint_path.lstrip("/")
                document = await _get_json(session, url, context)
                jwks_uri = document.get("jwks_uri") if isinstance(document, dict) else None
                if not isinstance(jwks_uri, str) or not jwks_uri:
                    raise KeyFetchError(f"the discovery document at {url} names no jwks_uri")
                self.jwks_url = jwks_uri
            document = await _get_json(session, self.jwks_url, context)
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise KeyFetchError(f"{self.jwks_url} is not a JSON Web Key Set")
        keys: dict[str | None, Any] = {}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or entry.get("kty") == "oct":
                continue  # encryption keys, and shared secrets (never in a public key set)
            try:
                key = JWKRegistry.import_key(entry)
            except Exception as e:  # a key of a kind joserfc cannot use: the others still count
                log.warning("OAuth 2 provider %s: key %r skipped: %s", self.jwks_url, entry.get("kid"), e)
                continue
            keys[entry.get("kid") if isinstance(entry.get("kid"), str) else None] = key
        if not keys:
            raise KeyFetchError(f"{self.jwks_url} holds no signing key")
        if len(keys) == 1 and None not in keys:
            keys[None] = next(iter(keys.values()))
        self.keys = keys
        self.fetched_at = time.monotonic()
        log.info("OAuth 2 provider %s: %d signing keys fetched", self.jwks_url, len(set(map(id, keys.values()))))


def static_keys(settings: ProviderSettings) -> dict[str | None, Any]:
    """The provider's static keys by key id (a PEM file, PEM text or a JWK map each); a key that does
    not load is a ValueError naming it (the broker does not start)."""
    if not settings.signing_keys:
        return {}
    from joserfc.jwk import JWKRegistry

    keys: dict[str | None, Any] = {}
    for kid, value in settings.signing_keys.items():
        try:
            if isinstance(value, dict):
                key = JWKRegistry.import_key({**value, "kid": kid})
            else:
                text = str(value)
                if "-----BEGIN" not in text:
                    with open(text, "rb") as f:
                        text = f.read().decode()
                key = _import_pem(text, kid)
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"auth_oauth2 signing key {kid!r} could not be loaded: {e}") from None
        if key.is_private:
            raise ValueError(f"auth_oauth2 signing key {kid!r} is a private key: give the public one")
        keys[str(kid)] = key
    if settings.default_key and settings.default_key not in keys:
        raise ValueError(f"auth_oauth2 default_key {settings.default_key!r} names no signing key")
    return keys


def _import_pem(text: str, kid: str) -> Any:
    from joserfc.jwk import ECKey, OKPKey, RSAKey

    for kind in (RSAKey, ECKey, OKPKey):
        try:
            return kind.import_key(text, {"kid": kid})
        except Exception:  # not this kind of key: the next is tried
            continue
    raise ValueError("not a PEM public key of RSA, EC or Ed25519")


async def _get_json(session: Any, url: str, context: ssl.SSLContext) -> Any:
    import aiohttp

    try:
        async with session.get(url, ssl=context if url.startswith("https:") else None,
                               allow_redirects=False) as response:
            if response.status != 200:
                raise KeyFetchError(f"{url} answered HTTP {response.status}")
            body = await response.content.read(MAX_DOCUMENT_BYTES + 1)
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        raise KeyFetchError(f"{url} could not be fetched: {e or type(e).__name__}") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise KeyFetchError(f"{url} is over {MAX_DOCUMENT_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise KeyFetchError(f"{url} did not answer JSON") from None
