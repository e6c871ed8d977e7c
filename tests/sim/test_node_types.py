"""A cluster of several node types in the replay (issue 19 §1): per-type true rates, a mixed
job at its slower type's pace, what the policy is told, prices charged, the jobs YAML."""

from __future__ import annotations

import pytest

from malletrain.core.allocation.allocator import MalleTrainPolicy
from malletrain.core.allocation.hetero import TypeSpeeds
from malletrain.core.model import ThroughputModel
from malletrain.errors import PermanentError
from malletrain.sim.curves import LearnedCurves, TrueCurves
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob, dump_jobs, parse_jobs
from malletrain.sim.nodetypes import NodeTypes, gpu_counts, types_like
from malletrain.sim.trace import IdleTrace, TraceEvent

from .test_semantics import Script, done

P100 = ((1, 1.0), (2, 2.0), (4, 4.0))
V100 = ((1, 3.0), (2, 6.0), (4, 12.0))


def typed_job(name="j", total=1e9, **kw) -> SimJob:
    return SimJob(name, 0.0, 1, 4, total, 0.0, 0.0, (), (("p100", P100), ("v100", V100)), **kw)


def trace(end=100.0) -> IdleTrace:
    return IdleTrace("t", ("a", "b", "c", "d"), 0.0, end,
                     (TraceEvent(0.0, (0, 1, 2, 3), ()),))


TYPES = ("p100", "p100", "v100", "v100")


def test_a_job_runs_at_its_types_rate_and_at_the_slower_type_when_mixed():
    for nodes, per_s in ((("c", "d"), 6.0), (("a", "b"), 2.0), (("a", "c"), 2.0)):
        pol = Script({0.0: {"j": nodes}})
        res = Simulator(trace(), [typed_job()], pol, TrueCurves(),
                        types=NodeTypes(TYPES)).run()
        assert done(res, "j") == pytest.approx(per_s * 100.0), nodes


def test_the_policy_is_told_types_and_prices_only_when_asked():
    prices = {"p100": 1.0, "v100": 2.0}
    for types, told_types, told_prices in (
            (NodeTypes(TYPES, prices), True, False),
            (NodeTypes(TYPES, prices, objective="cost"), True, True),
            (NodeTypes(TYPES, prices, hidden=True), False, False)):
        pol = Script({0.0: {"j": ("c", "d")}})
        res = Simulator(trace(), [typed_job(rate_target=5.0)], pol, TrueCurves(),
                        types=types).run()
        inp = pol.seen[0]
        assert ({n.node_type for n in inp.nodes} == {"p100", "v100"}) is told_types
        assert (set(inp.jobs[0].type_throughput) == {"p100", "v100"}) is told_types
        assert (inp.prices == prices) is told_prices
        assert inp.jobs[0].rate_target == 5.0
        # the replay charges the price of every node-second used, told or not
        assert res.type_node_seconds == {"v100": pytest.approx(200.0)}
        assert res.cost == pytest.approx(400.0)


def test_malletrain_puts_the_job_on_its_faster_type():
    res = Simulator(trace(), [typed_job()], MalleTrainPolicy(charge_start=False), TrueCurves(),
                    types=NodeTypes(TYPES)).run()
    assert res.type_node_seconds == {"v100": pytest.approx(200.0)}
    assert done(res, "j") == pytest.approx(600.0)


def test_jobs_with_only_per_type_curves_need_a_typed_cluster():
    with pytest.raises(PermanentError, match="node types"):
        Simulator(trace(), [typed_job()], Script({}), TrueCurves())


def test_learned_profiles_are_kept_per_type():
    curves = LearnedCurves()
    j = typed_job()
    curves.observe(j, 0.0, 2, 0.0, "v100")
    for t in range(40, 400, 10):
        curves.observe(j, float(t), 2, 6.0 * t, "v100")
    models = curves.type_models(j, ("p100", "v100"))
    assert models["v100"].rate(2) == pytest.approx(6.0, rel=0.05)
    assert models["v100"].measured_max_nodes == 2
    # never on p100, nobody measured both: the v100 curve times the optimism, as unmeasured
    assert models["p100"].rate(2) == pytest.approx(6.0 * 1.25, rel=0.05)
    assert models["p100"].measured_max_nodes == 0


def test_a_typed_profile_sees_only_the_progress_made_on_its_type():
    """A job that ran on v100 and then moves to p100: the p100 profile's rate is its p100
    progress, not everything the job made (that once read 200,000 samples/s on one node and
    stopped jobs in the cost objective's replay)."""
    curves = LearnedCurves()
    j = typed_job()
    done = 0.0
    for t in range(0, 101, 10):  # first a while on 4 p100, then v100, then 2 p100
        # (as in the replay: every decision comes right after an observation)
        done = 4.0 * t
        curves.observe(j, float(t), 4, done, "p100")
    curves.rescaled(j, 100.0, 4, 2, "p100", "v100")
    for t in range(110, 1001, 10):
        done += 60.0
        curves.observe(j, float(t), 2, done, "v100")
    curves.rescaled(j, 1000.0, 2, 2, "v100", "p100")
    for t in range(1001, 1021, 1):  # within the warm-up: not clean, but all there is at 2
        done += 2.0
        curves.observe(j, float(t), 2, done, "p100")
    models = curves.type_models(j, ("p100", "v100"))
    # p100's own progress only (2-4/s with its warm-up and fit); everything would be ~50/s
    assert 1.5 < models["p100"].rate(2) < 4.0
    assert models["v100"].rate(2) == pytest.approx(6.0, rel=0.05)


def test_type_speeds_come_from_jobs_measured_on_both():
    speeds = TypeSpeeds()
    both = {"p100": ThroughputModel(((1, 1.0), (2, 2.0)), measured_max_nodes=2),
            "v100": ThroughputModel(((1, 3.0), (2, 6.0)), measured_max_nodes=2)}
    speeds.fill("a", both)
    one = {"p100": ThroughputModel(((1, 1.0),), measured_max_nodes=0),
           "v100": ThroughputModel(((1, 9.0), (2, 18.0)), measured_max_nodes=2)}
    got = speeds.fill("b", one)
    assert got["p100"].rate(2) == pytest.approx(6.0) and got["p100"].measured_max_nodes == 0
    assert got["v100"] is one["v100"]


def test_the_jobs_yaml_takes_per_type_curves_and_a_target(tmp_path):
    text = """jobs:
  - name: j
    submit_s: 0
    min_nodes: 1
    max_nodes: 4
    total_samples: 1000.0
    scale_up_s: 18
    scale_down_s: 12
    rate_target: 5.0
    curves: {v100: [[1, 3.0], [4, 12.0]], p100: [[1, 1.0], [4, 4.0]]}
"""
    (jobs,) = parse_jobs("jobs.yaml", text)
    assert jobs.allowed_types == frozenset({"p100", "v100"}) and jobs.rate_target == 5.0
    assert jobs.true_models()["v100"].rate(4) == 12.0
    assert parse_jobs("again.yaml", dump_jobs([jobs])) == [jobs]
    bad = text.replace("curves: {v100: [[1, 3.0], [4, 12.0]], p100: [[1, 1.0], [4, 4.0]]}",
                       "curves: [[1, 3.0]]")
    with pytest.raises(Exception, match=r"jobs.yaml:.*curves"):
        parse_jobs("jobs.yaml", bad)


def test_types_in_the_shares_of_a_real_node_list():
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "data" / "traces" / \
        "alibaba-gpu-v2023-openb_node_list_gpu_node.csv"
    counts = gpu_counts(path, {"P100": "p100", "V100M16": "v100", "V100M32": "v100"})
    assert counts == {"p100": 265, "v100": 399}
    kinds = types_like(100, counts, seed=3)
    assert len(kinds) == 100 and kinds.count("p100") == 40 and kinds.count("v100") == 60
    assert types_like(100, counts, seed=3) == kinds != types_like(100, counts, seed=4)
