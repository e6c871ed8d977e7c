"""Prometheus metrics of the daemon.

Two kinds of metrics, two mechanisms (the client_python pattern for exporters):

* **State** (idle nodes, each job's nodes, samples/s ...) is whatever the daemon saw at
  its last tick. The daemon publishes one immutable :class:`MetricsSnapshot` per tick
  and a custom collector turns the latest one into gauges *at scrape time*. A job that
  ends simply disappears from the next snapshot, so no label set is ever left stale.
* **Events** (decision time, tick duration, yield latency, preemptions, Slurm call
  errors) are observed as they happen through the small typed API of :class:`Metrics`
  into histograms and counters.

Library code never touches prometheus_client's global default registry: the registry
is passed in, so tests (and two daemons in one process) stay independent.

Names follow Prometheus conventions: ``malletrain_`` prefix, base units in the name
(``_seconds``), ``_total`` for counters. The per-job label is ``job_id``, not ``job``:
Prometheus attaches its own ``job`` label (the scrape job) to every series and would
rename ours to ``exported_job``.

Usage (daemon)::

    from prometheus_client import CollectorRegistry
    from malletrain.ops.metrics import JobStatus, Metrics, MetricsSnapshot, serve

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server = serve(settings.metrics.address, registry)   # http://HOST:PORT/metrics
    ...
    # each tick:
    t0 = time.monotonic()
    plan = policy.decide(inp)
    metrics.observe_decision(time.monotonic() - t0)
    metrics.publish(MetricsSnapshot(
        time_s=time.time(), total_nodes=8, idle_nodes=3, scavenged_nodes=4,
        predicted_idle_node_seconds=1200.0,
        jobs=(JobStatus(job_id="m1", user="alice", state="running", nodes=4,
                        samples_per_s=812.5, samples_total=10_000, rescales_up=2,
                        rescales_down=1),),
    ))
    metrics.observe_tick(time.monotonic() - tick_started)
    # when Slurm preempts a slot and the node is free again:
    metrics.count_preemption()
    metrics.observe_yield(seconds_from_slurm_wanting_the_node_to_release)
    # around every Slurm command (or: with metrics.slurm_call("observe"): ...):
    metrics.observe_slurm_call("squeue", seconds, ok=False)
    # each request on the submit channel:
    metrics.observe_request("attach", seconds)
    ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from malletrain.ops.metrics_http import MetricsServer as MetricsServer
from malletrain.ops.metrics_http import serve as serve

log = logging.getLogger(__name__)

PREFIX = "malletrain"

#: Seconds from Slurm wanting a node back to the slot released. Slurm's GraceTime is a
#: few seconds to minutes, so the buckets cover 50 ms to 2 min.
YIELD_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
#: Allocation decisions should take milliseconds (target < 50 ms at 5,000 nodes).
DECISION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
#: One tick = Slurm queries + decision + actions.
TICK_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: One Slurm CLI call (sinfo/squeue take ~10 ms on a small cluster).
SLURM_CALL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: users' requests on the submit channel (the daemon's own time, from request to answer)
REQUEST_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)
#: the request kinds with a series of their own (anything else is "other")
REQUEST_OPS = frozenset({"submit", "attach", "abort", "cancel", "jobs"})


@dataclass(frozen=True)
class JobStatus:
    """One malleable job as the daemon saw it at the last tick."""

    job_id: str
    user: str
    #: lifecycle state name (e.g. "queued", "running", "evicted"); free text for the gauge label.
    state: str
    nodes: int
    samples_per_s: float = 0.0
    #: samples processed since the job was submitted (from its progress reports).
    samples_total: int = 0
    rescales_up: int = 0
    rescales_down: int = 0


#: label values of the bad-records counter (bounded: a label per kind, never per job)
_RECORD_KINDS = frozenset({"progress report", "membership", "finish record", "event"})


@dataclass(frozen=True)
class MetricsSnapshot:
    """What the daemon knows at the end of one tick; the collector reads the latest one.

    Node counts are over the nodes of the configured partitions:
    ``idle_nodes`` are idle in Slurm (no job at all), ``scavenged_nodes`` are held by
    malletrain's slot jobs, so ``idle_nodes + scavenged_nodes`` are the holes malletrain
    could use and ``scavenged / (idle + scavenged)`` is how much of them it uses.
    """

    #: when the snapshot was taken (Unix time, seconds).
    time_s: float
    total_nodes: int
    idle_nodes: int
    scavenged_nodes: int
    #: sum over idle and scavenged nodes of the predicted idle window (seconds); a node
    #: with no planned job counts with the daemon's horizon (slurm.max_slot_time_s).
    predicted_idle_node_seconds: float
    jobs: tuple[JobStatus, ...] = ()
    #: did the last Slurm query succeed? (False: the numbers above are the last good ones.)
    slurm_up: bool = True


class SnapshotCollector(Collector):
    """Builds the gauge families from the latest published snapshot at each scrape: the
    cluster's (``part="cluster"``) or the per-job ones (``part="jobs"``, reading the
    cluster collector's snapshot: served only to the operator where jobs are private,
    :mod:`.metrics_http`)."""

    def __init__(self, part: str = "cluster", source: SnapshotCollector | None = None) -> None:
        self._snapshot: MetricsSnapshot | None = None
        self._part = part
        self._source = source

    def set(self, snapshot: MetricsSnapshot) -> None:
        # One reference assignment: a scrape sees the old or the new snapshot, never a mix.
        self._snapshot = snapshot

    @property
    def snapshot(self) -> MetricsSnapshot | None:
        return self._source.snapshot if self._source is not None else self._snapshot

    def describe(self) -> Iterable[Metric]:
        # Returning the (empty) families lets the registry check for name clashes at
        # registration without calling collect() on a snapshot that does not exist yet.
        return list(self._of(None))

    def collect(self) -> Iterable[Metric]:
        return list(self._of(self.snapshot))

    def _of(self, s: MetricsSnapshot | None) -> Iterator[Metric]:
        if self._part in ("cluster", "all"):
            yield from self._families(s)
        if self._part in ("jobs", "all"):
            yield from self._job_families(s)

    @staticmethod
    def _families(s: MetricsSnapshot | None) -> Iterator[Metric]:
        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc)
            if value is not None:
                g.add_metric([], value)
            return g

        yield gauge("last_tick_timestamp_seconds",
                    "Unix time of the daemon's last completed tick (alert if it gets old).",
                    s.time_s if s else None)
        yield gauge("slurm_up", "1 if the last Slurm query succeeded, else 0.",
                    (1.0 if s.slurm_up else 0.0) if s else None)
        yield gauge("cluster_nodes", "Nodes in the partitions malletrain watches.",
                    s.total_nodes if s else None)
        yield gauge("idle_nodes", "Nodes idle in Slurm (no job at all) at the last tick.",
                    s.idle_nodes if s else None)
        yield gauge("scavenged_nodes", "Nodes held by malletrain slot jobs at the last tick.",
                    s.scavenged_nodes if s else None)
        yield gauge("predicted_idle_node_seconds",
                    "Sum of the predicted idle windows of idle and scavenged nodes, seconds.",
                    s.predicted_idle_node_seconds if s else None)

        jobs = s.jobs if s else ()
        by_state = GaugeMetricFamily(f"{PREFIX}_jobs", "Malleable jobs by lifecycle state.",
                                     labels=["state"])
        counts: dict[str, int] = {}
        for j in jobs:
            counts[j.state] = counts.get(j.state, 0) + 1
        for state, n in sorted(counts.items()):
            by_state.add_metric([state], n)
        yield by_state

    @staticmethod
    def _job_families(s: MetricsSnapshot | None) -> Iterator[Metric]:
        jobs = s.jobs if s else ()
        labels = ["job_id", "user"]
        nodes = GaugeMetricFamily(f"{PREFIX}_job_nodes", "Nodes a malleable job holds.",
                                  labels=labels)
        rate = GaugeMetricFamily(f"{PREFIX}_job_samples_per_second",
                                 "A job's training throughput (whole job), samples/s.",
                                 labels=labels)
        samples = CounterMetricFamily(f"{PREFIX}_job_samples",
                                      "Samples a job has processed since submission.",
                                      labels=labels)
        rescales = CounterMetricFamily(f"{PREFIX}_job_rescales",
                                       "Times a job changed size, by direction (up/down).",
                                       labels=[*labels, "direction"])
        for j in jobs:
            key = [j.job_id, j.user]
            nodes.add_metric(key, j.nodes)
            rate.add_metric(key, j.samples_per_s)
            samples.add_metric(key, j.samples_total)
            rescales.add_metric([*key, "up"], j.rescales_up)
            rescales.add_metric([*key, "down"], j.rescales_down)
        yield from (nodes, rate, samples, rescales)


class PhaseClock:
    """Laps of one tick, each observed under its phase (``Metrics.tick_phases``); with no
    summary (a daemon without metrics) the laps go nowhere."""

    def __init__(self, summary: Summary | None) -> None:
        self._summary = summary
        self._t = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        if self._summary is not None:
            self._summary.labels(phase=phase).observe(now - self._t)
        self._t = now


class Metrics:
    """The daemon's metrics, registered on ``registry``. See the module docstring."""

    def __init__(self, registry: CollectorRegistry,
                 jobs_registry: CollectorRegistry | None = None) -> None:
        """``jobs_registry``: where the per-job series go (the daemon: a registry of their
        own, served to the operator only, :func:`.metrics_http.serve`); None: with the rest."""
        self.registry = registry
        self._collector = SnapshotCollector("cluster" if jobs_registry else "all")
        registry.register(self._collector)
        self._job_collector = SnapshotCollector("jobs", source=self._collector)
        if jobs_registry is not None:
            jobs_registry.register(self._job_collector)
        p = PREFIX
        self.decision_seconds = Histogram(
            f"{p}_decision_duration_seconds", "Time of one allocation decision.",
            buckets=DECISION_BUCKETS_S, registry=registry)
        self.tick_seconds = Histogram(
            f"{p}_tick_duration_seconds", "Time of one observe-decide-act tick.",
            buckets=TICK_BUCKETS_S, registry=registry)
        self.tick_phase_seconds = Summary(
            f"{p}_tick_phase_seconds", "Time of each phase of a tick: slurm (the snapshot), "
            "observe (store, coordinator), decide, act (queue the actions), publish.",
            ["phase"], registry=registry)
        self.yield_seconds = Histogram(
            f"{p}_yield_latency_seconds",
            "Seconds from Slurm wanting a scavenged node back to malletrain's slot released.",
            buckets=YIELD_BUCKETS_S, registry=registry)
        self.preemptions = Counter(
            f"{p}_preemptions", "Scavenger slots preempted by Slurm for regular work.",
            registry=registry)
        self.slurm_calls = Counter(
            f"{p}_slurm_calls", "Slurm commands run, by command.", ["call"], registry=registry)
        self.slurm_call_errors = Counter(
            f"{p}_slurm_call_errors", "Slurm commands that failed or timed out, by command.",
            ["call"], registry=registry)
        self.slurm_call_seconds = Histogram(
            f"{p}_slurm_call_duration_seconds", "Duration of Slurm commands, by command.",
            ["call"], buckets=SLURM_CALL_BUCKETS_S, registry=registry)
        self.bad_records = Counter(
            f"{p}_bad_records", "Records from jobs' workers refused for failing their schema, "
            "by kind (the job's id is in the log).", ["record"], registry=registry)
        self.request_seconds = Histogram(
            f"{p}_request_duration_seconds", "Time the daemon took to answer a user's "
            "request on the submit channel, by request.", ["op"],
            buckets=REQUEST_BUCKETS_S, registry=registry)
        self.config_reloads = Counter(
            f"{p}_config_reloads", "SIGHUP config reloads, by result (ok/rejected).",
            ["result"], registry=registry)
        for result in ("ok", "rejected"):
            self.config_reloads.labels(result=result)  # export 0 before the first reload
        self.submit_notice_usable = Gauge(
            f"{p}_submit_notice_usable", "1 while slurm.submit_notice can be used, 0 while "
            "the arrival probe polls instead (the reason is in the log).", ["path"],
            registry=registry)  # a series only where a notice is configured

    # -- state ------------------------------------------------------------------------
    def publish(self, snapshot: MetricsSnapshot) -> None:
        """Make ``snapshot`` what the next scrape reports."""
        self._collector.set(snapshot)

    @property
    def snapshot(self) -> MetricsSnapshot | None:
        return self._collector.snapshot

    # -- events -----------------------------------------------------------------------
    def observe_decision(self, seconds: float) -> None:
        self.decision_seconds.observe(seconds)

    def observe_tick(self, seconds: float) -> None:
        self.tick_seconds.observe(seconds)

    def tick_phases(self) -> PhaseClock:
        """A clock for one tick: ``lap(phase)`` records the time since the previous lap."""
        return PhaseClock(self.tick_phase_seconds)

    def observe_yield(self, seconds: float) -> None:
        self.yield_seconds.observe(seconds)

    def count_bad_record(self, what: str) -> None:
        kind = what if what in _RECORD_KINDS else "other"
        self.bad_records.labels(record=kind).inc()

    def count_preemption(self, n: int = 1) -> None:
        self.preemptions.inc(n)

    def observe_slurm_call(self, call: str, seconds: float, ok: bool = True) -> None:
        """One Slurm command (``call`` = its name, e.g. "squeue"; keep the set small)."""
        self.slurm_calls.labels(call=call).inc()
        self.slurm_call_seconds.labels(call=call).observe(seconds)
        if not ok:
            self.slurm_call_errors.labels(call=call).inc()

    @contextlib.contextmanager
    def slurm_call(self, call: str) -> Iterator[None]:
        """Time a block of Slurm work as one call; an exception counts as an error (re-raised).

        ``with metrics.slurm_call("observe"): snap = cache.refresh()``
        """
        t0 = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.observe_slurm_call(call, time.monotonic() - t0, ok=ok)

    def observe_request(self, op: object, seconds: float) -> None:
        """One request answered (``op`` as the user sent it: unknown ones count as other)."""
        label = op if isinstance(op, str) and op in REQUEST_OPS else "other"
        self.request_seconds.labels(op=label).observe(seconds)

    def count_reload(self, ok: bool) -> None:
        self.config_reloads.labels(result="ok" if ok else "rejected").inc()

    # -- introspection ------------------------------------------------------------------
    def sample_names(self) -> set[str]:
        """Every series name these metrics can expose (to check dashboards and alerts)."""
        sources: list[SnapshotCollector | Counter | Gauge | Histogram | Summary] = [
            self._collector, self._job_collector, self.decision_seconds, self.tick_seconds,
            self.tick_phase_seconds, self.yield_seconds,
            self.preemptions, self.slurm_calls, self.slurm_call_errors,
            self.slurm_call_seconds, self.request_seconds, self.config_reloads,
            self.submit_notice_usable,
        ]
        names: set[str] = set()
        for source in sources:
            for family in source.describe():
                # prometheus_client adds a _created series to its own counters/histograms
                created = (set() if isinstance(source, SnapshotCollector)
                           else {f"{family.name}_created"})
                if family.type == "counter":
                    names |= {f"{family.name}_total"} | created
                elif family.type == "histogram":
                    names |= {f"{family.name}_{x}" for x in ("bucket", "count", "sum")} | created
                elif family.type == "summary":
                    names |= {f"{family.name}_{x}" for x in ("count", "sum")} | created
                else:
                    names.add(family.name)
        return names
