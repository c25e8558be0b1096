"""ops.set_queue_expiry (an MQTT 5 session's new expiry interval): every queue kind but streams takes
the new x-expires at once and keeps it across a restart; a stream and a bad value get the declare's
406, and nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.broker.errors import BrokerChannelError
from lavinpy.broker.ops import objects as ops
from tests.broker.model_harness import OWNER, Model


def test_every_kind_but_a_stream_takes_a_new_expiry_across_a_restart(tmp_path: Path) -> None:
    m = Model(tmp_path, fsync="never")
    try:
        kinds = {"classic": {}, "quorum": {"queue_type": "quorum"}, "priority": {"max_priority": 5},
                 "stream": {"queue_type": "stream"}}
        for name, arguments in kinds.items():
            m.declare(name, durable=True, **arguments)
        ops.declare_exchange(None, m.vhost, "delayed", "x-delayed-message",
                             arguments={"x-delayed-type": "direct"})
        m.declare("delayed-q", durable=True)  # a delayed exchange's queue: a classic one
        m.bind("delayed-q", "delayed", "k")
        for name in ("classic", "quorum", "priority", "delayed-q"):
            ops.set_queue_expiry(None, m.vhost, name, 30_000, OWNER)
            assert m.vhost.queues[name].settings.expires == 30_000
        ops.set_queue_expiry(None, m.vhost, "priority", None, OWNER)  # never expires again
        for name, value in (("stream", 30_000), ("classic", 0)):
            with pytest.raises(BrokerChannelError, match="invalid arg 'x-expires'"):
                ops.set_queue_expiry(None, m.vhost, name, value, OWNER)
        m.reopen()
        assert m.vhost.queues["classic"].arguments == {"x-expires": 30_000}
        assert m.vhost.queues["quorum"].arguments == {"x-queue-type": "quorum", "x-expires": 30_000}
        assert m.vhost.queues["priority"].arguments == {"x-max-priority": 5}
        assert "x-expires" not in m.vhost.queues["stream"].arguments
    finally:
        m.close()
