"""The oauth2 backend's resource servers and identity providers (RabbitMQ's ``auth_oauth2.*``), and
how a token's claims become its user name and scopes.

A token names its resource server by its ``aud`` claim: exactly one of the configured ids must be in
it (``verify_aud``; with ``verify_aud: false`` on a single resource server, a token with another or no
audience is that server's). The resource server's scopes are gathered as RabbitMQ gathers them: the
``scope`` claim (a space-separated string or a list), the claims ``additional_scopes_key`` names
(dotted paths; a value is a list, a space-separated string, or a map whose key is the resource server
id), Keycloak's requesting party token (``authorization.permissions[].scopes``); then each alias of
``scope_aliases`` adds the scopes it stands for; then only the scopes with the resource server's prefix
are kept, the prefix taken off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...config import Config

ROOT = ""  # the provider of the auth_oauth2_issuer / auth_oauth2_jwks_url settings
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                         "EdDSA", "Ed25519")
MAX_SCOPES = 2048  # more is refused (RabbitMQ's limit)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    name: str
    issuer: str
    jwks_url: str
    discovery_endpoint_path: str
    https_cacertfile: str
    algorithms: tuple[str, ...]
    signing_keys: Mapping[str, Any] = field(default_factory=dict)  # static keys: kid -> PEM file/text or JWK
    default_key: str = ""  # the static key of a token without kid

    @property
    def static_only(self) -> bool:
        """Keys from the settings alone (no JWKS to fetch: an unknown key id is refused at once)."""
        return not (self.issuer or self.jwks_url)


@dataclass(frozen=True, slots=True)
class ResourceServer:
    id: str
    scope_prefix: str
    additional_scopes_key: str
    preferred_username_claims: tuple[str, ...]
    scope_aliases: Mapping[str, tuple[str, ...]]
    verify_aud: bool
    require_exp: bool
    provider: str

    def username(self, claims: Mapping[str, Any]) -> str:
        """The first preferred claim holding a string (RabbitMQ's ``unknown`` when none does)."""
        for claim in self.preferred_username_claims:
            value = claims.get(claim)
            if isinstance(value, str) and value:
                return value
        return "unknown"

    def scopes(self, claims: Mapping[str, Any]) -> list[str]:
        """The token's scopes for this resource server, its prefix taken off."""
        found = _scope_list(claims.get("scope"))
        found += self._values(claims, "authorization.permissions.scopes")
        for path in self.additional_scopes_key.split():
            found += self._values(claims, path)
        for scope in list(found):
            found += self.scope_aliases.get(scope, ())
        prefix = self.scope_prefix
        return sorted({s[len(prefix):] for s in found if s.startswith(prefix)})

    def _values(self, claims: Mapping[str, Any], path: str) -> list[str]:
        """The scopes under a dotted ``path`` (lists of maps are walked through)."""
        nodes: list[Any] = [claims]
        for key in path.split("."):
            step: list[Any] = []
            for node in nodes:
                for item in (node if isinstance(node, list) else [node]):
                    if isinstance(item, Mapping) and key in item:
                        step.append(item[key])
            nodes = step
        out: list[str] = []
        for node in nodes:
            if isinstance(node, Mapping):  # keyed by resource server id: scopes without the prefix
                out += [f"{self.id}.{s}" for s in _scope_list(node.get(self.id))]
            else:
                out += _scope_list(node)
        return out


def _scope_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _aliases(value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        return {}
    return {str(alias): tuple(_scope_list(scopes)) for alias, scopes in value.items()}


@dataclass(frozen=True, slots=True)
class OAuth2Settings:
    resource_servers: tuple[ResourceServer, ...]
    providers: Mapping[str, ProviderSettings]
    leeway: int

    def resolve(self, audience: Any) -> ResourceServer | str:
        """The resource server a token's ``aud`` names, or why there is none (RabbitMQ's rules)."""
        if isinstance(audience, str):
            audiences = set(audience.split())
        elif isinstance(audience, list):
            audiences = {a for a in audience if isinstance(a, str)}
        else:
            audiences = set()
        matching = [s for s in self.resource_servers if s.id in audiences]
        if len(matching) == 1:
            return matching[0]
        if len(matching) > 1:
            return "the token's audience names more than one resource server"
        unverified = [s for s in self.resource_servers if not s.verify_aud]
        if len(unverified) == 1:
            return unverified[0]
        if not audiences:
            return "the token has no audience (aud)"
        return f"the token's audience {sorted(audiences)} names no resource server of this broker"


def oauth2_settings(config: Config) -> OAuth2Settings:
    """The settings as objects (``Config.validate`` checked their shapes)."""
    providers = {ROOT: _provider(ROOT, {"issuer": config.auth_oauth2_issuer, "jwks_url": config.auth_oauth2_jwks_url,
                                        "discovery_endpoint_path": config.auth_oauth2_discovery_endpoint_path,
                                        "https_cacertfile": config.auth_oauth2_https_cacertfile,
                                        "algorithms": config.auth_oauth2_algorithms,
                                        "signing_keys": config.auth_oauth2_signing_keys,
                                        "default_key": config.auth_oauth2_default_key}, config)}
    for name, values in config.auth_oauth2_oauth_providers.items():
        providers[name] = _provider(name, values, config)
    root = ResourceServer(
        id=config.auth_oauth2_resource_server_id,
        scope_prefix=config.auth_oauth2_scope_prefix or f"{config.auth_oauth2_resource_server_id}.",
        additional_scopes_key=config.auth_oauth2_additional_scopes_key,
        preferred_username_claims=tuple(config.auth_oauth2_preferred_username_claims),
        scope_aliases=_aliases(config.auth_oauth2_scope_aliases),
        verify_aud=config.auth_oauth2_verify_aud, require_exp=config.auth_oauth2_require_exp,
        provider=config.auth_oauth2_default_oauth_provider or ROOT)
    servers = [root] if root.id else []
    for name, values in config.auth_oauth2_resource_servers.items():
        server_id = str(values.get("id") or name)
        claims = values.get("preferred_username_claims")
        servers.append(ResourceServer(
            id=server_id,
            scope_prefix=str(values.get("scope_prefix") or config.auth_oauth2_scope_prefix or f"{server_id}."),
            additional_scopes_key=str(values.get("additional_scopes_key", root.additional_scopes_key)),
            preferred_username_claims=tuple(_scope_list(claims)) if claims else root.preferred_username_claims,
            scope_aliases=_aliases(values["scope_aliases"]) if "scope_aliases" in values else root.scope_aliases,
            verify_aud=bool(values.get("verify_aud", root.verify_aud)),
            require_exp=bool(values.get("require_exp", root.require_exp)),
            provider=str(values.get("oauth_provider_id") or root.provider)))
    return OAuth2Settings(tuple(servers), providers, config.auth_oauth2_leeway)


def _provider(name: str, values: Mapping[str, Any], config: Config) -> ProviderSettings:
    algorithms: Iterable[str] = values.get("algorithms") or config.auth_oauth2_algorithms or ASYMMETRIC_ALGORITHMS
    if isinstance(algorithms, str):
        algorithms = algorithms.replace(",", " ").split()
    return ProviderSettings(
        name=name, issuer=str(values.get("issuer") or ""), jwks_url=str(values.get("jwks_url") or ""),
        discovery_endpoint_path=str(values.get("discovery_endpoint_path")
                                    or config.auth_oauth2_discovery_endpoint_path),
        https_cacertfile=str(values.get("https_cacertfile") or config.auth_oauth2_https_cacertfile),
        # Symmetric (HS*) and "none" are never taken: the keys are public, anyone could sign with them.
        algorithms=tuple(a for a in algorithms if a in ASYMMETRIC_ALGORITHMS),
        signing_keys=dict(values.get("signing_keys") or {}), default_key=str(values.get("default_key") or ""))
