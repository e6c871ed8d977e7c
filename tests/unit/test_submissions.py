"""Attached slot jobs are checked by the tick against its own snapshot (daemon/submissions.py).

The attack a check at the tick opens, and its test: a user naming another user's fresh slot
jobs in their own attach claims those ids in the store before the owner attaches them. The
tick refuses the claim and lets go of the ids; the owner's attach, told to try again
meanwhile, then succeeds. The same checks on the dev cluster with real users:
``tests/e2e/test_daemon_failures.py::test_a_user_cannot_attach_or_cancel_someone_elses_jobs``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from malletrain.core.cluster import ClusterSnapshot, Job, JobState
from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.jobs.slots import slot_tag
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.submit.channel import Peer
from malletrain.daemon.submit.requests import RequestHandler
from malletrain.daemon.submit.submissions import admit_attached, attach_problem
from malletrain.errors import PermanentError, RetryableError
from malletrain.ops.settings import Settings
from malletrain.slurm.privacy import Privacy

PART = Settings().slurm.scavenger_partition
ALICE = Peer(uid=1001, gid=1001, pid=1, user="alice")
BOB = Peer(uid=1002, gid=1002, pid=2, user="bob")


def slot_job(sid: int, owner: str, job_id: str, slot: int, **kw: object) -> Job:
    fields = {"name": "slot", "user": owner, "partition": PART, "state": JobState.PENDING,
              "node_count": 1, "comment": slot_tag(job_id, slot), **kw}
    return Job(job_id=sid, **fields)  # type: ignore[arg-type]


def handler(store: Store) -> RequestHandler:
    coordinator = SimpleNamespace(address="127.0.0.1:1", job_secret=lambda job_id, owner=-1: "s")
    return RequestHandler(Settings(), store, coordinator=coordinator, state_dir=store.path.parent,
                          rows=lambda: [], wake=lambda: None,
                          privacy=lambda: Privacy(private_jobs=False))


def submit(h: RequestHandler, peer: Peer, max_nodes: int = 2) -> str:
    spec = {"script": "/x/t.py", "max_nodes": max_nodes}
    return str(h.handle(peer, {"op": "submit", "spec": spec})["job_id"])


def tick(store: Store, snapshot: ClusterSnapshot) -> None:
    jobs = store.jobs()
    slots = {j.job_id: tuple(store.slots(j.job_id)) for j in jobs}
    admit_attached(store, jobs, slots, snapshot, PART)


@pytest.mark.parametrize(("change", "why"), [
    ({"user": "bob"}, "belongs to bob, not to alice"),
    ({"comment": "malletrain:m9:0"}, "is not tagged"),
    ({"partition": "batch"}, "is in partition batch"),
    ({"state": JobState.RUNNING}, "is not a pending single-node job"),
    ({"node_count": 2}, "is not a pending single-node job"),
    (None, "is unknown to Slurm"),
])
def test_each_thing_a_slot_job_must_be_is_checked(tmp_path, change, why):
    store = Store(tmp_path / "s.db")
    job = store.create_job(1001, "alice", JobSpec.from_dict({"script": "/x/t.py",
                                                            "max_nodes": 2}))
    store.add_slots(job.job_id, [11, 12])
    recs = store.slots(job.job_id)
    good = [slot_job(11, "alice", job.job_id, 0)]
    snap = ClusterSnapshot(taken_at=0.0, jobs=(*good, slot_job(12, "alice", job.job_id, 1)))
    assert attach_problem(snap, job, recs, PART) is None
    bad = () if change is None else (slot_job(12, "alice", job.job_id, 1, **change),)
    problem = attach_problem(ClusterSnapshot(taken_at=0.0, jobs=(*good, *bad)), job, recs, PART)
    assert problem is not None and problem.startswith("slot job 12 ") and why in problem
    # one slot job short of the job's slots
    store.drop_slots(job.job_id, [12])
    assert "1 slot jobs attached for 2 slots" in str(
        attach_problem(snap, job, store.slots(job.job_id), PART))


def test_an_attach_is_queued_at_the_next_tick_and_sent_again_gets_the_same_answer(tmp_path):
    store = Store(tmp_path / "s.db")
    h = handler(store)
    job = submit(h, ALICE)
    for _ in range(2):  # a client whose answer was lost sends it again
        assert h.handle(ALICE, {"op": "attach", "job_id": job, "slots": [11, 12]}) == {
            "job_id": job}
    assert store.job(job).state is JobPhase.SUBMITTING  # nothing is used before the check
    with pytest.raises(PermanentError, match="attached already"):
        h.handle(ALICE, {"op": "attach", "job_id": job, "slots": [13, 14]})
    tick(store, ClusterSnapshot(taken_at=0.0, jobs=(slot_job(11, "alice", job, 0),
                                                    slot_job(12, "alice", job, 1))))
    rec = store.job(job)
    assert rec.state is JobPhase.QUEUED and rec.lifecycle.history[-1].reason == (
        "2 slot jobs attached (11..12)")
    assert h.handle(ALICE, {"op": "attach", "job_id": job, "slots": [11, 12]}) == {
        "job_id": job}


def test_a_claim_on_another_users_slot_jobs_is_refused_and_let_go(tmp_path):
    """alice attaches bob's fresh slot job (and one of her own) before bob attaches it: her
    job fails at the tick with the reason, bob's id is let go (his attach, told to try
    again meanwhile, then succeeds), her own slot stays hers for the wind-down to cancel."""
    store = Store(tmp_path / "s.db")
    h = handler(store)
    bobs, alices = submit(h, BOB, max_nodes=1), submit(h, ALICE)
    h.handle(ALICE, {"op": "attach", "job_id": alices, "slots": [21, 31]})
    with pytest.raises(RetryableError, match="attached to another job"):
        h.handle(BOB, {"op": "attach", "job_id": bobs, "slots": [31]})
    snap = ClusterSnapshot(taken_at=0.0, jobs=(slot_job(21, "alice", alices, 0),
                                               slot_job(31, "bob", bobs, 0)))
    tick(store, snap)
    rec = store.job(alices)
    assert rec.state is JobPhase.FAILED
    assert rec.lifecycle.history[-1].reason == (
        "refused at attach: slot job 31 belongs to bob, not to alice")
    assert [s.slurm_job_id for s in store.slots(alices)] == [21]
    assert h.handle(BOB, {"op": "attach", "job_id": bobs, "slots": [31]}) == {"job_id": bobs}
    tick(store, snap)
    assert store.job(bobs).state is JobPhase.QUEUED
    assert store.job(alices).state is JobPhase.FAILED  # judged once
