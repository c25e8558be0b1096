"""Settings: built-in defaults < YAML file < LAVINPY_* environment < command-line flags."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .cgroups import cgroup_memory_limit
from .wire.proxy_header import parse_network

FSYNC_POLICIES = ("always", "batch", "never")
# The login backends auth_backends may name (lavinpy.broker.access.auth_backends builds them).
AUTH_BACKENDS = ("local", "oauth2", "ldap")
AUTH_MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")
CERT_LOGIN_FROM = ("distinguished_name", "common_name", "subject_alternative_name", "subject_alt_name")
CERT_LOGIN_SAN_TYPES = ("dns", "ip", "email", "uri", "other_name")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


# memory_high_watermark: a fraction of the memory this process may use, RAM or its cgroup's cap ("0.4", as
# RabbitMQ's vm_memory_high_watermark), or an absolute size ("512MiB", "200MB", "1073741824").
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|[kmgt]i?b|B|b)?\s*")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def total_memory() -> int:
    """The memory this process may use in bytes: the host's RAM, or its cgroup's cap when lower."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 0
    cap = cgroup_memory_limit()
    return min(ram, cap) if cap and ram else (cap or ram)


def parse_watermark(value: str | float | int, total: int | None = None) -> int:
    """The memory limit in bytes; ValueError when the value is neither a fraction nor a size."""
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"memory_high_watermark must be a fraction of RAM (0.4) or a size (512MiB), not {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if not unit and number <= 1.0:  # a fraction of RAM (1 means all of it)
        return int(number * (total_memory() if total is None else total))
    return int(number * _UNITS[unit])


class ConfigError(ValueError):
    """A setting has a bad value or an unknown name."""


@dataclass
class Config:
    data_dir: str = "data"
    # Addresses to listen on; one the machine lacks (e.g. ::1 without IPv6) is logged and skipped.
    bind: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1"])
    amqp_port: int = 5672
    # Added to every listener port that is on (set or default), so that nodes on one machine need one
    # setting each: multiples of 100 (a node's own ports are up to 20 apart).
    port_offset: int = 0
    # AMQPS listens on amqps_port only when tls_cert is set (0 turns it off even then).
    amqps_port: int = 5671
    tls_cert: str = ""
    tls_key: str = ""
    tls_key_password: str = ""  # RabbitMQ's ssl_options.password: the passphrase of an encrypted tls_key
    tls_ca_cert: str = ""
    tls_verify_peer: bool = False  # ask for a client certificate and check it against tls_ca_cert
    tls_fail_if_no_peer_cert: bool = False  # with tls_verify_peer: refuse clients without one
    tls_crl_file: str = ""  # PEM certificate revocation lists of tls_ca_cert: a revoked client certificate is refused
    # Logins with a verified client certificate (tls_verify_peer): the user name taken from it as
    # RabbitMQ's ssl_cert_login_from says (distinguished_name | common_name | subject_alternative_name,
    # the last with ssl_cert_login_san_type dns | ip | email | uri | other_name and the 0-based
    # ssl_cert_login_san_index among the names of that type); no password, the user must exist.
    ssl_cert_login_from: str = "distinguished_name"
    ssl_cert_login_san_type: str = "dns"
    ssl_cert_login_san_index: int = 0
    # The SASL mechanisms AMQP offers (RabbitMQ's auth_mechanisms); EXTERNAL (the certificate's user)
    # is offered only on a TLS connection whose client sent a verified certificate.
    auth_mechanisms: list[str] = field(default_factory=lambda: ["PLAIN", "AMQPLAIN"])
    # Who decides a login, in order (RabbitMQ's and LavinMQ's auth_backends): the first backend that
    # knows the user decides, and the same backend gives its tags and permissions ("authn:authz" names
    # another backend for those). Known: local (the user store), oauth2 (JWT access tokens as passwords).
    auth_backends: list[str] = field(default_factory=lambda: ["local"])
    # oauth2 (RabbitMQ's auth_oauth2.* with "_" for "."; docs/auth.md): a token's aud must name a resource
    # server (this id, or one of auth_oauth2_resource_servers); its keys come from the issuer's JWKS
    # (OpenID discovery at issuer + discovery path, or jwks_url), refetched for an unknown key id.
    auth_oauth2_resource_server_id: str = ""
    auth_oauth2_issuer: str = ""
    auth_oauth2_jwks_url: str = ""
    auth_oauth2_discovery_endpoint_path: str = "/.well-known/openid-configuration"
    auth_oauth2_https_cacertfile: str = ""  # the CA of the issuer's HTTPS certificate ("" = the system's)
    auth_oauth2_algorithms: list[str] = field(default_factory=list)  # [] = every asymmetric one
    auth_oauth2_verify_aud: bool = True
    auth_oauth2_require_exp: bool = True
    auth_oauth2_leeway: int = 0  # seconds of clock skew allowed on exp and nbf
    auth_oauth2_scope_prefix: str = ""  # "" = "<resource_server_id>."
    # Claims (dotted paths, space-separated) holding more scopes (RabbitMQ's extra_scopes_source).
    auth_oauth2_additional_scopes_key: str = ""
    auth_oauth2_preferred_username_claims: list[str] = field(default_factory=lambda: ["sub", "client_id"])
    # alias -> scopes (a list, or one space-separated string) a token's alias scope stands for.
    auth_oauth2_scope_aliases: dict[str, Any] = field(default_factory=dict)
    # More resource servers: name -> {id, scope_prefix, additional_scopes_key, preferred_username_claims,
    # scope_aliases, verify_aud, require_exp, oauth_provider_id}; unset keys are the settings above.
    auth_oauth2_resource_servers: dict[str, Any] = field(default_factory=dict)
    # More identity providers: name -> {issuer, jwks_url, discovery_endpoint_path, https_cacertfile, algorithms,
    # signing_keys, default_key}.
    auth_oauth2_oauth_providers: dict[str, Any] = field(default_factory=dict)
    auth_oauth2_default_oauth_provider: str = ""  # a provider above for auth_oauth2_resource_server_id
    # Static keys (RabbitMQ's auth_oauth2.signing_keys / default_key): key id -> a PEM file, PEM text or a
    # JWK map, checked before any JWKS; default_key: the key of a token without kid. Providers take both too.
    auth_oauth2_signing_keys: dict[str, Any] = field(default_factory=dict)
    auth_oauth2_default_key: str = ""
    # The dashboard's single sign-on (RabbitMQ's management.oauth_*): the authorization code flow with
    # PKCE against the provider (a public client: no secret), the token then sent as Bearer.
    management_oauth_enabled: bool = False
    management_oauth_client_id: str = ""
    management_oauth_provider_url: str = ""  # the issuer the browser goes to ("" = auth_oauth2_issuer)
    management_oauth_scopes: str = "openid profile"
    # ldap (RabbitMQ's auth_ldap.*, "." written "_"; queries are its advanced.config terms as YAML lists).
    auth_ldap_servers: list[str] = field(default_factory=list)
    auth_ldap_port: int = 389
    auth_ldap_use_ssl: bool = False
    auth_ldap_use_starttls: bool = False
    auth_ldap_ssl_cacertfile: str = ""
    auth_ldap_timeout: float = 5.0  # seconds for a connection or an answer
    auth_ldap_user_dn_pattern: str = "${username}"
    auth_ldap_dn_lookup_attribute: str = ""  # e.g. uid, userPrincipalName: the DN is looked up
    auth_ldap_dn_lookup_base: str = ""
    auth_ldap_dn_lookup_bind: str = "as_user"  # as_user | anon | the DN the lookup binds as
    auth_ldap_dn_lookup_bind_password: str = ""
    auth_ldap_other_bind: str = "as_user"  # who asks the queries: as_user | anon | a DN
    auth_ldap_other_bind_password: str = ""
    auth_ldap_group_lookup_base: str = ""  # where in_group_nested searches ("" = dn_lookup_base)
    auth_ldap_tag_queries: dict[str, Any] = field(default_factory=dict)  # tag -> query
    auth_ldap_vhost_access_query: Any = field(default_factory=lambda: ["constant", True])
    auth_ldap_resource_access_query: Any = field(default_factory=lambda: ["constant", True])
    auth_ldap_topic_access_query: Any = field(default_factory=lambda: ["constant", True])
    auth_ldap_cache_ttl: float = 15.0  # seconds a query's answer is remembered
    auth_ldap_check_wait: float = 0.5  # seconds a permission check the cache misses waits for the directory
    # MQTT 3.1/3.1.1 (0 = off): topics on mqtt_exchange, vhost from a "vhost:user" user name or
    # mqtt_default_vhost; no user name logs in as default_user (RabbitMQ's default: guest, kept to
    # loopback by loopback_users) unless mqtt_allow_anonymous is false (then CONNACK 5).
    mqtt_port: int = 1883
    mqtts_port: int = 8883  # MQTT over TLS with the AMQPS certificate, once tls_cert is set (0 = off)
    mqtt_default_vhost: str = "/"
    mqtt_exchange: str = "amq.topic"
    mqtt_allow_anonymous: bool = True
    # RabbitMQ's mqtt.ssl_cert_login: a CONNECT with neither user name nor password over MQTTS (or
    # WebSocket over HTTPS) with a verified client certificate logs in as the certificate's user.
    mqtt_ssl_cert_login: bool = False
    mqtt_max_packet_size: int = 128 * 1024 * 1024 + 65536  # a whole packet, headers included
    mqtt_inflight_window: int = 10  # QoS 1 and 2 deliveries awaiting PUBACK or PUBREC, one window per client
    mqtt_max_subscribe_filters: int = 1000  # topic filters in one SUBSCRIBE (more closes the connection)
    # MQTT 5: the longest Session Expiry Interval granted (RabbitMQ's max_session_expiry_interval_seconds),
    # the topic aliases a client may set (RabbitMQ's topic_alias_maximum), and the longest keepalive
    # (0: the client's; else told as Server Keep Alive when the client asks for more or none).
    mqtt_max_session_expiry_interval: int = 86400
    mqtt_topic_alias_maximum: int = 16
    mqtt_max_keepalive: int = 0
    mqtt_receive_maximum: int = 65535  # MQTT 5: a client's QoS 1 and 2 publishes unanswered (more: 0x93)
    # Retained messages per vhost: a retained publish that would go over either is not retained (it is
    # still delivered), with a log line; replacing or clearing a retained topic is always allowed.
    mqtt_retained_max_messages: int = 100_000
    mqtt_retained_max_bytes: int = 1024 * 1024 * 1024  # their topics and payloads
    http_port: int = 15672  # 0 = no plain HTTP (e.g. when https_port serves the API)
    # The management API and /metrics over TLS (RabbitMQ's ports), with the AMQPS certificate (if tls_cert).
    https_port: int = 15671
    # A request over HTTPS without Basic credentials whose client sent a verified certificate acts as
    # the certificate's user (the same login as every face; the user needs a management tag).
    management_ssl_cert_login: bool = False
    # Largest HTTP API request body (RabbitMQ's management.http.max_body_size, 20 MiB by default).
    management_max_body_size: int = 20 * 1024 * 1024
    prometheus_port: int = 15692  # Prometheus /metrics (0 = off)
    prometheus_tls_port: int = 15691
    # Addresses and CIDRs of load balancers (LavinMQ's name): their connections must start with a PROXY
    # protocol header (v1 or v2) naming the client, whose address then counts as the connection's.
    proxy_protocol_trusted_sources: list[str] = field(default_factory=list)
    stats_sample_interval: float = 5.0  # seconds between message-rate samples
    log_level: str = "info"
    log_format: str = "text"  # text | json (one object per line)
    log_file: str = ""  # appended to, reopened on SIGUSR1 (logrotate); "" = stderr
    segment_size: int = 8 * 1024 * 1024
    fsync: str = "always"
    fsync_interval_ms: int = 50
    ack_file_max_bytes: int = 16 * 1024 * 1024
    definitions_compact_deletes: int = 8192
    max_message_size: int = 128 * 1024 * 1024
    disk_free_limit: int = 50 * 1000 * 1000
    # A fraction of RAM ("0.4") or a size ("512MiB"): above it publishers are blocked.
    memory_high_watermark: str = "0.4"
    # ms a delivery may stay unacknowledged before its channel is closed (0 = no limit).
    consumer_timeout: int = 1_800_000
    # Consumers one channel may have (0 = unlimited); one more closes the channel with 530.
    max_consumers_per_channel: int = 0
    frame_max: int = 131072
    # The largest frame before connection.tune-ok (RabbitMQ 4.1's initial_frame_max): what a client that has
    # not logged in can make the broker buffer. 8192 takes a start-ok with a JWT of several KiB.
    initial_frame_max: int = 8192
    channel_max: int = 2047
    heartbeat: int = 60
    default_user: str = "guest"
    default_password: str = "guest"
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    # A user with a bcrypt hash (imported from LavinMQ) gets RabbitMQ's salted SHA-256 hash of the same
    # password on its first good login: bcrypt costs a quarter of a second of CPU per check.
    rehash_bcrypt_on_login: bool = True
    # Failed logins per source address answered without delay; after them the login throttle slows every
    # login from the address (docs/security.md).
    login_free_failures: int = 3
    # A definitions JSON file (RabbitMQ's format) applied at every boot; "" = none.
    load_definitions: str = ""
    # High availability (LavinMQ's names): nodes coordinated by etcd, one leader, followers replicating.
    clustering: bool = False
    clustering_etcd_endpoints: str = "127.0.0.1:2379"  # comma-separated host:port list
    clustering_etcd_prefix: str = "lavinpy"  # every key of this cluster is under <prefix>/
    clustering_bind: str = "127.0.0.1"  # the replication listener's address
    clustering_port: int = 5679
    # How the other nodes reach this one's replication port ("" = tcp://<clustering_bind>:<clustering_port>).
    clustering_advertised_uri: str = ""
    clustering_on_leader_elected: str = ""  # shell commands run on becoming / ceasing to be leader
    clustering_on_leader_lost: str = ""
    # etcd holds the replication secret: log in as this user (etcd's auth/authenticate) when etcd has
    # authentication on; the password belongs in the YAML file or LAVINPY_CLUSTERING_ETCD_PASSWORD.
    clustering_etcd_user: str = ""
    clustering_etcd_password: str = ""
    # TLS to etcd (endpoints without a scheme become https://): the CA that signed etcd's certificate
    # ("" = the system's), and this node's client certificate and key when etcd asks for one.
    clustering_etcd_tls_ca: str = ""
    clustering_etcd_tls_cert: str = ""
    clustering_etcd_tls_key: str = ""
    clustering_etcd_tls_key_password: str = ""  # an encrypted key's passphrase (RabbitMQ's etcd ssl_options.password)
    # TLS on the replication port with the node's tls_cert / tls_key, each side verifying the other's
    # certificate against tls_ca_cert (both ends must have it on).
    clustering_tls: bool = False
    # Seconds an etcd lease outlives its holder's last keepalive (LavinMQ's 10): how long a leader
    # paused or cut off from etcd keeps its place before another node may take it.
    clustering_lease_ttl: int = 10

    def validate(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, not {self.log_format!r}")
        for name in LISTENER_PORTS:
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                shifted = f" (port_offset {self.port_offset} included)" if self.port_offset else ""
                raise ConfigError(f"{name} must be between 0 and 65535, not {port}{shifted}")
        if not self.bind:
            raise ConfigError("bind must name at least one address")
        if not self.stats_sample_interval > 0:
            raise ConfigError(f"stats_sample_interval must be above 0, not {self.stats_sample_interval}")
        self._validate_tls()
        self._validate_auth()
        for entry in self.proxy_protocol_trusted_sources:
            try:
                parse_network(entry)
            except ValueError:
                raise ConfigError(f"proxy_protocol_trusted_sources: {entry!r} is neither an address nor a CIDR")
        self._validate_clustering()
        if self.login_free_failures < 0:
            raise ConfigError(f"login_free_failures must be 0 or more, not {self.login_free_failures}")
        if self.segment_size < 4096:
            raise ConfigError(f"segment_size must be at least 4096 bytes, not {self.segment_size}")
        if self.ack_file_max_bytes < 8 or self.ack_file_max_bytes % 8:
            raise ConfigError("ack_file_max_bytes must be a positive multiple of 8")
        if self.frame_max < 4096:
            raise ConfigError(f"frame_max must be at least 4096, not {self.frame_max}")
        if self.initial_frame_max < 4096:
            raise ConfigError(f"initial_frame_max must be at least 4096, not {self.initial_frame_max}")
        if not 1 <= self.channel_max <= 65535:
            raise ConfigError(f"channel_max must be between 1 and 65535, not {self.channel_max}")
        if self.max_message_size < 1:
            raise ConfigError("max_message_size must be positive")
        if self.management_max_body_size < 1:
            raise ConfigError("management_max_body_size must be positive")
        if not 2 <= self.mqtt_max_packet_size <= 268_435_460:
            raise ConfigError(f"mqtt_max_packet_size must be between 2 and 268435460, not {self.mqtt_max_packet_size}")
        for name, bottom, top in (("mqtt_inflight_window", 1, 65535), ("mqtt_receive_maximum", 1, 65535),
                                  ("mqtt_max_session_expiry_interval", 0, 0xFFFFFFFF),
                                  ("mqtt_topic_alias_maximum", 0, 65535), ("mqtt_max_keepalive", 0, 65535)):
            if not bottom <= getattr(self, name) <= top:
                raise ConfigError(f"{name} must be between {bottom} and {top}, not {getattr(self, name)}")
        for name in ("mqtt_max_subscribe_filters", "mqtt_retained_max_messages", "mqtt_retained_max_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")
        if self.consumer_timeout < 0:
            raise ConfigError(f"consumer_timeout must be 0 (off) or a number of ms, not {self.consumer_timeout}")
        if self.max_consumers_per_channel < 0:
            raise ConfigError("max_consumers_per_channel must be 0 (unlimited) or a positive number, "
                              f"not {self.max_consumers_per_channel}")
        try:
            parse_watermark(self.memory_high_watermark, total=1)
        except ValueError as e:
            raise ConfigError(str(e))


    def _validate_tls(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key must be set together")
        if self.tls_verify_peer and not self.tls_ca_cert:
            raise ConfigError("tls_verify_peer needs tls_ca_cert (the CA that signs client certificates)")
        if self.tls_crl_file and not self.tls_verify_peer:
            raise ConfigError("tls_crl_file needs tls_verify_peer: true (it revokes client certificates)")
        if self.tls_fail_if_no_peer_cert and not self.tls_verify_peer:
            raise ConfigError("tls_fail_if_no_peer_cert needs tls_verify_peer: true")

    def _validate_auth(self) -> None:
        if not self.auth_backends:
            raise ConfigError("auth_backends must name at least one backend (e.g. local)")
        for entry in self.auth_backends:
            for name in entry.split(":", 1):
                if name not in AUTH_BACKENDS:
                    raise ConfigError(f"auth_backends: unknown backend {name!r} (known: {', '.join(AUTH_BACKENDS)})")
        for mechanism in self.auth_mechanisms:
            if mechanism not in AUTH_MECHANISMS:
                raise ConfigError(f"auth_mechanisms: unknown mechanism {mechanism!r} "
                                  f"(known: {', '.join(AUTH_MECHANISMS)})")
        if self.ssl_cert_login_from not in CERT_LOGIN_FROM:
            raise ConfigError(f"ssl_cert_login_from must be one of {', '.join(CERT_LOGIN_FROM)}, "
                              f"not {self.ssl_cert_login_from!r}")
        if self.ssl_cert_login_san_type not in CERT_LOGIN_SAN_TYPES:
            raise ConfigError(f"ssl_cert_login_san_type must be one of {', '.join(CERT_LOGIN_SAN_TYPES)}, "
                              f"not {self.ssl_cert_login_san_type!r}")
        if self.ssl_cert_login_san_index < 0:
            raise ConfigError(f"ssl_cert_login_san_index must be 0 or more, not {self.ssl_cert_login_san_index}")
        for name, on in (("auth_mechanisms: EXTERNAL", "EXTERNAL" in self.auth_mechanisms),
                         ("mqtt_ssl_cert_login", self.mqtt_ssl_cert_login),
                         ("management_ssl_cert_login", self.management_ssl_cert_login)):
            if on and not self.tls_verify_peer:
                raise ConfigError(f"{name} needs tls_verify_peer: true (and tls_ca_cert, the CA that signs "
                                  "client certificates)")
        if any("oauth2" in entry.split(":", 1) for entry in self.auth_backends):
            self._validate_oauth2()
        if self.management_oauth_enabled:
            if not any("oauth2" in entry.split(":", 1) for entry in self.auth_backends):
                raise ConfigError("management_oauth_enabled needs oauth2 in auth_backends (the API checks the tokens)")
            if not self.management_oauth_client_id:
                raise ConfigError("management_oauth_enabled needs management_oauth_client_id")
            provider = self.management_oauth_provider_url or self.auth_oauth2_issuer
            if not provider.startswith(("https://", "http://")):
                raise ConfigError("management_oauth_enabled needs management_oauth_provider_url "
                                  "(or auth_oauth2_issuer)")
        if any("ldap" in entry.split(":", 1) for entry in self.auth_backends):
            if find_spec("ldap3") is None:
                raise ConfigError("auth_backends: ldap needs the ldap3 package (pip install 'lavinpy[ldap]')")
            if not self.auth_ldap_servers:
                raise ConfigError("auth_backends: ldap needs auth_ldap_servers (the directory's hosts)")
            if self.auth_ldap_use_ssl and self.auth_ldap_use_starttls:
                raise ConfigError("auth_ldap_use_ssl and auth_ldap_use_starttls: choose one")
            if not isinstance(self.auth_ldap_tag_queries, dict):
                raise ConfigError("auth_ldap_tag_queries must map a tag to a query")
        if (self.ssl_cert_login_from in ("subject_alternative_name", "subject_alt_name")
                and self.ssl_cert_login_san_type == "other_name" and find_spec("cryptography") is None):
            raise ConfigError("ssl_cert_login_san_type: other_name needs the cryptography package")

    def _validate_oauth2(self) -> None:
        if find_spec("joserfc") is None:
            raise ConfigError("auth_backends: oauth2 needs the joserfc package (pip install 'lavinpy[oauth2]')")
        if not self.auth_oauth2_resource_server_id and not self.auth_oauth2_resource_servers:
            raise ConfigError("auth_backends: oauth2 needs auth_oauth2_resource_server_id (the audience of its tokens)")
        providers = self.auth_oauth2_oauth_providers
        for name, provider in providers.items():
            if not isinstance(provider, dict) or not (provider.get("issuer") or provider.get("jwks_url")
                                                      or provider.get("signing_keys")):
                raise ConfigError(f"auth_oauth2_oauth_providers: {name!r} needs an issuer, a jwks_url or signing_keys")
        default = self.auth_oauth2_default_oauth_provider
        if default and default not in providers:
            raise ConfigError(f"auth_oauth2_default_oauth_provider: no provider {default!r}")
        root_used = not self.auth_oauth2_default_oauth_provider and bool(self.auth_oauth2_resource_server_id)
        for name, server in self.auth_oauth2_resource_servers.items():
            if not isinstance(server, dict):
                raise ConfigError(f"auth_oauth2_resource_servers: {name!r} must be a mapping of settings")
            provider = server.get("oauth_provider_id")
            if provider and provider not in providers:
                raise ConfigError(f"auth_oauth2_resource_servers: {name!r} names no known provider {provider!r}")
            root_used = root_used or not (provider or self.auth_oauth2_default_oauth_provider)
        if root_used and not (self.auth_oauth2_issuer or self.auth_oauth2_jwks_url or self.auth_oauth2_signing_keys):
            raise ConfigError("auth_backends: oauth2 needs auth_oauth2_issuer, auth_oauth2_jwks_url or "
                              "auth_oauth2_signing_keys (where the signing keys are)")
        if not isinstance(self.auth_oauth2_scope_aliases, dict):
            raise ConfigError("auth_oauth2_scope_aliases must map an alias to scopes")
        if self.auth_oauth2_leeway < 0:
            raise ConfigError(f"auth_oauth2_leeway must be 0 or more seconds, not {self.auth_oauth2_leeway}")

    def _validate_clustering(self) -> None:
        if not self.clustering:
            return
        if not [e for e in self.clustering_etcd_endpoints.split(",") if e.strip()]:
            raise ConfigError("clustering_etcd_endpoints must name at least one etcd endpoint")
        if not self.clustering_etcd_prefix or "\x00" in self.clustering_etcd_prefix:
            raise ConfigError("clustering_etcd_prefix must be a non-empty key prefix")
        if self.clustering_advertised_uri and not re.fullmatch(r"tcp://[^/:]+:[0-9]+|tcp://\[[0-9a-fA-F:.]+\]:[0-9]+",
                                                                self.clustering_advertised_uri):
            raise ConfigError("clustering_advertised_uri must look like tcp://host:port, "
                              f"not {self.clustering_advertised_uri!r}")
        if self.clustering_lease_ttl < 3:
            raise ConfigError(f"clustering_lease_ttl must be at least 3 s, not {self.clustering_lease_ttl}")
        if self.clustering_etcd_password and not self.clustering_etcd_user:
            raise ConfigError("clustering_etcd_password needs clustering_etcd_user")
        if bool(self.clustering_etcd_tls_cert) != bool(self.clustering_etcd_tls_key):
            raise ConfigError("clustering_etcd_tls_cert and clustering_etcd_tls_key must be set together")
        if self.clustering_tls and not (self.tls_cert and self.tls_key and self.tls_ca_cert):
            raise ConfigError("clustering_tls needs tls_cert, tls_key and tls_ca_cert (the node's certificate "
                              "and the CA that signed the other nodes')")

    @property
    def clustering_etcd_tls(self) -> bool:
        """Whether the etcd client speaks TLS to endpoints that name no scheme."""
        return bool(self.clustering_etcd_tls_ca or self.clustering_etcd_tls_cert)

    @property
    def clustering_uri(self) -> str:
        """The replication address the other nodes use to reach this one."""
        if self.clustering_advertised_uri:
            return self.clustering_advertised_uri
        host = self.clustering_bind or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return f"tcp://[{host}]:{self.clustering_port}" if ":" in host else f"tcp://{host}:{self.clustering_port}"

    @property
    def amqps_enabled(self) -> bool:
        return bool(self.tls_cert) and self.amqps_port != 0

    @property
    def mqtts_enabled(self) -> bool:
        return bool(self.tls_cert) and self.mqtts_port != 0

    @property
    def https_enabled(self) -> bool:
        return bool(self.tls_cert) and self.https_port != 0

    @property
    def prometheus_tls_enabled(self) -> bool:
        return bool(self.tls_cert) and self.prometheus_tls_port != 0

    @property
    def tls_enabled(self) -> bool:
        """Whether any listener needs the certificate."""
        return self.amqps_enabled or self.mqtts_enabled or self.https_enabled or self.prometheus_tls_enabled


_FIELDS = {f.name: f for f in fields(Config)}
LISTENER_PORTS = ("amqp_port", "amqps_port", "mqtt_port", "mqtts_port", "http_port", "https_port", "prometheus_port",
                  "prometheus_tls_port", "clustering_port")


def _shift_ports(cfg: Config) -> None:
    """port_offset moves every listener that is on (0 stays off)."""
    if cfg.port_offset:
        for name in LISTENER_PORTS:
            if getattr(cfg, name):
                setattr(cfg, name, getattr(cfg, name) + cfg.port_offset)


def _coerce(name: str, value: Any) -> Any:
    kind = _FIELDS[name].type
    try:
        if kind == "int":
            return int(value)
        if kind == "bool":
            return _bool(value)
        if kind == "float":
            return float(value)
        if kind == "Any":  # a query: YAML as it is, or JSON from the environment
            return json.loads(value) if isinstance(value, str) else value
        if kind == "dict[str, Any]":
            parsed = json.loads(value) if isinstance(value, str) else value
            if not isinstance(parsed, dict):
                raise ValueError(value)
            return {str(k): v for k, v in parsed.items()}
        if kind == "list[str]":
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            return [str(v) for v in value or []]
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"setting {name}: cannot use {value!r}")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(value)


def _apply(cfg: Config, values: dict[str, Any], source: str) -> None:
    for name, value in values.items():
        if name not in _FIELDS:
            raise ConfigError(f"{source}: unknown setting {name!r}")
        if value is not None:
            setattr(cfg, name, _coerce(name, value))


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """Build the settings from a YAML file, LAVINPY_* variables and explicit overrides."""
    cfg = Config()
    if path is not None:
        import yaml  # only a broker started with a settings file pays for the YAML parser

        p = Path(path)
        try:
            doc = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror}")
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}")
        if not isinstance(doc, dict):
            raise ConfigError(f"config file {p} must hold a mapping of settings")
        _apply(cfg, doc, str(p))
    variables: Mapping[str, str] = os.environ if env is None else env
    from_env = {
        k[len("LAVINPY_"):].lower(): v
        for k, v in variables.items()
        if k.startswith("LAVINPY_") and k[len("LAVINPY_"):].lower() in _FIELDS
    }
    _apply(cfg, from_env, "environment")
    _apply(cfg, overrides or {}, "command line")
    _shift_ports(cfg)
    cfg.validate()
    return cfg


_CLUSTERING_FLAGS = {
    "clustering_etcd_endpoints": "etcd endpoints, comma-separated host:port (default 127.0.0.1:2379)",
    "clustering_etcd_prefix": "prefix of this cluster's etcd keys (default lavinpy)",
    "clustering_bind": "address of the replication listener (default 127.0.0.1)",
    "clustering_port": "port of the replication listener (default 5679)",
    "clustering_advertised_uri": "tcp://host:port the other nodes use to reach this one",
    "clustering_on_leader_elected": "shell command run when this node becomes leader",
    "clustering_on_leader_lost": "shell command run when this node stops being leader",
    "clustering_etcd_user": "etcd user to log in as (the password: clustering_etcd_password in the YAML file or "
                            "LAVINPY_CLUSTERING_ETCD_PASSWORD)",
    "clustering_etcd_tls_ca": "CA file that signed etcd's certificate (turns TLS to etcd on)",
    "clustering_etcd_tls_cert": "client certificate for etcd (with --clustering-etcd-tls-key)",
    "clustering_etcd_tls_key": "key of the client certificate for etcd",
    "clustering_lease_ttl": "seconds a leader's etcd lease outlives its last keepalive (default 10)",
    "clustering_tls": "true: TLS on the replication port with tls_cert/tls_key, peers verified against tls_ca_cert",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML settings file (default conf/lavinpy.yaml if present)")
    parser.add_argument("--data-dir", dest="data_dir")
    parser.add_argument("--bind", help="addresses to listen on, comma-separated (default 127.0.0.1,::1)")
    parser.add_argument("--amqp-port", dest="amqp_port", type=int)
    parser.add_argument("--port-offset", dest="port_offset", type=int,
                        help="added to every listener port that is on, e.g. 100, 200, 300 for nodes on one machine")
    parser.add_argument("--amqps-port", dest="amqps_port", type=int, help="AMQP over TLS (needs tls_cert)")
    parser.add_argument("--mqtt-port", dest="mqtt_port", type=int, help="MQTT listener (0 = off)")
    parser.add_argument("--mqtts-port", dest="mqtts_port", type=int, help="MQTT over TLS (needs tls_cert)")
    parser.add_argument("--http-port", dest="http_port", type=int, help="management API (0 = off)")
    parser.add_argument("--https-port", dest="https_port", type=int, help="management API over TLS (needs tls_cert)")
    parser.add_argument("--prometheus-port", dest="prometheus_port", type=int, help="Prometheus /metrics (0 = off)")
    parser.add_argument("--prometheus-tls-port", dest="prometheus_tls_port", type=int,
                        help="Prometheus /metrics over TLS (needs tls_cert)")
    parser.add_argument("--proxy-protocol-trusted-sources", dest="proxy_protocol_trusted_sources",
                        help="load balancer addresses/CIDRs that send a PROXY header, comma-separated")
    parser.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS)
    parser.add_argument("--log-format", dest="log_format", choices=LOG_FORMATS)
    parser.add_argument("--log-file", dest="log_file", help="append the log here (SIGUSR1 reopens it); default stderr")
    parser.add_argument("--fsync", choices=FSYNC_POLICIES)
    cluster = parser.add_argument_group("clustering (high availability with etcd, see docs/clustering.md)")
    cluster.add_argument("--clustering", action="store_const", const=True, help="run as a node of a cluster")
    for name, text in _CLUSTERING_FLAGS.items():
        kind = int if name in ("clustering_port", "clustering_lease_ttl") else str
        cluster.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=text)


def from_args(args: argparse.Namespace) -> Config:
    path = args.config
    if path is None and Path("conf/lavinpy.yaml").is_file():
        path = "conf/lavinpy.yaml"
    overrides = {k: getattr(args, k) for k in ("data_dir", "bind", "amqp_port", "port_offset", "amqps_port",
                                                "mqtt_port", "mqtts_port", "http_port", "https_port", "prometheus_port",
                                                "prometheus_tls_port",
                                                "proxy_protocol_trusted_sources", "log_level", "fsync", "clustering",
                                                *_CLUSTERING_FLAGS)}
    overrides.update(log_format=args.log_format, log_file=args.log_file)
    return load(path, overrides=overrides)
