"""Each pure step of a tick on its own (malletrain/daemon/tick/): views, screen, pool,
allocate, reconcile, membership. ``test_daemon_decide.py`` tests the whole pipeline."""

from __future__ import annotations

import dataclasses

from tick_scenes import NOW, node, record, slot_job, world

from malletrain.core.cluster import Job, JobState, NodeState
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import IdleNode, MalleableJob, ThroughputModel
from malletrain.core.policies import make_policy
from malletrain.daemon.jobs.slots import SlotStatus, member_id, slot_tag
from malletrain.daemon.jobs.store import SlotRecord
from malletrain.daemon.tick import CoordView, Registration, decide
from malletrain.daemon.tick.actions import Cancel, ClearMarks, Hold, Leave, Park, Place, Transit
from malletrain.daemon.tick.allocate import allocate, policy_jobs
from malletrain.daemon.tick.membership import next_membership, phase_transitions
from malletrain.daemon.tick.pool import build_pool, holdings, regular_jobs
from malletrain.daemon.tick.reconcile import JobContext, SlotDiff, reconcile
from malletrain.daemon.tick.screen import screen
from malletrain.daemon.tick.views import job_slots, sigtermed, slot_member

M0, M1 = member_id(0, 0), member_id(1, 0)


def _ctx(w, job, target=(), windows=None):
    return JobContext.of(w, job, target, windows or {})


# -- views -------------------------------------------------------------------------------


def test_views_a_recycled_slurm_id_tagged_for_another_slot_is_gone():
    foreign = Job(job_id=11, name="x", user="bob", partition="batch", state=JobState.RUNNING,
                  node_count=1, nodes=("n1",), comment=slot_tag("m9", 0))
    w = world([node("n1")], [foreign, slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n2"])],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12)], [record()])
    views = job_slots(w)["m1"].views
    assert [v.status for v in views] == [SlotStatus.GONE, SlotStatus.RUNNING]
    assert views[1].node == "n2"


def test_views_the_newest_incarnation_is_the_member_and_its_departure_counts():
    live = {member_id(0, 0): Registration("n1", NOW - 9), member_id(0, 2): Registration("n1", NOW)}
    assert slot_member(0, live) == member_id(0, 2)
    assert slot_member(1, live) is None
    cv = CoordView(departed={member_id(0, 3): NOW}, sigtermed=frozenset({member_id(0, 3)}))
    assert sigtermed(0, cv)
    # a newer live incarnation registered since: not a SIGTERM departure any more
    assert not sigtermed(0, CoordView(live={member_id(0, 4): Registration("n1", NOW)},
                                      departed=cv.departed, sigtermed=cv.sigtermed))


# -- screen ------------------------------------------------------------------------------


def test_screen_winds_down_a_completing_job_and_keeps_a_managed_one():
    done = record("m1", JobPhase.COMPLETING)
    live = record("m2", JobPhase.RUNNING, seq=2)
    running = slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"])
    parked = slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser")
    other = slot_job(21, "m2", 0, JobState.RUNNING, nodes=["n2"])
    w = world([node("n1"), node("n2")], [running, parked, other],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12), SlotRecord("m2", 0, 21)],
              [done, live], finish_grace_s=10_000.0)
    out = screen(w, job_slots(w))
    assert [j.job_id for j in out.managed] == ["m2"]
    # within the grace the running slot may finish on its own; the parked one goes at once
    assert out.actions == (Cancel("m1", 1, 12),)
    w_late = world([node("n1")], [running], [SlotRecord("m1", 0, 11)], [done],
                   finish_grace_s=0.0)
    assert screen(w_late, job_slots(w_late)).actions == (Cancel("m1", 0, 11),)


def test_screen_stop_conditions_take_a_job_out_of_the_allocation():
    job = record("m1", JobPhase.RUNNING)
    slots = [SlotRecord("m1", 0, 11)]
    jobs = [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"])]
    w = world([node("n1")], jobs, slots, [job], coord={"m1": CoordView(finished_samples=640)})
    out = screen(w, job_slots(w))
    assert out.managed == ()
    assert out.actions == (
        Transit("m1", JobPhase.COMPLETING, "stop condition reached: 640 samples"),)
    gone = world([node("n1")], [], slots, [job])
    assert screen(gone, job_slots(gone)).actions[0].to is JobPhase.CANCELLING


def test_screen_fails_a_job_whose_last_state_could_not_be_saved():
    """Issue 49: an evict-to-zero save that failed lost the state without a word."""
    job = record("m1", JobPhase.RUNNING)
    slots = [SlotRecord("m1", 0, 11)]
    jobs = [slot_job(11, "m1", 0, JobState.PENDING)]
    w = world([node("n1")], jobs, slots, [job],
              coord={"m1": CoordView(state_lost=frozenset({M0}))})
    (failed,) = screen(w, job_slots(w)).actions
    assert failed.to is JobPhase.FAILED and "training state lost" in failed.reason


# -- pool --------------------------------------------------------------------------------


def test_pool_holdings_running_placed_and_leaving_slots():
    job = record("m1", JobPhase.RUNNING, max_nodes=3)
    w = world([node("n1"), node("n2"), node("n3")],
              [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
               slot_job(12, "m1", 1, JobState.PENDING, "Resources"),
               slot_job(13, "m1", 2, JobState.RUNNING, nodes=["n3"])],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12, placed_node="n2"),
               SlotRecord("m1", 2, 13, leaving_since_s=NOW - 1)], [job])
    h = holdings(w, (job,), job_slots(w), regular_jobs(w.snapshot))
    assert h.held == {"m1": ("n1", "n2")}
    assert h.placing == {"n2"} and h.freeing == {"n3"}


def test_pool_offers_long_windows_and_our_leftovers_at_zero():
    job = record("m1", JobPhase.RUNNING, max_nodes=2)
    soon = Job(job_id=99, name="big", user="bob", partition="batch", state=JobState.PENDING,
               node_count=1, planned_nodes=("n2",), start_time=NOW + 30, submit_time=NOW - 50)
    busy = NodeState.ALLOCATED
    w = world([node("n1", busy), node("n2"), node("n3", busy)],
              [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
               slot_job(12, "m1", 1, JobState.RUNNING, nodes=["n3"]), soon],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12, leaving_since_s=NOW - 1)],
              [job], min_slot_time_s=60.0)
    pool = build_pool(w, (job,), job_slots(w))
    assert [n.name for n in pool.held] == ["n1"]
    assert pool.free == ()  # n2's 30 s window is shorter than a slot is worth
    assert [(n.name, n.window_s) for n in pool.leaving] == [("n2", 0.0), ("n3", 0.0)]
    assert pool.offered == {"n1"} and not pool.give_back.follow_up


# -- allocate ----------------------------------------------------------------------------


def test_allocate_caps_jobs_at_their_usable_slots_and_targets_only_offered_nodes():
    big = record("m1", JobPhase.QUEUED, max_nodes=4)
    w = world([node("n1"), node("n2")],
              [slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser"),
               slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser")],
              [SlotRecord("m1", k, 11 + k) for k in range(4)], [big])
    slots = job_slots(w)
    jobs = policy_jobs(0.0, (big,), slots, {"m1": ()}, {})
    assert [(j.job_id, j.max_nodes) for j in jobs] == [("m1", 2)]  # two slots are gone
    pool = build_pool(w, (big,), slots)
    out = allocate(NOW, pool, jobs, make_policy("equal-share"))
    assert sorted(out.targets["m1"]) == ["n1", "n2"]
    assert allocate(NOW, pool, (), make_policy("equal-share")).plan is None


def test_allocate_gives_a_gpu_job_only_nodes_of_its_gpu_model():
    """Node types from Slurm's GRES (issue 19 §1): a job that asks for a100 GPUs is offered
    only a100 nodes, a job that asks for any GPU only GPU nodes, a CPU job every node."""
    from malletrain.daemon.jobs.spec import JobSpec
    from malletrain.daemon.tick.allocate import allowed_types

    def gpu_node(name, gres):
        return dataclasses.replace(node(name), gres=gres)

    a100 = dataclasses.replace(record("m1", JobPhase.QUEUED, max_nodes=4), spec=JobSpec(
        script="/x/t.py", min_nodes=1, max_nodes=4, gpus_per_node=4, gpu_type="A100"))
    w = world([gpu_node("n1", "gpu:v100:4"), gpu_node("n2", "gpu:a100:4(S:0-1)"),
               gpu_node("n3", "gpu:a100:4"), node("n4")],
              [slot_job(11 + k, "m1", k, JobState.PENDING, "JobHeldUser") for k in range(4)],
              [SlotRecord("m1", k, 11 + k) for k in range(4)], [a100])
    out = decide(w, make_policy("malletrain"))
    assert sorted(out.targets["m1"]) == ["n2", "n3"]
    any_gpu = JobSpec(script="/x/t.py", gpus_per_node=1)
    assert allowed_types(any_gpu, frozenset({"a100", "v100"})) == {"a100", "v100"}
    assert allowed_types(JobSpec(script="/x/t.py"), frozenset({"a100"})) is None


def test_allocate_never_targets_a_zero_window_leftover():
    class Greedy:
        name = "greedy"

        def decide(self, inp):
            from malletrain.core.model import Plan
            return Plan({j.job_id: tuple(n.name for n in inp.nodes) for j in inp.jobs}, 0.0, 0.0)

    job = MalleableJob("m1", 1, 4, (), ThroughputModel(((1, 1.0),), 1.0), 3.0, 1.0)
    w = world([node("n1")], [], [], [])
    pool = build_pool(w, (), {})
    pool = dataclasses.replace(pool, free=(IdleNode("n1", None, 5.0),),
                               leaving=(IdleNode("n9", 0.0, 5.0),))
    assert allocate(NOW, pool, (job,), Greedy()).targets == {"m1": ("n1",)}


# -- reconcile ---------------------------------------------------------------------------


def test_reconcile_a_member_off_target_leaves_and_parked_slots_fill_the_target():
    job = record("m1", JobPhase.RUNNING, max_nodes=3)
    cv = {"m1": CoordView(members=(M0,), live={M0: Registration("n1", NOW - 60)})}
    w = world([node("n1"), node("n2"), node("n3")],
              [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"]),
               slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser"),
               slot_job(13, "m1", 2, JobState.PENDING, "JobHeldUser")],
              [SlotRecord("m1", 0, 11), SlotRecord("m1", 1, 12, placed_node="n9"),
               SlotRecord("m1", 2, 13)], [job], coord=cv)
    d = reconcile(_ctx(w, job, target=("n2", "n3")), job_slots(w)["m1"])
    assert d.actions[0] == Leave("m1", 0) and d.leaving_needed
    assert ClearMarks("m1", 1) in d.actions  # a parked slot forgets its old placement
    places = [a for a in d.actions if isinstance(a, Place)]
    assert [(p.slot, p.node) for p in places] == [(1, "n2"), (2, "n3")]
    assert d.waiting_for == 2 and d.notes == []


def test_reconcile_a_node_given_back_stops_a_restart_job_at_once_a_native_one_leaves():
    cv = {"m1": CoordView(members=(M0,), live={M0: Registration("n1", NOW - 60)})}
    for mode, leaves in (("native", True), ("restart", False)):
        job = record("m1", JobPhase.RUNNING, max_nodes=1)
        job = dataclasses.replace(job, spec=dataclasses.replace(
            job.spec, mode=mode, stop_grace_s=30 if mode == "restart" else 0))
        w = world([node("n1")], [slot_job(11, "m1", 0, JobState.RUNNING, nodes=["n1"])],
                  [SlotRecord("m1", 0, 11)], [job], coord=cv)
        d = reconcile(JobContext.of(w, job, (), {}, giving_back={"n1"}), job_slots(w)["m1"])
        if leaves:  # its step boundary comes in a fraction of a second, progress kept
            assert d.actions == [Leave("m1", 0)]
        else:  # its --signal grace could hold the node 30 s: Slurm's SIGTERM instead
            (park,) = d.actions
            assert isinstance(park, Park) and park.node == "n1" and "regular job" in park.why
        assert d.leaving_needed
    # a restart-mode job's node re-planned for another malleable job still stops gracefully
    d = reconcile(_ctx(w, job), job_slots(w)["m1"])
    assert d.actions == [Leave("m1", 0)]


def test_reconcile_a_placed_slot_no_longer_wanted_is_held_and_an_ended_one_parked():
    job = record("m1", JobPhase.RUNNING, max_nodes=2)
    w = world([node("n1"), node("n2")],
              [slot_job(11, "m1", 0, JobState.PENDING, "Resources"),
               slot_job(12, "m1", 1, JobState.COMPLETED, nodes=["n2"], end=NOW - 1)],
              [SlotRecord("m1", 0, 11, placed_node="n1", placed_at_s=NOW - 5),
               SlotRecord("m1", 1, 12, last_status="running", last_node="n2")], [job])
    d = reconcile(_ctx(w, job), job_slots(w)["m1"])
    assert d.actions[0] == Hold("m1", 0, 11, "no longer planned")
    park = d.actions[1]
    assert isinstance(park, Park) and park.preempted and park.node == "n2"


def test_reconcile_an_ended_slot_whose_member_never_left_names_it_gone():
    """SIGKILL or a lost node: the member never announced its departure. The actuator
    records it, so newcomers waiting for the last group to leave stop waiting for it."""
    job = record("m1", JobPhase.RUNNING, max_nodes=2)
    ended = [slot_job(11, "m1", 0, JobState.FAILED, nodes=["n1"], end=NOW - 1),
             slot_job(12, "m1", 1, JobState.COMPLETED, nodes=["n2"], end=NOW - 1)]
    recs = [SlotRecord("m1", 0, 11, last_status="running", last_node="n1"),
            SlotRecord("m1", 1, 12, last_status="running", last_node="n2")]
    cv = CoordView(members=(M0, M1), live={M0: Registration("n1", NOW - 30)},
                   departed={M1: NOW - 2})
    w = world([node("n1"), node("n2")], ended, recs, [job], coord={"m1": cv})
    parks = [a for a in reconcile(_ctx(w, job), job_slots(w)["m1"]).actions
             if isinstance(a, Park)]
    assert [(p.slot, p.gone_member) for p in parks] == [(0, M0), (1, None)]


def test_reconcile_notes_a_target_no_slot_is_left_for():
    job = record("m1", JobPhase.QUEUED, max_nodes=1)
    w = world([node("n1"), node("n2")], [slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser")],
              [SlotRecord("m1", 0, 11)], [job])
    d = reconcile(_ctx(w, job, target=("n1", "n2")), job_slots(w)["m1"])
    assert len([a for a in d.actions if isinstance(a, Place)]) == 1
    assert d.notes == ["m1: no parked slot left for n2"]


# -- membership --------------------------------------------------------------------------


def test_membership_newcomers_wait_for_each_other_up_to_the_batch_time():
    job = record("m1", JobPhase.RUNNING)
    w = world([], [], [], [job], coord={"m1": CoordView(
        members=(M0,), live={M0: Registration("n1", NOW - 60), M1: Registration("n2", NOW - 1)})},
        publish_batch_s=8.0)
    ctx = _ctx(w, job)
    d = SlotDiff(survivors=[M0], ready=[(NOW - 1, M1)], waiting_for=1)
    assert next_membership(ctx, d) is None  # another newcomer is on its way
    assert next_membership(ctx, SlotDiff(survivors=[M0], ready=[(NOW - 1, M1)])) == (M0, M1)
    late = SlotDiff(survivors=[M0], ready=[(NOW - 9, M1)], waiting_for=1)
    assert next_membership(ctx, late) == (M0, M1)
    assert next_membership(ctx, SlotDiff(leaving_needed=True)) == ()


def test_a_job_training_on_nothing_publishes_its_first_newcomer_at_once():
    """An evicted (or starting) job gains nothing by waiting for its other newcomers: it
    trains on the first one while they start up, and they join at a step boundary."""
    job = record("m1", JobPhase.STARTING)
    w = world([], [], [], [job], coord={"m1": CoordView(
        members=(), live={M1: Registration("n2", NOW - 1)})}, publish_batch_s=8.0)
    d = SlotDiff(ready=[(NOW - 1, M1)], waiting_for=3)
    assert next_membership(_ctx(w, job), d) == (M1,)
    assert next_membership(_ctx(w, job), SlotDiff(waiting_for=3)) is None
    restart = dataclasses.replace(job, spec=dataclasses.replace(job.spec, mode="restart"))
    assert next_membership(_ctx(w, restart), d) is None  # 1 then 4 would restart the script


def test_membership_phases_follow_what_is_seen():
    queued = record("m1", JobPhase.QUEUED)
    w = world([], [], [], [queued], heartbeat_timeout_s=30.0)
    assert [t.to for t in phase_transitions(_ctx(w, queued), 0, True)] == [JobPhase.STARTING]
    assert [t.to for t in phase_transitions(_ctx(w, queued), 2, True)] == [
        JobPhase.STARTING, JobPhase.RUNNING]
    running = record("m1", JobPhase.RUNNING)
    quiet = world([], [], [], [running], coord={"m1": CoordView(
        members=(M0,), progress_at_s=NOW - 100)}, heartbeat_timeout_s=30.0)
    assert [t.to for t in phase_transitions(_ctx(quiet, running), 1, True)] == [
        JobPhase.STALLED]
    fresh = world([], [], [], [running], coord={"m1": CoordView(
        members=(M0,), progress_at_s=NOW - 1)}, heartbeat_timeout_s=30.0)
    assert phase_transitions(_ctx(fresh, running), 1, True) == []
    assert phase_transitions(_ctx(quiet, running), 0, False)[0].to is JobPhase.EVICTED


def test_views_a_slot_changed_outside_malletrain_is_no_longer_used():
    """Slots are re-checked every tick, not only at attach (issue 15): owner, partition, size."""
    moved = slot_job(11, "m1", 0, JobState.PENDING, "JobHeldUser")
    moved = dataclasses.replace(moved, partition="batch")
    grown = dataclasses.replace(slot_job(12, "m1", 1, JobState.PENDING, "JobHeldUser"),
                                node_count=4)
    stolen = dataclasses.replace(slot_job(13, "m1", 2, JobState.RUNNING, nodes=["n3"]),
                                 user="bob")
    fine = slot_job(14, "m1", 3, JobState.PENDING, "JobHeldUser")
    w = world([node("n3")], [moved, grown, stolen, fine],
              [SlotRecord("m1", k, 11 + k) for k in range(4)], [record(max_nodes=4)])
    js = job_slots(w)["m1"]
    assert [v.status for v in js.views] == [SlotStatus.GONE] * 3 + [SlotStatus.PARKED]
    assert js.changed == (
        "m1: slot job 11 moved to partition batch; no longer used",
        "m1: slot job 12 asks for 4 nodes; no longer used",
        "m1: slot job 13 belongs to bob, not alice; no longer used",
    )
    plan = decide(w, make_policy("equal-share"))
    assert js.changed[0] in plan.notes
    assert all(getattr(a, "slurm_job_id", 14) == 14 for a in plan.actions
               if not isinstance(a, Transit))


def test_allocate_meets_a_rate_target_on_the_cheapest_node_type():
    """Issue 19 §1, in the daemon: node prices from ``allocator.node_prices`` and a job's
    ``--rate-target`` reach the plan, which meets the target on the cheaper type and takes
    no node beyond it; without a target the same job takes every node of that type."""
    from malletrain.daemon.jobs.spec import JobSpec

    def gpu_node(name, gres):
        return dataclasses.replace(node(name), gres=gres)

    def job(target):
        return dataclasses.replace(record("m1", JobPhase.QUEUED, max_nodes=6), spec=JobSpec(
            script="/x/t.py", min_nodes=1, max_nodes=6, gpus_per_node=1, rate_target=target))

    nodes = [gpu_node(f"a{i}", "gpu:a100:1") for i in range(3)] + [
        gpu_node(f"v{i}", "gpu:v100:1") for i in range(3)]
    slots = [slot_job(11 + k, "m1", k, JobState.PENDING, "JobHeldUser") for k in range(6)]
    records = [SlotRecord("m1", k, 11 + k) for k in range(6)]
    prices = {"a100": 0.6, "v100": 0.1}
    # no model yet: the job competes as a linear one, 1 sample/s per node on either type
    w = world(nodes, slots, records, [job(2.0)], node_prices=prices)
    assert sorted(decide(w, make_policy("malletrain")).targets["m1"]) == ["v0", "v1"]
    w = world(nodes, slots, records, [job(None)], node_prices=prices)
    assert sorted(decide(w, make_policy("malletrain")).targets["m1"]) == ["v0", "v1", "v2"]


def test_a_rate_target_is_raised_while_the_job_is_behind_it():
    """A target is met on average since the job first started: a job that trained for
    900 s at half its target asks for more until it is back on schedule (30 minutes)."""
    from malletrain.daemon.jobs.spec import JobSpec
    from malletrain.daemon.tick.allocate import rate_target

    spec = JobSpec(script="/x/t.py", rate_target=2.0)
    queued = dataclasses.replace(record("m1", JobPhase.QUEUED), spec=spec)
    assert rate_target(queued, NOW) == 2.0  # never started: nothing owed yet
    started = dataclasses.replace(record("m1", JobPhase.RUNNING), spec=spec)
    assert rate_target(started, NOW) == 2.0  # no progress reported yet: its rate is unknown
    since = started.lifecycle.first_s(JobPhase.STARTING)
    behind = dataclasses.replace(started, samples_total=int(2.0 * (NOW - since) / 2))
    assert rate_target(behind, NOW) == 2.0 + (2.0 * (NOW - since) / 2) / 1800
    ahead = dataclasses.replace(started, samples_total=int(4.0 * (NOW - since)))
    assert rate_target(ahead, NOW) == 2.0
    assert rate_target(record("m1", JobPhase.RUNNING), NOW) is None


def test_a_job_that_excludes_nodes_is_planned_only_onto_the_others():
    """``--exclude`` in the daemon (issue 16): the excluded nodes are never a target, and
    the job is capped at the nodes it may use, so the plan does not count on the others."""
    from malletrain.daemon.jobs.spec import JobSpec

    job = dataclasses.replace(record("m1", JobPhase.QUEUED, max_nodes=4), spec=JobSpec(
        script="/x/t.py", min_nodes=1, max_nodes=4, exclude=("n1", "n3")))
    w = world([node(f"n{i}") for i in range(1, 5)],
              [slot_job(11 + k, "m1", k, JobState.PENDING, "JobHeldUser") for k in range(4)],
              [SlotRecord("m1", k, 11 + k) for k in range(4)], [job])
    slots = job_slots(w)
    pool = build_pool(w, (job,), slots)
    jobs = policy_jobs(NOW, (job,), slots, {"m1": ()}, {}, offered=frozenset(pool.offered))
    assert jobs[0].max_nodes == 2 and jobs[0].excluded_nodes == {"n1", "n3"}
    assert sorted(decide(w, make_policy("malletrain")).targets["m1"]) == ["n2", "n4"]
    assert sorted(decide(w, make_policy("equal-share")).targets["m1"]) == ["n2", "n4"]
