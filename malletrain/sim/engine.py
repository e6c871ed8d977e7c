"""The replay: malleable jobs on a trace's idle nodes, decided by a core policy.

Semantics follow FreeTrain's replayer so that results compare (issue 4 §3):

1. Trace events are the trace's change times. Between them every running job
   advances at its *true* rate for its node count.
2. At a trace event, nodes that turned busy are taken from the jobs holding them; each
   such job loses ``scale_down_s`` x its rate (before the loss) once for the event.
   A job left below ``min_nodes`` stops and releases the rest.
3. Finished jobs leave; jobs are admitted up to the concurrency limit, fair among users
   (:mod:`malletrain.sim.admission`; one user: in submit order), and an admitted job stays
   admitted until it finishes. ``submit_s`` counts
   from the start of the replay, so one jobs file fits any slice of a trace.
   A job that reaches ``total_samples`` between trace events finishes at that exact
   moment, and a job submitted while there is room is admitted when it arrives: both
   are decision points of their own (as the daemon wakes early on them), with the
   idle set and the backfill plan of the last trace event. An arrival that is not
   admitted changes nothing and is not one.
4. The policy decides on every idle node (free or held) and every admitted job.
   A job that changes size loses ``scale_up_s`` (growing) or ``scale_down_s``
   (shrinking or stopping) x its current rate; one that both gains and loses nodes
   pays both. Starting from zero nodes costs nothing.

Samples are net of losses, so a job's count may dip below zero right after a loss.
The jobs' true curves reach the policy only when its registry entry says
``curves="true"``; ``curves="learned"`` policies get the Profiling Advisor's model,
fed with the progress each job really made, as the daemon feeds it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

import numpy as np

from malletrain.core.model import AllocationInput, MalleableJob, Plan, Policy, ThroughputModel
from malletrain.errors import PermanentError
from malletrain.sim.admission import Admission
from malletrain.sim.curves import CurveProvider
from malletrain.sim.jobs import SimJob
from malletrain.sim.nodetypes import NodeTypes, charge, target_now
from malletrain.sim.result import JobNodes, JobRun, Result, Sample
from malletrain.sim.trace import IdleTrace, PlannedStart, TraceEvent
from malletrain.sim.view import SnapshotView

log = logging.getLogger(__name__)


class PolicyError(PermanentError):
    """The policy returned a plan the cluster cannot carry out (a bug in the policy)."""


ProgressFn = Callable[[float], None]


class Simulator:
    """Replays one trace with one job set under one policy."""

    def __init__(
        self,
        trace: IdleTrace,
        jobs: Iterable[SimJob],
        policy: Policy,
        curves: CurveProvider,
        *,
        max_concurrent_jobs: int = 10,
        until_s: float | None = None,
        progress: ProgressFn | None = None,
        types: NodeTypes | None = None,
    ) -> None:
        self.trace = trace
        self.policy = policy
        self.curves = curves
        self.until_s = trace.end_s if until_s is None else min(until_s, trace.end_s)
        self.progress = progress
        runs = sorted(jobs, key=lambda j: j.submit_s)
        self.types = types
        typed = None if types is None else types.per_node
        if typed is None and any(j.allowed_types is not None for j in runs):
            raise PermanentError("jobs with only per-type curves need a cluster with node "
                                 "types (Simulator(types=...))")
        if typed is not None and len(typed) != len(trace.node_names):
            raise PermanentError(f"{len(typed)} node types for {len(trace.node_names)} nodes")
        self.runs = [JobRun(j, i, node_types=typed) for i, j in enumerate(runs)]
        n = len(trace.node_names)
        self.view = SnapshotView(trace.node_names,
                                 typed if types is not None and not types.hidden else None)
        self._told_types = () if types is None or types.hidden else tuple(sorted(set(typed or ())))
        self.index = {name: i for i, name in enumerate(trace.node_names)}
        self.idle = np.zeros(n, dtype=bool)
        self.idle_since = np.zeros(n)
        self.holder = np.full(n, -1, dtype=np.int64)
        #: Predicted end of each node's current hole (first prediction), NaN if none.
        self.predicted_end = np.full(n, np.nan)
        self.result = Result(
            policy=getattr(policy, "name", type(policy).__name__),
            trace=trace.source,
            start_s=trace.start_s,
            end_s=self.until_s,
        )
        self.result.jobs = self.runs
        self.admission = Admission(self.runs, trace.start_s, max_concurrent_jobs)
        self._active: list[JobRun] = []

    # -- time passing ---------------------------------------------------------------
    def _advance(self, t0: float, t1: float) -> None:
        dt = t1 - t0
        if dt <= 0:
            return
        self.result.idle_node_seconds += int(self.idle.sum()) * dt
        for run in self._active:
            if not run.nodes or run.finished_s is not None:
                continue
            rate = run.rate
            left = run.job.total_samples - run.done
            n = len(run.nodes)
            # (a finish computed by _next_finish lands here up to rounding)
            if rate > 0 and rate * dt >= left * (1.0 - 1e-12):
                took = max(0.0, left / rate)
                run.done = run.job.total_samples
                run.finished_s = t0 + took
                run.node_s += n * took
                self.result.used_node_seconds += n * took
                self.curves.observe(run.job, t0 + took, n, run.done, self._type_of(run))
            else:
                run.done += rate * dt
                run.node_s += n * dt
                self.result.used_node_seconds += n * dt
                self.curves.observe(run.job, t1, n, run.done, self._type_of(run))
            charge(self.result, self.types, run.nodes, (run.finished_s or t1) - t0)

    def _type_of(self, run: JobRun) -> str | None:
        """The type of the job's nodes as the policy's profiles know it (None: untyped)."""
        return None if not self._told_types else run.node_type()

    # -- one event ------------------------------------------------------------------
    def _apply_trace(self, ev: TraceEvent) -> None:
        t = ev.time_s
        if ev.became_idle:
            idx = np.asarray(ev.became_idle, dtype=np.int64)
            self.idle[idx] = True
            self.idle_since[idx] = t if ev.idle_since_s is None else ev.idle_since_s
            self.view.mark_idle(ev.became_idle, self.idle_since[idx].tolist())
            self.predicted_end[idx] = np.nan
        if not ev.became_busy:
            return
        busy = np.asarray(ev.became_busy, dtype=np.int64)
        pred = self.predicted_end[busy]
        known = ~np.isnan(pred)
        self.result.window_errors_s.extend((t - pred[known]).tolist())
        self.predicted_end[busy] = np.nan
        self.idle[busy] = False
        holders = self.holder[busy]
        for slot in np.unique(holders[holders >= 0]):
            run = self.runs[int(slot)]
            lost_nodes = set(busy[holders == slot].tolist())
            keep = [i for i in run.nodes if i not in lost_nodes]  # stays sorted
            if len(keep) < run.job.min_nodes:
                keep = []
            old_n, old_type = len(run.nodes), self._type_of(run)
            if run.finished_s is None:
                loss = run.job.scale_down_s * run.rate
                run.done -= loss
                self.result.samples_lost_preemption += loss
                self.result.preemptions += 1
            self._set_nodes(run, keep, t, "trace")
            if run.finished_s is None:  # a mix that lost one type is on a single type now
                self.curves.rescaled(run.job, t, old_n, len(keep), old_type, self._type_of(run))
        self.holder[busy] = -1

    def _set_nodes(self, run: JobRun, nodes: list[int], t: float, cause: str) -> None:
        if nodes == run.nodes:
            return
        if run.nodes:
            self.holder[np.asarray(run.nodes, dtype=np.int64)] = -1
        if nodes:
            self.holder[np.asarray(nodes, dtype=np.int64)] = run.order
        if len(nodes) != len(run.nodes) or set(nodes) != set(run.nodes):
            run.changed_s = t
            self.result.job_nodes.append(JobNodes(t, run.job.name, len(nodes), cause))
        run.nodes = nodes

    def _retire_and_admit(self, t: float) -> None:
        still: list[JobRun] = []
        for run in self._active:
            if run.finished_s is not None:
                self._set_nodes(run, [], t, "finished")
                self.curves.forget(run.job)
            else:
                still.append(run)
        self._active = still
        for run in self.admission.admit(still, t):
            run.admitted_s = t
            self._active.append(run)

    def _decide(self, t: float, planned: tuple[PlannedStart, ...] | None) -> None:
        idle_idx = np.flatnonzero(self.idle)
        nodes = self.view.idle_nodes(t, idle_idx, planned)
        if planned:
            for node in nodes:
                if node.window_s is not None:
                    i = self.index[node.name]
                    if np.isnan(self.predicted_end[i]):
                        self.predicted_end[i] = t + node.window_s
        names = self.trace.node_names
        told = bool(self._told_types)
        mjobs = []
        for run in self._active:
            model, up_s, down_s = self.curves.model(run.job)
            mjobs.append(
                MalleableJob(
                    job_id=run.job.name,
                    min_nodes=run.job.min_nodes,
                    max_nodes=run.job.max_nodes,
                    nodes=tuple(names[i] for i in run.nodes),
                    throughput=model,
                    scale_up_s=up_s,
                    scale_down_s=down_s,
                    submit_order=run.order,
                    # declared by the user (total_samples), not the curve: every policy may see it
                    remaining_samples=max(0.0, run.job.total_samples - run.done),
                    type_throughput=(self.curves.type_models(run.job, self._told_types)
                                     if told else {}),
                    allowed_types=run.job.allowed_types if told else None,
                    rate_target=target_now(run, t),
                    user=run.job.user,
                )
            )
        queued = self.admission.queued(t)
        prices = {}
        if self.types is not None and told and self.types.objective == "cost":
            prices = dict(self.types.prices)
        inp = AllocationInput(now_s=t, nodes=nodes, jobs=tuple(mjobs), queued_jobs=queued,
                              prices=prices)
        t0 = time.perf_counter()
        plan = self.policy.decide(inp)
        self.result.decision_s.append(time.perf_counter() - t0)
        self._apply_plan(plan, t)

    def _apply_plan(self, plan: Plan, t: float) -> None:
        wanted = self._checked_plan(plan, t)
        # Release first so a node may pass from one job to another in one decision.
        changes = []
        for run in self._active:
            new = wanted.get(run.job.name, [])
            old = run.nodes
            if new == old:
                continue
            grew = bool(set(new) - set(old))
            shrank = bool(set(old) - set(new))
            if old:
                rate = run.rate
                cost_s = (run.job.scale_up_s if grew else 0.0) + (
                    run.job.scale_down_s if shrank else 0.0
                )
                loss = cost_s * rate
                run.done -= loss
                run.lost_rescale += loss
                self.result.samples_lost_rescale += loss
                self.result.rescales += 1
            elif new:
                self.result.starts += 1
                if run.started_s is None:
                    run.started_s = t
            old_type = self._type_of(run)
            changes.append((run, sorted(new), old_type))
        for run, _, _ in changes:
            if run.nodes:
                self.holder[np.asarray(run.nodes, dtype=np.int64)] = -1
        for run, new, old_type in changes:
            if new:
                self.holder[np.asarray(new, dtype=np.int64)] = run.order
            run.changed_s = t
            self.result.job_nodes.append(JobNodes(t, run.job.name, len(new)))
            old_n = len(run.nodes)
            run.nodes = new
            self.curves.rescaled(run.job, t, old_n, len(new), old_type, self._type_of(run))

    def _checked_plan(self, plan: Plan, t: float) -> dict[str, list[int]]:
        """Job -> node indices of ``plan``; a PolicyError for anything a policy may not do."""
        by_name = {run.job.name: run for run in self._active}
        unknown = set(plan.assignments) - set(by_name)
        if unknown:
            raise PolicyError(f"plan at t={t:g} names jobs not offered: {sorted(unknown)}")
        wanted: dict[str, list[int]] = {}
        every: list[int] = []
        for name, node_names in plan.assignments.items():
            run = by_name[name]
            try:
                idx = sorted(self.index[nn] for nn in node_names)
            except KeyError as exc:
                what = f"plan at t={t:g} gives {name} node {exc.args[0]!r}, not idle"
                raise PolicyError(what) from None
            if idx and not run.job.min_nodes <= len(idx) <= run.job.max_nodes:
                raise PolicyError(
                    f"plan at t={t:g} gives {name} {len(idx)} nodes, outside "
                    f"[{run.job.min_nodes}, {run.job.max_nodes}]"
                )
            wanted[name] = idx
            every += idx
        arr = np.asarray(every, dtype=np.int64)
        if len(arr) and not self.idle[arr].all():
            bad = self.trace.node_names[int(arr[~self.idle[arr]][0])]
            raise PolicyError(f"plan at t={t:g} gives node {bad!r}, not idle")
        if len(np.unique(arr)) != len(arr):
            values, counts = np.unique(arr, return_counts=True)
            dup = self.trace.node_names[int(values[counts > 1][0])]
            raise PolicyError(f"plan at t={t:g} gives node {dup!r} to two jobs")
        return wanted

    # -- the loop -------------------------------------------------------------------
    def run(self) -> Result:
        wall0 = time.perf_counter()
        last: TraceEvent | None = None
        upper_rate = max((r.job.best_per_node_rate() for r in self.runs), default=0.0)
        for ev in self.trace.events():
            if ev.time_s > self.until_s:
                break
            if last is not None:
                self._run_until(last, ev.time_s)
            last = ev
            self._apply_trace(ev)
            self._step(ev.time_s, ev.planned)
            self.result.events += 1
            if self.progress is not None:
                self.progress(ev.time_s)
        if last is not None:
            self._run_until(last, self.until_s)
            self._record(self.until_s)
        self.result.samples_total = sum(r.done for r in self.runs)
        self.result.upper_bound_samples = self.result.idle_node_seconds * upper_rate
        self.result.wall_s = time.perf_counter() - wall0
        return self.result

    def _step(self, t: float, planned: tuple[PlannedStart, ...] | None) -> None:
        """One decision point: retire finished jobs, admit arrivals, decide, record."""
        self._retire_and_admit(t)
        self._decide(t, planned)
        self.result.decisions += 1
        self._record(t)

    def _run_until(self, last: TraceEvent, t_end: float) -> None:
        """Advance from ``last`` to ``t_end``, deciding at every finish and admission between."""
        t = last.time_s
        while True:
            t_next = min(self._next_finish(t), self._next_admission(t))
            if t_next >= t_end:
                break
            t_next = max(t_next, math.nextafter(t, math.inf))  # always move on
            self._advance(t, t_next)
            t = t_next
            self._step(t, last.planned)
        self._advance(t, t_end)

    def _next_finish(self, t: float) -> float:
        """When the first running job reaches its total at its current rate (inf: none)."""
        first = math.inf
        for run in self._active:
            if run.nodes and run.finished_s is None:
                rate = run.rate
                if rate > 0:
                    first = min(first, t + max(0.0, run.job.total_samples - run.done) / rate)
        return first

    def _next_admission(self, t: float) -> float:
        """When the next job is submitted that is admitted on arrival (inf: none)."""
        return self.admission.next_admission(
            [r for r in self._active if r.finished_s is None], t)

    def _record(self, t: float) -> None:
        running = [r for r in self._active if r.nodes and r.finished_s is None]
        self.result.timeline.append(
            Sample(
                time_s=t,
                idle_nodes=int(self.idle.sum()),
                used_nodes=sum(len(r.nodes) for r in running),
                running_jobs=len(running),
                samples_total=sum(r.done for r in self.runs),
            )
        )


def empty_model() -> ThroughputModel:
    """What a policy that needs no curves is given: nothing."""
    return ThroughputModel(())


