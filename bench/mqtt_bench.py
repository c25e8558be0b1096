"""MQTT throughput, one publisher to one subscriber over raw sockets (the client side does little
more than write prepared packets and count, so the broker is the bound). Works against any MQTT
3.1.1 broker: lavinpy, mosquitto. Prints msg/s per QoS; not a test.

    python3 bench/mqtt_bench.py --port 1883 [--messages 200000] [--size 16] [--qos 0 1]

The publisher writes batches of ``--batch`` PUBLISH packets; a QoS 1 subscriber PUBACKs what it read
after each read, a QoS 1 publisher's PUBACKs are counted by a thread of their own. The time is from
the first publish to the last message read (and, for QoS 1, the last PUBACK received).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lavinpy.mqtt import codec  # noqa: E402  (the repository's codec encodes the packets)


def connect(args: argparse.Namespace, client_id: str) -> socket.socket:
    sock = socket.create_connection((args.host, args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(codec.encode_connect(client_id, username=args.user, password=args.password.encode(), keepalive=0))
    connack = sock.recv(4)
    if len(connack) != 4 or connack[3] != 0:
        raise SystemExit(f"CONNECT refused: {connack!r}")
    return sock


def subscribe(sock: socket.socket, topic: str, qos: int) -> None:
    name = topic.encode()
    body = b"\x00\x01" + len(name).to_bytes(2, "big") + name + bytes((qos,))
    sock.sendall(bytes((0x82, len(body))) + body)
    if len(sock.recv(5)) != 5:
        raise SystemExit("no SUBACK")


def run(args: argparse.Namespace, qos: int) -> float:
    topic = f"bench/{qos}/{time.monotonic_ns()}"
    sub = connect(args, f"bench-sub-{qos}")
    subscribe(sub, topic, qos)
    pub = connect(args, f"bench-pub-{qos}")
    count = args.messages

    def read_subscriber() -> None:
        reader, got = codec.PacketReader(1 << 26), 0
        while got < count:
            acks = []
            for kind, flags, body in reader.feed(sub.recv(1 << 20)):
                if kind == codec.PUBLISH:
                    got += 1
                    if qos:
                        acks.append(codec.puback(codec.parse_publish(flags, body).packet_id))
            if acks:
                sub.sendall(b"".join(acks))

    def read_pubacks() -> None:
        reader, got = codec.PacketReader(1 << 26), 0
        while got < count:
            got += sum(1 for kind, _, _ in reader.feed(pub.recv(1 << 20)) if kind == codec.PUBACK)

    readers = [threading.Thread(target=read_subscriber)] + ([threading.Thread(target=read_pubacks)] if qos else [])
    payload = b"x" * args.size
    batches = [b"".join(codec.publish(topic, payload, qos, False, False, j % 65535 + 1)
                        for j in range(i, min(i + args.batch, count))) for i in range(0, count, args.batch)]
    for thread in readers:
        thread.start()
    started = time.monotonic()
    for batch in batches:
        pub.sendall(batch)
    for thread in readers:
        thread.join()
    elapsed = time.monotonic() - started
    pub.close()
    sub.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=16, help="payload bytes")
    parser.add_argument("--batch", type=int, default=1000, help="PUBLISH packets per write")
    parser.add_argument("--qos", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    args = parser.parse_args()
    for qos in args.qos:
        rate = run(args, qos)
        print(f"QoS {qos}: {args.messages} messages of {args.size} B, one publisher to one subscriber: "
              f"{rate:,.0f} msg/s")


if __name__ == "__main__":
    main()
