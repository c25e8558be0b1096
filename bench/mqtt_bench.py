"""MQTT throughput over raw sockets (the client side does little more than write prepared packets
and count, so the broker is the bound): one publisher to one subscriber, fan-in (``--publishers``
to one subscriber) and fan-out (one publisher to ``--subscribers``). Works against any MQTT 3.1.1
broker: lavinpy, mosquitto. Prints delivered msg/s per QoS; not a test.

    python3 bench/mqtt_bench.py --port 1883 [--messages 200000] [--size 16] [--qos 0 1 2] [--inflight 1000]
    python3 bench/mqtt_bench.py --port 1883 --publishers 100      # fan-in
    python3 bench/mqtt_bench.py --port 1883 --subscribers 100     # fan-out
    python3 bench/mqtt_bench.py --port 1883 --idle 10000 --pid PID  # RSS per idle device
    python3 bench/mqtt_bench.py --port 1883 --mqtt5 --pid PID    # MQTT 5 clients; the broker's CPU per delivery

Each publisher writes batches of ``--batch`` PUBLISH packets (``--messages`` in all, shared among the
publishers); a QoS 1 subscriber PUBACKs what it read after each read; a QoS 1 publisher's PUBACKs
are counted by a thread of its own. At QoS 2 the subscriber answers PUBLISH with PUBREC and PUBREL
with PUBCOMP (a message counts at its PUBREL), the publisher's thread answers PUBREC with PUBREL and
counts PUBCOMPs, and a publisher keeps at most ``--inflight`` messages unfinished (its packet ids are
reused only once free). The time is from the first publish to the last message read (and, for QoS 1
and 2, the last PUBACK or PUBCOMP received); the rate counts deliveries (messages x subscribers).
With ``--mqtt5`` the clients speak MQTT 5 (PUBLISH with an empty property block); with ``--pid`` the
broker's CPU time (user + system) per delivery is printed too, the figure to compare on a shared machine:
the CPU of the process holding the listening socket of ``--port``, found among the given pid and its
descendants (a launcher's pid, a shell's or ``python3 -m lavinpy``'s wrapper, names the broker under it);
``--pid auto`` finds it by the port alone.
A QoS 1 or 2 run prints the largest subscriber read: the most deliveries one read held, all of them
unacknowledged at once (the subscriber answers each read after it), a lower bound of the in-flight
window the broker really kept (mosquitto 2.0.11 goes far past its ``max_inflight_messages`` here while
the subscriber acks, though it stops at the window when the subscriber never acks).

Every run also prints the client's own share, since the client is Python on the broker's machine: its
CPU, when the publishers' side was done (every PUBLISH written and acknowledged), and per subscriber
read (a QoS 1 subscriber's round trip: read, PUBACKs written) the time, the subscriber thread's CPU and
the time spent in ``recv`` (the broker's part, wake-ups included); with ``--pid``, the broker's share of
a core after the publishers were done. With a window the broker keeps, the rate is window / round trip.
``--ack-each`` has a subscriber write each of its replies on its own, as paho and libmosquitto do
(the broker then mostly reads one PUBACK at a time). ``--split-roles`` runs the subscribers in a
process of their own, so that the publishers' threads (100 writers and 100 PUBACK readers) do not
share their interpreter lock: the fairer setting when the publishing overlaps the deliveries (a broker
that acknowledges publishes slowly).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lavinpy.mqtt import codec, codec5  # noqa: E402  (the repository's codec encodes the packets)


def read_packet(sock: socket.socket, kind: int) -> bytes:
    """The body of the next packet, which must be of ``kind``."""
    reader, packets = codec.PacketReader(1 << 20), []
    while not packets:
        data = sock.recv(1 << 16)
        if not data:
            raise SystemExit(f"closed before {codec.PACKET_NAMES[kind]}")
        packets = reader.feed(data)
    if packets[0][0] != kind:
        raise SystemExit(f"{codec.PACKET_NAMES[packets[0][0]]} instead of {codec.PACKET_NAMES[kind]}")
    return packets[0][2]


def connect(args: argparse.Namespace, client_id: str) -> socket.socket:
    sock = socket.create_connection((args.host, args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if args.mqtt5:
        sock.sendall(codec5.encode_connect(client_id, username=args.user, password=args.password.encode(),
                                           keepalive=0))
    else:
        sock.sendall(codec.encode_connect(client_id, username=args.user, password=args.password.encode(),
                                          keepalive=0))
    connack = read_packet(sock, codec.CONNACK)
    if connack[1] != 0:
        raise SystemExit(f"CONNECT refused: {connack!r}")
    return sock


def subscribe(sock: socket.socket, topic: str, qos: int, mqtt5: bool) -> None:
    if mqtt5:
        sock.sendall(codec5.encode_subscribe(1, [(topic, qos)]))
    else:
        name = topic.encode()
        body = b"\x00\x01" + len(name).to_bytes(2, "big") + name + bytes((qos,))
        sock.sendall(bytes((0x82, len(body))) + body)
    read_packet(sock, codec.SUBACK)


class Result(NamedTuple):
    """One run's figures: deliveries/s, the largest subscriber read, and what the client spent."""

    rate: float
    largest_read: int
    elapsed: float
    published: float  # when the publishers' side was done (every PUBLISH written, and acknowledged)
    client_cpu: float  # this process's CPU seconds (all roles)
    subscriber_cpu: float  # the subscriber threads' CPU seconds
    subscriber_reads: int
    subscriber_waited: float  # the subscriber threads' seconds in recv
    broker_cpu_after: float  # the broker's CPU seconds after the publishers' side was done (with --pid)


def run(args: argparse.Namespace, qos: int) -> Result:
    """Deliveries per second, the most QoS 1/2 deliveries one subscriber read held (see ``main``), and the
    client's own share of the time."""
    topic = f"bench/{qos}/{time.monotonic_ns()}"
    subs = [connect(args, f"bench-sub-{qos}-{i}") for i in range(args.subscribers)]
    for sub in subs:
        subscribe(sub, topic, qos, args.mqtt5)
    pubs = [connect(args, f"bench-pub-{qos}-{i}") for i in range(args.publishers)]
    count = args.messages - args.messages % args.publishers  # the same share for every publisher
    share = count // args.publishers

    largest_read = [0]  # the most deliveries awaiting PUBACK or PUBREC that one read of a subscriber held
    sub_cpu = [0.0]  # the subscriber threads' own CPU seconds
    sub_reads = [0]  # the subscribers' reads (a QoS 1 subscriber's round trips: read, then PUBACK)
    sub_waited = [0.0]  # the subscribers' seconds in recv: the broker's share of a round trip, wake-ups included

    def read_subscriber(sub: socket.socket) -> None:
        reader, got = codec.PacketReader(1 << 26), 0
        thread_start, clock, waited = time.thread_time(), time.perf_counter, 0.0
        while got < count:
            acks = []
            unacked = 0
            before = clock()
            data = sub.recv(1 << 20)
            waited += clock() - before
            for kind, _, body in reader.feed(data):
                if kind == codec.PUBLISH:
                    unacked += 1
                    if qos == 2:
                        acks.append(codec.qos2_reply(1, packet_id_of(body)))  # PUBREC
                        continue
                    got += 1
                    if qos:
                        acks.append(codec.puback(packet_id_of(body)))
                elif kind == codec.PUBREL:
                    got += 1
                    acks.append(codec.qos2_reply(2, int.from_bytes(body, "big")))  # PUBCOMP
            if acks and args.ack_each:  # a write per PUBACK, as paho and libmosquitto send them
                for ack in acks:
                    sub.sendall(ack)
            elif acks:
                sub.sendall(b"".join(acks))
            largest_read[0] = max(largest_read[0], unacked)
            sub_reads[0] += 1
        sub_cpu[0] += time.thread_time() - thread_start
        sub_waited[0] += waited

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
    encode = codec5.publish if args.mqtt5 else codec.publish
    batches = [b"".join(encode(topic, payload, qos, False, False, j % 65535 + 1)
                        for j in range(i, min(i + batch, share))) for i in range(0, share, batch)]
    sizes = [min(batch, share - i) for i in range(0, share, batch)]
    windows = [threading.Semaphore(args.inflight) for _ in pubs]
    sub_threads = [threading.Thread(target=read_subscriber, args=(sub,)) for sub in subs]
    readers = [threading.Thread(target=read_pubacks, args=(pub, w)) for pub, w in zip(pubs, windows, strict=True)] \
        if qos else []
    writers = [threading.Thread(target=write_publisher, args=(pub, w)) for pub, w in zip(pubs, windows, strict=True)]
    child, results = 0, -1
    if args.split_roles:  # the subscribers in a process of their own: no GIL shared with the publishers' threads
        results, child_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(results)
            own_cpu = time.process_time()
            for thread in sub_threads:
                thread.start()
            for thread in sub_threads:
                thread.join()
            figures = (time.monotonic(), largest_read[0], sub_cpu[0], sub_reads[0], sub_waited[0],
                       time.process_time() - own_cpu)
            os.write(child_end, json.dumps(figures).encode())
            os._exit(0)
        os.close(child_end)
        sub_threads = []
    for thread in sub_threads + readers:
        thread.start()
    started, own_cpu = time.monotonic(), time.process_time()
    for thread in writers:
        thread.start()
    for thread in readers + writers:  # the publishers' side: all written and acknowledged
        thread.join()
    published = time.monotonic() - started
    broker_cpu_then = cpu_seconds(args.pid) if args.pid else 0.0  # the rest is the subscribers' part
    for thread in sub_threads:
        thread.join()
    ended, own_cpu = time.monotonic(), time.process_time() - own_cpu
    if child:
        with os.fdopen(results, "rb") as pipe:
            ended, largest_read[0], sub_cpu[0], sub_reads[0], sub_waited[0], child_cpu = json.loads(pipe.read())
        os.waitpid(child, 0)
        own_cpu += child_cpu
    elapsed = ended - started
    broker_cpu_after = (cpu_seconds(args.pid) - broker_cpu_then) if args.pid else 0.0
    for sock in pubs + subs:
        sock.close()
    return Result(count * len(subs) / elapsed, largest_read[0], elapsed, published, own_cpu, sub_cpu[0], sub_reads[0],
                  sub_waited[0], broker_cpu_after)


def packet_id_of(body: bytes) -> int:
    """A QoS 1 or 2 PUBLISH's packet id (after its topic, in both versions)."""
    start = 2 + int.from_bytes(body[:2], "big")
    return int.from_bytes(body[start:start + 2], "big")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on ``port`` (IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except OSError:
            continue
    return inodes


def _holds(pid: int, inodes: set[str]) -> bool:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            continue
    return False


def _descendants(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def broker_pid(given: str, port: int) -> int:
    """The pid whose CPU is the broker's: the process listening on ``port`` among ``given`` and its
    descendants (``auto``: among all processes); ``given`` itself when none of them listens there."""
    inodes = _listening_inodes(port)
    candidates = _descendants(1 if given == "auto" else int(given))
    for pid in candidates:
        if inodes and _holds(pid, inodes):
            return pid
    if given == "auto":
        raise SystemExit(f"no process found listening on port {port}")
    print(f"warning: neither pid {given} nor a descendant listens on port {port}; measuring {given}",
          file=sys.stderr)
    return int(given)


def process_name(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]


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
    parser.add_argument("--pid", help="the broker's process id (or a launcher's above it, or auto: found by --port), "
                                      "for --idle (else: CPU per delivery)")
    parser.add_argument("--mqtt5", action="store_true", help="MQTT 5 clients (else 3.1.1)")
    parser.add_argument("--split-roles", action="store_true",
                        help="the subscribers in a process of their own (else threads beside the publishers')")
    parser.add_argument("--ack-each", action="store_true",
                        help="a subscriber writes each reply (PUBACK, PUBREC, PUBCOMP) on its own")
    args = parser.parse_args()
    if args.idle:
        if not args.pid:
            parser.error("--idle needs --pid (the broker's process id)")
        args.pid = broker_pid(args.pid, args.port)
        idle_devices(args)
        return
    if args.pid:
        args.pid = broker_pid(args.pid, args.port)
        print(f"broker pid {args.pid}: {process_name(args.pid)}")
    for qos in args.qos:
        cpu = cpu_seconds(args.pid) if args.pid else 0.0
        result = run(args, qos)
        deliveries = (args.messages - args.messages % args.publishers) * args.subscribers
        cost = ""
        if args.pid:
            cost = f", broker CPU {(cpu_seconds(args.pid) - cpu) / deliveries * 1e6:.2f} us/delivery"
        print(f"QoS {qos}{' (MQTT 5)' if args.mqtt5 else ''}: {args.messages} messages of {args.size} B, "
              f"{args.publishers} publisher(s) to {args.subscribers} subscriber(s): "
              f"{result.rate:,.0f} deliveries/s{cost}"
              + (f", largest subscriber read {result.largest_read} deliveries" if qos else ""))
        # The client's share: a Python client on the broker's machine may be the bound for any broker.
        print(f"  client: {result.elapsed:.2f} s (publishers done at {result.published:.2f} s), "
              f"CPU {result.client_cpu / result.elapsed * 100:.0f} % of a core "
              f"({result.client_cpu / deliveries * 1e6:.2f} us/delivery); subscriber threads "
              f"{result.subscriber_cpu / result.elapsed * 100:.0f} % busy, {result.subscriber_reads:,} reads "
              f"({result.elapsed / max(result.subscriber_reads, 1) * 1e6:.0f} us a read, "
              f"{result.subscriber_cpu / max(result.subscriber_reads, 1) * 1e6:.0f} us of it the thread's CPU, "
              f"{result.subscriber_waited / max(result.subscriber_reads, 1) * 1e6:.0f} us in recv)")
        if args.pid and result.elapsed - result.published > 0.5:  # enough 100 Hz ticks to say something
            print(f"  after the publishers were done ({result.elapsed - result.published:.2f} s): broker CPU "
                  f"{result.broker_cpu_after / (result.elapsed - result.published) * 100:.0f} % of a core")


if __name__ == "__main__":
    main()
