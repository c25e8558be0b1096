"""Recovery of durable queues whose declaration was lost to a damaged ``definitions.amqp`` record.

A queue's directory (with its ``.queue`` name file and its index) outlives a damaged declare
record. Without an open index its messages would count as unreferenced and their segments would
be deleted at boot, so when the definitions file had damaged records, every queue directory that
no surviving declare names is declared again (default arguments; a stream when it has a stream
file) before the bindings are replayed: the queue, its messages and its bindings come back.
Only then: an orphan directory in an undamaged file is a deletion interrupted by a crash.
"""

from __future__ import annotations

import logging
from typing import Any

from pamqp import commands

from ..store.stream_index import META_FILE as STREAM_META_FILE
from ..store.vhost_store import VhostStore
from ..wire.frames import build_method

log = logging.getLogger(__name__)


def orphan_queue_declares(vhost_name: str, store: VhostStore, replay: list[Any]) -> list[commands.Queue.Declare]:
    """Declares for the queue directories on disk that no declare in ``replay`` names."""
    declared = {cmd.queue for cmd in replay if isinstance(cmd, commands.Queue.Declare)}
    orphans = []
    for name in store.queue_names_on_disk():
        if name in declared:
            continue
        stream = (store.queue_path(name) / STREAM_META_FILE).exists()
        arguments: dict[str, Any] = {"x-queue-type": "stream"} if stream else {}
        log.error("vhost %r: queue %r is declared again from its directory (its declaration was in a damaged "
                  "definitions record); arguments other than its type are not known", vhost_name, name)
        orphans.append(build_method(commands.Queue.Declare, queue=name, durable=True, arguments=arguments))
    return orphans
