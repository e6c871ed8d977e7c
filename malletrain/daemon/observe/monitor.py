"""The Job Monitor: per job, what the coordinator says, fed to the Profiling Advisor.

Each tick it reads every active job's membership, live registrations, departures, newest
progress report and finish record from the coordinator (a :class:`CoordView`), writes the
progress to the store, and teaches the advisor the job's throughput at its current size.
The advisor's models are then handed to the tick's pure decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from malletrain.core.allocation.hetero import TypedProgress, TypeSpeeds, typed_models
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import ThroughputModel
from malletrain.core.profiling.profiler import ProfilingAdvisor
from malletrain.daemon.jobs.store import JobRecord, Store
from malletrain.daemon.tick import CoordView, JobModel, Registration
from malletrain.elastic.coordinator.batchread import JobRead
from malletrain.elastic.protocol.records import RecordError

log = logging.getLogger(__name__)


class JobMonitor:
    """Reads the coordinator per job; one job's bad record never reaches another job.

    Everything a job's workers write is untrusted (the records are decoded strictly,
    :mod:`malletrain.elastic.protocol.records`). A record that fails its schema is refused: the job
    keeps its last good view (so it is neither evicted nor finished by junk), the refusal
    is logged with the job's id, counted (``on_bad_record(job_id, what)``, a metric in the
    daemon) and shown as the job's message; every other job is read as usual.
    """

    def __init__(self, advisor: ProfilingAdvisor, store: Store,
                 on_bad_record: Callable[[str, str], None] | None = None) -> None:
        self.advisor = advisor
        self.store = store
        self._on_bad = on_bad_record
        #: job -> (time, samples) of the last progress report fed to the advisor
        self._last_progress: dict[str, tuple[float, int]] = {}
        #: job -> its last view read without a refused record
        self._last_good: dict[str, CoordView] = {}
        #: job -> bad event records already reported (the coordinator keeps skipping them)
        self._bad_events: dict[str, int] = {}
        #: job -> the refusal last reported: junk that stays in the store is reported once,
        #: not at every tick (no log, metric or store write per tick for one bad write)
        self._reported: dict[str, str] = {}
        #: on a cluster of several node types, each job is also profiled per type
        #: (``<job>@<type>``, pooled per ``<kind>@<type>``; core.hetero)
        self.progress = TypedProgress()
        self.speeds = TypeSpeeds()
        self.typed_kinds: set[str] = set()
        #: job -> (typed key, time, nodes) of its last report on a single type
        self._last_typed: dict[str, tuple[str, float, int]] = {}
        #: job -> the progress fields the last :meth:`observe` wrote to the store
        self.written: dict[str, dict[str, Any]] = {}
        #: job -> how many sizes its profile has measured, as of the last :meth:`models`
        self.measured_points: dict[str, int] = {}
        #: node -> leaf switch, as of the last :meth:`observe`
        self._switches: Mapping[str, str] = {}

    def observe(self, coordinator: Any, jobs: list[JobRecord],
                node_types: Mapping[str, str] | None = None,
                node_switches: Mapping[str, str] | None = None) -> dict[str, CoordView]:
        """Every active job's view, read at once (:meth:`Coordinator.read_jobs`);
        ``node_types`` (node -> type, where the cluster has types) for per-type profiles,
        ``node_switches`` (node -> leaf switch) to tell spread groups' step times apart."""
        self.written = {}
        self._switches = node_switches or {}
        active = [j for j in jobs if j.state is not JobPhase.SUBMITTING and not j.state.terminal]
        if not active:
            return {}
        try:
            reads = coordinator.read_jobs([j.job_id for j in active])
        except Exception as exc:  # the store may be restarting: keep the last good views
            log.warning("coordinator read failed: %s", exc)
            return {j.job_id: self._last_good[j.job_id] for j in active
                    if j.job_id in self._last_good}
        out: dict[str, CoordView] = {}
        progress: dict[str, dict[str, Any]] = {}
        for job in active:
            jid = job.job_id
            read = reads.get(jid)
            if isinstance(read, RecordError):
                self._refused(jid, read)
                if jid in self._last_good:
                    out[jid] = self._last_good[jid]
                continue
            if read is None:
                continue
            self._count_skipped_events(jid, read.bad_records)
            out[jid] = self._view(read)
            self._last_good[jid] = out[jid]
            fields = self._learn(job, out[jid], read.progress, node_types or {})
            if fields:
                progress[jid] = fields
        self.store.update_jobs(progress)  # one transaction, not one per job
        self.written = progress
        return out

    @staticmethod
    def _view(read: JobRead) -> CoordView:
        m, prog, fin, gone = read.membership, read.progress, read.finished, read.departures
        return CoordView(
            epoch=m.epoch if m else 0,
            members=tuple(m.members) if m else (),
            live={k: Registration(v.node, v.registered_at_s) for k, v in read.live.items()},
            departed={d.member_id: d.time_s for d in gone},
            sigtermed=frozenset(d.member_id for d in gone if d.reason == "sigterm"),
            crashed=frozenset(d.member_id for d in gone if d.reason == "crashed"),
            state_lost=frozenset(d.member_id for d in gone if d.reason == "state_lost"),
            failure=next((d.detail for d in reversed(gone)
                          if d.reason == "crashed" and d.detail), ""),
            samples_total=prog.samples_total if prog else None,
            samples_per_s=prog.samples_per_s if prog else 0.0,
            progress_at_s=prog.time_s if prog else None,
            finished_samples=fin.samples_total if fin else None,
        )

    def _refused(self, job_id: str, exc: RecordError) -> None:
        if self._reported.get(job_id) == str(exc):
            return
        self._reported[job_id] = str(exc)
        log.error("job %s: bad record from its workers refused (last good view kept): %s",
                  job_id, exc)
        if self._on_bad is not None:
            self._on_bad(job_id, exc.record)
        self.store.update_job(job_id, message=f"bad record refused: {str(exc)[:200]}")

    def _count_skipped_events(self, job_id: str, skipped: int) -> None:
        """Events the coordinator skipped as malformed, reported once each."""
        new = skipped - self._bad_events.get(job_id, 0)
        if new > 0:
            self._bad_events[job_id] = skipped
            self._refused(job_id, RecordError(f"event: {new} malformed record(s) skipped"))

    def forget(self, job_id: str) -> None:
        for d in (self._last_progress, self._last_good, self._bad_events, self._reported,
                  self._last_typed):
            d.pop(job_id, None)
        for key in self.progress.forget(job_id):
            self.advisor.forget(key)

    def _type_of(self, cv: CoordView, prog: Any, node_types: Mapping[str, str]) -> str | None:
        """The one node type the report's members ran on (None: a mix, or unknown)."""
        kinds = {node_types.get(cv.live[m].node, "") if m in cv.live else ""
                 for m in prog.members}
        return kinds.pop() if len(kinds) == 1 and "" not in kinds else None

    def _spread(self, cv: CoordView, prog: Any) -> bool:
        """Whether the report's members sat on two or more leaf switches."""
        switches = {self._switches.get(cv.live[m].node) for m in prog.members if m in cv.live}
        return len(switches - {None}) > 1

    def _learn_typed(self, job: JobRecord, cv: CoordView, prog: Any, nodes: int,
                     node_types: Mapping[str, str]) -> None:
        kind = self._type_of(cv, prog, node_types)
        typed = self.progress.observe(job.job_id, kind, float(prog.samples_total))
        key = typed[0] if typed is not None else None
        last = self._last_typed.get(job.job_id)
        if last is not None and last[0] != key:
            # it left that type: the time until it comes back is no interval of it
            self.advisor.rescaled(last[0], last[1], last[2], 0)
        if typed is None or kind is None:
            self._last_typed.pop(job.job_id, None)
            return
        pooled = f"{job.spec.kind}@{kind}"
        self.typed_kinds.add(pooled)
        self.advisor.register(typed[0], pooled)
        if last is not None and last[0] != typed[0]:
            self.advisor.rescaled(typed[0], last[1], 0, nodes)
        self.advisor.observe(typed[0], prog.time_s, nodes, typed[1])
        self._last_typed[job.job_id] = (typed[0], prog.time_s, nodes)

    def _learn(self, job: JobRecord, cv: CoordView, prog: Any,
               node_types: Mapping[str, str]) -> dict[str, Any] | None:
        """A new progress report feeds the Profiling Advisor; returns the job's fields for
        the store (None: nothing new)."""
        if prog is None:
            return None
        last = self._last_progress.get(job.job_id)
        if last is not None and last[0] == prog.time_s:
            return None
        self.advisor.register(job.job_id, job.spec.kind)
        nodes = max(1, len(prog.members) or prog.world_size // max(1, job.spec.nproc_per_node))
        # A report without new samples (the group is forming, or a step is slower than the
        # report interval) says nothing about throughput; feeding it would teach the advisor
        # a rate of 0 and make the allocator evict a job that merely started. Hangs are the
        # stalled-job detector's business, not the curve's.
        if last is None or prog.samples_total > last[1]:
            self._last_progress[job.job_id] = (prog.time_s, prog.samples_total)
            self.advisor.observe(job.job_id, prog.time_s, nodes, float(prog.samples_total))
            if node_types:
                self._learn_typed(job, cv, prog, nodes, node_types)
            if prog.sync_time_s is not None and prog.step_time_s > 0:  # native mode only
                self.advisor.step_times(job.job_id, nodes, prog.step_time_s, prog.sync_time_s,
                                        prog.samples_per_s * prog.step_time_s / nodes,
                                        spread=self._spread(cv, prog))
        total = prog.samples_total if cv.finished_samples is None else cv.finished_samples
        return {"samples_total": int(total), "samples_per_s": float(prog.samples_per_s),
                "last_progress_s": float(prog.time_s)}

    def models(self, jobs: list[JobRecord], types: Sequence[str] = ()) -> dict[str, JobModel]:
        """Each job's model; with two or more node ``types``, its throughput per type too."""
        out = {}
        points = {}
        for job in jobs:
            self.advisor.register(job.job_id, job.spec.kind)
            told = self.advisor.answers(job.job_id)
            # (its model says how far the curve is measured: the policy explores beyond it
            # on free nodes only)
            model = told.model
            if model.rate(job.spec.max_nodes) <= 0.0:
                # nothing measured worth the name yet: compete as a linear job, never as
                # "worth nothing" (that would evict it)
                model = ThroughputModel(((1, 1.0),), 1.0, model.measured_max_nodes)
            points[job.job_id] = len(told.measured_sizes)
            out[job.job_id] = JobModel(model, told.scale_up_s, told.scale_down_s, told.start_s,
                                       self.advisor.rate_noise(job.job_id),
                                       self._by_type(job, types) if len(types) > 1 else {},
                                       told.spread_factor)
        self.measured_points = points
        return out

    def _by_type(self, job: JobRecord, types: Sequence[str]) -> dict[str, ThroughputModel]:
        return typed_models(self.advisor, self.speeds, job.job_id, job.spec.kind, types)
