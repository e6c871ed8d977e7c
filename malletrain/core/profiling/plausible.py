"""Progress reports that jump beyond a job's own history are held until they repeat.

Why: a job's progress reaches the Profiling Advisor from its own workers, and the job's user
can make them report anything (docs/security.md). Across users the fair shares decide
(:mod:`malletrain.core.allocation.fairness`): a report moves nodes only within its own user's
part. Within that part a sudden claim would still take nodes from the user's other jobs, and
one wild interval (a counter reset, a report of the wrong unit) would bend the curve for as
long as the profile lives. So a rate is compared with the job's own history:

* at the same node count, the time-weighted mean of the rates accepted there;
* at a size never measured, the largest smaller measured size scaled linearly (``r_m x n/m``:
  the most a concave curve can give);
* no history at all: nothing to compare with, accepted (a job's first rate is its history).

A rate above ``factor`` x that reference is *held*: used for nothing (rates, noise, costs).
It is accepted once ``repeats`` reports in a row at that size agree with it (each within
``factor`` of the first held one): then the job really changed speed (a data cache warmed up,
a bigger batch) and that rate becomes the size's reference. A report may fall without limit:
a stall is real, and reporting less only costs the job itself. What this bounds: one report
cannot raise a job's curve by more than ``factor``; a sustained claim needs ``repeats``
reports per step of ``factor`` at each size, and across users it buys nothing at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlausibleRule:
    """When a report's rate is held (``factor`` <= 0: never)."""

    factor: float = 4.0
    repeats: int = 3


@dataclass
class ReportGuard:
    """One job's accepted history per size and the jump it is holding (mutable)."""

    #: node count -> (accepted samples, accepted seconds), clean intervals only
    history: dict[int, tuple[float, float]] = field(default_factory=dict)
    held_nodes: int = 0
    held_rate: float = 0.0
    held_in_a_row: int = 0
    #: reports held so far (not used): for logs and tests
    held_total: int = 0

    def reference(self, nodes: int) -> float | None:
        """The rate a report at ``nodes`` is compared with (None: no history)."""
        if nodes in self.history:
            samples, seconds = self.history[nodes]
            return samples / seconds
        smaller = [m for m in self.history if m < nodes]
        if not smaller:
            return None
        m = max(smaller)
        samples, seconds = self.history[m]
        return samples / seconds * nodes / m

    def admit(self, rule: PlausibleRule, nodes: int, samples: float, seconds: float,
              clean: bool) -> bool:
        """Whether the interval (``samples`` in ``seconds`` at ``nodes``) may be used."""
        rate = samples / seconds
        ref = self.reference(nodes)
        jump = rule.factor > 0 and ref is not None and ref > 0 and rate > rule.factor * ref
        if jump:
            same = (self.held_in_a_row > 0 and self.held_nodes == nodes
                    and rate <= rule.factor * self.held_rate
                    and self.held_rate <= rule.factor * rate)
            if not same:
                self.held_nodes, self.held_rate, self.held_in_a_row = nodes, rate, 0
            self.held_in_a_row += 1
            if self.held_in_a_row < rule.repeats:
                self.held_total += 1
                return False
            self.history.pop(nodes, None)  # confirmed: the job's speed changed here
        self.held_in_a_row = 0
        if clean:
            old_samples, old_seconds = self.history.get(nodes, (0.0, 0.0))
            self.history[nodes] = (old_samples + samples, old_seconds + seconds)
        return True
