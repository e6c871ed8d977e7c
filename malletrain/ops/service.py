"""Signals and config reload for a long-running service, the way systemd drives it.

systemd stops a service with SIGTERM and reloads it with ``ExecReload=kill -HUP $MAINPID``.
A signal handler must not run the reload itself (it interrupts the loop at an arbitrary
point, maybe in the middle of a Slurm action), so :class:`ControlSignals` only records the
request and wakes the loop; the loop acts on it **between two ticks**, which is what keeps
state consistent. :func:`reload_config` is that between-ticks step: validate the file again,
keep the running settings if it is invalid (and say why), apply the log level and format,
count the outcome in the metrics and tell systemd.

Usage (daemon)::

    from malletrain.ops.service import ControlSignals, reload_config

    signals = ControlSignals(stop_deadline_s=settings.daemon.stop_timeout_s)
    signals.install()                         # main thread; SIGTERM/SIGINT/SIGHUP
    notifier.ready()
    while not signals.stop_requested:
        if signals.take_reload():
            settings = reload_config(config_path, settings, metrics=metrics, notifier=notifier)
        tick(settings)
        notifier.watchdog()
        signals.wait(notifier.max_sleep_s(settings.allocator.tick_interval_s))
    notifier.stopping()
    signals.restore()

``signals.wake()`` also ends the wait early, e.g. when a user submits a job.

The stop deadline: after SIGTERM the loop finishes its tick and the shutdown path runs; if
that has not ended the process within ``stop_deadline_s`` (a Slurm command hanging up to its
timeout, say), a timer exits the process with status 1 and says so. That is safe because the
daemon records every Slurm action before running it and reconciles unfinished ones at the
next start; it beats being SIGKILLed by systemd at TimeoutStopSec with no word in the log.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

from malletrain.ops.config_file import reload_settings
from malletrain.ops.logs import configure_logging
from malletrain.ops.metrics import Metrics
from malletrain.ops.settings import Settings
from malletrain.ops.systemd import Notifier

log = logging.getLogger(__name__)

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Exit status when the stop deadline forces the exit (a failure: systemd logs it as such).
STOP_DEADLINE_EXIT_CODE = 1


class ControlSignals:
    """Records SIGTERM/SIGINT (stop) and SIGHUP (reload) and wakes the main loop."""

    def __init__(self, stop_deadline_s: float | None = None) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._previous: dict[int, object] = {}
        self._deadline_timer: threading.Timer | None = None
        self.stop_deadline_s = stop_deadline_s
        self.stop_signal: int | None = None

    def install(self) -> None:
        """Install the handlers (Python only allows this in the main thread)."""
        for sig in _HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back; cancels a pending stop deadline (clean exit)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # Only set flags here: no logging, no I/O (a handler can run in the middle of either).
        if signum == signal.SIGHUP:
            self._reload.set()
        else:
            self.stop_signal = signum
            self._stop.set()
            self._arm_deadline()
        self._wake.set()

    def _arm_deadline(self) -> None:
        if self.stop_deadline_s is None or self._deadline_timer is not None:
            return
        timer = threading.Timer(self.stop_deadline_s, self._deadline_passed)
        timer.daemon = True
        self._deadline_timer = timer
        timer.start()

    def _deadline_passed(self) -> None:
        log.error("stop took longer than %.0f s (daemon.stop_timeout_s): exiting now; Slurm "
                  "actions in flight are recorded and reconciled at the next start",
                  self.stop_deadline_s)
        logging.shutdown()  # flush what was logged
        os._exit(STOP_DEADLINE_EXIT_CODE)

    # -- what the loop asks ------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._stop.set()
        self._arm_deadline()
        self._wake.set()

    def take_reload(self) -> bool:
        """True once per SIGHUP (several HUPs before the loop looks count as one)."""
        if self._reload.is_set():
            self._reload.clear()
            return True
        return False

    def wake(self) -> None:
        self._wake.set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; return early (True) on a signal or :meth:`wake`."""
        woken = self._wake.wait(timeout_s)
        self._wake.clear()
        return woken


def reload_config(
    path: str | os.PathLike[str] | None,
    running: Settings,
    *,
    metrics: Metrics | None = None,
    notifier: Notifier | None = None,
    reconfigure_logging: bool = True,
) -> Settings:
    """The SIGHUP step: the settings to run with from now on (``running`` if the file is bad)."""
    if notifier is not None:
        notifier.reloading()
    result = reload_settings(path, running)
    if result.error is not None:
        log.error("config reload rejected, keeping the running config: %s", result.error)
        if notifier is not None:
            notifier.ready("config reload rejected; running with the previous config")
    else:
        new = result.settings
        if reconfigure_logging and new.logging != running.logging:
            configure_logging(new.logging.level, new.logging.format, exclusive=True)
        for field_path in result.needs_restart:
            log.warning("%s changed but takes effect only after a restart", field_path)
        log.info("config reloaded from %s", path,
                 extra={"changed": ",".join(result.changed) or "nothing"})
        if notifier is not None:
            notifier.ready("config reloaded")
    if metrics is not None:
        metrics.count_reload(result.ok)
    return result.settings
