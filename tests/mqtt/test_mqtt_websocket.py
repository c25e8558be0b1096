"""MQTT over WebSocket on the HTTP port (/ws, subprotocol mqtt): paho's WebSocket transport and a
plain aiohttp WebSocket client, with MQTT over TCP and AMQP on the other side."""

from __future__ import annotations

import asyncio

import aiohttp
import pika

from lavinpy.mqtt import codec

from .conftest import MQTTBroker, Paho, unique


def test_paho_over_websocket_to_tcp_and_amqp(mqtt_broker: MQTTBroker) -> None:
    topic = unique("ws") + "/t"
    tcp = Paho(mqtt_broker.mqtt_port, unique("tcp"))
    tcp.connect()
    tcp.subscribe(topic, 1)
    ws = Paho(mqtt_broker.http_port, unique("ws"), websocket=True)
    assert ws.connect()[1] == "Success"
    assert ws.subscribe(topic, 1) == [1]
    ws.publish(topic, b"from ws", qos=1)
    assert tcp.message().payload == b"from ws"
    assert ws.message().payload == b"from ws"
    conn = pika.BlockingConnection(pika.URLParameters(mqtt_broker.url))
    conn.channel().basic_publish("amq.topic", topic.replace("/", "."), b"from amqp")
    assert ws.message().payload == b"from amqp"
    conn.close()
    ws.disconnect()
    tcp.disconnect()


def test_plain_websocket_client_and_bad_input(mqtt_broker: MQTTBroker) -> None:
    async def main() -> tuple[str | None, bytes, bool]:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{mqtt_broker.http_port}/ws"
            async with session.ws_connect(url, protocols=("mqtt",)) as ws:
                await ws.send_bytes(codec.encode_connect(unique("aio"), username="guest", password=b"guest"))
                connack = await asyncio.wait_for(ws.receive(), 10)
                await ws.send_bytes(bytes((0xC0, 0x00)))  # PINGREQ
                pingresp = await asyncio.wait_for(ws.receive(), 10)
                assert pingresp.data == codec.PINGRESP_PACKET
                await ws.send_bytes(bytes((0xF0, 0x00)))  # a reserved packet type: the server closes
                end = await asyncio.wait_for(ws.receive(), 10)
                return ws.protocol, connack.data, end.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    protocol, connack, closed = asyncio.run(main())
    assert protocol == "mqtt"
    assert connack == codec.connack(False, codec.ACCEPTED)
    assert closed
