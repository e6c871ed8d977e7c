"""Replay semantics on tiny, hand-computed scenarios (FreeTrain's replayer, issue 4 §3).

A scripted policy hands out exactly the nodes a test names, so every number below
can be checked with pencil and paper.
"""

from dataclasses import dataclass, field

import pytest

from malletrain.core.model import AllocationInput, Plan
from malletrain.sim.curves import TrueCurves
from malletrain.sim.engine import PolicyError, Simulator
from malletrain.sim.jobs import SimJob
from malletrain.sim.trace import IdleTrace, TraceEvent


@dataclass
class Script:
    """At time t, give each listed job exactly these nodes; otherwise keep what is still idle."""

    steps: dict[float, dict[str, tuple[str, ...]]]
    name: str = "script"
    seen: list[AllocationInput] = field(default_factory=list)

    def decide(self, inp: AllocationInput) -> Plan:
        self.seen.append(inp)
        idle = {n.name for n in inp.nodes}
        plan = {j.job_id: tuple(n for n in j.nodes if n in idle) for j in inp.jobs}
        plan.update(self.steps.get(inp.now_s, {}))
        return Plan(assignments=plan)


def job(name, *, submit=0.0, lo=1, hi=4, total=1e9, up=2.0, down=1.0, curve=((1, 1.0), (4, 4.0))):
    return SimJob(name, submit, lo, hi, total, up, down, tuple(curve))


def trace(*events, names=("a", "b", "c", "d"), end=None):
    evs = tuple(TraceEvent(t, tuple(i), tuple(b)) for t, i, b in events)
    return IdleTrace("test", names, evs[0].time_s, end if end is not None else evs[-1].time_s, evs)


def run(tr, jobs, steps, **kw):
    pol = Script(steps)
    sim = Simulator(tr, jobs, pol, TrueCurves(), **kw)
    return sim.run(), pol


def done(result, name):
    return next(r.done for r in result.jobs if r.job.name == name)


def test_start_from_zero_is_free_and_growth_pays_scale_up_at_old_rate():
    tr = trace((0, [0, 1, 2, 3], []), (10, [], []), (20, [], []))
    res, _ = run(tr, [job("j")], {0: {"j": ("a",)}, 10: {"j": ("a", "b", "c")}})
    # 0-10: 1 node, 1/s = 10. At 10 grow 1->3: lose up_s(2) x rate(1)=1 = 2. 10-20: 3/s = 30.
    assert done(res, "j") == pytest.approx(10 - 2 + 30)
    assert res.samples_lost_rescale == pytest.approx(2.0)
    assert (res.rescales, res.starts, res.preemptions) == (1, 1, 0)
    assert res.used_node_seconds == pytest.approx(10 * 1 + 10 * 3)
    assert res.idle_node_seconds == pytest.approx(20 * 4)


def test_shrink_pays_scale_down_at_old_rate_and_stop_too():
    tr = trace((0, [0, 1, 2, 3], []), (10, [], []), (20, [], []), (30, [], []))
    res, _ = run(tr, [job("j")], {0: {"j": ("a", "b", "c", "d")}, 10: {"j": ("a",)}, 20: {"j": ()}})
    # 0-10: 4/s = 40; shrink 4->1: lose 1 x 4 = 4; 10-20: 10; stop 1->0: lose 1 x 1 = 1.
    assert done(res, "j") == pytest.approx(40 - 4 + 10 - 1)
    assert res.rescales == 2


def test_swap_of_nodes_pays_both_ways():
    tr = trace((0, [0, 1], []), (10, [], []), (20, [], []))
    res, _ = run(tr, [job("j")], {0: {"j": ("a",)}, 10: {"j": ("b",)}})
    assert done(res, "j") == pytest.approx(10 - (2 + 1) * 1 + 10)


def test_takeover_costs_scale_down_once_per_event_however_many_nodes():
    # Two of j's three nodes turn busy in one event: one scale_down x rate(3), not two.
    tr = trace((0, [0, 1, 2], []), (10, [], [1, 2]), (20, [], []))
    res, pol = run(tr, [job("j")], {0: {"j": ("a", "b", "c")}})
    assert done(res, "j") == pytest.approx(30 - 1 * 3 + 10)
    assert res.preemptions == 1 and res.rescales == 0
    assert res.samples_lost_preemption == pytest.approx(3.0)
    # The policy saw the job already shrunk to its surviving node.
    at10 = pol.seen[1]
    assert at10.jobs[0].nodes == ("a",) and [n.name for n in at10.nodes] == ["a"]


def test_takeover_below_min_stops_the_job_and_frees_the_rest():
    tr = trace((0, [0, 1, 2], []), (10, [], [0]), (20, [], []))
    res, pol = run(tr, [job("j", lo=3)], {0: {"j": ("a", "b", "c")}})
    # 0-10: 3/s = 30; lose 1 x 3 at the takeover; then below min: stopped, nothing more.
    assert done(res, "j") == pytest.approx(30 - 3)
    assert pol.seen[1].jobs[0].nodes == ()
    assert res.used_node_seconds == pytest.approx(30)


def test_finishes_at_exactly_total_samples_between_events():
    tr = trace((0, [0], []), (10, [], []), (30, [], []), (40, [], []))
    res, _ = run(tr, [job("j", total=25)], {0: {"j": ("a",)}})
    r = res.jobs[0]
    assert r.done == 25 and r.finished_s == pytest.approx(25.0)
    s = res.summary()
    assert s["jobs_finished"] == 1 and s["mean_jct_s"] == pytest.approx(25.0)
    assert s["makespan_s"] == pytest.approx(25.0)
    assert res.used_node_seconds == pytest.approx(25.0)  # not the 5 s until the event


def test_admission_in_submit_order_up_to_the_limit():
    jobs = [job("late", submit=5), job("first"), job("second", total=5), job("third")]
    tr = trace((0, [0, 1], []), (10, [], []), (20, [], []))
    res, pol = run(tr, jobs, {0: {"first": ("a",), "second": ("b",)}}, max_concurrent_jobs=2)
    assert [j.job_id for j in pol.seen[0].jobs] == ["first", "second"]
    # "second" finishes at t=5; at t=10 it leaves and "third" (submitted before "late") enters.
    assert [j.job_id for j in pol.seen[1].jobs] == ["first", "third"]
    assert [j.job_id for j in pol.seen[2].jobs] == ["first", "third"]
    assert res.summary()["jobs_admitted"] == 3


def test_finished_job_losing_a_node_pays_nothing():
    tr = trace((0, [0], []), (10, [], [0]), (20, [], []))
    res, _ = run(tr, [job("j", total=5)], {0: {"j": ("a",)}})
    assert res.jobs[0].done == 5 and res.preemptions == 0


@pytest.mark.parametrize(
    ("step", "match"),
    [
        ({"j": ("a", "zz")}, "not idle"),
        ({"j": ("a", "a")}, "two jobs"),
        ({"ghost": ("a",)}, "not offered"),
        ({"j": ("a", "b", "c", "d", "e")}, "outside"),
    ],
)
def test_invalid_plans_are_rejected(step, match):
    tr = trace((0, [0, 1, 2, 3, 4], []), (10, [], []), names=("a", "b", "c", "d", "e"))
    with pytest.raises(PolicyError, match=match):
        run(tr, [job("j")], {0: step})


def test_policy_sees_idle_ages():
    tr = trace((0, [0], []), (10, [1], []), (25, [], []), names=("a", "b"))
    _, pol = run(tr, [job("j")], {})
    ages = {n.name: n.idle_age_s for n in pol.seen[2].nodes}
    assert ages == {"a": 25.0, "b": 15.0}


def test_backfill_plan_reaches_the_policy_as_node_windows(tmp_path):
    """SWF replay -> plan -> shared scavenger -> IdleNode.window_s, as on a real cluster."""
    from malletrain.sim.swf import swf_trace

    head = "; MaxNodes: 4\n"
    rows = [(1, 1000, 100, 2, 100), (2, 1000, 100, 4, 100), (3, 1010, 50, 2, 50)]
    (tmp_path / "t.swf").write_text(
        head + "".join(f"{i} {s} -1 {r} {n} -1 -1 {n} {q} -1 1 -1 -1 -1 -1 -1 -1 -1\n"
                       for i, s, r, n, q in rows)
    )
    tr = swf_trace(tmp_path / "t.swf", 4, until_s=150)  # default end: the last submit
    res, pol = run(tr, [job("j")], {})
    at = {inp.now_s: {n.name: (n.window_s, n.idle_age_s) for n in inp.nodes} for inp in pol.seen}
    # t=0: nodes 2, 3 idle until job 2's planned start at t=100; t=60: freed by job 3.
    assert at[0.0] == {"n2": (100.0, 0.0), "n3": (100.0, 0.0)}
    assert at[60.0] == {"n2": (40.0, 0.0), "n3": (40.0, 0.0)}
    assert at[100.0] == {}
    # The plan said t=100 both times; job 3 was backfilled onto the hole at t=10 (90 s early),
    # the second hole ended on time.
    assert sorted(res.window_errors_s) == [-90.0, -90.0, 0.0, 0.0]
    s = res.summary()
    assert s["window_holes"] == 4 and s["window_ended_early_share"] == 0.5


def test_submit_times_count_from_the_start_of_the_slice():
    tr = trace((1000, [0], []), (1010, [], []), (1030, [], []), (1040, [], []))
    res, pol = run(tr, [job("j", total=25), job("k", submit=20, total=1e9)], {1000: {"j": ("a",)}})
    assert [j.job_id for j in pol.seen[0].jobs] == ["j"]  # k is submitted at 1000 + 20
    assert [j.job_id for j in pol.seen[1].jobs] == ["j"]
    # k arrives at 1020 with room (a decision of its own); j finishes at 1025 and leaves.
    assert (pol.seen[2].now_s, [j.job_id for j in pol.seen[2].jobs]) == (1020, ["j", "k"])
    assert (pol.seen[3].now_s, [j.job_id for j in pol.seen[3].jobs]) == (1025, ["k"])
    s = res.summary()
    assert s["mean_jct_s"] == pytest.approx(25.0) and s["makespan_s"] is None


def test_a_finish_between_events_hands_its_nodes_on_at_once():
    """The daemon wakes when a job ends; so does the replay (issue 20 §3)."""
    tr = trace((0, [0, 1], []), (100, [], []))
    steps = {0: {"short": ("a",), "long": ("b",)}, 10: {"long": ("a", "b")}}
    res, pol = run(tr, [job("short", total=10), job("long")], steps)
    # short runs 0-10 at 1/s and finishes at 10: a decision there gives long both nodes.
    assert [inp.now_s for inp in pol.seen] == [0, 10, 100]
    assert [j.job_id for j in pol.seen[1].jobs] == ["long"]
    # long: 10 s at 1/s, grows at 10 (loses up_s x 1 = 2), then 90 s at 2/s.
    assert done(res, "long") == pytest.approx(10 - 2 + 180)
    assert (res.events, res.decisions) == (2, 3)


def test_an_arrival_is_a_decision_only_when_there_is_room():
    tr = trace((0, [0, 1], []), (100, [], []))
    jobs = [job("first", total=30), job("queued", submit=5), job("late", submit=50)]
    _, pol = run(tr, jobs, {0: {"first": ("a",)}}, max_concurrent_jobs=1)
    # queued arrives at 5 with no room: no decision; first finishes at 30 and queued is
    # admitted then; late (50) finds no room either.
    assert [(inp.now_s, [j.job_id for j in inp.jobs]) for inp in pol.seen] == [
        (0, ["first"]), (30, ["queued"]), (100, ["queued"])]


def test_policy_sees_remaining_samples_and_the_queue():
    """Each job's declared total minus its progress, and how many submitted jobs wait."""
    jobs = [job("first", total=100), job("second", total=50), job("third"), job("late", submit=15)]
    tr = trace((0, [0, 1], []), (10, [], []), (20, [], []))
    _, pol = run(tr, jobs, {0: {"first": ("a",), "second": ("b",)}}, max_concurrent_jobs=2)
    left = [{j.job_id: j.remaining_samples for j in inp.jobs} for inp in pol.seen]
    assert left[0] == {"first": 100.0, "second": 50.0}
    assert left[1] == {"first": pytest.approx(90.0), "second": pytest.approx(40.0)}
    # "late" is submitted at t=15: it waits only from then on
    assert [inp.queued_jobs for inp in pol.seen] == [1, 1, 2]
