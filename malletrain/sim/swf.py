"""Idle nodes from a supercomputer job log: replay SWF jobs through FCFS + EASY backfill.

Recorded start times cannot be trusted for idleness (RICC's overlap beyond the
machine's size) and carry no plan, so the regular workload is replayed on the
machine's node count: first come first served, and EASY backfill (a later job may
start now if it fits and does not delay the queue head's reservation). Jobs run for
their recorded run time; the scheduler only knows their wall-time limits, as a real
one would (the request, or the run time where a job ran past it: ``SwfJob.limit_s``).

At every change of the idle set the replay also emits the backfill *plan*: the
planned start of the first ``plan_depth`` pending jobs on concrete nodes (each
planned in queue order, by wall-time limits, onto the nodes it will take when it
starts). That is what ``squeue --start`` gives the daemon, and it is what the shared
scavenger turns into per-node idle windows. Predictions are often too late, as real
ones are: jobs end before their wall time.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from malletrain.sim.trace import IdleTrace, PlannedStart, TraceEvent, input_error, read_text

log = logging.getLogger(__name__)

_FIELDS = (
    "job_id",
    "submit_time",
    "wait_time",
    "run_time",
    "allocated_procs",
    "avg_cpu_time",
    "used_memory",
    "requested_procs",
    "requested_time",
)


@dataclass(frozen=True)
class SwfJob:
    job_id: int
    submit_s: float
    run_s: float
    nodes: int
    #: The user's wall-time request, as the log records it.
    requested_s: float

    @property
    def limit_s(self) -> float:
        """The wall-time limit the scheduler plans with: the request, or the run time where
        the log has the job running longer.

        A scheduler ends a job at its limit, so a job that ran hours past its request had a
        longer one (extended by an operator: Theta 2022 has 1,024-node jobs 21-26 h over)
        that the log does not record. Planned with the request, such a job "ends now" for
        hours: the queue head's reservation is always now, nothing is backfilled around it
        and every plan on its nodes is stale (idle nodes with a start in the past), which a
        real scheduler, knowing the extended limit, would not show.
        """
        return max(self.requested_s, self.run_s)


def read_swf(
    path: str | Path, machine_nodes: int, procs_per_node: int = 1, text: str | None = None
) -> list[SwfJob]:
    """Parse SWF job lines (field 5 = processors, or field 8 when 5 is unknown).

    ``procs_per_node`` > 1 turns processor counts into whole nodes (RICC: 8 cores per
    node). Jobs with no run time or no size are skipped; so are jobs larger than the
    machine (counted in the log). Submit times become seconds from the first submit.
    """
    name = str(path)
    if text is None:
        text = read_text(path)
    jobs: list[SwfJob] = []
    skipped = 0
    too_big = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        cells = line.split()
        if len(cells) < len(_FIELDS):
            raise input_error(
                name, lineno, _FIELDS[len(cells)], f"expected 18 SWF fields, got {len(cells)}"
            )
        vals: list[float] = []
        for field, cell in zip(_FIELDS, cells, strict=False):
            try:
                v = float(cell)
            except ValueError:
                raise input_error(name, lineno, field, f"not a number: {cell!r}") from None
            if not math.isfinite(v):
                raise input_error(name, lineno, field, f"not a finite number: {cell!r}")
            vals.append(v)
        job_id, submit, _wait, run, alloc, _cpu, _mem, req_procs, req_time = vals
        if submit < 0:
            raise input_error(name, lineno, "submit_time", f"negative time {submit:g}")
        procs = alloc if alloc > 0 else req_procs
        if run <= 0 or procs <= 0:
            skipped += 1
            continue
        nodes = math.ceil(procs / procs_per_node)
        if nodes > machine_nodes:
            too_big += 1
            continue
        requested = req_time if req_time > 0 else run
        jobs.append(SwfJob(int(job_id), submit, run, nodes, requested))
    if not jobs:
        raise input_error(name, None, "jobs", "no usable job lines")
    if skipped or too_big:
        log.info(
            "%s: skipped %d jobs without run time or size, %d larger than %d nodes",
            name,
            skipped,
            too_big,
            machine_nodes,
        )
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    t0 = jobs[0].submit_s
    return [SwfJob(j.job_id, j.submit_s - t0, j.run_s, j.nodes, j.requested_s) for j in jobs]


@dataclass(frozen=True)
class _Running:
    job: SwfJob
    start_s: float
    nodes: np.ndarray

    @property
    def expected_end_s(self) -> float:
        return self.start_s + self.job.limit_s


class EasyBackfillReplay:
    """FCFS + EASY backfill over ``machine_nodes`` identical nodes, event by event."""

    def __init__(self, jobs: list[SwfJob], machine_nodes: int, plan_depth: int = 100) -> None:
        self.jobs = jobs
        self.n = machine_nodes
        self.plan_depth = plan_depth
        self.free = np.ones(machine_nodes, dtype=bool)
        self.free_since = np.zeros(machine_nodes)
        self.queue: deque[SwfJob] = deque()
        self.running: dict[int, _Running] = {}
        #: (job_id, start_s) of every started job, for tests and the log.
        self.started: list[tuple[int, float]] = []

    def _start(self, job: SwfJob, now: float) -> None:
        nodes = np.flatnonzero(self.free)[: job.nodes]
        self.free[nodes] = False
        self.running[job.job_id] = _Running(job, now, nodes)
        self.started.append((job.job_id, now))

    def _schedule(self, now: float) -> None:
        free_count = int(self.free.sum())
        while self.queue and self.queue[0].nodes <= free_count:
            job = self.queue.popleft()
            self._start(job, now)
            free_count -= job.nodes
        if not self.queue:
            return
        head = self.queue[0]
        # The head's reservation ("shadow time") from the running jobs' requested ends.
        ends = sorted((max(r.expected_end_s, now), len(r.nodes)) for r in self.running.values())
        avail = free_count
        shadow = math.inf
        extra = 0
        for end, count in ends:
            avail += count
            if avail >= head.nodes:
                shadow, extra = end, avail - head.nodes
                break
        for job in list(self.queue)[1:]:
            if free_count == 0:
                break
            if job.nodes > free_count:
                continue
            ends_before = now + job.limit_s <= shadow
            if ends_before or job.nodes <= extra:
                self.queue.remove(job)
                self._start(job, now)
                free_count -= job.nodes
                if not ends_before:
                    extra -= job.nodes

    def plan(self, now: float) -> tuple[PlannedStart, ...]:
        """Planned starts of the first ``plan_depth`` pending jobs, on idle nodes only."""
        avail = np.full(self.n, now)
        for r in self.running.values():
            avail[r.nodes] = max(r.expected_end_s, now)
        out: list[PlannedStart] = []
        for job in list(self.queue)[: self.plan_depth]:
            k = job.nodes
            # The start: when the k-th node is free. The nodes: the k lowest-numbered of those
            # free by then, as the job will take them (_start), not the k that free earliest:
            # a plan that names long-idle nodes the job will not take ends their windows for
            # nothing once its start has passed.
            start = float(np.partition(avail, k - 1)[k - 1])
            idx = np.flatnonzero(avail <= start)[:k]
            avail[idx] = start + job.limit_s
            on_idle = idx[self.free[idx]]
            if len(on_idle):
                out.append(PlannedStart(job.job_id, start, tuple(int(i) for i in on_idle)))
        return tuple(out)

    def run(self, start_s: float = 0.0, until_s: float = math.inf) -> Iterator[TraceEvent]:
        """Replay from time 0; emit idle-set changes (with the plan) from ``start_s`` on."""
        heap: list[tuple[float, int, int]] = []  # (time, 0=end/1=submit, job index or id)
        for i, job in enumerate(self.jobs):
            heap.append((job.submit_s, 1, i))
        heapq.heapify(heap)
        emitted_first = False
        prev_free = self.free.copy()
        while heap:
            now = heap[0][0]
            if now > until_s:
                break
            if not emitted_first and now > start_s:
                # The state at start_s (reached earlier) is the first event.
                emitted_first = True
                yield self._initial(start_s)
                prev_free = self.free.copy()
            while heap and heap[0][0] == now:
                _, kind, ref = heapq.heappop(heap)
                if kind == 0:
                    r = self.running.pop(ref)
                    self.free[r.nodes] = True
                    self.free_since[r.nodes] = now
                else:
                    self.queue.append(self.jobs[ref])
            before = set(self.running)
            self._schedule(now)
            for job_id in set(self.running) - before:
                r = self.running[job_id]
                heapq.heappush(heap, (now + r.job.run_s, 0, job_id))
            if now < start_s:
                continue
            if not emitted_first:
                emitted_first = True
                yield self._initial(now)
                prev_free = self.free.copy()
                continue
            changed = prev_free != self.free
            if changed.any():
                idle = np.flatnonzero(changed & self.free)
                busy = np.flatnonzero(changed & prev_free)
                yield TraceEvent(
                    float(now),
                    tuple(int(i) for i in idle),
                    tuple(int(i) for i in busy),
                    self.plan(now),
                )
                prev_free = self.free.copy()
        if not emitted_first and start_s <= until_s:
            yield self._initial(start_s)

    def _initial(self, t: float) -> TraceEvent:
        idx = np.flatnonzero(self.free)
        since = tuple(float(x) for x in self.free_since[idx])
        return TraceEvent(float(t), tuple(int(i) for i in idx), (), self.plan(t), since)


@dataclass(frozen=True)
class SwfTrace(IdleTrace):
    """An :class:`IdleTrace` produced lazily by replaying an SWF log."""

    jobs: tuple[SwfJob, ...] = ()
    machine_nodes: int = 0
    plan_depth: int = 100

    def events(self) -> Iterator[TraceEvent]:
        replay = EasyBackfillReplay(list(self.jobs), self.machine_nodes, self.plan_depth)
        return replay.run(self.start_s, self.end_s)


def swf_trace(
    path: str | Path,
    machine_nodes: int,
    start_s: float = 0.0,
    until_s: float | None = None,
    procs_per_node: int = 1,
    plan_depth: int = 100,
    prefix: str = "n",
) -> SwfTrace:
    """The idle-node trace of an SWF log replayed on ``machine_nodes`` nodes.

    ``start_s``/``until_s`` cut a slice (trace seconds from the first submit); the
    replay still starts at time 0 so the machine is in its real state at ``start_s``.
    """
    if machine_nodes <= 0:
        raise input_error(path, None, "swf-nodes", f"must be positive, got {machine_nodes}")
    jobs = read_swf(path, machine_nodes, procs_per_node)
    last = max(j.submit_s for j in jobs)
    end = last if until_s is None else until_s
    width = len(str(machine_nodes - 1))
    names = tuple(f"{prefix}{i:0{width}d}" for i in range(machine_nodes))
    return SwfTrace(
        source=str(path),
        node_names=names,
        start_s=start_s,
        end_s=end,
        jobs=tuple(jobs),
        machine_nodes=machine_nodes,
        plan_depth=plan_depth,
    )
