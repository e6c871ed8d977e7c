"""Fair shares among users (issue 47): the nodes are divided among users before jobs.

The A/B scenario: user A runs several jobs on every node, user B submits one job of the same
kind. User-blind, B got nothing for as long as A's jobs ran (A's twenty jobs and the keep
margin outbid B's one); with shares, B's job gets B's half in the next decision and A's
jobs shrink to A's half."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tick_scenes import NOW, node, record, slot_job, world

from malletrain.core.allocation.fairness import solve_fair
from malletrain.core.allocation.knapsack import solve_counts
from malletrain.core.allocation.shares import user_caps
from malletrain.core.cluster import JobState, NodeState
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import ThroughputModel
from malletrain.core.options import LIVE
from malletrain.core.policies import make_policy
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import SlotRecord
from malletrain.daemon.tick import CoordView, Registration, decide
from malletrain.daemon.tick.world import JobModel


def test_caps_are_max_min_fair_and_work_conserving():
    assert user_caps({"a": 64, "b": 64}, {}, 64) == {"a": 32, "b": 32}
    assert user_caps({"a": 64, "b": 5}, {}, 64) == {"a": 59, "b": 5}  # b cannot use more
    assert user_caps({"a": 64, "b": 64, "c": 64}, {"b": 30}, 64) == {"a": 21, "b": 22, "c": 21}
    assert user_caps({"a": 0, "b": 8}, {}, 64) == {"a": 0, "b": 8}
    assert sum(user_caps({"a": 9, "b": 9, "c": 9}, {}, 10).values()) == 10


def _values(n_jobs: int, per_node: float, max_n: int, cap: int) -> np.ndarray:
    """Linear jobs: value ``per_node * n`` for 0..max_n nodes (``-inf`` beyond)."""
    v = np.full((n_jobs, cap + 1), -np.inf)
    for n in range(max_n + 1):
        v[:, n] = per_node * n
    return v


def test_twenty_jobs_of_one_user_get_one_users_part():
    values = np.vstack([_values(20, 1.0, 8, 64), _values(1, 1.0, 8, 64)])
    users = ["a"] * 20 + ["b"]
    counts, _ = solve_fair(values, users, [3] * 20 + [0], 64)
    assert counts[:20].sum() == 56 and counts[20] == 8  # b's job is full at 8; a gets the rest
    values = np.vstack([_values(20, 1.0, 8, 64), _values(1, 1.0, 64, 64)])
    counts, _ = solve_fair(values, users, [3] * 20 + [0], 64)
    assert counts[:20].sum() == 32 and counts[20] == 32


def test_a_rate_ten_times_higher_buys_nothing_beyond_its_users_part():
    values = np.vstack([_values(1, 10.0, 64, 64), _values(1, 1.0, 64, 64)])
    blind, _ = solve_counts(values, 64)
    fair, _ = solve_fair(values, ["a", "b"], [0, 0], 64)
    assert list(blind) == [64, 0] and list(fair) == [32, 32]


def test_one_user_is_exactly_the_user_blind_problem():
    rng = np.random.default_rng(7)
    values = np.cumsum(rng.random((12, 17)), axis=1)
    values[:, 0] = 0.0
    assert np.array_equal(solve_fair(values, ["u"] * 12, [0] * 12, 16)[0],
                          solve_counts(values, 16)[0])


def _running(job_id: str, seq: int, nodes: list[str], max_nodes: int, sid0: int):
    rec = dataclasses.replace(record(job_id, JobPhase.RUNNING, max_nodes=max_nodes, seq=seq))
    slots, jobs = [], []
    for k in range(max_nodes):
        sid = sid0 + k
        if k < len(nodes):
            slots.append(SlotRecord(job_id, k, sid, last_status="running", last_node=nodes[k]))
            jobs.append(slot_job(sid, job_id, k, JobState.RUNNING, nodes=[nodes[k]]))
        else:
            slots.append(SlotRecord(job_id, k, sid))
            jobs.append(slot_job(sid, job_id, k, JobState.PENDING, "JobHeldUser"))
    members = tuple(f"s{k}-r0" for k in range(len(nodes)))
    cv = CoordView(epoch=2, members=members,
                   live={m: Registration(n, NOW - 300) for m, n in zip(members, nodes,
                                                                       strict=True)},
                   samples_total=10_000, progress_at_s=NOW - 1)
    return rec, slots, jobs, cv


@pytest.mark.parametrize("fair, b_nodes", [(True, 8), (False, 0)])
def test_b_gets_its_half_in_the_next_decision_while_a_holds_every_node(fair, b_nodes):
    names = [f"n{i}" for i in range(1, 17)]
    records, slots, jobs, coord = [], [], [], {}
    for j in range(4):  # alice: four jobs of 1-8 nodes, four nodes each: all 16 held
        rec, s, js, cv = _running(f"m{j + 1}", j + 1, names[4 * j:4 * j + 4], 8, 100 * (j + 1))
        records.append(rec)
        slots += s
        jobs += js
        coord[rec.job_id] = cv
    bob = dataclasses.replace(record("m9", JobPhase.QUEUED, max_nodes=8, seq=9),
                              uid=1001, user="bob",
                              spec=JobSpec(script="/x/train.py", min_nodes=1, max_nodes=8))
    records.append(bob)
    for k in range(8):
        slots.append(SlotRecord("m9", k, 900 + k))
        jobs.append(dataclasses.replace(
            slot_job(900 + k, "m9", k, JobState.PENDING, "JobHeldUser"), user="bob"))
    near_linear = ThroughputModel(tuple((n, 100.0 * n * 0.97 ** np.log2(n))
                                        for n in (1, 2, 4, 8)))
    model = JobModel(near_linear, scale_up_s=10.0, scale_down_s=5.0)
    w = world([node(n, NodeState.ALLOCATED) for n in names], jobs, slots, records, coord)
    w = dataclasses.replace(w, models={r.job_id: model for r in records})
    plan = decide(w, make_policy("malletrain", LIVE.with_(fair_share=fair)))
    alice = sum(len(plan.targets.get(r.job_id, ())) for r in records[:4])
    assert len(plan.targets.get("m9", ())) == b_nodes
    assert alice == 16 - b_nodes


def test_each_job_says_why_it_has_the_nodes_it_has():
    from malletrain.daemon.tick.reasons import job_reasons

    def rec(job_id, user, max_nodes):
        r = record(job_id, JobPhase.RUNNING, max_nodes=max_nodes)
        return dataclasses.replace(r, user=user)

    a1, a2, b1 = rec("m1", "alice", 8), rec("m2", "alice", 2), rec("m3", "bob", 8)
    targets = {"m1": ("n1", "n2"), "m2": ("n3", "n4"), "m3": ("n5", "n6", "n7", "n8")}
    reasons = job_reasons([a1, a2, b1], targets, 8, {"m4": "waiting for afterok:m3"})
    assert reasons == {"m1": "UserShare", "m2": "MaxNodes", "m3": "UserShare",
                       "m4": "Dependency (waiting for afterok:m3)"}
    alone = job_reasons([a1], {"m1": ("n1",)}, 1, {})
    assert alone == {"m1": "Resources"}
    assert job_reasons([a1], {"m1": ("n1",)}, 4, {}) == {"m1": "Value"}
