"""Exploration uses free nodes only (MalleTrainPolicy.explore_free_only).

The Profiling Advisor extends a curve optimistically beyond the largest measured
size so that untried sizes get tried. Seen live on the dev cluster (2026-11-22):
with no free node, that optimism evicted a measured running job so that an
unmeasured one could try its second node. The allocator now values counts that
need nodes other running jobs release without the extension beyond the measured
size (``ThroughputModel.measured_max_nodes``), and keeps it on free nodes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.core.allocation.allocator import MalleTrainPolicy, malletrain_policy
from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.options import LIVE


def live_case(free_nodes: int) -> AllocationInput:
    """The dev cluster's case: m1 measured at 1 node (247/s), m2 measured at 1 node
    (281/s, extended linearly to 562/s at 2), each holding one long-idle node."""
    m1 = ThroughputModel(((1, 247.0),), optimistic_slope=123.5, measured_max_nodes=1)
    m2 = ThroughputModel(((1, 281.0),), optimistic_slope=281.0, measured_max_nodes=1)
    nodes = [IdleNode("n1", None, 3600.0), IdleNode("n2", None, 3600.0)]
    nodes += [IdleNode(f"free{i}", None, 3600.0) for i in range(free_nodes)]
    jobs = (
        MalleableJob("m1", 1, 2, ("n1",), m1, 20.0, 20.0, submit_order=0),
        MalleableJob("m2", 1, 2, ("n2",), m2, 20.0, 20.0, submit_order=1),
    )
    return AllocationInput(0.0, tuple(nodes), jobs)


def live_policy(explore_free_only: bool) -> MalleTrainPolicy:
    # the daemon's preset (options.LIVE): keep margin 0.1, hole prior floor 0.1
    policy = malletrain_policy(LIVE)
    return dataclasses.replace(policy, explore_free_only=explore_free_only)


def test_live_case_unmeasured_job_does_not_take_a_measured_jobs_node():
    inp = live_case(free_nodes=0)
    # the failure, reproduced with the rule off: 562 > 281 + 247 x 1.1, m1 evicted
    before = live_policy(explore_free_only=False).decide(inp)
    assert before.count("m1") == 0 and before.count("m2") == 2
    plan = live_policy(explore_free_only=True).decide(inp)
    assert plan.assignments == {"m1": ("n1",), "m2": ("n2",)}


def test_live_case_with_a_free_node_the_unmeasured_size_is_explored():
    inp = live_case(free_nodes=1)
    plan = live_policy(explore_free_only=True).decide(inp)
    assert plan.assignments == {"m1": ("n1",), "m2": ("n2", "free0")}


def test_measured_sizes_may_still_take_nodes_from_others():
    """The rule is about guesses only: a job measured at 2 nodes that really makes
    562/s there still takes a node from a job making 247/s."""
    inp = live_case(free_nodes=0)
    m2 = ThroughputModel(((1, 281.0), (2, 562.0)), optimistic_slope=281.0, measured_max_nodes=2)
    jobs = (inp.jobs[0], dataclasses.replace(inp.jobs[1], throughput=m2))
    plan = live_policy(explore_free_only=True).decide(dataclasses.replace(inp, jobs=jobs))
    assert plan.count("m1") == 0 and plan.count("m2") == 2


def random_input(seed: int, caps: str) -> AllocationInput:
    """Random small instances, mostly scarce (few free nodes), curves with an
    optimistic extension; ``caps``: 'none' (measured_max_nodes unset), 'full'
    (measured up to max_nodes) or 'random'."""
    rng = np.random.default_rng(seed)
    n_nodes = int(rng.integers(1, 24))
    names = [f"n{i}" for i in range(n_nodes)]
    nodes = tuple(
        IdleNode(
            nm,
            None if rng.random() < 0.5 else float(rng.uniform(0, 900)),
            float(rng.uniform(0, 4000)),
            f"s{int(rng.integers(0, 3))}",
        )
        for nm in names
    )
    pool = list(names)
    rng.shuffle(pool)
    jobs = []
    for j in range(int(rng.integers(1, 6))):
        lo = int(rng.integers(1, 3))
        hi = int(rng.integers(lo, 9))
        c = int(rng.integers(0, hi + 1)) if rng.random() < 0.8 else 0
        own = [] if c < lo or c > len(pool) else [pool.pop() for _ in range(c)]
        top = int(rng.integers(1, hi + 1))
        r1 = float(rng.uniform(1, 100))
        pts = tuple((n, r1 * n ** float(rng.uniform(0.5, 1.0))) for n in range(1, top + 1))
        slope = float(rng.uniform(0.0, 1.0)) * r1
        measured = {"none": None, "full": hi, "random": int(rng.integers(0, hi + 1))}[caps]
        tm = ThroughputModel(pts, optimistic_slope=slope, measured_max_nodes=measured)
        jobs.append(
            MalleableJob(
                f"j{j}", lo, hi, tuple(own), tm,
                float(rng.uniform(0, 40)), float(rng.uniform(0, 40)), submit_order=j,
                rate_noise=float(rng.choice([0.0, 0.05])),
            )
        )
    return AllocationInput(0.0, nodes, tuple(jobs))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["none", "full"]))
def test_nothing_changes_where_every_size_is_trusted_or_measured(seed, caps):
    inp = random_input(seed, caps)
    on = MalleTrainPolicy(horizon_s=1800.0, explore_free_only=True)
    off = MalleTrainPolicy(horizon_s=1800.0, explore_free_only=False)
    values_on, _, _ = on.value_table(inp)
    values_off, _, _ = off.value_table(inp)
    np.testing.assert_array_equal(values_on, values_off)


def conservative(model: ThroughputModel, cap: int) -> ThroughputModel:
    """r(min(n, cap)), written independently of the allocator: dense points, flat beyond."""
    return ThroughputModel(tuple((n, model.rate(n)) for n in range(1, cap + 1)))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_value_table_is_the_conservative_one_exactly_where_others_nodes_are_needed(seed):
    """Every entry of the combined table equals the plain table of either the job's
    model (counts within own + free nodes) or its conservative model (counts that need
    nodes others release)."""
    inp = random_input(seed, "random")
    on = MalleTrainPolicy(horizon_s=1800.0, explore_free_only=True)
    off = MalleTrainPolicy(horizon_s=1800.0, explore_free_only=False)
    values_on, _, own_idx = on.value_table(inp)
    values_off, _, _ = off.value_table(inp)
    held = {n for job in inp.jobs for n in job.nodes}
    n_free = sum(1 for node in inp.nodes if node.name not in held)
    for j, job in enumerate(inp.jobs):
        c = own_idx[j].size
        cap = max(job.throughput.measured_max_nodes or 0, c, job.min_nodes, 1)
        cons_jobs = tuple(
            dataclasses.replace(x, throughput=conservative(x.throughput, cap)) if i == j else x
            for i, x in enumerate(inp.jobs)
        )
        values_cons, _, _ = off.value_table(dataclasses.replace(inp, jobs=cons_jobs))
        for n in range(values_on.shape[1]):
            want = values_cons[j, n] if n > c + n_free else values_off[j, n]
            assert values_on[j, n] == pytest.approx(want, rel=1e-9, abs=1e-6), (j, n)
    # the DP over it: exact for any table (test_allocator.py checks it against brute
    # force and the MILP); here, that its plan is worth what it says
    counts, objective = solve_counts(values_on, len(inp.nodes))
    assert sum(counts) <= len(inp.nodes)
    assert sum(values_on[j, n] for j, n in enumerate(counts)) == pytest.approx(objective)
