"""What a login costs: AMQP logins per second with a password and with an OAuth 2 token, and what the
LDAP backend (with its cache) adds to a publish.

1. Logins: ``--clients`` concurrent raw AMQP 0-9-1 clients (asyncio, pamqp frames) each open a
   connection (PLAIN), open the vhost and close it, again and again for ``--seconds``, with
   - ``password``: guest's password (the local backend, SHA-256, the good check remembered);
   - ``token``: one token for every login (the token cache: its signature checked once);
   - ``token-fresh``: a new token each login (its signature checked every time), signed beforehand.
   The tokens are RS256 JWTs signed by a key the broker takes as a static signing key
   (``auth_oauth2_signing_keys``), so no identity provider is needed. Printed per mode: logins a
   second (wall clock, client and broker sharing the machine) and the broker's CPU per login (user +
   system from /proc over the run), and what that CPU allows: 1 / CPU per login, logins a second a
   core could serve.
2. With ``--ldap`` (needs Debian's slapd and ldap-utils): the tests' directory (tests/e2e/test_ldap.py)
   and a broker with ``auth_backends: [ldap, local]``; ``--messages`` publishes to amq.topic (16 B,
   routing key ``<user>.jobs``, each confirmed) by the local user guest and by the directory user
   bob, alternated for ``--rounds``; printed: the broker's CPU per publish of each.

Starts its own brokers (free ports, temporary data dirs, fsync never); prints a table, then one JSON
object on the last line. The Cost goal of issue 33: 1,000 token logins a second on the 2-core machine.

    python bench/login_bench.py [--seconds 10] [--clients 8] [--ldap]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_broker import BrokerProcess  # noqa: E402
from joserfc import jwt  # noqa: E402
from joserfc.jwk import RSAKey  # noqa: E402
from pamqp import commands, frame, header  # noqa: E402

SCOPES = "rabbitmq.configure:*/* rabbitmq.read:*/* rabbitmq.write:*/*"
_CLOSE = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


# --- logins -----------------------------------------------------------------------------------------

async def _read_method(reader: asyncio.StreamReader, buffer: bytearray) -> Any:
    while True:
        if buffer:
            try:
                used, _, value = frame.unmarshal(bytes(buffer))
            except Exception:  # an incomplete frame: read more
                used = 0
            if used:
                del buffer[:used]
                if not isinstance(value, header.ProtocolHeader):
                    return value
                continue
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("closed by the broker")
        buffer += chunk


async def login_once(port: int, user: str, password: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    buffer = bytearray()
    try:
        writer.write(b"AMQP\x00\x00\x09\x01")
        assert isinstance(await _read_method(reader, buffer), commands.Connection.Start)
        writer.write(frame.marshal(commands.Connection.StartOk(mechanism="PLAIN", response=f"\0{user}\0{password}"), 0))
        answer = await _read_method(reader, buffer)
        if not isinstance(answer, commands.Connection.Tune):
            raise RuntimeError(f"login refused: {answer}")
        writer.write(frame.marshal(commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0), 0)
                     + frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        answer = await _read_method(reader, buffer)
        if not isinstance(answer, commands.Connection.OpenOk):
            raise RuntimeError(f"open refused: {answer}")
        writer.write(frame.marshal(_CLOSE, 0))
        assert isinstance(await _read_method(reader, buffer), commands.Connection.CloseOk)
    finally:
        writer.close()


async def login_run(port: int, passwords: list[str], user: str, seconds: float, clients: int) -> int:
    """Logins done in ``seconds`` by ``clients`` loops; ``passwords`` used in turn (each once when
    there are enough)."""
    deadline = time.monotonic() + seconds
    done = 0
    turn = iter(range(10**12))

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await login_once(port, user, passwords[next(turn) % len(passwords)])
            done += 1
    await asyncio.gather(*(loop() for _ in range(clients)))
    return done


def token(key: Any, user: str, lifetime: int = 3600) -> str:
    now = int(time.time())
    return str(jwt.encode({"alg": "RS256", "kid": "bench"}, {"aud": "rabbitmq", "sub": user, "exp": now + lifetime,
                                                           "scope": SCOPES}, key))


def bench_logins(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    key = RSAKey.generate_key(2048, parameters={"kid": "bench"}, private=True)
    pem = workdir / "bench-key.pem"
    pem.write_bytes(key.as_pem(private=False))
    (workdir / "logins").mkdir()
    settings = {"auth_backends": ["local", "oauth2"], "auth_oauth2_resource_server_id": "rabbitmq",
                "auth_oauth2_signing_keys": {"bench": str(pem)}}
    broker = BrokerProcess(workdir / "logins", settings=settings)
    # Enough fresh tokens for every round (none used twice unless a round passes 1,500 logins a second).
    fresh = [token(key, f"fresh-{i}") for i in range(int(min(60_000, max(2_000, args.seconds * args.rounds * 1_500))))]
    modes = {"password": ("guest", ["guest"]), "token": ("ignored", [token(key, "bench-app")]),
             "token-fresh": ("ignored", fresh)}
    runs: dict[str, list[tuple[int, float, float]]] = {name: [] for name in modes}  # (logins, wall, cpu)
    try:
        asyncio.run(login_run(broker.amqp_port, ["guest"], "guest", 1.0, args.clients))  # warm up
        for _ in range(args.rounds):  # the modes alternated: the shared machine's load changes by the minute
            for name, (user, passwords) in modes.items():
                cpu0, wall0 = broker.cpu_seconds(), time.perf_counter()
                done = asyncio.run(login_run(broker.amqp_port, passwords, user, args.seconds, args.clients))
                runs[name].append((done, time.perf_counter() - wall0, broker.cpu_seconds() - cpu0))
                if name == "token-fresh":  # the next round's tokens are new ones
                    modes[name] = (user, passwords[done:] if len(passwords) > done else passwords)
    finally:
        broker.stop()
    results: dict[str, Any] = {}
    for name, values in runs.items():
        done, wall, cpu = (sum(v[i] for v in values) for i in range(3))
        results[name] = {"logins": done, "logins_per_s": round(done / wall),
                         "broker_cpu_us_per_login": round(cpu / done * 1e6),
                         "cpu_bound_logins_per_s": round(done / cpu) if cpu else None,
                         "rounds_cpu_us_per_login": [round(v[2] / v[0] * 1e6) for v in values if v[0]]}
    return results


# --- the login operation alone, in process ----------------------------------------------------------

def bench_operation(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The model's login operation (Logins.attempt + decide_now, what every face calls) without sockets:
    CPU per login (time.process_time) for a password, a cached token, a fresh token."""
    from lavinpy.broker.broker import Broker as Model
    from lavinpy.broker.ops import LoginRequest
    from lavinpy.config import Config

    key = RSAKey.generate_key(2048, parameters={"kid": "bench"}, private=True)
    pem = workdir / "op-key.pem"
    pem.write_bytes(key.as_pem(private=False))
    config = Config(data_dir=str(workdir / "op-data"), auth_backends=["local", "oauth2"],
                    auth_oauth2_resource_server_id="rabbitmq", auth_oauth2_signing_keys={"bench": str(pem)},
                    login_free_failures=10**9)
    config.validate()
    model = Model(config)
    model.open()
    cached = token(key, "bench-app")
    fresh = [token(key, f"op-{i}") for i in range(args.operations // 10)]
    modes = {"password": ("guest", ["guest"] * args.operations), "token": ("x", [cached] * args.operations),
             "token-fresh": ("x", fresh)}
    out: dict[str, Any] = {}
    try:
        for name, (user, passwords) in modes.items():
            started = time.process_time()
            attempt = model.logins.attempt
            for password in passwords:
                outcome = attempt(LoginRequest("AMQP 0-9-1", "PLAIN", user, password, "127.0.0.1")).decide_now()
                assert outcome is not None and outcome.ok, outcome
            cpu = time.process_time() - started
            out[name] = {"logins": len(passwords), "cpu_us_per_login": round(cpu / len(passwords) * 1e6, 1),
                         "logins_per_cpu_second": round(len(passwords) / cpu)}
    finally:
        model.logins.close()
    return out


# --- LDAP and a publish -----------------------------------------------------------------------------

def bench_ldap(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import pika  # type: ignore[import-untyped]

    from tests.e2e.slapd import Slapd
    from tests.e2e.test_ldap import ENTRIES, SETTINGS

    slapd = Slapd(workdir / "slapd")
    broker = None
    try:
        slapd.add(ENTRIES)
        (workdir / "ldap").mkdir()
        settings = {**SETTINGS, "auth_ldap_port": slapd.port, "auth_ldap_cache_ttl": 15.0}
        broker = BrokerProcess(workdir / "ldap", settings=settings)
        per_user: dict[str, list[float]] = {"guest": [], "bob": []}
        admin = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, "/", pika.PlainCredentials("guest", "guest"), heartbeat=0))
        setup = admin.channel()
        for user in per_user:  # guest's queues: bob only publishes (write and topic checks)
            setup.queue_declare(f"bench-{user}", auto_delete=False)
            setup.queue_bind(f"bench-{user}", "amq.topic", f"{user}.jobs")
        for _ in range(args.rounds):
            for user in per_user:
                params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, "/", pika.PlainCredentials(
                    user, "guest" if user == "guest" else "bob-pw"), heartbeat=0)
                with pika.BlockingConnection(params) as conn:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    ch.basic_publish("amq.topic", f"{user}.jobs", b"warm-up 16 bytes")
                    cpu0 = broker.cpu_seconds()
                    for _ in range(args.messages):
                        ch.basic_publish("amq.topic", f"{user}.jobs", b"sixteen bytes!!!")
                    per_user[user].append((broker.cpu_seconds() - cpu0) / args.messages * 1e6)
                setup.queue_purge(f"bench-{user}")
        admin.close()
    finally:
        if broker is not None:
            broker.stop()
        slapd.stop()
    return {user: {"broker_cpu_us_per_publish": [round(v, 1) for v in values],
                   "median": round(statistics.median(values), 1)} for user, values in per_user.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each login mode runs this long")
    parser.add_argument("--clients", type=int, default=8, help="concurrent logging-in clients")
    parser.add_argument("--ldap", action="store_true", help="also the LDAP publish cost (needs slapd)")
    parser.add_argument("--no-logins", action="store_true", help="only the LDAP publish cost")
    parser.add_argument("--messages", type=int, default=10_000, help="publishes per user and round (--ldap)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--operations", type=int, default=50_000, help="in-process logins per mode")
    args = parser.parse_args()
    out: dict[str, Any] = {"load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="login-bench-") as tmp:
        workdir = Path(tmp)
        if not args.no_logins:
            out["operation"] = bench_operation(args, workdir)
            print("the login operation in process (no sockets):")
            for name, r in out["operation"].items():
                print(f"  {name:<12} {r['cpu_us_per_login']:>8} us CPU per login = "
                      f"{r['logins_per_cpu_second']:>8} logins per CPU second")
            out["logins"] = bench_logins(args, workdir)
            print("whole AMQP connections (open, login, vhost, close) over loopback:")
            print(f"{'mode':<12} {'logins':>8} {'logins/s':>9} {'broker CPU/login':>17} {'1/CPU (logins/s)':>17}")
            for name, r in out["logins"].items():
                print(f"{name:<12} {r['logins']:>8} {r['logins_per_s']:>9} {r['broker_cpu_us_per_login']:>14} us "
                      f"{r['cpu_bound_logins_per_s']:>17}")
        if args.ldap:
            out["ldap_publish"] = bench_ldap(args, workdir)
            for user, r in out["ldap_publish"].items():
                print(f"publish as {user:<6} ({'ldap' if user == 'bob' else 'local'}): broker CPU per publish "
                      f"{r['median']} us (rounds: {r['broker_cpu_us_per_publish']})")
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
