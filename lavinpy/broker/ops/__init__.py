"""The model's front door: what a face (AMQP, MQTT, HTTP, the cluster, the server) calls and the value types
those calls take and give.

A face imports from here (``from ..broker.ops import VHost, Actor``), from the operation modules of this
package (scope, objects, messages, publish, deliveries, ack_head, refill, replies, admin, limits, node_info,
object_info, definitions) and from ``broker.errors``; never from the other wings (queues, access, settings, metrics,
exchanges) or the vhost's own modules: an import-linter contract (faces-through-the-front-door) keeps it so.
A name a face needs from a wing is re-exported below.
"""

from ..access.actor import ADMINISTRATOR, POLICYMAKER, Actor
from ..access.cert_login import PeerCertificate, certificate_login, certificate_user, peer_certificate
from ..access.links import FEDERATION_UPSTREAM, shown_error
from ..access.permissions import TopicCheck
from ..alarms import disk_limit, memory_watermark
from ..broker import RESOURCE_CHECK_BYTES, Broker, Face
from ..connections import ConnectionCounts, ConnectionRegistry, all_protocols
from ..exchanges.base import Exchange
from ..login import LoginAttempt, LoginOutcome, LoginRequest, Refusal
from ..metrics.history import Entry, Window, length_details, rate_details
from ..metrics.rates import WindowRates
from ..metrics.stats import (
    AMQP_091,
    DEAD_LETTER_REASONS,
    FIELDS,
    MESSAGE_SIZE_BOUNDS,
    NodeCounters,
    ProtocolCounters,
    ProtocolId,
    StatsSampler,
    node_totals,
    read_counts,
)
from ..publishing import REJECTED
from ..queues.base import QueueKind
from ..queues.consumer import Consumer
from ..settings.arguments import ArgumentError, parse_expiration, queue_type_of, validate_consumer_arguments
from ..vhost import VHost

__all__ = [
    "Actor",
    "ADMINISTRATOR",
    "all_protocols",
    "AMQP_091",
    "ArgumentError",
    "Broker",
    "RESOURCE_CHECK_BYTES",
    "certificate_login",
    "certificate_user",
    "ConnectionCounts",
    "ConnectionRegistry",
    "Consumer",
    "DEAD_LETTER_REASONS",
    "disk_limit",
    "Entry",
    "Exchange",
    "Face",
    "FEDERATION_UPSTREAM",
    "FIELDS",
    "length_details",
    "LoginAttempt",
    "LoginOutcome",
    "LoginRequest",
    "memory_watermark",
    "MESSAGE_SIZE_BOUNDS",
    "node_totals",
    "NodeCounters",
    "parse_expiration",
    "peer_certificate",
    "PeerCertificate",
    "POLICYMAKER",
    "ProtocolCounters",
    "ProtocolId",
    "queue_type_of",
    "QueueKind",
    "rate_details",
    "read_counts",
    "Refusal",
    "REJECTED",
    "shown_error",
    "StatsSampler",
    "TopicCheck",
    "validate_consumer_arguments",
    "VHost",
    "Window",
    "WindowRates",
]
