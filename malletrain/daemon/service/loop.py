"""The service's main loop: signals, reload, metrics server, systemd notifications.

Signals: SIGTERM/SIGINT stop the loop after the tick in progress (the Slurm actions in
flight finish and are recorded, for up to half of ``daemon.stop_timeout_s``); SIGHUP
reloads the config between ticks. Between ticks the loop sleeps ``tick_interval_s``
(shorter while nodes are being given back: ``TickPlan.follow_up``; longer while slurmctld
answers slowly: :func:`next_sleep_s`), and wakes early on a submission, a cancellation or a
new pending job at Slurm (the arrival probe, :mod:`malletrain.daemon.observe.arrivals`, paced by
slurmctld's submit notice where it has one). A tick's
actions are applied off the tick (:mod:`malletrain.daemon.act.action_queue`). The cyclic
garbage collector scans only what the last tick made (:mod:`malletrain.ops.heap`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from malletrain.daemon.observe.arrivals import ArrivalProbe, SubmitNotice
from malletrain.daemon.service.daemon import Daemon
from malletrain.daemon.submit.channel import ChannelServer
from malletrain.daemon.tick import TickPlan
from malletrain.errors import ConfigError
from malletrain.ops.heap import BetweenTicks
from malletrain.ops.metrics import Metrics
from malletrain.ops.settings import Settings
from malletrain.slurm.backend import SlurmBackend

log = logging.getLogger(__name__)

#: Seconds to the next tick while nodes are being given back ahead of a regular job
#: (``TickPlan.follow_up``): its backfill plan moves each pass and may name more of our
#: nodes; e2e runs saw a second give-back wait one whole 1 s tick, which the job waited too.
FOLLOW_UP_TICK_S = 0.25
#: When reading Slurm takes longer than ``SLOW_OBSERVE_S``, the loop waits at least
#: ``BACKOFF_FACTOR`` times as long before the next tick: slurmctld is shared by every
#: user of the machine, and a slow answer means it is busy (docs/slurm-backend.md §10).
SLOW_OBSERVE_S = 1.0
BACKOFF_FACTOR = 3.0


def next_sleep_s(interval_s: float, follow_up: bool, observe_s: float) -> float:
    """Seconds to the next tick: the interval, shorter while yielding, longer when the
    last snapshot took over ``SLOW_OBSERVE_S`` (then at most a quarter of the loop's time
    waits on slurmctld)."""
    sleep_s = min(interval_s, FOLLOW_UP_TICK_S) if follow_up else interval_s
    if observe_s > SLOW_OBSERVE_S:
        sleep_s = max(sleep_s, BACKOFF_FACTOR * observe_s)
    return sleep_s


def _tick(daemon: Daemon, heap: BetweenTicks) -> TickPlan | None:
    """One tick (None: it failed, logged; the next starts from a fresh snapshot), then the
    collector's turn (:mod:`malletrain.ops.heap`)."""
    plan, failed = None, False
    try:
        plan = daemon.tick()
    except Exception:
        log.exception("tick failed; the next tick starts from a fresh snapshot")
        failed = True
    heap.after_tick(failed)  # after the except block, which kept the error alive
    return plan


def _serve_metrics(settings: Settings, registry: Any, jobs: Any,
                   jobs_public: Callable[[], bool]) -> Any:
    """The /metrics endpoint; the per-job series only where jobs are public in Slurm or to
    the operator's password (:mod:`malletrain.ops.metrics_http`); None if disabled."""
    from malletrain.ops.metrics import serve

    if not settings.metrics.enabled:
        return None
    return serve(settings.metrics.address, registry, jobs=jobs, jobs_public=jobs_public,
                 password=_metrics_password(settings))


def _metrics_password(settings: Settings) -> bytes | None:
    """The operator's metrics password (``metrics.password_file``); a file others can read is
    a configuration error: the daemon does not start with it."""
    from malletrain.ops.metrics_http import read_password

    path = settings.metrics.password_file
    if path is None:
        return None
    try:
        return read_password(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"metrics.password_file: {exc}") from None


def run_daemon(settings: Settings, config_path: str | None, backend: SlurmBackend,
               *, decide_overrides: Mapping[str, float] | None = None) -> int:
    """The service's main loop (signals, reload, metrics, systemd notifications)."""
    from prometheus_client import CollectorRegistry

    from malletrain.ops.service import ControlSignals, reload_config
    from malletrain.ops.systemd import Notifier

    signals = ControlSignals(stop_deadline_s=settings.daemon.stop_timeout_s)
    signals.install()
    notifier = Notifier.from_environment()
    registry, jobs_registry = CollectorRegistry(), CollectorRegistry()
    metrics = Metrics(registry, jobs_registry)
    jobs_public: list[Callable[[], bool]] = [lambda: False]  # private until Slurm says
    server = _serve_metrics(settings, registry, jobs_registry, lambda: jobs_public[0]())
    daemon = Daemon(settings, backend, metrics=metrics, decide_overrides=decide_overrides,
                    wake=signals.wake, act_in_background=True)
    jobs_public[0] = lambda: not daemon.privacy.get().private_jobs
    channel = ChannelServer(settings.submit.socket_path, daemon.handle).start()
    notice_path = settings.slurm.submit_notice
    notice = SubmitNotice(notice_path) if notice_path is not None else None
    probe = ArrivalProbe(backend.pending_job_ids, signals.wake, settings.slurm.arrival_probe_s,
                         notice).start()
    heap = BetweenTicks()
    heap.after_tick()  # what start-up made (modules, settings, the store's records)
    notifier.ready(f"scavenging through partition {settings.slurm.scavenger_partition}")
    log.info("daemon running (instance %s, coordinator %s, socket %s)", daemon.instance,
             daemon.coordinator.address, settings.submit.socket_path)
    try:
        while not signals.stop_requested:
            if signals.take_reload():
                settings = reload_config(config_path, settings, metrics=metrics,
                                         notifier=notifier)
                daemon.apply_settings(settings)
                probe.interval_s = settings.slurm.arrival_probe_s
            plan = _tick(daemon, heap)
            probe.expect(daemon.seen_job_ids, armed=daemon.holds_nodes)
            if notice is not None:
                metrics.submit_notice_usable.labels(path=str(notice.path)).set(
                    notice.problem is None)
            notifier.watchdog()
            sleep_s = next_sleep_s(settings.allocator.tick_interval_s,
                                   plan is not None and plan.follow_up, daemon.observe_s)
            if sleep_s > settings.allocator.tick_interval_s:
                log.warning("Slurm answered in %.1f s: next tick in %.1f s", daemon.observe_s,
                            sleep_s)
            signals.wait(notifier.max_sleep_s(sleep_s))
    finally:
        notifier.stopping("stopping: the tick in progress has finished")
        log.info("stopping (signal %s)", signals.stop_signal)
        channel.stop()
        probe.stop()
        if server is not None:
            server.stop()
        # the actions in flight finish and are recorded, inside the stop deadline
        daemon.close(timeout_s=settings.daemon.stop_timeout_s / 2)
        heap.close()
        signals.restore()
    return 0

