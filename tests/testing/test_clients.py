"""Real clients against the fixtures' broker: pika, aio-pika, paho-mqtt, kombu and a Celery worker."""

from __future__ import annotations

import asyncio
import copy
import pickle
import queue
import uuid

import aio_pika
import paho.mqtt.client as mqtt
import pika
import pytest

from lavinpy.testing import VirtualHost


def test_pika_round_trip_and_the_queue_helpers(lavinpy_vhost: VirtualHost) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(lavinpy_vhost))
    try:
        channel = connection.channel()
        channel.queue_declare("orders", durable=True)
        for n in range(3):
            channel.basic_publish("", "orders", f'{{"n": {n}}}'.encode(),
                                  pika.BasicProperties(content_type="application/json", headers={"n": n}))
        assert lavinpy_vhost.wait_for_messages("orders", 3, timeout=10) == 3
        assert lavinpy_vhost.message_count("orders") == 3
        assert lavinpy_vhost.queues() == ["orders"]
        [first] = lavinpy_vhost.get("orders")
        assert first.json() == {"n": 0} and first.routing_key == "orders"
        assert first.properties["headers"] == {"n": 0}
        peeked = lavinpy_vhost.get("orders", count=5, requeue=True)
        assert [m.json()["n"] for m in peeked] == [1, 2]
        # the rest is still there for a consumer
        method, _, body = channel.basic_get("orders", auto_ack=True)
        assert method is not None and body == b'{"n": 1}'
    finally:
        connection.close()


def test_a_copy_of_the_vhost_is_its_url(lavinpy_vhost: VirtualHost) -> None:
    """Libraries that deep-copy or pickle their settings get the URL (not the broker with it)."""
    for copied in (copy.deepcopy(lavinpy_vhost), pickle.loads(pickle.dumps(lavinpy_vhost))):
        assert type(copied) is str and copied == lavinpy_vhost.amqp_url


def test_wait_for_messages_times_out_with_what_the_queue_holds(lavinpy_vhost: VirtualHost) -> None:
    with pytest.raises(TimeoutError, match="holds 0 messages"):
        lavinpy_vhost.wait_for_messages("never-declared", 1, timeout=0.3)


def test_aio_pika_round_trip(lavinpy_vhost: VirtualHost) -> None:
    async def round_trip() -> bytes:
        connection = await aio_pika.connect_robust(lavinpy_vhost.amqp_url)
        async with connection:
            channel = await connection.channel()
            declared = await channel.declare_queue("events")
            await channel.default_exchange.publish(aio_pika.Message(b"hello"), routing_key="events")
            message = await declared.get(timeout=10)
            await message.ack()
            return message.body

    assert asyncio.run(round_trip()) == b"hello"


def test_paho_mqtt_round_trip_on_the_vhost(lavinpy_vhost: VirtualHost) -> None:
    received: queue.Queue[tuple[str, bytes]] = queue.Queue()
    subscribed: queue.Queue[bool] = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
    client.username_pw_set(lavinpy_vhost.mqtt_username, lavinpy_vhost.password)
    client.on_connect = lambda c, userdata, flags, reason, props: c.subscribe("sensors/+", qos=1)
    client.on_subscribe = lambda c, userdata, mid, reasons, props: subscribed.put(True)
    client.on_message = lambda c, userdata, message: received.put((message.topic, message.payload))
    client.connect(lavinpy_vhost.mqtt_host, lavinpy_vhost.mqtt_port)
    client.loop_start()
    try:
        assert subscribed.get(timeout=10)
        client.publish("sensors/t1", b"21.5", qos=1).wait_for_publish(10)
        assert received.get(timeout=10) == ("sensors/t1", b"21.5")
    finally:
        client.disconnect()
        client.loop_stop()


def test_kombu_round_trip(lavinpy_vhost: VirtualHost) -> None:
    kombu = pytest.importorskip("kombu")
    with kombu.Connection(lavinpy_vhost) as connection:
        jobs = kombu.Queue("jobs", kombu.Exchange("jobs", type="direct"), routing_key="jobs")
        with connection.Producer() as producer:
            producer.publish({"id": 7}, exchange=jobs.exchange, routing_key="jobs", declare=[jobs],
                             serializer="json")
        assert lavinpy_vhost.wait_for_messages("jobs", 1) == 1
        message = jobs(connection.default_channel).get(no_ack=True)
        assert message is not None and message.payload == {"id": 7}


def test_celery_app_with_celerys_test_worker(lavinpy_vhost: VirtualHost) -> None:
    celery = pytest.importorskip("celery")
    from celery.contrib.testing.worker import start_worker

    app = celery.Celery("billing", broker=lavinpy_vhost.amqp_url, backend="rpc://", set_as_current=False)
    # The worker thread sees start_worker's stop request between two polls of its event loop, which wait
    # up to 10 s when no timer is due (longer than start_worker's shutdown_timeout): the heartbeat's
    # check, every heartbeat / 2 s, keeps the polls short.
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False, broker_heartbeat=2)

    @app.task(name="billing.add")
    def add(x: int, y: int) -> int:
        return x + y

    # start_worker checks the worker with Celery's own ping task before handing it over.
    app.loader.import_module("celery.contrib.testing.tasks")
    with start_worker(app, pool="solo", perform_ping_check=True, shutdown_timeout=10):
        assert add.delay(2, 3).get(timeout=30) == 5
    assert "celery" in lavinpy_vhost.queues()
