"""sd_notify without libsystemd: READY, WATCHDOG, STOPPING and STATUS for a Type=notify unit.

systemd passes ``$NOTIFY_SOCKET`` (a Unix datagram socket, a file path or an abstract
``@name``) to a Type=notify service; the service sends newline-separated ``KEY=VALUE``
datagrams. With ``WatchdogSec=`` set, systemd also passes ``$WATCHDOG_USEC`` (and
``$WATCHDOG_PID``) and kills the service if no ``WATCHDOG=1`` arrives in time, which is how a
wedged main loop gets restarted. Outside systemd (a terminal, the tests, the dev demo) the
variable is unset and every call is a cheap no-op, so the daemon calls these
unconditionally.

The protocol is a few lines, so no dependency (python-systemd needs libsystemd headers).

Usage (daemon)::

    from malletrain.ops.systemd import Notifier

    notifier = Notifier.from_environment()
    ...                                    # bind sockets, open the store, first tick
    notifier.ready("scavenging 8 nodes")    # READY=1 + STATUS=...
    while running:
        tick()
        notifier.watchdog()                 # WATCHDOG=1 (one datagram; cheap every tick)
        wake.wait(notifier.max_sleep_s(settings.allocator.tick_interval_s))
    notifier.stopping()                     # STOPPING=1 at the start of shutdown

Ping the watchdog only from the main loop (never from a helper thread): the point is to
prove the loop itself still turns.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


def _address(path: str) -> str | bytes:
    """``@name`` is Linux's abstract namespace: a leading NUL byte instead of the ``@``."""
    if path.startswith("@"):
        return b"\0" + path[1:].encode()
    return path


def watchdog_interval_s(env: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout systemd expects (``$WATCHDOG_USEC``), or None when not enabled.

    ``$WATCHDOG_PID``, when set, names the process that must ping; a child that inherited
    the environment must not think the watchdog is its own business.
    """
    e = os.environ if env is None else env
    usec = e.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = e.get("WATCHDOG_PID", "")
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000


class Notifier:
    """Sends sd_notify messages to ``socket_path``; all methods are no-ops when it is None.

    A failed send is logged once and never raised: systemd going away must not take the
    daemon down with it.
    """

    def __init__(self, socket_path: str | None, watchdog_s: float | None = None) -> None:
        self.socket_path = socket_path or None
        self.watchdog_s = watchdog_s
        self._last_watchdog = 0.0
        self._warned = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Notifier:
        e = os.environ if env is None else env
        return cls(e.get("NOTIFY_SOCKET") or None, watchdog_interval_s(e))

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` lines (``notify(READY=1, STATUS="...")``). True if sent."""
        if self.socket_path is None:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value)
            if "\n" in text:  # one field per line: a newline would forge another field
                text = text.replace("\n", " ")
            lines.append(f"{key}={text}")
        payload = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                # Never block the main loop on a notification: a datagram socket whose
                # reader lags blocks the sender once its queue (net.unix.max_dgram_qlen,
                # 10 by default) is full. A lost WATCHDOG=1 costs nothing; a blocked loop
                # would be killed by the very watchdog it is trying to feed.
                s.setblocking(False)
                s.connect(_address(self.socket_path))
                s.send(payload)
        except OSError as exc:
            if not self._warned:
                log.warning("sd_notify to %s failed: %s", self.socket_path, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def reloading(self) -> bool:
        """Around a SIGHUP reload: RELOADING=1 now, :meth:`ready` when done."""
        return self.notify(RELOADING=1)

    def stopping(self, status: str | None = None) -> bool:
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def max_sleep_s(self, wanted_s: float) -> float:
        """How long the loop may sleep: ``wanted_s``, but at most half the watchdog interval
        (systemd's advice), so a long tick interval never looks like a hung daemon."""
        if self.watchdog_s is None or self.socket_path is None:
            return wanted_s
        return min(wanted_s, self.watchdog_s / 2)

    def watchdog_due(self, now_s: float | None = None) -> bool:
        """True when half the watchdog interval has passed since the last ping."""
        if self.watchdog_s is None or self.socket_path is None:
            return False
        now = time.monotonic() if now_s is None else now_s
        return now - self._last_watchdog >= self.watchdog_s / 2

    def watchdog(self, now_s: float | None = None) -> bool:
        """WATCHDOG=1 if the watchdog is enabled; call it from the main loop every tick."""
        if self.watchdog_s is None or self.socket_path is None:
            return False
        self._last_watchdog = time.monotonic() if now_s is None else now_s
        return self.notify(WATCHDOG=1)
