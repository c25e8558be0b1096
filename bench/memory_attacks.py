"""The broker's RSS while clients make it hold memory they never let it free (a broker of its own).

- ``partial-content``: one AMQP connection opens every channel it may (channel_max) and on each starts a
  message of 32 KiB (the largest kept in memory, larger ones go to a file) sent as 1-byte body frames,
  and never ends it;
- ``half-open``: ``--clients`` AMQP connections that send the protocol header and most of a frame of
  128 KiB (frame_max), and nothing more (the handshake timeout, 10 s, closes them);
- ``no-read``: ``--clients`` AMQP connections that write basic.qos for 5 s without reading an answer (the
  answers back up: the writer's high-water mark stops the reading);
- ``http-unauth``: ``--clients`` HTTP uploads of ``--mib`` MiB each to /api/definitions without
  credentials, all at once;
- ``http-auth``: the same with the guest user's credentials.

Prints the broker's RSS before and at the end (VmRSS, and the peak VmHWM), in MiB.

    python3 bench/memory_attacks.py partial-content [--repo <tree>]
    python3 bench/memory_attacks.py http-auth --clients 8 --mib 100
"""

from __future__ import annotations

import argparse
import base64
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from bench_broker import REPO, BrokerProcess  # noqa: E402
from pamqp import commands, frame, header  # noqa: E402
from rawamqp import RawAMQP  # noqa: E402


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def partial_content(port: int, channels: int) -> list[RawAMQP]:
    client = RawAMQP("127.0.0.1", port)
    client.handshake()
    body = 32 * 1024
    one_byte = b"\x03" + b"\x00\x00" + (1).to_bytes(4, "big") + b"x\xce"  # channel patched in below
    for channel in range(1, channels + 1):
        client.open_channel(channel)
        start = (frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), channel)
                 + frame.marshal(header.ContentHeader(0, body, commands.Basic.Properties()), channel))
        frames = one_byte[:1] + channel.to_bytes(2, "big") + one_byte[3:]
        client.send_raw(start + frames * (body - 1))
    return [client]


def half_open(amqp_port: int, clients: int) -> list[socket.socket]:
    socks = []
    for _ in range(clients):
        s = socket.create_connection(("127.0.0.1", amqp_port))
        size = 131072 - 8
        s.sendall(b"AMQP\x00\x00\x09\x01" + b"\x01\x00\x00" + size.to_bytes(4, "big") + b"\x00" * (size - 4096))
        socks.append(s)
    return socks


def no_read(port: int, clients: int) -> list[RawAMQP]:
    held = []
    data = frame.marshal(commands.Basic.Qos(prefetch_count=1), 1) * 10_000
    for _ in range(clients):
        client = RawAMQP("127.0.0.1", port)
        client.handshake()
        client.open_channel()
        client.sock.setblocking(False)
        held.append(client)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        for client in held:
            try:
                client.sock.send(data)
            except BlockingIOError:
                pass
        time.sleep(0.01)
    return held


def upload(port: int, mib: int, auth: bool, results: list[str]) -> None:
    head = (f"POST /api/definitions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {mib << 20}\r\n")
    if auth:
        head += "Authorization: Basic " + base64.b64encode(b"guest:guest").decode() + "\r\n"
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(60)
    try:
        s.sendall(head.encode() + b"\r\n")
        chunk = b"[" + b" " * ((1 << 20) - 1)
        for _ in range(mib):
            s.sendall(chunk)
        results.append(s.recv(200).split(b"\r\n", 1)[0].decode())
    except OSError as e:
        results.append(f"{type(e).__name__}")
    finally:
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attack", choices=("partial-content", "half-open", "no-read", "http-unauth", "http-auth"))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--channels", type=int, default=2047)
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), repo=args.repo, http=args.attack.startswith("http"))
        try:
            time.sleep(1)
            before = rss_mib(broker.proc.pid)
            t0 = time.monotonic()
            held: list = []
            outcome = ""
            if args.attack == "partial-content":
                held = partial_content(broker.amqp_port, args.channels)
                time.sleep(2)
            elif args.attack == "no-read":
                held = no_read(broker.amqp_port, args.clients)
            elif args.attack == "half-open":
                held = half_open(broker.amqp_port, args.clients)
                time.sleep(2)
            else:
                results: list[str] = []
                threads = [threading.Thread(target=upload, args=(broker.http_port, args.mib,
                                                                 args.attack == "http-auth", results))
                           for _ in range(args.clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                outcome = ", ".join(sorted(set(results)))
            after = rss_mib(broker.proc.pid)
            for h in held:
                h.close()
        finally:
            broker.stop()
    print(f"{args.attack}: RSS {before[0]:.1f} MiB before, {after[0]:.1f} after (peak {after[1]:.1f}), "
          f"{time.monotonic() - t0:.1f} s {outcome}")


if __name__ == "__main__":
    main()
