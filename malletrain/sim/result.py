"""What a replay produced: samples per job over time, node use, and the summary written to disk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from malletrain.sim.jobs import SimJob


@dataclass
class JobRun:
    """Mutable replay state of one job (internal)."""

    job: SimJob
    order: int
    nodes: list[int] = field(default_factory=list)
    done: float = 0.0
    admitted_s: float | None = None
    started_s: float | None = None
    finished_s: float | None = None
    #: Node-seconds it held while running (fair-share measurements: per user)
    node_s: float = 0.0
    #: Samples its size changes cost it (rescale downtime; fairness's cost measurements)
    lost_rescale: float = 0.0
    #: When the job's size last changed (profiling discards warm-up after it).
    changed_s: float = 0.0
    #: The node type of each node of the trace, where it has several (set by the Simulator).
    node_types: Sequence[str] | None = None

    @property
    def rate(self) -> float:
        if not self.nodes:
            return 0.0
        if self.node_types is None or not self.job.type_curves:
            return self.job.true_model.rate(len(self.nodes))
        return self.job.rate_on({self.node_types[i] for i in self.nodes}, len(self.nodes))

    def node_type(self) -> str | None:
        """The type of all its nodes; None when it holds none or several types."""
        if self.node_types is None or not self.nodes:
            return None
        kinds = {self.node_types[i] for i in self.nodes}
        return kinds.pop() if len(kinds) == 1 else None


@dataclass(frozen=True)
class Sample:
    """One timeline row: the state right after the decision at ``time_s``."""

    time_s: float
    idle_nodes: int
    used_nodes: int
    running_jobs: int
    samples_total: float


@dataclass(frozen=True)
class JobNodes:
    """A change of one job's node count (for the timeline and plot)."""

    time_s: float
    job: str
    nodes: int
    #: ``policy`` (a decision), ``trace`` (nodes taken back) or ``finished``.
    cause: str = "policy"


@dataclass
class Result:
    policy: str
    trace: str
    start_s: float
    end_s: float
    samples_total: float = 0.0
    samples_lost_rescale: float = 0.0
    samples_lost_preemption: float = 0.0
    idle_node_seconds: float = 0.0
    used_node_seconds: float = 0.0
    rescales: int = 0
    preemptions: int = 0
    starts: int = 0
    events: int = 0
    #: Decision points: every trace event, and every finish or admission between them.
    decisions: int = 0
    decision_s: list[float] = field(default_factory=list)
    jobs: list[JobRun] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    job_nodes: list[JobNodes] = field(default_factory=list)
    upper_bound_samples: float = 0.0
    wall_s: float = 0.0
    #: Per hole that had a predicted window when first offered: actual end - predicted end.
    window_errors_s: list[float] = field(default_factory=list)
    #: On a cluster of several node types: node-seconds used per type, and their price.
    type_node_seconds: dict[str, float] = field(default_factory=dict)
    cost: float = 0.0

    def _window_stats(self) -> dict[str, object]:
        """How good the scavenger's windows were: the first prediction of each hole vs its end."""
        err = np.array(self.window_errors_s)
        if not len(err):
            return {"window_holes": 0}
        return {
            "window_holes": len(err),
            "window_error_s_p50": float(np.median(err)),
            "window_abs_error_s_p50": float(np.median(np.abs(err))),
            "window_ended_early_share": float(np.mean(err < -60.0)),
            "window_ended_late_share": float(np.mean(err > 60.0)),
        }

    def summary(self) -> dict[str, object]:
        finished = [r for r in self.jobs if r.finished_s is not None]
        # Job submit times count from the start of the replay (a jobs file fits any slice).
        jct = [
            r.finished_s - (self.start_s + r.job.submit_s)
            for r in finished
            if r.finished_s is not None
        ]
        dec_ms = np.array(self.decision_s) * 1000.0 if self.decision_s else np.zeros(1)
        first_submit = self.start_s + min((r.job.submit_s for r in self.jobs), default=0.0)
        makespan = (
            max(r.finished_s for r in finished if r.finished_s is not None) - first_submit
            if finished and len(finished) == len(self.jobs)
            else None
        )
        unit_work = sum(r.done / r.job.unit_rate() for r in self.jobs)
        return {
            "policy": self.policy,
            "trace": self.trace,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "samples_total": self.samples_total,
            "samples_lost_rescale": self.samples_lost_rescale,
            "samples_lost_preemption": self.samples_lost_preemption,
            "one_worker_seconds_total": unit_work,
            "idle_node_seconds": self.idle_node_seconds,
            "used_node_seconds": self.used_node_seconds,
            "idle_used_share": (
                self.used_node_seconds / self.idle_node_seconds if self.idle_node_seconds else 0.0
            ),
            "upper_bound_samples": self.upper_bound_samples,
            "type_node_seconds": dict(sorted(self.type_node_seconds.items())),
            "cost": self.cost,
            "rescales": self.rescales,
            "preemptions": self.preemptions,
            "starts": self.starts,
            "jobs_total": len(self.jobs),
            "jobs_admitted": sum(r.admitted_s is not None for r in self.jobs),
            "jobs_finished": len(finished),
            "mean_jct_s": float(np.mean(jct)) if jct else None,
            "makespan_s": makespan,
            "events": self.events,
            "decisions": self.decisions,
            "decision_ms_p50": float(np.percentile(dec_ms, 50)),
            "decision_ms_p99": float(np.percentile(dec_ms, 99)),
            "decision_ms_max": float(dec_ms.max()),
            "wall_s": self.wall_s,
            **self._window_stats(),
        }
