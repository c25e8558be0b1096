"""A follower process for the replication tests: runs ReplicationClient.run() in a loop until SIGTERM.

Usage: python -m tests.cluster.replication_follower DATA_DIR SECRET_HEX NODE_ID HOST PORT
Exit status 3 when the leader refuses the secret.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from lavinpy.cluster.errors import ReplicationRefused
from lavinpy.cluster.replication_client import ReplicationClient


async def main(data_dir: str, secret_hex: str, node_id: str, host: str, port: str) -> int:
    client = ReplicationClient(Path(data_dir), bytes.fromhex(secret_hex), node_id, host, int(port))
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    while not stopping.is_set():
        run = asyncio.ensure_future(client.run())
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait([run, stop], return_when=asyncio.FIRST_COMPLETED)
        if stopping.is_set():
            await client.close()
            run.cancel()
            break
        stop.cancel()
        try:
            run.result()
        except ReplicationRefused as exc:
            print(f"refused: {exc}", flush=True)
            return 3
        except OSError:
            pass
        await asyncio.sleep(0.2)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main(*sys.argv[1:6])))
