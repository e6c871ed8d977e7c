"""Idle windows from the backfill plan and reservations (pure core logic)."""

from __future__ import annotations

import time
from pathlib import Path

from malletrain.core.cluster import (
    ClusterSnapshot,
    Job,
    JobState,
    Node,
    NodeState,
    Reservation,
)
from malletrain.core.model import IdleNode
from malletrain.core.scavenging.scavenger import Claim, earliest_claims, idle_nodes, node_windows
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot

NOW = 1000.0
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm" / "busy"


def node(name, state=NodeState.IDLE, flags=(), partitions=("batch", "scavenger"), busy=None):
    return Node(name=name, state=state, flags=frozenset(flags), partitions=partitions,
                last_busy_at=busy)


def pending(job_id, start, planned, state=JobState.PENDING):
    return Job(job_id=job_id, name="p", user="u", partition="batch", state=state,
               planned_nodes=tuple(planned), start_time=start)


def windows(snap, **kw):
    return {w.name: w for w in node_windows(snap, NOW, **kw)}


def test_unplanned_idle_node_is_unbounded():
    w = windows(ClusterSnapshot(taken_at=NOW, nodes=(node("n1", busy=900.0),)))["n1"]
    assert w.idle and w.window_s is None and w.claim is None and w.idle_age_s == 100.0


def test_earliest_planned_start_bounds_the_window():
    snap = ClusterSnapshot(
        taken_at=NOW,
        nodes=(node("n1"), node("n2"), node("n3")),
        jobs=(pending(1, NOW + 600, ["n1", "n2"]), pending(2, NOW + 300, ["n2"]),
              pending(3, NOW + 50, [])),  # no planned nodes: claims nothing
    )
    w = windows(snap)
    assert w["n1"].window_s == 600 and w["n1"].claim == Claim(NOW + 600, "job 1")
    assert w["n2"].window_s == 300 and w["n2"].claim.by == "job 2"
    assert w["n3"].window_s is None


def test_only_pending_jobs_with_a_start_claim_nodes():
    snap = ClusterSnapshot(
        taken_at=NOW,
        nodes=(node("n1"),),
        jobs=(pending(1, NOW + 60, ["n1"], state=JobState.RUNNING),
              pending(2, None, ["n1"])),
    )
    assert windows(snap)["n1"].window_s is None


def test_a_plan_of_a_job_in_a_state_this_release_does_not_know_still_claims():
    """A newer Slurm's job state reads UNKNOWN: its plan must still bound the window."""
    snap = ClusterSnapshot(taken_at=NOW, nodes=(node("n1"),),
                           jobs=(pending(1, NOW + 90, ["n1"], state=JobState.UNKNOWN),))
    assert windows(snap)["n1"].window_s == 90


def test_excluded_jobs_claim_nothing():
    # the daemon's own released slot: a pending job planned onto the node it is to take
    snap = ClusterSnapshot(taken_at=NOW, nodes=(node("n1"), node("n2")),
                           jobs=(pending(7, NOW, ["n1"]), pending(8, NOW + 90, ["n1", "n2"])))
    assert earliest_claims(snap, NOW)["n1"] == Claim(NOW, "job 7")
    claims = earliest_claims(snap, NOW, exclude_job_ids={7})
    assert claims == {"n1": Claim(NOW + 90, "job 8"), "n2": Claim(NOW + 90, "job 8")}
    assert [n.window_s for n in idle_nodes(snap, NOW, claims=claims)] == [90, 90]


def test_reservations_bound_windows_and_active_ones_take_the_node():
    snap = ClusterSnapshot(
        taken_at=NOW,
        nodes=(node("n1"), node("n2"), node("n3")),
        jobs=(pending(1, NOW + 900, ["n1"]),),
        reservations=(
            Reservation("later", ("n1",), NOW + 120, NOW + 220),
            Reservation("now", ("n2",), NOW - 10, NOW + 100),
            Reservation("over", ("n3",), NOW - 100, NOW - 1),
        ),
    )
    w = windows(snap)
    assert w["n1"].window_s == 120 and w["n1"].claim.by == "reservation later"
    assert not w["n2"].idle and w["n2"].window_s == 0
    assert w["n3"].idle and w["n3"].window_s is None


def test_stale_plan_in_the_past_clips_to_zero_and_is_not_offered():
    snap = ClusterSnapshot(taken_at=NOW, nodes=(node("n1"),),
                           jobs=(pending(1, NOW - 5, ["n1"]),))
    assert windows(snap)["n1"].window_s == 0
    assert idle_nodes(snap, NOW) == ()


def test_busy_drained_and_flagged_nodes_are_not_idle():
    snap = ClusterSnapshot(taken_at=NOW, nodes=(
        node("a", NodeState.ALLOCATED), node("d", NodeState.DRAINED, ["DRAIN"]),
        node("p", flags=["PLANNED"]), node("r", flags=["POWERED_DOWN"]),
        node("u", NodeState.UNKNOWN)))
    w = windows(snap)
    assert {n for n, x in w.items() if x.idle} == {"p"}
    assert all(x.window_s == 0 for n, x in w.items() if n != "p")


def test_partition_filter_and_min_window():
    snap = ClusterSnapshot(
        taken_at=NOW,
        nodes=(node("n1"), node("n2", partitions=("batch",)), node("n3")),
        jobs=(pending(1, NOW + 30, ["n3"]),),
    )
    assert [w.name for w in node_windows(snap, NOW, partitions=["scavenger"])] == ["n1", "n3"]
    assert idle_nodes(snap, NOW, partitions=["scavenger"], min_window_s=60) == (
        IdleNode(name="n1", window_s=None, idle_age_s=0.0),)


def test_golden_busy_cluster_windows_match_the_backfill_plan():
    d = GOLDEN
    snap = build_snapshot(float((d / "taken_at.txt").read_text()), SnapshotTexts(
        nodes_json=(d / "nodes.json").read_text(), squeue_json=(d / "squeue.json").read_text(),
        partitions=(d / "partitions.txt").read_text(),
        reservations=(d / "reservations.txt").read_text(), planned=(d / "planned.txt").read_text(),
        topology=(d / "topology.txt").read_text()))
    long_job = next(j for j in snap.jobs if j.name == "long")
    w = {x.name: x for x in node_windows(snap, snap.taken_at)}
    assert sorted(n for n, x in w.items() if x.idle) == ["n7", "n8"]
    for name in ("n7", "n8"):  # n8's reservation is 3 h away; the plan comes first
        assert w[name].window_s == long_job.end_time - snap.taken_at
        assert w[name].claim.by == "job 6"
    assert not w["n6"].idle  # drained
    assert [(n.name, n.switch) for n in idle_nodes(snap, snap.taken_at)] == [
        ("n7", "s2"), ("n8", "s2")]
    # the tick's pool asks for the idle nodes only: the same windows, the busy ones left out
    assert node_windows(snap, snap.taken_at, idle_only=True) == tuple(
        x for x in w.values() if x.idle)


def test_4000_nodes_and_2000_pending_jobs_are_fast():
    nodes = tuple(node(f"n{i}") for i in range(4000))
    jobs = tuple(pending(j, NOW + 10 * j, [f"n{(j * 7 + k) % 4000}" for k in range(16)])
                 for j in range(1, 2001))
    snap = ClusterSnapshot(taken_at=NOW, nodes=nodes, jobs=jobs)
    t0 = time.perf_counter()
    out = node_windows(snap, NOW)
    elapsed_s = time.perf_counter() - t0
    assert len(out) == 4000
    claims = earliest_claims(snap, NOW)
    # spot-check against a direct scan for a few nodes
    for name in ("n0", "n7", "n3999"):
        starts = [j.start_time for j in jobs if name in j.planned_nodes]
        if starts:
            assert claims[name].start_at == min(starts)
        else:
            assert name not in claims
    assert elapsed_s < 0.5, f"node_windows took {elapsed_s:.3f} s for 4000 nodes"
