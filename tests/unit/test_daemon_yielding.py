"""serve_unplanned: held nodes given back to a regular job Slurm has neither started nor planned.

(Through ``decide``: tests/unit/test_daemon_decide.py.)

The scenes are the e2e benchmark's burst (benchmarks/e2e.py, 2026-11-23 14:28): four
regular jobs took the nodes of preempted slots, and a fifth 2-node job stayed pending with
no plan for 2.8 s while two slots still held nodes; nothing was given back until a plan
appeared.
"""

from __future__ import annotations

from malletrain.core.cluster import ClusterSnapshot, Job, JobState, Node, NodeState
from malletrain.daemon.jobs.slots import slot_tag
from malletrain.daemon.tick.yielding import serve_unplanned, stale_plans

NOW = 10_000.0
PARTS = ("batch", "scavenger")


def regular(job_id, nodes, submitted_ago_s, *, reason="Resources", planned=(), partition="batch",
            planned_in_s=0.0):
    return Job(job_id=job_id, name="reg", user="bob", partition=partition,
               state=JobState.PENDING, state_reason=reason, node_count=nodes,
               planned_nodes=tuple(planned), start_time=NOW + planned_in_s if planned else None,
               submit_time=NOW - submitted_ago_s)


def snap(*jobs, nodes=()):
    names = nodes or [f"n{i}" for i in range(1, 9)]
    return ClusterSnapshot(taken_at=NOW, jobs=tuple(jobs),
                           nodes=tuple(Node(n, NodeState.ALLOCATED, partitions=PARTS, cpus=2)
                                       for n in names))


def serve(snapshot, held=(), freeing=(), free=(), confirm_s=1.0, max_age_s=10.0, ahead_s=10.0,
          stale=()):
    return serve_unplanned(snapshot, now_s=NOW, held=list(held), freeing=list(freeing),
                           free=list(free), confirm_s=confirm_s, max_age_s=max_age_s,
                           ahead_s=ahead_s, stale=stale)


def running(job_id, nodes, *, comment="", ends_in_s=119.0):
    return Job(job_id=job_id, name="reg", user="bob", partition="batch",
               state=JobState.RUNNING, node_count=len(nodes), nodes=tuple(nodes),
               submit_time=NOW - 5, start_time=NOW - 1, comment=comment,
               end_time=None if ends_in_s is None else NOW + ends_in_s)


def test_a_job_slurm_has_not_planned_after_confirm_s_gets_held_nodes_in_order():
    out = serve(snap(regular(28, 2, 1.5)), held=["n2", "n1", "n5"])
    assert sorted(out.give_back) == ["n1", "n2"]  # the first two in the caller's order
    assert out.give_back["n1"].by == "job 28" and not out.waiting


def test_free_and_freeing_nodes_serve_first_and_free_ones_are_withheld_from_growth():
    out = serve(snap(regular(28, 3, 1.5)), held=["n1", "n2"], freeing=["n7"], free=["n8"])
    assert list(out.give_back) == ["n1"]  # 3 = n8 (free) + n7 (freeing) + one held
    assert out.withheld == {"n8"}
    # enough free nodes: Slurm's next pass starts it there; nothing given back, n8 withheld
    out = serve(snap(regular(29, 1, 5.0)), held=["n1"], free=["n8"])
    assert not out.give_back and out.withheld == {"n8"}


def test_earlier_submissions_take_the_freeing_nodes_first():
    # jobs 24-27 of the burst: Slurm has already preempted slots for them (freeing); job 28
    # comes last and needs two more, which only held nodes can give
    jobs = [regular(24, 1, 2.0), regular(25, 2, 1.8), regular(28, 2, 1.2)]
    out = serve(snap(*jobs), held=["n1", "n2", "n3"], freeing=["n4", "n6", "n7"])
    assert sorted(out.give_back) == ["n1", "n2"]
    assert {c.by for c in out.give_back.values()} == {"job 28"}


def test_slurm_gets_confirm_s_to_serve_a_new_job_itself():
    out = serve(snap(regular(28, 2, 0.4)), held=["n1", "n2"])
    assert not out.give_back and out.waiting  # the daemon looks again soon
    out = serve(snap(regular(28, 2, 0.4)), held=["n1", "n2"], confirm_s=0.0)
    assert sorted(out.give_back) == ["n1", "n2"]


def test_a_fresh_job_planned_far_ahead_is_served_like_an_unplanned_one_its_nodes_first():
    # e2e run 8, job 40: a plan made while n6 was still being freed put it on n3 (held) and
    # n7 (a regular job's) two minutes ahead; n6 is idle now: withhold n6, give back n3
    job = regular(40, 2, 1.1, planned=("n3", "n7"), planned_in_s=120.0)
    out = serve(snap(job), held=["n1", "n2", "n3"], free=["n6"])
    assert list(out.give_back) == ["n3"] and out.withheld == {"n6"}
    # planned later although enough nodes are free: something else holds it, leave it be
    assert serve(snap(job), held=["n3"], free=["n5", "n6"]) == serve(snap(), held=["n3"])
    # due within ahead_s: yield_ahead gives back its planned nodes, not this
    soon = regular(41, 2, 1.1, planned=("n3", "n7"), planned_in_s=5.0)
    assert not serve(snap(soon), held=["n1", "n3"], free=["n6"]).give_back


def test_jobs_left_alone():
    held = ["n1", "n2", "n3"]
    cases = [
        regular(30, 2, 1.5, planned=("n1", "n2")),  # due now: yield_ahead's business
        regular(31, 2, 30.0),  # pending unplanned for 30 s: something else blocks it
        regular(32, 2, 1.5, reason="Dependency"),  # not waiting for nodes
        regular(33, 9, 1.5),  # does not fit even with all our nodes
        regular(34, 2, 1.5, partition="debug"),  # may not use these nodes
        Job(job_id=35, name="mt.m1.s0", user="alice", partition="scavenger",
            state=JobState.PENDING, node_count=1, submit_time=NOW - 2,
            comment=slot_tag("m1", 0)),  # one of our own slots
    ]
    for job in cases:
        out = serve(snap(job), held=held)
        assert not out.give_back and not out.withheld and not out.waiting, job.job_id


def test_a_due_plan_naming_a_node_another_regular_job_got_is_stale():
    # e2e run 13: job 31's plan (n5, n6) was made while job 30 was pending; job 30 then got n6
    job31 = regular(31, 2, 0.8, planned=("n5", "n6"))
    assert stale_plans(snap(job31, running(30, ["n4", "n6"])), NOW) == {31}
    # not stale: the plan waits for a job at its time limit (yield_ahead's case), an end
    # not known, our own slot on the node (Slurm preempts it), a plan not due yet, no plan
    for ends_in_s in (0.0, -3.0, None):
        assert stale_plans(snap(job31, running(30, ["n6"], ends_in_s=ends_in_s)), NOW) == set()
    ours = running(13, ["n6"], comment=slot_tag("m1", 0))
    assert stale_plans(snap(job31, ours), NOW) == frozenset()
    later = regular(32, 2, 0.8, planned=("n5", "n6"), planned_in_s=5.0)
    assert stale_plans(snap(later, running(30, ["n6"])), NOW) == frozenset()
    assert stale_plans(snap(regular(33, 2, 0.8), running(30, ["n6"])), NOW) == frozenset()


def test_a_job_with_a_stale_due_plan_is_served_in_full_its_planned_nodes_first():
    job31 = regular(31, 2, 1.5, planned=("n5", "n6"))
    scene = snap(job31, running(30, ["n4", "n6"]))
    out = serve(scene, held=["n2", "n3", "n5"], stale={31})
    assert sorted(out.give_back) == ["n2", "n5"]  # n5 (its plan's) first, then the cheapest
    assert {c.by for c in out.give_back.values()} == {"job 31"}
    # free nodes serve it first (withheld, even though it has a plan), held ones after
    out = serve(scene, held=["n2", "n5"], free=["n8"], stale={31})
    assert list(out.give_back) == ["n5"] and out.withheld == {"n8"}
    # not known stale: a due plan is yield_ahead's business
    assert not serve(scene, held=["n2", "n3", "n5"]).give_back
