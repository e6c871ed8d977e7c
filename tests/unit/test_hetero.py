"""Node types (issue 19 §1): one type per job, chosen for its throughput there; prices and
throughput targets (the cost objective); the homogeneous path unchanged."""

from __future__ import annotations

from dataclasses import replace

from malletrain.core.allocation.allocator import MalleTrainPolicy
from malletrain.core.allocation.hetero import is_typed
from malletrain.core.allocation.targets import capped
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.scavenging.scavenger import node_type


def linear(per_node: float, up_to: int = 8) -> ThroughputModel:
    return ThroughputModel(tuple((n, per_node * n) for n in range(1, up_to + 1)))


def nodes(kind: str, count: int, start: int = 0) -> list[IdleNode]:
    return [IdleNode(f"{kind}-{i}", None, node_type=kind) for i in range(start, start + count)]


def job(name: str, order: int, **kw) -> MalleableJob:
    base = dict(job_id=name, min_nodes=1, max_nodes=8, nodes=(), throughput=linear(1.0),
                scale_up_s=10.0, scale_down_s=10.0, submit_order=order)
    base.update(kw)
    return MalleableJob(**base)  # type: ignore[arg-type]


def policy() -> MalleTrainPolicy:
    return MalleTrainPolicy(charge_start=False)


def types_of(plan, name: str, inp: AllocationInput) -> set[str]:
    kind = {n.name: n.node_type for n in inp.nodes}
    return {kind[n] for n in plan.assignments.get(name, ())}


def test_node_type_comes_from_the_gpu_model_in_the_gres():
    assert node_type("gpu:a100:4(S:0-1)") == "a100"
    assert node_type("gpu:V100:2,mps:100") == "v100"
    assert node_type("mps:100,gpu:tesla:2") == "tesla"
    assert node_type("gpu:4") == "gpu"
    assert node_type("gpu") == "gpu"
    assert node_type("(null)") == "" and node_type("") == ""


def test_each_job_gets_the_type_it_gains_most_on_and_never_a_mix():
    """A is 3x faster on v100, B the same on both: A takes the v100s, B the p100s. A
    type-oblivious split would give each job a mix, running both at p100 pace."""
    a = job("a", 0, max_nodes=4, type_throughput={"v100": linear(3.0, 4), "p100": linear(1.0, 4)})
    b = job("b", 1, max_nodes=4, type_throughput={"v100": linear(1.0, 4), "p100": linear(1.0, 4)})
    inp = AllocationInput(0.0, tuple(nodes("p100", 4) + nodes("v100", 4)), (b, a))
    assert is_typed(inp)
    plan = policy().decide(inp)
    assert types_of(plan, "a", inp) == {"v100"} and plan.count("a") == 4
    assert types_of(plan, "b", inp) == {"p100"} and plan.count("b") == 4


def test_a_job_runs_only_on_the_types_it_allows():
    a = job("a", 0, allowed_types=frozenset({"p100"}),
            type_throughput={"v100": linear(5.0), "p100": linear(1.0)})
    inp = AllocationInput(0.0, tuple(nodes("p100", 2) + nodes("v100", 6)), (a,))
    plan = policy().decide(inp)
    assert types_of(plan, "a", inp) == {"p100"} and plan.count("a") == 2


def test_a_running_job_moves_type_only_if_the_gain_beats_its_scale_down():
    held = tuple(f"p100-{i}" for i in range(4))
    pool = tuple(nodes("p100", 4) + nodes("v100", 4))
    for v100_rate, moves in ((1.02, False), (3.0, True)):
        a = job("a", 0, max_nodes=4, nodes=held, scale_down_s=600.0,
                type_throughput={"v100": linear(v100_rate, 4), "p100": linear(1.0, 4)})
        inp = AllocationInput(0.0, pool, (a,))
        got = types_of(policy().decide(inp), "a", inp)
        assert got == ({"v100"} if moves else {"p100"}), (v100_rate, got)


def test_a_throughput_target_is_met_on_the_cheapest_nodes_and_no_more():
    """Cost objective: 2 v100 (3/s each) or 6 p100 (1/s each) meet a target of 6/s; p100
    costs 1, v100 2 per node-second: 2 v100 cost 4, 6 p100 cost 6 -> 2 v100, not 4."""
    a = job("a", 0, rate_target=6.0,
            type_throughput={"v100": linear(3.0), "p100": linear(1.0)})
    pool = tuple(nodes("p100", 8) + nodes("v100", 8))
    inp = AllocationInput(0.0, pool, (a,), prices={"p100": 0.01, "v100": 0.02})
    plan = policy().decide(inp)
    assert types_of(plan, "a", inp) == {"v100"} and plan.count("a") == 2
    # without prices or target: every v100 (the most throughput)
    free = replace(inp, prices={}, jobs=(replace(a, rate_target=None),))
    assert policy().decide(free).count("a") == 8


def test_capped_holds_the_rate_at_the_target():
    m = capped(ThroughputModel(((1, 2.0), (4, 6.0)), optimistic_slope=1.0), 5.0)
    assert m.rate(1) == 2.0 and m.rate(4) == 5.0 and m.rate(40) == 5.0
    m = capped(ThroughputModel(((1, 2.0),), optimistic_slope=1.0), 4.0)
    assert m.rate(3) == 4.0 and m.rate(10) == 4.0
    flat = ThroughputModel(((1, 2.0),))
    assert capped(flat, 10.0) == flat
    # measured at 2+ nodes only: one node reaches a small target (proportional below)
    m = capped(ThroughputModel(((2, 400.0), (3, 600.0))), 1.0)
    assert m.rate(1) == 1.0 and m.rate(3) == 1.0
    m = capped(ThroughputModel(((2, 400.0), (3, 600.0))), 300.0)
    assert m.rate(1) == 200.0 and m.rate(2) == 300.0 and m.rate(3) == 300.0


def test_a_node_beyond_the_target_counts_as_a_small_loss_so_it_is_given_back():
    m = capped(ThroughputModel(((1, 2.0), (4, 6.0))), 5.0, max_nodes=10)
    assert m.rate(4) == 5.0 and m.rate(5) == 5.0 * 0.99 and m.rate(10) == 5.0 * 0.94
    # a job holding two nodes where one meets its target gives the other back (no prices)
    a = job("a", 0, max_nodes=4, nodes=("-0", "-1"), rate_target=1.0,
            throughput=ThroughputModel(((1, 200.0), (4, 700.0)), 0.0, 4))
    plan = MalleTrainPolicy().decide(AllocationInput(0.0, tuple(nodes("", 6)), (a,)))
    assert plan.count("a") == 1
    untargeted = replace(a, rate_target=None)
    assert MalleTrainPolicy().decide(AllocationInput(0.0, tuple(nodes("", 6)), (untargeted,))
                                     ).count("a") == 4


def test_one_type_takes_the_plain_path():
    a, b = job("a", 0), job("b", 1, throughput=linear(2.0))
    inp = AllocationInput(0.0, tuple(nodes("", 6)), (a, b))
    assert not is_typed(inp)
    p = MalleTrainPolicy(charge_start=False)
    assert p.decide(inp).assignments == p.assign(inp)[0]


def test_when_both_want_the_scarce_type_it_goes_to_the_job_that_gains_most_there():
    """Four v100s, both jobs faster there: the v100 price rises until only the job with the
    larger gain (3x against 1.2x) still takes them; the other runs on the p100s."""
    a = job("a", 1, max_nodes=4, type_throughput={"v100": linear(3.0, 4), "p100": linear(1.0, 4)})
    b = job("b", 0, max_nodes=4, type_throughput={"v100": linear(1.2, 4), "p100": linear(1.0, 4)})
    inp = AllocationInput(0.0, tuple(nodes("p100", 4) + nodes("v100", 4)), (b, a))
    plan = policy().decide(inp)
    assert types_of(plan, "a", inp) == {"v100"} and plan.count("a") == 4
    assert types_of(plan, "b", inp) == {"p100"} and plan.count("b") == 4


def test_many_jobs_and_types_fill_every_type_without_a_mix():
    import random
    rng = random.Random(1)
    kinds = ("a100", "v100", "t4")
    pool = tuple(n for k in kinds for n in nodes(k, 30))
    jobs = tuple(job(f"j{i}", i, max_nodes=16, type_throughput={
        k: linear(rng.uniform(0.5, 3.0), 16) for k in kinds}) for i in range(12))
    inp = AllocationInput(0.0, pool, jobs)
    plan = policy().decide(inp)
    assert sum(plan.count(j.job_id) for j in jobs) == 90  # linear curves: every node used
    assert all(len(types_of(plan, j.job_id, inp)) <= 1 for j in jobs)
