"""Hand-built scenes for the tick's pure steps: nodes, slot jobs, job records, a World."""

from __future__ import annotations

from malletrain.core.cluster import ClusterSnapshot, Job, Node, NodeState
from malletrain.core.lifecycle import JobPhase, Lifecycle, advance
from malletrain.daemon.jobs.slots import slot_tag
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.tick import DecideSettings, World

NOW = 10_000.0
PARTS = ("batch", "scavenger")


def node(name, state=NodeState.IDLE):
    return Node(name=name, state=state, partitions=PARTS, cpus=2)


def slot_job(sid, job_id, k, state, reason="", nodes=(), end=None):
    return Job(job_id=sid, name=f"mt.{job_id}.s{k}", user="alice", partition="scavenger",
               state=state, state_reason=reason, node_count=1, nodes=tuple(nodes),
               comment=slot_tag(job_id, k), end_time=end, start_time=NOW - 100)


def record(job_id="m1", state=JobPhase.QUEUED, max_nodes=2, seq=1):
    lc = Lifecycle.new(NOW - 500)
    path = {JobPhase.QUEUED: [JobPhase.QUEUED],
            JobPhase.STARTING: [JobPhase.QUEUED, JobPhase.STARTING],
            JobPhase.RUNNING: [JobPhase.QUEUED, JobPhase.STARTING, JobPhase.RUNNING],
            JobPhase.COMPLETING: [JobPhase.QUEUED, JobPhase.STARTING, JobPhase.RUNNING,
                                  JobPhase.COMPLETING]}[state]
    for i, to in enumerate(path):
        lc = advance(lc, to, NOW - 400 + i, "test")
    spec = JobSpec(script="/x/train.py", min_nodes=1, max_nodes=max_nodes)
    return JobRecord(job_id, seq, 1000, "alice", spec, lc, NOW - 500)


def world(nodes, jobs, slots, records, coord=None, **settings):
    snap = ClusterSnapshot(taken_at=NOW, nodes=tuple(nodes), jobs=tuple(jobs))
    return World(now_s=NOW, snapshot=snap, jobs=tuple(records),
                 slots={r.job_id: tuple(s for s in slots if s.job_id == r.job_id)
                        for r in records},
                 coord=coord or {}, models={}, settings=DecideSettings(**settings))


def kinds(plan, cls):
    return [a for a in plan.actions if isinstance(a, cls)]
