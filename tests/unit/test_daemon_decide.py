"""decide(world) -> TickPlan: the pure reconciliation, on hand-built snapshots."""

from __future__ import annotations

import dataclasses

from tick_scenes import NOW, kinds, node, record, slot_job, world

from malletrain.core.cluster import Job, JobState, NodeState
from malletrain.core.lifecycle import JobPhase, advance
from malletrain.core.policies import make_policy
from malletrain.core.scavenging.scavenger import Claim
from malletrain.daemon.jobs.slots import slot_tag
from malletrain.daemon.jobs.store import JobRecord, SlotRecord
from malletrain.daemon.tick import CoordView, Registration, decide
from malletrain.daemon.tick.actions import Cancel, Hold, Leave, Park, Place, Publish, Transit
from malletrain.daemon.tick.yielding import yield_ahead

POLICY = make_policy("equal-share")


def test_queued_job_is_placed_on_idle_nodes_with_a_time_limit_inside_the_window():
    pending = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.PENDING,
                  node_count=2, planned_nodes=("n1", "n2"), start_time=NOW + 600,
                  submit_time=NOW - 5)
    w = world([node("n1"), node("n2")],
              [slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser"),
               slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser"), pending],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12)], [record()])
    plan = decide(w, POLICY)
    places = kinds(plan, Place)
    assert sorted(p.node for p in places) == ["n1", "n2"]
    assert all(p.time_limit_min == 10 for p in places)  # 600 s window -> 10 min, not more
    assert Transit("m1", JobPhase.STARTING, "slots placed on nodes") in plan.actions


def test_short_holes_are_not_scavenged():
    pending = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.PENDING,
                  node_count=1, planned_nodes=("n1",), start_time=NOW + 30)
    w = world([node("n1")], [slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser"), pending],
              [SlotRecord("m1", 0, 11)], [record(max_nodes=1)])
    assert not kinds(decide(w, POLICY), Place)


def test_shrink_publishes_without_the_member_then_parks_the_ended_slot():
    # two running slots; a regular job is planned on n2 now: n2 must be given back
    pending = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.PENDING,
                  node_count=1, planned_nodes=("n2",), start_time=NOW)
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
             SlotRecord("m1", 1, 12, last_status="running", last_node="n2")]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n2"]), pending]
    cv = CoordView(epoch=3, members=("s0-r0", "s1-r0"),
                   live={"s0-r0": Registration("n1", NOW - 60),
                         "s1-r0": Registration("n2", NOW - 60)},
                   samples_total=1000, progress_at_s=NOW - 1)
    model_policy = make_policy("malletrain")
    plan = decide(world([node("n1", NodeState.ALLOCATED), node("n2", NodeState.ALLOCATED)],
                        jobs, slots, [record(state=JobPhase.RUNNING)], {"m1": cv}),
                  model_policy)
    assert plan.targets["m1"] == ("n1",)
    assert Leave("m1", 1) in plan.actions
    assert Publish("m1", ("s0-r0",), 2) in plan.actions
    assert not kinds(plan, Park)  # the member leaves at a step boundary first

    # next tick: the member left, its slot job ended -> back to the pool, not a preemption
    slots[1] = SlotRecord("m1", 1, 12, leaving_since_s=NOW - 2, last_status="running",
                          last_node="n2")
    jobs[1] = slot_job(12, "m1", 1, JobState.COMPLETED, nodes=["n2"], end=NOW - 1)
    cv2 = CoordView(epoch=4, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW - 60)},
                    samples_total=1100, progress_at_s=NOW - 1)
    plan = decide(world([node("n1", NodeState.ALLOCATED), node("n2", NodeState.COMPLETING)],
                        jobs, slots, [record(state=JobPhase.RUNNING)], {"m1": cv2}),
                  model_policy)
    parks = kinds(plan, Park)
    assert [(p.slot, p.preempted) for p in parks] == [(1, False)]
    assert not kinds(plan, Publish)


def test_a_slot_ended_by_slurm_while_running_is_a_preemption_with_its_yield_time():
    bob = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.RUNNING,
              node_count=1, nodes=("n2",), submit_time=NOW - 10)
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
             SlotRecord("m1", 1, 12, last_status="running", last_node="n2")]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.PREEMPTED, nodes=["n2"], end=NOW - 8), bob]
    cv = CoordView(epoch=4, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW - 60)},
                   samples_total=100, progress_at_s=NOW)
    plan = decide(world([node("n1", NodeState.ALLOCATED), node("n2", NodeState.ALLOCATED)],
                        jobs, slots, [record(state=JobPhase.RUNNING)], {"m1": cv}), POLICY)
    park = kinds(plan, Park)[0]
    assert park.preempted and park.slot == 1 and park.yield_s == 2.0


def test_a_job_that_ran_on_the_node_before_the_slot_is_not_the_one_yielded_to():
    # Slurm still lists an older finished job on n2 (MinJobAge): its age is no yield time
    old = Job(job_id=90, name="old", user="bob", partition="batch", state=JobState.COMPLETED,
              node_count=1, nodes=("n2",), submit_time=NOW - 300, start_time=NOW - 290,
              end_time=NOW - 200)
    slots = [SlotRecord("m1", 1, 12, last_status="running", last_node="n2")]
    jobs = [slot_job(12, "m1", 1, JobState.PREEMPTED, nodes=["n2"], end=NOW - 8), old]
    plan = decide(world([node("n2", NodeState.IDLE)], jobs, slots,
                        [record(state=JobPhase.RUNNING)]), POLICY)
    park = kinds(plan, Park)[0]
    assert park.preempted and park.yield_s is None

    # the job that did take the node is found beside it
    bob = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.RUNNING,
              node_count=1, nodes=("n2",), submit_time=NOW - 10, start_time=NOW - 7)
    plan = decide(world([node("n2", NodeState.ALLOCATED)], [*jobs, bob], slots,
                        [record(state=JobPhase.RUNNING)]), POLICY)
    assert kinds(plan, Park)[0].yield_s == 2.0


def test_a_yield_to_a_job_still_waiting_for_other_nodes_is_timed_against_that_job():
    # bob's job needs n1 and n2: n2's slot has ended (preempted), n1's is still going, so the
    # job is pending with no plan yet; an old finished job on n2 is not the one yielded to
    old = Job(job_id=90, name="old", user="bob", partition="batch", state=JobState.COMPLETED,
              node_count=1, nodes=("n2",), submit_time=NOW - 100, start_time=NOW - 95,
              end_time=NOW - 90)
    wide = Job(job_id=99, name="wide", user="bob", partition="batch", state=JobState.PENDING,
               node_count=2, submit_time=NOW - 4)
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
             SlotRecord("m1", 1, 12, last_status="running", last_node="n2")]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.PREEMPTED, nodes=["n2"], end=NOW - 1), old, wide]
    cv = CoordView(epoch=4, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW - 60)},
                   samples_total=100, progress_at_s=NOW)
    plan = decide(world([node("n1", NodeState.ALLOCATED), node("n2", NodeState.IDLE)],
                        jobs, slots, [record(state=JobPhase.RUNNING)], {"m1": cv}), POLICY)
    park = next(p for p in kinds(plan, Park) if p.slot == 1)
    assert park.preempted and park.yield_s == 3.0
    # a pending job of another partition does not want n2
    other = Job(job_id=98, name="gpu", user="bob", partition="gpu", state=JobState.PENDING,
                node_count=1, submit_time=NOW - 2)
    plan = decide(world([node("n1", NodeState.ALLOCATED), node("n2", NodeState.IDLE)],
                        [*jobs, other], slots, [record(state=JobPhase.RUNNING)], {"m1": cv}),
                  POLICY)
    assert next(p for p in kinds(plan, Park) if p.slot == 1).yield_s == 3.0


def _two_starting_slots():
    slots = [SlotRecord("m1", 0, 11, last_status="running", placed_node="n1", placed_at_s=NOW),
             SlotRecord("m1", 1, 12, last_status="running", placed_node="n2", placed_at_s=NOW)]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n2"])]
    nodes = [node("n1", NodeState.ALLOCATED), node("n2", NodeState.ALLOCATED)]
    return nodes, jobs, slots


def test_newcomers_of_a_restart_mode_job_are_published_together():
    """Each membership of a restart-mode job is a new generation of its script: its first
    newcomers wait for the others (up to publish_batch_s)."""
    nodes, jobs, slots = _two_starting_slots()
    rec = record(state=JobPhase.STARTING)
    rec = dataclasses.replace(rec, spec=dataclasses.replace(rec.spec, mode="restart"))
    early = CoordView(live={"s0-r0": Registration("n1", NOW - 2)})
    plan = decide(world(nodes, jobs, slots, [rec], {"m1": early}), POLICY)
    assert not kinds(plan, Publish)  # s1 is still starting: wait for it
    late = CoordView(live={"s0-r0": Registration("n1", NOW - 20)})
    plan = decide(world(nodes, jobs, slots, [rec], {"m1": late}), POLICY)
    assert kinds(plan, Publish) == [Publish("m1", ("s0-r0",), 0)]  # waited long enough
    both = CoordView(live={"s0-r0": Registration("n1", NOW - 2),
                           "s1-r1": Registration("n2", NOW - 1),
                           "s1-r0": Registration("n2", NOW - 90)})  # stale incarnation
    plan = decide(world(nodes, jobs, slots, [rec], {"m1": both}), POLICY)
    assert kinds(plan, Publish) == [Publish("m1", ("s0-r0", "s1-r1"), 0)]
    assert Transit("m1", JobPhase.RUNNING, "training on 2 node(s)") in plan.actions


def test_a_native_job_training_on_nothing_starts_on_its_first_newcomer():
    nodes, jobs, slots = _two_starting_slots()
    early = CoordView(live={"s0-r0": Registration("n1", NOW - 2)})
    plan = decide(world(nodes, jobs, slots, [record(state=JobPhase.STARTING)], {"m1": early}),
                  POLICY)
    assert kinds(plan, Publish) == [Publish("m1", ("s0-r0",), 0)]
    assert Transit("m1", JobPhase.RUNNING, "training on 1 node(s)") in plan.actions


def test_a_slot_released_behind_the_daemons_back_is_held_again():
    w = world([node("n1")], [slot_job(11, "m1", 0, JobState.PENDING, "Priority")],
              [SlotRecord("m1", 0, 11)], [record(max_nodes=1)])
    plan = decide(w, POLICY)
    assert kinds(plan, Hold) == [Hold("m1", 0, 11, "no longer planned")]


def test_finished_job_completes_and_cancels_its_parked_slots():
    cv = CoordView(finished_samples=5000)
    slots = [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12)]
    jobs = [slot_job(11, "m1", 0, JobState.COMPLETED, end=NOW - 1),
            slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser")]
    plan = decide(world([node("n1")], jobs, slots, [record(state=JobPhase.RUNNING)],
                        {"m1": cv}), POLICY)
    assert [a.to for a in kinds(plan, Transit)] == [JobPhase.COMPLETING]
    plan = decide(world([node("n1")], jobs, slots, [record(state=JobPhase.COMPLETING)],
                        {"m1": cv}), POLICY)
    assert kinds(plan, Cancel) == [Cancel("m1", 1, 12)]
    jobs[1] = slot_job(12, "m1", 1, JobState.CANCELLED)
    plan = decide(world([node("n1")], jobs, slots, [record(state=JobPhase.COMPLETING)],
                        {"m1": cv}), POLICY)
    assert [a.to for a in kinds(plan, Transit)] == [JobPhase.COMPLETED]


def test_a_job_whose_slots_were_all_cancelled_by_the_user_is_cancelled():
    jobs = [slot_job(11, "m1", 0, JobState.CANCELLED)]
    plan = decide(world([node("n1")], jobs, [SlotRecord("m1", 0, 11)],
                        [record(max_nodes=1)]), POLICY)
    assert [a.to for a in kinds(plan, Transit)] == [JobPhase.CANCELLING]


def test_decide_is_pure_and_deterministic():
    w = world([node("n1"), node("n2")],
              [slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser"),
               slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser")],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12)], [record()])
    assert decide(w, POLICY).actions == decide(w, POLICY).actions


def test_a_job_without_progress_reports_is_stalled_then_failed():
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1")]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"])]
    nodes = [node("n1", NodeState.ALLOCATED)]
    quiet = CoordView(epoch=1, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW - 300)},
                      samples_total=100, progress_at_s=NOW - 45)
    rec = record(state=JobPhase.RUNNING, max_nodes=1)  # running since NOW - 398
    plan = decide(world(nodes, jobs, slots, [rec], {"m1": quiet}, heartbeat_timeout_s=30),
                  POLICY)
    assert [a.to for a in kinds(plan, Transit)] == [JobPhase.STALLED]
    stalled = JobRecord(rec.job_id, rec.seq, rec.uid, rec.user, rec.spec,
                        advance(rec.lifecycle, JobPhase.STALLED, NOW - 100, "quiet"),
                        rec.created_s)
    silent = CoordView(epoch=1, members=("s0-r0",), live=quiet.live, samples_total=100,
                       progress_at_s=NOW - 150)  # nothing since it was declared stalled
    plan = decide(world(nodes, jobs, slots, [stalled], {"m1": silent}, heartbeat_timeout_s=30),
                  POLICY)
    assert [a.to for a in kinds(plan, Transit)] == [JobPhase.FAILED]
    alive = CoordView(epoch=1, members=("s0-r0",), live=quiet.live, samples_total=200,
                      progress_at_s=NOW - 1)
    plan = decide(world(nodes, jobs, slots, [stalled], {"m1": alive}, heartbeat_timeout_s=30),
                  POLICY)
    assert [a.to for a in kinds(plan, Transit)] == [JobPhase.RUNNING]


def test_a_slot_near_its_time_limit_is_extended_only_as_far_as_the_window_allows():
    from malletrain.daemon.tick.actions import Extend

    def running_slot(claim_in_s):
        sj = Job(job_id=11, name="mt.m1.s0", user="alice", partition="scavenger",
                 state=JobState.RUNNING, node_count=1, nodes=("n1",), time_limit_s=3600,
                 start_time=NOW - 3500, comment=slot_tag("m1", 0))
        jobs = [sj]
        if claim_in_s is not None:
            jobs.append(Job(job_id=99, name="big", user="bob", partition="batch",
                            state=JobState.PENDING, node_count=1, planned_nodes=("n1",),
                            start_time=NOW + claim_in_s))
        cv = CoordView(epoch=1, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW)},
                       samples_total=10, progress_at_s=NOW)
        return world([node("n1", NodeState.ALLOCATED)], jobs,
                     [SlotRecord("m1", 0, 11, last_status="running", last_node="n1")],
                     [record(state=JobPhase.RUNNING, max_nodes=1)], {"m1": cv},
                     max_slot_time_s=3600)

    assert kinds(decide(running_slot(None), POLICY), Extend) == [Extend("m1", 0, 11, 118)]
    assert kinds(decide(running_slot(60), POLICY), Extend) == []  # a job is planned there


def test_yield_ahead_gives_back_held_nodes_whose_claim_is_due_or_overdue():
    claims = {"n1": Claim(NOW + 5, "job 99"), "n2": Claim(NOW - 3, "job 98"),
              "n3": Claim(NOW + 300, "job 97"), "n5": Claim(NOW, "reservation maint")}
    held = ["n1", "n2", "n3", "n4"]
    assert yield_ahead(held, claims, NOW, 10).now == {"n1": claims["n1"], "n2": claims["n2"]}
    assert yield_ahead(held, claims, NOW, 0).now == {"n2": claims["n2"]}  # overdue only
    assert yield_ahead([], claims, NOW, 10).now == {}  # free nodes are not its business
    assert yield_ahead(held, claims, NOW, 10).waiting == {}


def test_a_claim_due_as_its_job_arrives_is_left_to_slurm_for_confirm_s():
    claims = {"n1": Claim(NOW, "job 99", submitted_at=NOW - 0.4),  # due on arrival
              "n2": Claim(NOW + 5, "job 98", submitted_at=NOW - 0.4),  # ahead: give back
              "n3": Claim(NOW - 1, "job 97", submitted_at=NOW - 1.5),  # Slurm had its pass
              "n4": Claim(NOW, "reservation maint")}  # no submission: give back
    out = yield_ahead(["n1", "n2", "n3", "n4"], claims, NOW, 10, confirm_s=1.0)
    assert out.waiting == {"n1": claims["n1"]}
    assert out.now == {n: claims[n] for n in ("n2", "n3", "n4")}
    # confirm_s=0 restores giving back at once
    assert yield_ahead(["n1"], claims, NOW, 10, confirm_s=0.0).now == {"n1": claims["n1"]}


def _held_on_n1_n2(claim_in_s, policy_name="equal-share", submitted_ago_s=None):
    """Two running members on n1, n2; a regular 1-node job planned on n2 in claim_in_s."""
    bob = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.PENDING,
              node_count=2, planned_nodes=("n2", "n3"), start_time=NOW + claim_in_s,
              state_reason="Resources",
              submit_time=None if submitted_ago_s is None else NOW - submitted_ago_s)
    busy = Job(job_id=98, name="other", user="bob", partition="batch", state=JobState.RUNNING,
               node_count=1, nodes=("n3",))
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
             SlotRecord("m1", 1, 12, last_status="running", last_node="n2")]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n2"]), bob, busy]
    cv = CoordView(epoch=3, members=("s0-r0", "s1-r0"),
                   live={"s0-r0": Registration("n1", NOW - 60),
                         "s1-r0": Registration("n2", NOW - 60)},
                   samples_total=1000, progress_at_s=NOW - 1)
    nodes = [node("n1", NodeState.ALLOCATED), node("n2", NodeState.ALLOCATED),
             node("n3", NodeState.ALLOCATED)]
    return decide(world(nodes, jobs, slots, [record(state=JobPhase.RUNNING)], {"m1": cv}),
                  make_policy(policy_name))


def test_a_held_node_a_regular_job_is_due_on_is_given_back_before_slurm_preempts_it():
    # equal-share values nodes by count only: without yield_ahead it would keep n2 until
    # Slurm preempts the slot; the job waits on n3 meanwhile
    for claim_in_s in (0.0, 4.0, -20.0):
        plan = _held_on_n1_n2(claim_in_s)
        assert plan.targets["m1"] == ("n1",)
        assert Leave("m1", 1) in plan.actions
        assert Publish("m1", ("s0-r0",), 2) in plan.actions
        assert [n.name for n in plan.held_nodes] == ["n1"]
        assert any("n2: given back ahead of job 99" in note for note in plan.notes)
        assert plan.follow_up  # the plan moves while job 99 waits: look again soon


def test_a_held_node_due_to_a_job_just_submitted_is_kept_until_slurm_had_its_pass():
    # in the first second after the submission Slurm's own pass preempts for the job (often
    # on other nodes than its plan names): the daemon keeps n2 but looks again soon
    plan = _held_on_n1_n2(0.0, submitted_ago_s=0.3)
    assert sorted(plan.targets["m1"]) == ["n1", "n2"]
    assert not kinds(plan, Leave) and not plan.notes
    assert plan.follow_up
    # still planned there a second after the submission: Slurm did not preempt; give it back
    later = _held_on_n1_n2(0.0, submitted_ago_s=1.2)
    assert later.targets["m1"] == ("n1",) and Leave("m1", 1) in later.actions


def test_a_held_node_with_a_claim_further_ahead_is_kept():
    plan = _held_on_n1_n2(120.0)
    assert sorted(plan.targets["m1"]) == ["n1", "n2"]
    assert not kinds(plan, Leave) and not kinds(plan, Park)
    assert not plan.follow_up


def test_yield_ahead_is_capped_by_min_slot_time_so_a_given_back_node_is_not_placed_again():
    # a 30 s claim with yield_ahead_s=60 but min_slot_time_s=20: kept (capped at 20 s);
    # had it been given back, the free pool (window > 20 s) would offer it again at once
    bob = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.PENDING,
              node_count=1, planned_nodes=("n1",), start_time=NOW + 30)
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1")]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]), bob]
    cv = CoordView(epoch=1, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW - 60)},
                   samples_total=10, progress_at_s=NOW)
    w = world([node("n1", NodeState.ALLOCATED)], jobs, slots,
              [record(state=JobPhase.RUNNING, max_nodes=1)], {"m1": cv},
              yield_ahead_s=60, min_slot_time_s=20)
    plan = decide(w, POLICY)
    assert plan.targets["m1"] == ("n1",) and not kinds(plan, Leave)


def test_our_own_released_slot_planned_on_its_node_is_not_a_claim():
    # a placed (released) slot is a pending job that backfill plans onto its own node now;
    # that plan must not end the node's window, or the slot would be held again at once
    slots = [SlotRecord("m1", 0, 11, placed_node="n1", placed_at_s=NOW - 1)]
    placing = Job(job_id=11, name="mt.m1.s0", user="alice", partition="scavenger",
                  state=JobState.PENDING, state_reason="Resources", node_count=1,
                  planned_nodes=("n1",), start_time=NOW, comment=slot_tag("m1", 0))
    plan = decide(world([node("n1")], [placing], slots,
                        [record(state=JobPhase.STARTING, max_nodes=1)]), POLICY)
    assert plan.targets["m1"] == ("n1",)
    assert not kinds(plan, Hold) and not plan.notes


def test_decide_gives_a_held_node_to_an_unplanned_job_and_does_not_grow_onto_free_ones():
    # m1 runs on n1, n2 and may grow onto idle n3; regular job 28 needs 2 nodes, submitted
    # 1.5 s ago, no plan: n3 is withheld and one of m1's nodes is given back
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n2"]),
            slot_job(13, "m1", 2, JobState.PENDING, "JobHeldUser"),
            Job(job_id=28, name="reg", user="bob", partition="batch", state=JobState.PENDING,
                state_reason="Resources", node_count=2, submit_time=NOW - 1.5)]
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
             SlotRecord("m1", 1, 12, last_status="running", last_node="n2"),
             SlotRecord("m1", 2, 13)]
    cv = CoordView(epoch=3, members=("s0-r0", "s1-r0"),
                   live={"s0-r0": Registration("n1", NOW - 60),
                         "s1-r0": Registration("n2", NOW - 60)},
                   samples_total=1000, progress_at_s=NOW - 1)
    nodes = [node("n1", NodeState.ALLOCATED), node("n2", NodeState.ALLOCATED), node("n3")]
    w = world(nodes, jobs, slots, [record(state=JobPhase.RUNNING, max_nodes=3)], {"m1": cv})
    plan = decide(w, make_policy("equal-share"))
    assert plan.targets["m1"] == ("n2",)
    assert Leave("m1", 0) in plan.actions and not kinds(plan, Place)
    assert plan.notes == ("n1: given back to job 28 (pending, not planned to start yet)",)
    assert plan.follow_up
    # off: the old behaviour (grow onto n3, keep both)
    off = decide(world(nodes, jobs, slots, [record(state=JobPhase.RUNNING, max_nodes=3)],
                       {"m1": cv}, yield_unplanned_s=0), make_policy("equal-share"))
    assert sorted(off.targets["m1"]) == ["n1", "n2", "n3"]


def test_a_completing_slot_on_a_node_slurm_already_gave_away_does_not_serve_the_next_job():
    # the e2e burst at 14:39:59: slot 16 completes on n3, which Slurm has already allocated
    # to regular job 27; job 28 (1 node, no plan) can only be served from m1's n1
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(16, "m1", 1, JobState.COMPLETING, nodes=["n3"]),
            Job(job_id=27, name="reg", user="bob", partition="batch", state=JobState.RUNNING,
                node_count=1, nodes=("n3",), submit_time=NOW - 2, start_time=NOW - 0.5),
            Job(job_id=28, name="reg", user="bob", partition="batch", state=JobState.PENDING,
                state_reason="Resources", node_count=1, submit_time=NOW - 1.5)]
    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
             SlotRecord("m1", 1, 16, last_status="running", last_node="n3")]
    cv = CoordView(epoch=3, members=("s0-r0",), live={"s0-r0": Registration("n1", NOW - 60)},
                   samples_total=1000, progress_at_s=NOW - 1)
    nodes = [node("n1", NodeState.ALLOCATED), node("n3", NodeState.ALLOCATED)]
    plan = decide(world(nodes, jobs, slots, [record(state=JobPhase.RUNNING)], {"m1": cv}),
                  make_policy("equal-share"))
    assert plan.notes == ("n1: given back to job 28 (pending, not planned to start yet)",)
    assert Leave("m1", 0) in plan.actions


def _m1_on(nodes_held, extra_jobs, *, leaving=()):
    """m1 holds ``nodes_held`` (slot i on the i-th); ``leaving``: of them, members leaving."""
    jobs, slots, live = [], [], {}
    for i, n in enumerate(nodes_held):
        jobs.append(slot_job(11 + i, "m1", i, JobState.RUNNING, nodes=[n]))
        slots.append(SlotRecord("m1", i, 11 + i, last_status="running", last_node=n,
                                leaving_since_s=NOW - 0.3 if n in leaving else None))
        if n not in leaving:
            live[f"s{i}-r0"] = Registration(n, NOW - 60)
    cv = CoordView(epoch=3, members=tuple(live), live=live, samples_total=1000,
                   progress_at_s=NOW - 1)
    nodes = [node(n, NodeState.ALLOCATED) for n in nodes_held]
    nodes += [node(n, NodeState.ALLOCATED) for j in extra_jobs for n in j.nodes
              if n not in nodes_held]
    return world(nodes, jobs + list(extra_jobs), slots,
                 [record(state=JobPhase.RUNNING, max_nodes=4)], {"m1": cv})


def test_a_job_whose_due_plan_went_stale_gets_its_held_planned_node_and_one_more():
    # e2e run 13, 17:27:15.46: job 31 (2 nodes) was planned on n5 and n6, then job 30 got n6;
    # giving back n5 alone left job 31 waiting 1.5 s for Slurm's next plan
    job30 = Job(job_id=30, name="reg", user="bob", partition="batch", state=JobState.RUNNING,
                node_count=2, nodes=("n4", "n6"), submit_time=NOW - 2, start_time=NOW - 0.3,
                end_time=NOW + 119.7)  # -t 2
    job31 = Job(job_id=31, name="reg", user="bob", partition="batch", state=JobState.PENDING,
                state_reason="Resources", node_count=2, planned_nodes=("n5", "n6"),
                start_time=NOW - 0.5, submit_time=NOW - 1.5)
    plan = decide(_m1_on(["n2", "n3", "n5"], [job30, job31]), make_policy("equal-share"))
    assert sorted(plan.notes) == [
        "n2: given back to job 31 (pending, not planned to start yet)",
        "n5: given back to job 31 (pending, not planned to start yet)"]
    assert plan.targets["m1"] == ("n3",) and plan.follow_up


def test_leaving_nodes_another_jobs_due_plan_names_do_not_serve_a_later_job():
    # e2e run 14, 17:31:54.2: m1's members on n5, n6 leave for job 27 (due plan there); job
    # 28 (2 nodes, no plan) was counted as served by them and waited 1.1 s for its own plan
    job27 = Job(job_id=27, name="reg", user="bob", partition="batch", state=JobState.PENDING,
                state_reason="Resources", node_count=2, planned_nodes=("n5", "n6"),
                start_time=NOW, submit_time=NOW - 1.3)
    job28 = Job(job_id=28, name="reg", user="bob", partition="batch", state=JobState.PENDING,
                state_reason="Priority", node_count=2, submit_time=NOW - 1.2)
    plan = decide(_m1_on(["n3", "n4", "n5", "n6"], [job27, job28], leaving=("n5", "n6")),
                  make_policy("equal-share"))
    assert sorted(plan.notes) == [
        "n3: given back to job 28 (pending, not planned to start yet)",
        "n4: given back to job 28 (pending, not planned to start yet)"]


def test_a_busy_job_keeps_its_nodes_gets_no_actions_and_no_one_is_planned_onto_them():
    """Its placement on n1 is still being applied (off the tick): n1 is its, whatever the
    policy would now prefer, and m2 gets only n2."""
    import dataclasses

    slots = [SlotRecord("m1", 0, 11, placed_node="n1", placed_at_s=NOW - 1),
             SlotRecord("m1", 1, 12), SlotRecord("m2", 0, 21), SlotRecord("m2", 1, 22)]
    jobs = [slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser"),
            slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser"),
            slot_job(21, "m2", 0, JobState.PENDING, "JobHeldUser"),
            slot_job(22, "m2", 1, JobState.PENDING, "JobHeldUser")]
    w = world([node("n1"), node("n2")], jobs, slots,
              [record("m1", JobPhase.STARTING), record("m2", seq=2)])
    plan = decide(dataclasses.replace(w, busy=frozenset({"m1"})), POLICY)
    assert plan.targets["m1"] == ("n1",)
    assert not [a for a in plan.actions if a.job_id == "m1"]
    assert [p.node for p in kinds(plan, Place) if p.job_id == "m2"] == ["n2"]
    # not busy: the equal share moves things as it likes (here it keeps n1 for m1 as well)
    free = decide(w, POLICY)
    assert any(a.job_id == "m1" for a in free.actions)


def test_seen_slots_marks_only_what_changed_and_skips_busy_jobs():
    from dataclasses import replace

    from malletrain.daemon.tick.views import job_slots, seen_slots

    slots = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),  # as recorded
             SlotRecord("m1", 1, 12, last_status="parked"),                   # now running
             SlotRecord("m1", 2, 13, last_status="running", last_node="n3"),  # now held
             SlotRecord("m2", 0, 21, last_status="parked")]                   # busy: skipped
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
            slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n2"]),
            slot_job(13, "m1", 2, JobState.PENDING, reason="JobHeldUser"),
            slot_job(21, "m2", 0, JobState.RUNNING, nodes=["n4"])]
    w = world([node(f"n{i}", NodeState.ALLOCATED) for i in range(1, 5)], jobs, slots,
              [record(max_nodes=3), record("m2", seq=2)])
    w = replace(w, busy=frozenset({"m2"}))
    views = {jid: js.views for jid, js in job_slots(w).items()}
    nodes, marks = seen_slots(views, w)
    assert nodes == {"m1": ("n1", "n2")}
    assert marks == [("m1", 1, {"last_status": "running", "last_node": "n2"}),
                     ("m1", 2, {"last_status": "parked"})]
