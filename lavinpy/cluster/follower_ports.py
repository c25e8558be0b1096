"""A follower's client ports: AMQP, HTTP and plain MQTT accepted on the node's own ports and forwarded to
the leader's, each with a PROXY line naming the client (proxy.py), so clients may connect to any node.

TLS ports are not forwarded: TLS clients are served by the leader only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..listeners import HTTP_PROXY_HEADER_REFUSED, ProxyPolicy
from ..wire.constants import PROTOCOL_HEADER
from .proxy import HTTP_UNAVAILABLE, MQTT_UNAVAILABLE, ClientProxy

if TYPE_CHECKING:
    from ..config import Config

# "amqp", "http" or "mqtt" -> the leader's (host, port) for it, or None while no leader is known
LeaderPort = Callable[[str], "tuple[str, int] | None"]


class FollowerPorts:
    """The forwarding listeners of one follower, started together and stopped together."""

    def __init__(self, config: Config, leader_port: LeaderPort, policy: ProxyPolicy) -> None:
        self.config = config
        self.leader_port = leader_port
        self.policy = policy
        self._proxies: list[ClientProxy] = []

    @property
    def listening(self) -> bool:
        """Whether every port accepts (the node counts as started from then on)."""
        return bool(self._proxies) and all(proxy.listening for proxy in self._proxies)

    async def start(self) -> None:
        config, policy = self.config, self.policy
        self._proxies = [ClientProxy("AMQP", config.bind, config.amqp_port, lambda: self.leader_port("amqp"),
                                     policy=policy, refused_reply=PROTOCOL_HEADER)]
        if config.http_port:
            self._proxies.append(ClientProxy("HTTP", config.bind, config.http_port,
                                             lambda: self.leader_port("http"), HTTP_UNAVAILABLE, policy,
                                             HTTP_PROXY_HEADER_REFUSED))
        if config.mqtt_port:
            self._proxies.append(ClientProxy("MQTT", config.bind, config.mqtt_port,
                                             lambda: self.leader_port("mqtt"), MQTT_UNAVAILABLE, policy))
        for proxy in self._proxies:
            await proxy.start()

    async def stop(self) -> None:
        for proxy in self._proxies:
            await proxy.stop()
        self._proxies = []
