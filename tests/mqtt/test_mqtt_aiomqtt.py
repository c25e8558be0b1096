"""aiomqtt (asyncio) with aio-pika on the other side, both ways."""

from __future__ import annotations

import asyncio

import aio_pika
import aiomqtt

from .conftest import MQTTBroker, unique


def test_aiomqtt_and_aio_pika_both_ways(mqtt_broker: MQTTBroker) -> None:
    base = unique("aio")

    async def main() -> tuple[bytes, str, bytes]:
        amqp = await aio_pika.connect(mqtt_broker.url)
        channel = await amqp.channel()
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind("amq.topic", f"{base}.up.#")
        async with aiomqtt.Client("127.0.0.1", mqtt_broker.mqtt_port, username="guest", password="guest",
                                  identifier=unique("dev")) as client:
            await client.subscribe(f"{base}/down/+", qos=1)
            await client.publish(f"{base}/up/temp", b"22", qos=1)
            incoming = await queue.get(timeout=10)
            await incoming.ack()
            exchange = await channel.get_exchange("amq.topic")
            await exchange.publish(aio_pika.Message(b"reboot"), routing_key=f"{base}.down.cmd")
            message = await asyncio.wait_for(anext(aiter(client.messages)), 10)
        await amqp.close()
        return incoming.body, str(message.topic), bytes(message.payload)  # type: ignore[arg-type]

    up, topic, down = asyncio.run(main())
    assert up == b"22"
    assert (topic, down) == (f"{base}/down/cmd", b"reboot")
