"""systemd's notify protocol (``Type=notify``), written with the socket module alone.

systemd names a unix datagram socket in NOTIFY_SOCKET (a path, or an abstract name starting with
"@") and reads "KEY=value" lines from it: READY=1 when the service serves, STOPPING=1 when it begins
to stop, WATCHDOG=1 at least every WATCHDOG_USEC microseconds when the unit sets WatchdogSec=.
Without NOTIFY_SOCKET every call does nothing, so the broker runs the same outside systemd.

The variables are left in the environment on purpose: a cluster node that steps down re-executes
itself under the same pid and must go on notifying (the unit's NotifyAccess=main ignores any child
that would write to the socket).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger("lavinpy.systemd")


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        name = env.get("NOTIFY_SOCKET", "")
        if name.startswith("@"):
            name = "\0" + name[1:]  # Linux abstract namespace
        self.address = name if name.startswith(("/", "\0")) else ""
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process systemd watches; a child that inherited the variables is not it.
        if self.address and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            # Half the timeout, as sd_watchdog_enabled(3) advises: one late ping is not yet a failure.
            self.watchdog_interval = int(usec) / 2_000_000
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, message: str) -> bool:
        """Send one notification; False when there is no socket or systemd did not take it."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError as e:
            # The service keeps running: a missed READY is systemd's start timeout to report.
            log.warning("systemd notification %r not sent to %s: %s", message, self.address.replace("\0", "@"), e)
            return False
        return True

    def ready(self) -> None:
        self.notify("READY=1\nSTATUS=serving")

    def stopping(self) -> None:
        self.notify("STOPPING=1\nSTATUS=stopping")

    def start_watchdog(self) -> None:
        """Ping from the event loop: a loop that stops turning stops the pings and systemd restarts it."""
        if self.watchdog_interval is None or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._watchdog(self.watchdog_interval))

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    def stop_watchdog(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
