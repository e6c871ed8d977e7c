"""The proven upper bound (sim/bounds/bound.py): hand-computed cases, and no policy beats it.

The property test replays small random traces and job sets through the real engine
with every registered policy and checks ``samples_total <= bound``; jobs are small
enough that some finish, so admissions, the ``total_samples`` cap and the
earliest-start rule are all exercised, and some nodes are held back by a plan that
starts now (idle but not offered).
"""

import math
import random

import numpy as np
import pytest

from malletrain.core.policies import CORE, POLICIES, REPLAY, make_policy
from malletrain.sim.bounds.bound import upper_bound
from malletrain.sim.bounds.bound_inputs import (
    FinishCost,
    IdleSegment,
    earliest_starts,
    idle_segments,
    in_worker_seconds,
    job_rates,
    type_envelope,
)
from malletrain.sim.bounds.bound_lp import best_allocations
from malletrain.sim.bounds.cli_bound import main
from malletrain.sim.curves import provider_for
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob
from malletrain.sim.nodetypes import NodeTypes
from malletrain.sim.trace import IdleTrace, PlannedStart, TraceEvent


def job(name, curve, *, lo=1, hi=None, total=1e12, submit=0.0, up=0.0, down=0.0):
    hi = curve[-1][0] if hi is None else hi
    return SimJob(name, submit, lo, hi, total, up, down, tuple(curve))


def seg(t0, t1, idle, offered=None):
    return IdleSegment(t0, t1, idle, idle if offered is None else offered)


def test_dp_picks_the_best_counts_for_every_capacity():
    # a: 1 node 10/s, 2 nodes 12/s; b: 1 node 6/s; b needs its node.
    rates = [job_rates(job("a", [(1, 10.0), (2, 12.0)])), job_rates(job("b", [(1, 6.0)]))]
    alloc = best_allocations(rates, [1.0, 1.0], max_jobs=2, capacity=3)
    assert alloc.value.tolist() == [0.0, 10.0, 16.0, 18.0]
    assert alloc.nodes.tolist() == [[0, 0], [1, 0], [1, 1], [2, 1]]
    one = best_allocations(rates, [1.0, 1.0], max_jobs=1, capacity=3)
    assert one.value.tolist() == [0.0, 10.0, 12.0, 12.0]
    # Weights scale each job's value: with a at weight 0.1, b comes first.
    w = best_allocations(rates, [0.1, 1.0], max_jobs=1, capacity=2)
    assert w.value.tolist() == pytest.approx([0.0, 6.0, 6.0])


def test_dp_respects_min_nodes_and_interpolates_like_the_engine():
    j = job("j", [(2, 4.0), (4, 6.0)], lo=2)
    r = job_rates(j)
    assert r.tolist() == [0.0, 0.0, 4.0, 5.0, 6.0]  # n=3 linear between points, n=1 not allowed
    alloc = best_allocations([r], [1.0], max_jobs=1, capacity=4)
    assert alloc.value.tolist() == [0.0, 0.0, 4.0, 5.0, 6.0]


def test_bound_is_the_integral_of_F_for_identical_jobs():
    # Two identical jobs (1 node 3/s, 2 nodes 4/s), K = 2: F(1)=3, F(2)=6, F(3)=7, F(4)=8.
    jobs = [job(f"j{i}", [(1, 3.0), (2, 4.0)]) for i in range(2)]
    segs = [seg(0, 10, 1), seg(10, 30, 3), seg(30, 35, 4), seg(35, 40, 0)]
    b = upper_bound(segs, jobs, max_concurrent_jobs=2)
    assert b.samples == pytest.approx(10 * 3 + 20 * 7 + 5 * 8)
    assert b.samples_uncapped == b.samples and b.rounds == 0
    assert b.idle_node_seconds == 10 + 60 + 20
    # K = 1: F(n) = 3, 4, 4, 4.
    assert upper_bound(segs, jobs, 1).samples == pytest.approx(10 * 3 + 20 * 4 + 5 * 4)


def test_total_samples_caps_a_job():
    # One job that would make 100 samples but has only 30 to make.
    b = upper_bound([seg(0, 100, 1)], [job("j", [(1, 1.0)], total=30.0)], 1)
    assert b.samples_uncapped == pytest.approx(100.0)
    assert b.samples == pytest.approx(30.0, rel=1e-6)


def test_finish_cost_is_the_convex_envelope():
    # 1 node 10/s, 2 nodes 12/s, total 120: in 12 s at 1 node (12 node-s); in 10 s it
    # must average 12/s: 2 nodes throughout (20 node-s); in 11 s: mix, 11 * h(120/11).
    c = FinishCost.of(job("j", [(1, 10.0), (2, 12.0)], total=120.0))
    assert c.node_s(12.0) == pytest.approx(12.0)
    assert c.node_s(100.0) == pytest.approx(12.0)
    assert c.node_s(10.0) == pytest.approx(20.0)
    assert c.node_s(11.0) == pytest.approx(11 * (1 + (120 / 11 - 10) / 2))
    assert c.node_s(9.0) == math.inf


def test_later_jobs_wait_for_finishes():
    # K = 1; each job needs >= 10 s at its peak (10/s, total 100). Job 1 can run once job 0
    # finished (>= 10 s, >= 10 node-s); job 2 once two have (>= 20 s, >= 20 node-s).
    jobs = [job(f"j{i}", [(1, 10.0)], total=100.0) for i in range(3)]
    segs = [seg(t, t + 5, 1) for t in range(0, 40, 5)]
    assert earliest_starts(segs, jobs, 1) == [0.0, 10.0, 20.0]
    # With only half a node on average (offered 0 every other segment), node-seconds bind.
    sparse = [seg(t, t + 5, 1, offered=(t // 5 + 1) % 2) for t in range(0, 60, 5)]
    assert earliest_starts(sparse, jobs, 1) == [0.0, 10.0, 30.0]
    assert earliest_starts(sparse, jobs, 1, nodes="idle") == [0.0, 10.0, 20.0]
    b = upper_bound(segs, jobs, 1)
    assert b.jobs_admissible == 3 and b.can_run_dry  # 4 finishes possible in 40 s
    assert b.samples == pytest.approx(300.0, rel=1e-6)


def test_integer_finishes_make_the_admitted_job_wait_for_a_real_finish():
    # K = 2, one node. a (10/s, 100 samples) and c (50/s) run first; b (100/s) is third and
    # can run once a or c has finished. The LP bound only asks that a *could* have finished
    # by t = 10 (10 s, 10 node-s), so it runs c, then b: 10 x 50 + 20 x 100 = 2500. With
    # whole finishes b needs a to have run: a 0-10 then b 10-30: 100 + 2000 = 2100.
    jobs = [job("a", [(1, 10.0)], total=100.0), job("c", [(1, 50.0)]), job("b", [(1, 100.0)])]
    segs = [seg(0, 10, 1), seg(10, 20, 1), seg(20, 30, 1)]
    b = upper_bound(segs, jobs, 2, milp_s=10.0, block_s=0.0)
    assert b.earliest_s == (0.0, 0.0, 10.0)
    assert b.samples_lp == pytest.approx(2500.0)
    assert b.samples_milp == pytest.approx(2100.0, rel=1e-6) and b.milp_optimal
    assert b.samples == b.samples_milp


def test_submit_times_count_from_the_trace_start_as_in_the_engine():
    # The trace starts at 0, its first event is at 5; a job submitted at 3 runs from 5 on.
    j = job("j", [(1, 2.0)], submit=3.0)
    segs = [seg(5, 15, 1)]
    assert upper_bound(segs, [j], 1, submit_origin_s=0.0).samples == pytest.approx(20.0)
    # Counted from the first event instead, it is admitted when it arrives at 8 and makes
    # 14 in the engine; the bound counts the segment it arrives in whole.
    assert upper_bound(segs, [j], 1, submit_origin_s=5.0).samples == pytest.approx(20.0)
    # Arriving after the last segment's end (at 23), it can make nothing.
    assert upper_bound(segs, [j], 1, submit_origin_s=20.0).samples == 0.0
    assert upper_bound(segs, [j], 1).samples == pytest.approx(20.0)  # submit times ignored


def test_earliest_starts_follow_submit_order():
    rng = random.Random(3)
    for _ in range(20):
        tr, jobs, k = _random_case(rng)
        runs = sorted(jobs, key=lambda j: j.submit_s)
        starts = earliest_starts(idle_segments(tr), runs, k, submit_origin_s=tr.start_s)
        assert starts == sorted(starts)


def test_idle_segments_match_the_engine_timeline():
    names = ("a", "b", "c")
    evs = (
        TraceEvent(5.0, (0, 1, 2), ()),
        TraceEvent(10.0, (), (1,)),
        TraceEvent(20.0, (1,), (0, 2), (PlannedStart(7, 20.0, (1,)),)),
        TraceEvent(40.0, (0,), ()),
    )
    tr = IdleTrace("t", names, 5.0, 50.0, evs)
    segs = idle_segments(tr, until_s=30.0)
    assert [(s.start_s, s.end_s, s.idle, s.offered) for s in segs] == [
        (5.0, 10.0, 3, 3),
        (10.0, 20.0, 2, 2),
        (20.0, 30.0, 1, 0),  # b is planned for a job starting now: not offered
    ]
    res = Simulator(tr, [], make_policy("equal-share", CORE), provider_for("none"),
                    until_s=30.0).run()
    assert res.idle_node_seconds == pytest.approx(sum(s.idle * s.duration_s for s in segs))


def _random_case(rng: random.Random) -> tuple[IdleTrace, list[SimJob], int]:
    n_nodes = rng.randint(2, 7)
    names = tuple(f"n{i}" for i in range(n_nodes))
    idle = set(rng.sample(range(n_nodes), rng.randint(0, n_nodes)))
    t = rng.choice([0.0, 5.0])  # the first event may come after the trace's start
    events = [TraceEvent(t, tuple(sorted(idle)), ())]
    for _ in range(rng.randint(3, 12)):
        t += rng.choice([3.0, 10.0, 25.0, 60.0])
        flip = set(rng.sample(range(n_nodes), rng.randint(0, 2)))
        up = tuple(sorted(flip - idle))
        down = tuple(sorted(flip & idle))
        idle = (idle | set(up)) - set(down)
        planned = None
        if idle and rng.random() < 0.3:  # a plan that starts now holds a node back
            planned = (PlannedStart(1, t, (rng.choice(sorted(idle)),)),)
        events.append(TraceEvent(t, up, down, planned))
    jobs = []
    for i in range(rng.randint(1, 5)):
        hi = rng.randint(1, 4)
        lo = rng.randint(1, hi)
        r, pts = 0.0, []
        for n in range(1, hi + 1):
            r += rng.uniform(0.0, 5.0) if n > 1 else rng.uniform(0.5, 5.0)
            pts.append((n, round(r, 3)))
        total = rng.choice([20.0, 80.0, 300.0, 1e6])
        jobs.append(SimJob(f"k{i % 2}-{i:03d}", rng.choice([0.0, 0.0, 3.0, 15.0]), lo, hi, total,
                           rng.choice([0.0, 2.0]), rng.choice([0.0, 1.0]), tuple(pts)))
    until = t + rng.choice([0.0, 30.0])
    return IdleTrace("rand", names, 0.0, until, tuple(events)), jobs, rng.randint(1, 3)


POLICY_NAMES = ("equal-share", "freetrain", "malletrain-known-curves", "no-loss-bound",
                "malletrain")


def test_no_policy_beats_the_bound_on_random_replays():
    rng = random.Random(4)
    checked = 0
    for _ in range(30):
        tr, jobs, k = _random_case(rng)
        segs = idle_segments(tr)
        # Integer finishes too, over per-event blocks or blocks of several events.
        block_s = rng.choice([0.0, 30.0])
        offered = upper_bound(segs, jobs, k, rounds=30, submit_origin_s=tr.start_s,
                              milp_s=10.0, block_s=block_s)
        idle = upper_bound(segs, jobs, k, nodes="idle", rounds=30,
                           submit_origin_s=tr.start_s)
        assert offered.samples_milp is not None and offered.milp_optimal
        assert offered.samples <= offered.samples_lp <= offered.samples_uncapped * (1 + 1e-9)
        # the same bound in one-worker-seconds (samples of different models normalised)
        work = upper_bound(segs, in_worker_seconds(jobs), k, rounds=30,
                           submit_origin_s=tr.start_s)
        for name in POLICY_NAMES:
            pol = make_policy(name, REPLAY.with_(milp_time_limit_s=2.0))
            res = Simulator(tr, jobs, pol, provider_for(POLICIES[name].curves),
                            max_concurrent_jobs=k).run()
            slack = 1e-6 * max(1.0, offered.samples)  # HiGHS's feasibility tolerance
            assert res.samples_total <= offered.samples + slack, (name, tr, jobs, k)
            assert res.samples_total <= idle.samples + slack
            got = res.summary()["one_worker_seconds_total"]
            assert got <= work.samples + 1e-6 * max(1.0, work.samples)
            checked += 1
    assert checked == 30 * len(POLICY_NAMES)


def test_identical_jobs_the_bound_is_reached_without_rescale_costs():
    # Loss-free replay of the max-throughput policy on identical jobs that never finish:
    # it takes F(O) at every event, so it makes exactly the bound.
    rng = random.Random(7)
    for _ in range(5):
        tr, _, k = _random_case(rng)
        jobs = [job(f"same-{i:03d}", [(1, 2.0), (2, 3.5), (3, 4.0)]) for i in range(4)]
        pol = make_policy("no-loss-bound", CORE)
        res = Simulator(tr, jobs, pol, provider_for("true"), max_concurrent_jobs=k).run()
        b = upper_bound(idle_segments(tr), jobs, k)
        assert res.samples_total == pytest.approx(b.samples, rel=1e-9, abs=1e-9)


def test_cli_prints_both_bounds(tmp_path, capsys):
    (tmp_path / "idle.csv").write_text(
        "time_s,node,state\n0,a,idle\n0,b,idle\n10,b,busy\n30,b,idle\n"
    )
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - {name: j, submit_s: 0, min_nodes: 1, max_nodes: 2, total_samples: 1.0e+6,"
        " scale_up_s: 0, scale_down_s: 0, curve: [[1, 2.0], [2, 3.0]]}\n"
    )
    out = tmp_path / "b.json"
    rc = main(["--idle-trace", str(tmp_path / "idle.csv"), "--jobs", str(tmp_path / "jobs.yaml"),
               "--json", str(out), "--milp-s", "10"])
    assert rc == 0
    # 0-10: 2 nodes (3/s); 10-30: 1 node (2/s); the trace ends at 30.
    printed = capsys.readouterr().out
    assert printed.startswith("bound: samples_total <= 70 ") and "(optimal)" in printed
    assert len(printed.splitlines()) == 1  # nothing from HiGHS
    assert np.isclose(__import__("json").loads(out.read_text())["idle"]["samples"], 70.0)


def test_a_search_cut_short_is_looser_never_lower():
    """--bound-time-s: the multiplier search may stop at any round; its bound stays valid."""
    rng = random.Random(11)
    cut_short = 0
    for _ in range(15):
        tr, jobs, k = _random_case(rng)
        segs = idle_segments(tr)
        full = upper_bound(segs, jobs, k, submit_origin_s=tr.start_s)
        cut = upper_bound(segs, jobs, k, submit_origin_s=tr.start_s, time_limit_s=0.0)
        assert full.gap <= 1e-5
        assert cut.samples >= full.samples * (1 - 1e-9)
        # the gap it reports covers the distance to the converged bound
        assert cut.samples * (1 - cut.gap) <= full.samples * (1 + 1e-9)
        cut_short += cut.gap > 0
    assert cut_short > 0  # some cases needed the search at all


def _typed(rng: random.Random, jobs: list[SimJob]) -> list[SimJob]:
    """The jobs with a second node type: another curve at 0.3-2x of each point, kept
    non-decreasing (so the faster type changes with the size for some jobs)."""
    out = []
    for j in jobs:
        other, best = [], 0.0
        for n, r in j.curve:
            best = max(best, round(r * rng.uniform(0.3, 2.0), 3))
            other.append((n, best))
        out.append(SimJob(j.name, j.submit_s, j.min_nodes, j.max_nodes, j.total_samples,
                          j.scale_up_s, j.scale_down_s, (),
                          (("a", j.curve), ("b", tuple(other)))))
    return out


def test_no_policy_beats_the_bound_on_random_typed_replays():
    # On a cluster of two node types each job runs at its slower type's rate when it
    # holds both; the bound takes each job's faster type at every size (type_envelope).
    rng = random.Random(11)
    checked = 0
    for _ in range(20):
        tr, jobs, k = _random_case(rng)
        jobs = _typed(rng, jobs)
        kinds = tuple(rng.choice("ab") for _ in tr.node_names)
        segs = idle_segments(tr)
        samples = upper_bound(segs, jobs, k, rounds=30, submit_origin_s=tr.start_s)
        work = upper_bound(segs, in_worker_seconds(jobs), k, rounds=30,
                           submit_origin_s=tr.start_s)
        for name in POLICY_NAMES:
            for hidden in (False, True):
                pol = make_policy(name, REPLAY.with_(milp_time_limit_s=2.0))
                res = Simulator(tr, jobs, pol, provider_for(POLICIES[name].curves),
                                max_concurrent_jobs=k,
                                types=NodeTypes(kinds, hidden=hidden)).run()
                assert res.samples_total <= samples.samples * (1 + 1e-6) + 1e-6, (name, jobs)
                got = res.summary()["one_worker_seconds_total"]
                assert got <= work.samples * (1 + 1e-6) + 1e-6, (name, hidden, jobs)
                checked += 1
    assert checked == 20 * len(POLICY_NAMES) * 2


def test_a_typed_jobs_envelope_is_its_fastest_type_at_each_size():
    typed = SimJob("t", 0.0, 1, 4, 100.0, 0.0, 0.0, (),
                   (("p100", ((1, 1.0), (4, 4.0))), ("v100", ((1, 3.0), (2, 3.5)))))
    env = type_envelope(typed)
    assert env.curve == ((1, 3.0), (2, 3.5), (3, 3.5), (4, 4.0)) and not env.type_curves
    assert list(job_rates(typed)) == [0.0, 3.0, 3.5, 3.5, 4.0]
    assert in_worker_seconds([typed])[0].curve[0] == (1, 1.0)  # unit: the fastest one node
    plain = job("u", [(1, 2.0)])
    assert type_envelope(plain) is plain
