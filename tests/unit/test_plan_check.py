"""The plan check (core.plan_check): growth valued on the nodes really handed out.

The scene is the one ``benchmarks/load.py`` showed: as many jobs as idle nodes, most
nodes held, two free nodes with long windows. The count problem values every waiting
job's growth on those two windows, so it planned to shrink dozens of running jobs for
dozens of waiting ones, which got the running jobs' shorter windows instead; the next
tick moved them back.
"""

from __future__ import annotations

import dataclasses

import pytest

from malletrain.core.allocation.allocator import MalleTrainPolicy
from malletrain.core.allocation.plan_check import realised_value, realised_values
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel

VIT = ThroughputModel(((1, 200.0), (2, 303.0), (3, 386.0), (4, 460.0)))
RESNET = ThroughputModel(((1, 120.0), (2, 224.0), (4, 418.0)))


def scene() -> AllocationInput:
    held = [IdleNode(f"h{i}", 750.0, 900.0) for i in range(40)]
    free = [IdleNode(f"f{i}", 1800.0, 900.0) for i in range(2)]
    jobs = [MalleableJob(f"vit{k}", 1, 4, (f"h{2 * k}", f"h{2 * k + 1}"), VIT, 0.1, 0.1, k,
                         start_s=0.3) for k in range(20)]
    jobs += [MalleableJob(f"resnet{k}", 1, 4, (), RESNET, 0.1, 0.1, 20 + k, start_s=0.3)
             for k in range(20)]
    return AllocationInput(0.0, tuple(held + free), tuple(jobs))


def shrunk(inp: AllocationInput, assignments: dict[str, tuple[str, ...]]) -> list[str]:
    return [j.job_id for j in inp.jobs if len(assignments.get(j.job_id, ())) < len(j.nodes)]


def test_two_free_nodes_do_not_move_the_running_jobs() -> None:
    inp = scene()
    unchecked = MalleTrainPolicy(horizon_s=1800.0, check_plans=False)
    counts, objective, _, _ = unchecked.solve(inp)
    # the table alone: every resnet job counts on the two 1,800 s windows
    assert sum(counts[j.job_id] < len(j.nodes) for j in inp.jobs) >= 5
    before = unchecked.decide(inp)
    assert len(shrunk(inp, before.assignments)) >= 5

    plan = MalleTrainPolicy(horizon_s=1800.0).decide(inp)
    assert shrunk(inp, plan.assignments) == []
    # the two free nodes are used all the same
    used = {n for ns in plan.assignments.values() for n in ns}
    assert {"f0", "f1"} <= used
    # and the kept plan is worth more on the nodes really handed out
    policy = MalleTrainPolicy(horizon_s=1800.0)
    sol = policy._solution(inp, 0.0)
    def at(assignments: dict[str, tuple[str, ...]]) -> dict[str, list[int]]:
        return {j: [inp.node_index[n] for n in ns] for j, ns in assignments.items()}

    assert realised_value(inp, sol, at(plan.assignments)) > realised_value(
        inp, sol, at(before.assignments))
    assert realised_value(inp, sol, at(before.assignments)) < objective
    # both plans valued in one table, as the check does: each as valued alone
    both = realised_values(inp, sol, [at(plan.assignments), at(before.assignments)])
    assert both == pytest.approx([realised_value(inp, sol, at(plan.assignments)),
                                  realised_value(inp, sol, at(before.assignments))], rel=1e-12)


def test_a_plan_that_pays_on_the_real_nodes_still_shrinks() -> None:
    """Where the free pool is large, giving a waiting job better nodes is real: kept."""
    inp = scene()
    many = tuple(IdleNode(f"f{i}", 1800.0, 900.0) for i in range(40))
    # a job that scales far better than the holders: its growth is worth more even on the
    # holders' own 750 s windows, so shrinking them for it wins as placed too
    fast = MalleableJob("fast", 1, 44, (), ThroughputModel(((1, 1000.0), (44, 44000.0))),
                        0.1, 0.1, 99, start_s=0.3)
    inp = dataclasses.replace(inp, nodes=inp.nodes[:40] + many, jobs=(*inp.jobs, fast))
    plan = MalleTrainPolicy(horizon_s=1800.0).decide(inp)
    assert len(plan.assignments["fast"]) == 44
    assert shrunk(inp, plan.assignments)


def test_with_two_users_the_check_keeps_each_users_part() -> None:
    """The same scene with the jobs of two users, half each: the plan that shrinks is checked
    within each user's part of the nodes (keeping never moves nodes from one user to the
    other), so it does not swing there either."""
    inp = scene()
    jobs = tuple(dataclasses.replace(j, user="mt-alice" if k % 20 < 10 else "mt-bob")
                 for k, j in enumerate(inp.jobs))
    inp = dataclasses.replace(inp, jobs=jobs)
    unchecked = MalleTrainPolicy(horizon_s=1800.0, check_plans=False).decide(inp)
    assert len(shrunk(inp, unchecked.assignments)) >= 5
    plan = MalleTrainPolicy(horizon_s=1800.0).decide(inp)
    assert shrunk(inp, plan.assignments) == []
    per_user = {u: sum(len(plan.assignments[j.job_id]) for j in jobs if j.user == u)
                for u in ("mt-alice", "mt-bob")}
    assert per_user == {"mt-alice": 21, "mt-bob": 21}  # both free nodes used, one each
