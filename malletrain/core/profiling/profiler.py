"""Job Profiling Advisor: learns each job's throughput-vs-nodes curve and rescale costs online.

Pure logic: the caller owns the clock, so the daemon (its workers' progress reports) and the
simulator (the progress each job really made) make the same calls:
``observe(job_id, t_s, nodes, samples_total)`` at every report, ``rescaled(job_id, t_s,
old_nodes, new_nodes)`` at every size change, ``step_times(...)`` where the workers split
their steps into compute and all-reduce wait; the daemon keeps ``profile_dict(kind)`` in
SQLite and gives it back with ``load_profile(kind, data)``.

``samples_total`` is the job's cumulative, *net* progress: work lost to a rescale shows as
samples missing from it (a pause live, a deduction in the simulator); that gap is how the
real cost of a rescale is measured. Learned per job, and pooled per job *kind* (a new job of
a known kind starts from its predecessors' profile):

* the throughput at every size the job ran at, passively; the first ``warmup_s`` seconds
  after any size change are discarded unless nothing else was measured at that size; a rate
  far above the job's own history is held until it repeats (:mod:`.plausible`);
* the real scale-up and scale-down cost, in seconds of the rate before the change: after a
  change from n to m at t_r, the first clean interval at m gives r_m; the samples missing
  at t are ``r_m * (t - t_r) - (S(t) - S(t_r))``, divided by the rate at n;
* a monotone concave model (:func:`malletrain.core.profiling.profile.fit_curve`), optimistic beyond
  the largest measured size so that the allocator tries larger sizes when that pays,
  tempered there by the communication-aware step model where steps were split
  (:func:`malletrain.core.profiling.comm.temper`).

A job never measured gets a prior: its kind's profile, else linear scaling at the median per-node
rate of the jobs already measured, else 1 sample/s per node.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from malletrain.core.model import ThroughputModel
from malletrain.core.profiling.answers import AnswerCache, JobAnswers
from malletrain.core.profiling.comm import fit_comm, temper
from malletrain.core.profiling.comm import spread_factor as spread_factor_of
from malletrain.core.profiling.plausible import ReportGuard
from malletrain.core.profiling.profile import (
    PROFILE_VERSION,
    AdvisorSettings,
    Profile,
    WeightedSum,
    fit_curve,
    median_rate_per_node,
)

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """A size change whose cost is not measured yet."""

    t_s: float
    samples: float
    old_n: int
    new_n: int
    old_rate: float


@dataclass
class _JobState:
    kind: str | None
    profile: Profile = field(default_factory=Profile)
    last_t_s: float | None = None
    last_n: int = 0
    last_samples: float = 0.0
    changed_t_s: float = -math.inf
    pending: _Pending | None = None
    #: Rate of the last clean interval and the size it was measured at.
    last_rate: float = 0.0
    last_rate_n: int = 0
    #: squared relative deviations of clean interval rates from their size's mean so far
    noise_sq: float = 0.0
    noise_n: int = 0
    guard: ReportGuard = field(default_factory=ReportGuard)


class ProfilingAdvisor:
    """Online curves and rescale costs for every job it is told about (see module doc)."""

    def __init__(self, settings: AdvisorSettings | None = None) -> None:
        self.settings = settings or AdvisorSettings()
        self._jobs: dict[str, _JobState] = {}
        self._kinds: dict[str, Profile] = {}
        # The simulator and the daemon ask for every job's model, costs and start cost at
        # every decision; re-merging and re-fitting each time was over a quarter of a
        # replay's time. What is kept, and when it is worked out again: core.answers.
        self._answers = AnswerCache(self.settings.refresh_s)

    # -- feeding --------------------------------------------------------------
    def _pool(self, job_id: str) -> str:
        st = self._jobs.get(job_id)
        return f"kind:{st.kind}" if st is not None and st.kind is not None else f"job:{job_id}"

    def _touch(self, job_id: str, structural: bool = True) -> None:
        """Evidence of ``job_id`` changed (``structural``: see core.answers)."""
        self._answers.changed(self._pool(job_id), structural)
        if structural:
            self._answers.drop(job_id)

    def register(self, job_id: str, kind: str | None = None) -> None:
        """Declare a job (optional: observe() registers unknown jobs without a kind)."""
        st = self._jobs.get(job_id)
        if st is not None and (kind is None or st.kind == kind):
            return  # unchanged, caches stand (the daemon declares every job at every tick)
        if st is not None:
            self._touch(job_id)  # the old kind's pool
        self._jobs.setdefault(job_id, _JobState(kind=kind)).kind = kind
        self._touch(job_id)

    def observe(self, job_id: str, t_s: float, nodes: int, samples_total: float) -> None:
        """The job's cumulative progress was ``samples_total`` at ``t_s`` on ``nodes`` nodes."""
        st = self._job(job_id)
        self._answers.clock(t_s)
        if st.last_t_s is not None and t_s < st.last_t_s:
            log.debug("advisor: %s: report at %s older than %s ignored", job_id, t_s, st.last_t_s)
            return
        if st.last_t_s is not None and nodes != st.last_n:
            # a size change nobody told us about: at the last report at the latest
            self.rescaled(job_id, st.last_t_s, st.last_n, nodes)
            # when in (last report, now] is unknown: all of it is warm-up, the next is not
            st.changed_t_s = math.nextafter(t_s, -math.inf)
        if st.last_t_s is not None and nodes > 0 and t_s > st.last_t_s:
            dt = t_s - st.last_t_s
            ds = samples_total - st.last_samples
            # the interval that starts at a change carries that change's loss: never clean
            clean = (
                st.last_t_s >= st.changed_t_s + self.settings.warmup_s
                and st.last_t_s > st.changed_t_s
            )
            if ds >= 0 and not st.guard.admit(self.settings.plausible, nodes, ds, dt, clean):
                log.info("advisor: %s: %.6g samples/s at %d nodes held (core.plausible)",
                         job_id, ds / dt, nodes)
                ds, clean = -1.0, False  # used for nothing: rates, noise, costs
            book = st.profile.clean if clean else st.profile.dirty
            prior_mean = b.mean() if (b := st.profile.clean.get(nodes)) is not None else None
            if clean and ds >= 0 and prior_mean is not None and prior_mean > 0:
                st.noise_sq += ((ds / dt - prior_mean) / prior_mean) ** 2
                st.noise_n += 1
            if ds >= 0:
                new_size = nodes not in book
                book.setdefault(nodes, WeightedSum()).add(ds, dt)
                self._touch(job_id, structural=new_size)
            if clean and ds >= 0:
                st.last_rate, st.last_rate_n = ds / dt, nodes
            if clean and st.pending is not None and st.pending.new_n == nodes:
                self._measure_cost(st, t_s, samples_total, ds / dt)
                self._touch(job_id)
        st.last_t_s = t_s
        st.last_n = nodes
        st.last_samples = samples_total

    def step_times(self, job_id: str, nodes: int, step_s: float, sync_s: float,
                   samples_per_node: float, spread: bool = False) -> None:
        """A report's mean step at ``nodes`` nodes and the part it waited for the all-reduce;
        ``spread``: the group spanned two or more switches (kept apart: allocation/spread.py)."""
        profile = self._job(job_id).profile
        new_size = nodes not in (profile.spread_steps if spread else profile.steps)
        profile.add_step(nodes, step_s, sync_s, samples_per_node, spread)
        self._touch(job_id, structural=new_size)

    def spread_factor(self, job_id: str) -> float:
        """The job's (its kind's) rate across switches relative to one switch (1.0: not
        measured yet), from the step times of its spread and packed groups."""
        prof = self._combined(job_id)
        return spread_factor_of(prof.step_times(), prof.step_times(spread=True))

    def rescaled(self, job_id: str, t_s: float, old_nodes: int, new_nodes: int) -> None:
        """The job changed from ``old_nodes`` to ``new_nodes`` at ``t_s``."""
        st = self._job(job_id)
        self._answers.clock(t_s)
        # old == new: nodes were swapped: a warm-up, but no direction to attribute a cost to
        anchor = st.last_samples
        # the rate just before the change: the last clean measurement at that size
        if st.last_rate_n == old_nodes and st.last_rate > 0:
            old_rate = st.last_rate
        else:
            old_rate = self.model(job_id).rate(old_nodes)
        if st.last_t_s is not None and t_s > st.last_t_s and st.last_n == old_nodes:
            anchor += old_rate * (t_s - st.last_t_s)
        # Two changes with no progress report between them (Slurm took nodes, then the allocator
        # regrew the job at the same event): their losses cannot be told apart: neither counts.
        compound = (
            st.pending is not None and st.last_t_s is not None and st.pending.t_s >= st.last_t_s
        )
        st.pending = None
        measurable = old_nodes > 0 and new_nodes > 0 and old_nodes != new_nodes and old_rate > 0
        # a start from zero: its cost is measured in seconds of the rate it starts at
        starting = old_nodes == 0 and new_nodes > 0
        if (measurable or starting) and not compound:
            st.pending = _Pending(t_s, anchor, old_nodes, new_nodes, old_rate)
        st.changed_t_s = t_s
        if st.last_t_s is None or t_s >= st.last_t_s:
            st.last_t_s = t_s
            st.last_samples = anchor
        st.last_n = new_nodes

    def forget(self, job_id: str) -> None:
        """The job left: fold what it taught into its kind's profile."""
        if job_id in self._jobs:
            self._touch(job_id)
        st = self._jobs.pop(job_id, None)
        self._answers.drop(job_id)
        if st is not None and st.kind is not None:
            self._kinds.setdefault(st.kind, Profile()).merge(st.profile)

    def _measure_cost(self, st: _JobState, t_s: float, samples: float, new_rate: float) -> None:
        pend = st.pending
        assert pend is not None
        st.pending = None
        lost = new_rate * (t_s - pend.t_s) - (samples - pend.samples)
        per = new_rate if pend.old_n == 0 else pend.old_rate
        if per <= 0:
            return
        cost_s = min(max(0.0, lost / per), self.settings.max_cost_s)
        if pend.old_n == 0:
            st.profile.start_s.add(cost_s)
        elif pend.new_n > pend.old_n:
            st.profile.scale_up_s.add(cost_s)
        else:
            st.profile.scale_down_s.add(cost_s)

    def _job(self, job_id: str) -> _JobState:
        st = self._jobs.get(job_id)
        if st is None:
            st = self._jobs[job_id] = _JobState(kind=None)
        return st

    # -- answers --------------------------------------------------------------
    def _combined(self, job_id: str) -> Profile:
        """:meth:`_merged`, cached (core.answers; callers must not mutate it)."""
        return self._answers.profile(job_id, self._pool(job_id), lambda: self._merged(job_id))

    def _merged(self, job_id: str) -> Profile:
        """The job's own measurements, completed by those of its kind.

        Its kind's evidence is the archive of finished jobs plus the other running
        jobs of that kind (ten copies of one model learn ten times faster together);
        at sizes the job ran at itself, its own measurements replace the kind's.
        """
        st = self._jobs.get(job_id)
        prof = Profile()
        if st is None:
            return prof
        own = st.profile
        if st.kind is not None:
            # The kind's total (archive + every running job of the kind, this one
            # included) is built once per change of the kind; where this job has
            # evidence of its own (a size, a cost) only its own counts, so its share
            # of the total is exactly what gets replaced.
            total = self._kind_total(st.kind)
            # sizes the job's own evidence answers (warm-up only counts while it has
            # nothing clean, as in Profile.rates) ...
            mine = set(own.rates(self.settings.min_warmup_evidence_s))
            # ... but not a size it saw only in warm-up that its kind measured clean: a
            # stint's stall understates the rate, and one such stint at 64 nodes (26 s
            # against the kind's clean hours) made a replayed job's curve flat beyond 47
            # for a day (theta23-d100-sia, docs/evaluation.md)
            kind_clean = {n for n, s in total.clean.items() if s.weight > 0}
            mine -= kind_clean - {n for n, s in own.clean.items() if s.weight > 0}
            for src, dst in ((total.clean, prof.clean), (total.dirty, prof.dirty)):
                for n, s in src.items():
                    if n not in mine and not (dst is prof.dirty and n in own.dirty):
                        dst[n] = WeightedSum(s.total, s.weight)
            prof.steps = {n: list(v) for n, v in total.steps.items() if n not in own.steps}
            prof.spread_steps = {n: list(v) for n, v in total.spread_steps.items()
                                 if n not in own.spread_steps}
            for name in ("scale_up_s", "scale_down_s", "start_s"):
                if getattr(own, name).weight <= 0:
                    tot = getattr(total, name)
                    setattr(prof, name, WeightedSum(tot.total, tot.weight))
        prof.merge(own)
        return prof

    def _kind_total(self, kind: str) -> Profile:
        return self._answers.kind_total(kind, lambda: self._kind_sum(kind))

    def _kind_sum(self, kind: str) -> Profile:
        """Everything known of ``kind``: its archive and every running job of it."""
        total = Profile()
        if kind in self._kinds:
            total.merge(self._kinds[kind])
        for st in self._jobs.values():
            if st.kind == kind:
                total.merge(st.profile)
        return total

    def model(self, job_id: str) -> ThroughputModel:
        """What the allocator should believe about this job's throughput."""
        prof = self._combined(job_id)
        fitted = self._answers.model(job_id, prof, lambda: self._fit(prof))
        if fitted is not None:
            return fitted
        per_node = self._population_rate_per_node()
        return ThroughputModel(((1, per_node),), optimistic_slope=per_node)

    def answers(self, job_id: str) -> JobAnswers:
        """:meth:`model` (marked with how far it is measured), :meth:`scale_costs`,
        :meth:`start_cost_s`, :meth:`measured_sizes` and :meth:`spread_factor` at once,
        kept while the job's merged profile stands (core.answers)."""
        prof = self._combined(job_id)
        return self._answers.told(job_id, prof, lambda: self._work_out(job_id, prof))

    def _work_out(self, job_id: str, prof: Profile) -> tuple[JobAnswers, bool]:
        sizes = self.measured_sizes(job_id)
        fitted = self._answers.model(job_id, prof, lambda: self._fit(prof))
        model = fitted if fitted is not None else self.model(job_id)  # (the prior)
        told = JobAnswers(replace(model, measured_max_nodes=max(sizes, default=0)), sizes,
                          *self.scale_costs(job_id), self.start_cost_s(job_id),
                          self.spread_factor(job_id))
        # a prior (nothing fitted) follows the other jobs' rates: never kept
        return told, fitted is not None

    def _fit(self, prof: Profile) -> ThroughputModel | None:
        rates = prof.rates(self.settings.min_warmup_evidence_s)
        if not rates:
            return None
        st = self.settings
        return temper(fit_curve(rates, st.optimism, st.explore_fraction, st.concave,
                                st.optimistic_below), fit_comm(prof.step_times()))

    def scale_costs(self, job_id: str) -> tuple[float, float]:
        """(scale_up_s, scale_down_s): measured where possible, else the defaults.

        The default counts as ``cost_prior_weight`` measurements, so one noisy
        measurement moves the estimate only part of the way.
        """
        prof = self._combined(job_id)
        st = self.settings
        return (
            self._shrunk(prof.scale_up_s, st.default_scale_up_s),
            self._shrunk(prof.scale_down_s, st.default_scale_down_s),
        )

    def start_cost_s(self, job_id: str) -> float:
        """Seconds of its new rate a job loses when it starts from zero nodes.

        Measured from the job's (or its kind's) starts; until then its scale-up
        cost, the closest measured thing (both are dominated by the newcomers'
        start-up and rendezvous).
        """
        prof = self._combined(job_id)
        up, _ = self.scale_costs(job_id)
        return self._shrunk(prof.start_s, up)

    def _shrunk(self, measured: WeightedSum, default: float) -> float:
        if measured.weight <= 0:
            return default
        k = max(0.0, self.settings.cost_prior_weight)
        return (measured.total + k * default) / (measured.weight + k)

    def rate_noise(self, job_id: str) -> float:
        """Relative noise of the job's measured throughput (0 until measured twice): root mean
        square of each clean interval's relative deviation from the mean measured so far at
        its size (at most 0.5); the allocator's hysteresis scales with it. Replays: 0."""
        st = self._jobs.get(job_id)
        if st is None or st.noise_n < 2:
            return 0.0
        return min(0.5, math.sqrt(st.noise_sq / st.noise_n))

    def measured_sizes(self, job_id: str) -> tuple[int, ...]:
        return tuple(sorted(self._combined(job_id).rates(self.settings.min_warmup_evidence_s)))

    def _population_rate_per_node(self) -> float:
        profiles = [st.profile for st in self._jobs.values()] + list(self._kinds.values())
        return median_rate_per_node(profiles, self.settings.min_warmup_evidence_s,
                                    self.settings.prior_rate_per_node)

    # -- persistence ----------------------------------------------------------
    def profile_dict(self, kind: str) -> dict[str, Any] | None:
        """The stored form of a kind's profile (including running jobs of that kind)."""
        prof = self._kind_sum(kind)
        if (not prof.clean and not prof.dirty and not prof.steps
                and prof.scale_up_s.weight == 0 and prof.start_s.weight == 0):
            return None
        return prof.to_dict()

    def load_profile(self, kind: str, data: Any) -> None:
        """Restore a kind's profile from its stored form (ValueError if malformed)."""
        self._kinds[kind] = Profile.from_dict(data)
        self._answers.changed(f"kind:{kind}", structural=True)

    def to_dict(self) -> dict[str, Any]:
        names = set(self._kinds) | {st.kind for st in self._jobs.values() if st.kind is not None}
        kinds = {k: self.profile_dict(k) for k in sorted(names)}
        return {"version": PROFILE_VERSION, "kinds": {k: v for k, v in kinds.items() if v}}

    @classmethod
    def from_dict(cls, data: Any, settings: AdvisorSettings | None = None) -> ProfilingAdvisor:
        if not isinstance(data, dict) or not isinstance(data.get("kinds"), dict):
            raise ValueError("advisor: expected a mapping with 'kinds'")
        adv = cls(settings)
        for kind, prof in data["kinds"].items():
            adv.load_profile(str(kind), prof)
        return adv
