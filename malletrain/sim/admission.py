"""Which submitted jobs the replay hands to the policy: fair among users, up to a limit.

Why: the replay admits at most ``max_concurrent`` unfinished jobs to the decision (FreeTrain's
replayer does; an admitted job stays admitted until it finishes). Admitted first-in-first-out,
one user's queue blocked everyone else's: user A's 20 jobs at t=0 kept user B's one job, submitted
60 s later, out of the decision for 7,684-7,941 s under every policy (issue 47), however the
policy divides the nodes it is given. So:

* a job whose user has no job admitted is admitted when it arrives, even beyond the limit:
  every user with a submitted job is in the decision, and its share of the nodes is then the
  allocator's (:mod:`malletrain.core.allocation.fairness`). The limit is exceeded by at most
  the number of users, and only until the users with several jobs finish some: they are not
  admitted more while the total is at or above the limit;
* otherwise a free slot goes to the waiting user with the fewest jobs admitted (ties: the
  earliest submission, then the job set's order), so slots pass round-robin among users.

With one user (a job set that names none) this is exactly first-in-first-out up to the limit:
the user has no job admitted only when nothing is, and then there is room.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from malletrain.sim.result import JobRun


class Admission:
    """The jobs not yet admitted and the rule above (mutable replay state)."""

    def __init__(self, runs: Sequence[JobRun], start_s: float, max_concurrent: int) -> None:
        self._future = sorted(runs, key=lambda r: (r.job.submit_s, r.order))
        self._start_s = start_s
        self.max_concurrent = max_concurrent
        self._waiting: list[JobRun] = []  # arrived, not admitted, in submit order

    def _arrivals(self, t: float) -> None:
        k = 0
        while k < len(self._future) and self._start_s + self._future[k].job.submit_s <= t:
            k += 1
        if k:
            self._waiting += self._future[:k]
            del self._future[:k]

    def admit(self, active: Sequence[JobRun], t: float) -> list[JobRun]:
        """The waiting jobs to admit at ``t`` beside the unfinished ``active`` ones, in order."""
        self._arrivals(t)
        held = Counter(r.job.user for r in active)
        total = len(active)
        out: list[JobRun] = []
        while self._waiting:
            heads: dict[str, JobRun] = {}
            for run in self._waiting:
                heads.setdefault(run.job.user, run)
            user = min(heads, key=lambda u: (held[u], heads[u].job.submit_s, heads[u].order))
            if total >= self.max_concurrent and held[user] > 0:
                break
            run = heads[user]
            self._waiting.remove(run)
            out.append(run)
            held[user] += 1
            total += 1
        return out

    def queued(self, t: float) -> int:
        """Jobs submitted by ``t`` and not admitted."""
        self._arrivals(t)
        return len(self._waiting)

    def next_admission(self, active: Sequence[JobRun], t: float) -> float:
        """The next submission after ``t`` that would be admitted on arrival (inf: none)."""
        room = len(active) < self.max_concurrent
        users = {r.job.user for r in active}
        for run in self._future:
            t_submit = self._start_s + run.job.submit_s
            if t_submit > t and (room or run.job.user not in users):
                return t_submit
        return math.inf
