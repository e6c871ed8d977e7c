"""The Profiling Advisor's cached answers, and when each must be worked out again.

A job's answers (its profile merged with its kind's, the model fitted to it) depend on its
own evidence and on its kind's: the archive of finished jobs and every running job of that
kind. Every progress report adds evidence, so answers kept exact were rebuilt for every job
of a kind at every report of any of them: at 500 jobs the daemon's tick spent 30-60 ms on it
(``benchmarks/load.py``). Changes are of two sorts:

* **structural**: a size measured for the first time, a rescale cost measured, a job joining
  or leaving a pool, a stored profile loaded. Answers are worked out again at once: these
  are what move a plan (exploration waits for the first rate at a new size).
* **more evidence at sizes already known**: answers may be up to ``refresh_s`` old, on the
  clock the caller feeds the advisor (report times live, replay time in the simulator).
  With ``refresh_s`` = 0 (the core default, every replay) they are worked out again after
  any change, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from malletrain.core.model import ThroughputModel
from malletrain.core.profiling.profile import Profile


@dataclass(frozen=True)
class JobAnswers:
    """What the allocator is told of one job, all worked out from its merged profile: its
    model (marked with how far it is measured), its rescale and start costs, its rate across
    switches. Kept with that profile, so a tick asks the advisor once per job, not five times."""

    model: ThroughputModel
    measured_sizes: tuple[int, ...]
    scale_up_s: float
    scale_down_s: float
    start_s: float
    spread_factor: float


@dataclass
class _Entry:
    """One cached answer: the pool's generations and the clock when it was worked out."""

    gen: int
    data: int
    at_s: float
    profile: Profile
    fitted: bool = False
    #: None: the profile has no rates (the advisor answers with a prior, never cached)
    model: ThroughputModel | None = None
    told: JobAnswers | None = None


@dataclass
class AnswerCache:
    """Per-job merged profiles and fitted models, per-kind totals (see module doc)."""

    refresh_s: float = 0.0
    #: the latest time the caller reported (observe/rescaled)
    now_s: float = -math.inf
    _gen: dict[str, int] = field(default_factory=dict)
    _data: dict[str, int] = field(default_factory=dict)
    _jobs: dict[str, _Entry] = field(default_factory=dict)
    _kinds: dict[str, _Entry] = field(default_factory=dict)

    def clock(self, t_s: float) -> None:
        if t_s > self.now_s:
            self.now_s = t_s

    def changed(self, pool: str, structural: bool) -> None:
        """The evidence of ``pool`` (``kind:<kind>`` or ``job:<id>``) changed."""
        self._data[pool] = self._data.get(pool, 0) + 1
        if structural:
            self._gen[pool] = self._gen.get(pool, 0) + 1

    def drop(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def _fresh(self, entry: _Entry, pool: str) -> bool:
        if entry.gen != self._gen.get(pool, 0):
            return False
        if entry.data == self._data.get(pool, 0):
            return True
        return self.now_s - entry.at_s < self.refresh_s

    def _entry(self, pool: str, profile: Profile) -> _Entry:
        return _Entry(self._gen.get(pool, 0), self._data.get(pool, 0), self.now_s, profile)

    def _kept(self, table: dict[str, _Entry], key: str, pool: str,
              build: Callable[[], Profile]) -> Profile:
        hit = table.get(key)
        if hit is not None and self._fresh(hit, pool):
            return hit.profile
        entry = table[key] = self._entry(pool, build())
        return entry.profile

    def profile(self, job_id: str, pool: str, build: Callable[[], Profile]) -> Profile:
        """The job's merged profile (callers must not mutate it)."""
        return self._kept(self._jobs, job_id, pool, build)

    def model(self, job_id: str, profile: Profile,
              fit: Callable[[], ThroughputModel | None]) -> ThroughputModel | None:
        """The model fitted to ``profile`` (the job's cached merged profile), fitted once."""
        hit = self._jobs.get(job_id)
        if hit is None or hit.profile is not profile:
            return fit()
        if not hit.fitted:
            hit.model, hit.fitted = fit(), True
        return hit.model

    def told(self, job_id: str, profile: Profile,
             work_out: Callable[[], tuple[JobAnswers, bool]]) -> JobAnswers:
        """The job's answers from ``profile`` (its cached merged profile); ``work_out`` says
        whether they may be kept (not a prior's, which follows the other jobs)."""
        hit = self._jobs.get(job_id)
        if hit is not None and hit.profile is profile and hit.told is not None:
            return hit.told
        told, keep = work_out()
        if keep and hit is not None and hit.profile is profile:
            hit.told = told
        return told

    def kind_total(self, kind: str, build: Callable[[], Profile]) -> Profile:
        """Everything known of ``kind`` (archive + running jobs), kept like a job's answers."""
        return self._kept(self._kinds, kind, f"kind:{kind}", build)
