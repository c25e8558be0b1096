"""MQTT throughput over raw sockets (the client side does little more than write prepared packets
and count, so the broker is the bound): one publisher to one subscriber, fan-in (``--publishers``
to one subscriber) and fan-out (one publisher to ``--subscribers``). Works against any MQTT 3.1.1
broker: lavinpy, mosquitto. Prints delivered msg/s per QoS; not a test.

    python3 bench/mqtt_bench.py --port 1883 [--messages 200000] [--size 16] [--qos 0 1 2] [--inflight 1000]
    python3 bench/mqtt_bench.py --port 1883 --publishers 100      # fan-in
    python3 bench/mqtt_bench.py --port 1883 --subscribers 100     # fan-out
    python3 bench/mqtt_bench.py --port 1883 --idle 10000 --pid PID  # RSS per idle device

Each publisher writes batches of ``--batch`` PUBLISH packets (``--messages`` in all, shared among the
publishers); a QoS 1 subscriber PUBACKs what it read after each read; a QoS 1 publisher's PUBACKs
are counted by a thread of its own. At QoS 2 the subscriber answers PUBLISH with PUBREC and PUBREL
with PUBCOMP (a message counts at its PUBREL), the publisher's thread answers PUBREC with PUBREL and
counts PUBCOMPs, and a publisher keeps at most ``--inflight`` messages unfinished (its packet ids are
reused only once free). The time is from the first publish to the last message read (and, for QoS 1
and 2, the last PUBACK or PUBCOMP received); the rate counts deliveries (messages x subscribers).
"""

from __future__ import annotations

import argparse
import resource
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
    subs = [connect(args, f"bench-sub-{qos}-{i}") for i in range(args.subscribers)]
    for sub in subs:
        subscribe(sub, topic, qos)
    pubs = [connect(args, f"bench-pub-{qos}-{i}") for i in range(args.publishers)]
    count = args.messages - args.messages % args.publishers  # the same share for every publisher
    share = count // args.publishers

    def read_subscriber(sub: socket.socket) -> None:
        reader, got = codec.PacketReader(1 << 26), 0
        while got < count:
            acks = []
            for kind, flags, body in reader.feed(sub.recv(1 << 20)):
                if kind == codec.PUBLISH:
                    if qos == 2:
                        acks.append(codec.qos2_reply(1, codec.parse_publish(flags, body).packet_id))  # PUBREC
                        continue
                    got += 1
                    if qos:
                        acks.append(codec.puback(codec.parse_publish(flags, body).packet_id))
                elif kind == codec.PUBREL:
                    got += 1
                    acks.append(codec.qos2_reply(2, int.from_bytes(body, "big")))  # PUBCOMP
            if acks:
                sub.sendall(b"".join(acks))

    def read_pubacks(pub: socket.socket, window: threading.Semaphore) -> None:
        reader, got = codec.PacketReader(1 << 26), 0
        while got < share:
            pubrels = []
            for kind, _, body in reader.feed(pub.recv(1 << 20)):
                if kind == codec.PUBREC:
                    pubrels.append(codec.qos2_reply(3, int.from_bytes(body, "big")))
                elif kind in (codec.PUBACK, codec.PUBCOMP):
                    got += 1
                    if kind == codec.PUBCOMP:
                        window.release()
            if pubrels:
                pub.sendall(b"".join(pubrels))

    def write_publisher(pub: socket.socket, window: threading.Semaphore) -> None:
        for batch, size in zip(batches, sizes, strict=True):
            if qos == 2:
                for _ in range(size):
                    window.acquire()
            pub.sendall(batch)

    payload = b"x" * args.size
    batch = min(args.batch, args.inflight) if qos == 2 else args.batch
    batches = [b"".join(codec.publish(topic, payload, qos, False, False, j % 65535 + 1)
                        for j in range(i, min(i + batch, share))) for i in range(0, share, batch)]
    sizes = [min(batch, share - i) for i in range(0, share, batch)]
    windows = [threading.Semaphore(args.inflight) for _ in pubs]
    readers = [threading.Thread(target=read_subscriber, args=(sub,)) for sub in subs]
    if qos:
        readers += [threading.Thread(target=read_pubacks, args=(pub, w)) for pub, w in zip(pubs, windows, strict=True)]
    writers = [threading.Thread(target=write_publisher, args=(pub, w)) for pub, w in zip(pubs, windows, strict=True)]
    for thread in readers:
        thread.start()
    started = time.monotonic()
    for thread in writers:
        thread.start()
    for thread in readers + writers:
        thread.join()
    elapsed = time.monotonic() - started
    for sock in pubs + subs:
        sock.close()
    return count * len(subs) / elapsed


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def idle_devices(args: argparse.Namespace) -> None:
    """``--idle`` clean-session devices connected (keepalive 0) and left idle: the broker's RSS growth
    per device, 3 s after the last CONNACK."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.idle + 100)), hard))
    before = rss_kib(args.pid)
    devices = [connect(args, f"idle-{i}") for i in range(args.idle)]
    time.sleep(3)
    after = rss_kib(args.pid)
    print(f"{args.idle} idle devices: broker RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB, "
          f"{(after - before) / args.idle:.2f} KiB each")
    for sock in devices:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=16, help="payload bytes")
    parser.add_argument("--batch", type=int, default=1000, help="PUBLISH packets per write")
    parser.add_argument("--qos", type=int, nargs="+", default=[0, 1], choices=[0, 1, 2])
    parser.add_argument("--inflight", type=int, default=1000, choices=range(1, 65536), metavar="1..65535",
                        help="QoS 2 messages a publisher keeps unfinished (PUBCOMP not yet received)")
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--idle", type=int, default=0, help="connect this many idle devices instead (needs --pid)")
    parser.add_argument("--pid", type=int, help="the broker's process id, for --idle")
    args = parser.parse_args()
    if args.idle:
        if not args.pid:
            parser.error("--idle needs --pid (the broker's process id)")
        idle_devices(args)
        return
    for qos in args.qos:
        rate = run(args, qos)
        print(f"QoS {qos}: {args.messages} messages of {args.size} B, {args.publishers} publisher(s) to "
              f"{args.subscribers} subscriber(s): {rate:,.0f} deliveries/s")


if __name__ == "__main__":
    main()
