"""The SQLite store: WAL, ids, lifecycle with history, slots, open actions, profiles, reopen."""

import dataclasses
import gc
import weakref

import pytest

from malletrain.core.lifecycle import IllegalTransition, JobPhase
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import Store

SPEC = JobSpec(script="/home/a/train.py", min_nodes=1, max_nodes=3, kind="train.py")


def test_everything_survives_a_reopen(tmp_path):
    db = tmp_path / "state.db"
    s = Store(db)
    assert s.journal_mode() == "wal"
    a = s.create_job(1001, "alice", SPEC, now_s=10.0)
    b = s.create_job(1002, "bob", SPEC, now_s=11.0)
    assert (a.job_id, b.job_id) == ("m1", "m2")
    s.add_slots("m1", [41, 42, 43])
    s.transition("m1", JobPhase.QUEUED, "slots attached", now_s=12.0)
    s.transition("m1", JobPhase.STARTING, "placed", now_s=13.0)
    s.mark_slot("m1", 1, placed_node="n3", placed_at_s=13.0)
    s.update_job("m1", samples_total=640, rescales_up=2)
    aid = s.begin_action("m1", 42, "place", "n3")
    s.save_profile("train.py", {"version": 1, "clean": {}})
    s.close()  # as good as a kill -9 for SQLite: nothing is cached outside the file

    s2 = Store(db)
    rec = s2.job("m1")
    assert rec is not None and rec.state is JobPhase.STARTING
    assert [t.to_state for t in rec.lifecycle.history] == [
        JobPhase.SUBMITTING, JobPhase.QUEUED, JobPhase.STARTING]
    assert rec.samples_total == 640 and rec.rescales_up == 2 and rec.spec == SPEC
    slots = s2.slots("m1")
    assert [x.slurm_job_id for x in slots] == [41, 42, 43]
    assert slots[1].placed_node == "n3"
    assert [x["id"] for x in s2.open_actions()] == [aid]
    assert s2.profiles() == {"train.py": {"version": 1, "clean": {}}}
    assert s2.create_job(1001, "alice", SPEC).job_id == "m3"  # ids never reused
    assert s2.count_jobs() == 3 and s2.count_jobs(uid=1002) == 1


def test_illegal_transitions_change_nothing(tmp_path):
    s = Store(tmp_path / "s.db")
    s.create_job(1, "u", SPEC)
    with pytest.raises(IllegalTransition):
        s.transition("m1", JobPhase.RUNNING, "skipping ahead")
    rec = s.job("m1")
    assert rec is not None and rec.state is JobPhase.SUBMITTING
    assert len(rec.lifecycle.history) == 1


def test_slot_ids_are_unique_across_jobs(tmp_path):
    import sqlite3

    s = Store(tmp_path / "s.db")
    s.create_job(1, "u", SPEC)
    s.create_job(1, "u", SPEC)
    s.add_slots("m1", [5])
    with pytest.raises(sqlite3.IntegrityError):
        s.add_slots("m2", [5])
    assert [x.slurm_job_id for x in s.slots()] == [5]


def test_prune_keeps_the_newest_ended_jobs_and_every_live_one(tmp_path):
    s = Store(tmp_path / "state.db")
    for i in range(6):
        rec = s.create_job(1001, "alice", SPEC, now_s=float(i))
        s.add_slots(rec.job_id, [100 + 3 * i, 101 + 3 * i, 102 + 3 * i])
        s.begin_action(rec.job_id, 100 + 3 * i, "place", "n1")
        if i != 2:  # m3 stays queued: live jobs are never pruned, however old
            s.transition(rec.job_id, JobPhase.CANCELLED, "cancelled by alice")
        else:
            s.transition(rec.job_id, JobPhase.QUEUED, "slots attached")
    assert s.prune_ended(keep=2) == 3  # m1, m2, m4 go; m5, m6 (newest ended) and m3 stay
    assert [j.job_id for j in s.jobs()] == ["m3", "m5", "m6"]
    assert {r.job_id for r in s.slots()} == {"m3", "m5", "m6"}
    assert s.actions("m1") == [] and s.actions("m5") != []
    assert s.job("m1") is None and len(s.job("m5").lifecycle.history) == 2  # kept whole
    assert s.prune_ended(keep=2) == 0
    assert s.create_job(1001, "alice", SPEC).job_id == "m7"  # ids never reused


def test_one_users_ended_jobs_never_push_another_users_history_out(tmp_path):
    """Issue 49: keep_ended_jobs is shared; with only the overall bound, mt-bob's submit +
    abort loop deletes alice's history. The per-user bound deletes bob's own oldest first."""
    s = Store(tmp_path / "state.db")
    for i in range(2):
        s.create_job(1001, "alice", SPEC, now_s=float(i))
        s.transition(f"m{i + 1}", JobPhase.FAILED, "failed", now_s=float(i) + 0.5)
    for i in range(10):
        rec = s.create_job(1002, "bob", SPEC, now_s=10.0 + i)
        s.transition(rec.job_id, JobPhase.CANCELLED, "cancelled by bob", now_s=10.5 + i)
    assert s.prune_ended(keep=8, keep_per_user=3, since_s=19.0) == 6
    kept = [(j.user, j.job_id) for j in s.jobs()]
    # alice's two stay; bob's newest 3 of those created before 19 s, and m12 (created at
    # 19 s: still counted against his limits) is never deleted
    assert kept == [("alice", "m1"), ("alice", "m2"), ("bob", "m9"), ("bob", "m10"),
                    ("bob", "m11"), ("bob", "m12")]
    assert s.prune_ended(keep=8, keep_per_user=3) == 1  # m9, once m12 is past its hold
    assert s.prune_ended(keep=1, keep_per_user=3) == 4  # the overall bound still holds
    assert [j.job_id for j in s.jobs()] == ["m12"]


def test_the_job_list_rebuilds_only_what_changed_and_says_what_a_fresh_read_says(tmp_path):
    """``jobs()`` is read twice a tick for every job: its memo must never show a stale
    record, and must hand back the same record for a job whose rows did not change."""
    db = tmp_path / "state.db"
    s = Store(db)
    for i in range(4):
        s.create_job(1001, "alice", SPEC, now_s=float(i))
    first = {r.job_id: r for r in s.jobs()}
    s.transition("m1", JobPhase.QUEUED, "slots attached", now_s=5.0)
    s.update_jobs({"m2": {"samples_total": 64, "samples_per_s": 3.5},
                   "m3": {"message": "hello"}})
    s.transition("m4", JobPhase.CANCELLED, "cancelled by alice", now_s=6.0)
    again = {r.job_id: r for r in s.jobs()}
    fresh = {r.job_id: r for r in Store(db).jobs()}  # a new store has no memo
    assert again == fresh
    assert again["m1"].state is JobPhase.QUEUED and again["m4"].state is JobPhase.CANCELLED
    assert again["m2"].samples_total == 64 and again["m3"].message == "hello"
    assert again["m1"] is not first["m1"] and again["m2"] is not first["m2"]
    assert s.jobs()[0] is again["m1"]  # nothing changed since: the same records
    assert s.prune_ended(keep=0) == 1
    assert [r.job_id for r in s.jobs()] == ["m1", "m2", "m3"]
    s.create_job(1001, "alice", SPEC, now_s=7.0)
    assert [r.job_id for r in s.jobs()] == [r.job_id for r in Store(db).jobs()] == [
        "m1", "m2", "m3", "m5"]


def test_the_slot_list_rebuilds_only_what_changed_and_says_what_a_fresh_read_says(tmp_path):
    """``slots()`` is read every tick for every slot: a changed row gives a new record, an
    unchanged one the same record, and the list is always what a fresh store reads."""
    db = tmp_path / "state.db"
    s = Store(db)
    for i in range(3):
        s.create_job(1001, "alice", SPEC, now_s=float(i))
    s.add_slots("m1", [41, 42])
    s.add_slots("m2", [43])
    first = s.slots()
    assert [(r.job_id, r.slot, r.slurm_job_id) for r in first] == [
        ("m1", 0, 41), ("m1", 1, 42), ("m2", 0, 43)]
    s.mark_slots([("m1", 1, {"placed_node": "n3", "placed_at_s": 9.0}),
                  ("m2", 0, {"last_status": "running", "last_node": "n4"})])
    s.add_slots("m3", [44])
    again = s.slots()
    assert again == Store(db).slots()  # a new store has no memo
    assert again[0] is first[0]  # unchanged: the same record
    assert again[1].placed_node == "n3" and again[1] is not first[1]
    assert again[2].last_status == "running" and again[2].last_node == "n4"
    assert s.slots("m1") == again[:2] and s.slots("m3") == [again[3]]
    # a read of one job's slots leaves the memo of the whole list as it was
    assert all(a is b for a, b in zip(s.slots(), again, strict=True))


def test_a_jobs_spec_is_decoded_once_and_not_kept_once_the_job_is_gone(tmp_path):
    """The job list decodes a spec once per job, and keeps it with the job only: specs are
    up to a request's 1 MiB each, and a memo of every spec ever read grew with each job
    submitted (a user submitting and cancelling jobs grew the daemon without end)."""
    s = Store(tmp_path / "state.db")
    big = dataclasses.replace(SPEC, environment={f"V{k}": "x" * 4000 for k in range(200)})
    s.create_job(1001, "alice", big, now_s=1.0)
    first = s.jobs()[0]
    s.update_job("m1", samples_total=50, samples_per_s=5.0)
    again = s.jobs()[0]
    assert again is not first and again.samples_total == 50
    assert again.spec is first.spec and again.spec == big  # not decoded again
    spec = weakref.ref(first.spec)
    s.transition("m1", JobPhase.CANCELLED, "cancelled by alice")
    assert s.prune_ended(keep=0) == 1 and s.jobs() == []
    del first, again
    gc.collect()
    assert spec() is None


def test_batched_updates_check_every_column_before_writing_any(tmp_path):
    s = Store(tmp_path / "state.db")
    s.create_job(1, "u", SPEC)
    s.add_slots("m1", [7, 8])
    with pytest.raises(ValueError, match="not updatable"):
        s.update_jobs({"m1": {"samples_total": 5}, "m2": {"uid": 0}})
    with pytest.raises(ValueError, match="not updatable"):
        s.mark_slots([("m1", 0, {"last_status": "running"}), ("m1", 1, {"slurm_job_id": 9})])
    assert s.job("m1").samples_total == 0
    assert [x.last_status for x in s.slots("m1")] == ["parked", "parked"]
    s.mark_slots([("m1", 0, {"last_status": "running", "last_node": "n1"}),
                  ("m1", 1, {"placed_node": "n2"})])
    assert [(x.last_status, x.last_node, x.placed_node) for x in s.slots("m1")] == [
        ("running", "n1", None), ("parked", None, "n2")]


BIG = dataclasses.replace(SPEC, name="big", rate_target=5.0,
                          environment={f"V{k}": "x" * 4000 for k in range(200)})


def _spec_bytes(db, job_id):
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT length(spec) FROM jobs WHERE job_id=?", (job_id,)).fetchone()[0]
    finally:
        con.close()


def test_an_ended_job_keeps_what_jobs_shows_not_its_spec(tmp_path):
    """Issue 49: ~800 KB of spec per ended job, 1,000 ended jobs kept, in the database and
    in the daemon's memory, let one user's submit + abort loop grow the daemon by ~1 GB."""
    db = tmp_path / "state.db"
    s = Store(db)
    s.create_job(1001, "alice", BIG, now_s=1.0)
    assert _spec_bytes(db, "m1") > 800_000  # a live job keeps its whole spec
    assert s.jobs()[0].spec == BIG  # (and the job list's memo holds it, until the end)
    ended = s.transition("m1", JobPhase.CANCELLED, "submission aborted")
    assert _spec_bytes(db, "m1") < 300
    for rec in (ended, s.job("m1"), s.jobs()[0], Store(db).jobs()[0]):
        kept = rec.spec
        assert (kept.name, kept.min_nodes, kept.max_nodes, kept.rate_target, kept.kind) == (
            "big", 1, 3, 5.0, "train.py")
        assert kept.environment == {} and kept.script == "/"


def test_a_database_of_an_older_release_has_its_ended_specs_cut_at_open(tmp_path):
    import json
    import sqlite3

    db = tmp_path / "state.db"
    s = Store(db)
    s.create_job(1001, "alice", SPEC, now_s=1.0)
    s.create_job(1001, "alice", SPEC, now_s=2.0)
    s.transition("m1", JobPhase.CANCELLED, "aborted")
    s.close()
    con = sqlite3.connect(db)
    with con:  # as an older release left them: whole specs, ended or not
        con.execute("UPDATE jobs SET spec=?", (json.dumps(BIG.to_dict()),))
        con.execute("UPDATE jobs SET spec='{not json' WHERE job_id='m1'")
    con.close()
    s = Store(db)
    assert _spec_bytes(db, "m1") < 100 and _spec_bytes(db, "m2") > 800_000  # m2 is live
    assert s.job("m1").spec.script == "/" and s.job("m2").spec == BIG


def test_a_submission_counts_against_the_limits_for_a_while_even_once_ended(tmp_path):
    s = Store(tmp_path / "state.db")
    for t in (100.0, 150.0, 200.0):
        rec = s.create_job(1001, "alice", SPEC, now_s=t)
        s.transition(rec.job_id, JobPhase.CANCELLED, "aborted")
    s.create_job(1002, "bob", SPEC, now_s=10.0)  # live, long ago
    assert s.count_jobs(1001) == 0 and s.count_jobs(1001, since_s=140.0) == 2
    assert s.count_jobs(since_s=140.0) == 3 and s.count_jobs(1002, since_s=140.0) == 1
    # pruning never deletes what still counts
    assert s.prune_ended(keep=0, since_s=140.0) == 1
    assert s.count_jobs(1001, since_s=140.0) == 2


def test_job_numbers_start_where_the_site_says_and_a_database_keeps_its_own(tmp_path):
    """``state.first_job_number`` (Slurm's FirstJobId): a batch shell's $SLURM_JOB_ID is
    the job's number, and LUMI's `MASTER_PORT="1${SLURM_JOB_ID:0-4}"` needs 4 digits."""
    from malletrain.ops.settings import StateSettings

    assert StateSettings().first_job_number == 1000
    db = tmp_path / "state.db"
    assert Store(db, first_job_number=1000).create_job(1001, "a", SPEC).job_id == "m1000"
    # reopened with another first number: the numbering goes on, ids are never reused
    assert Store(db, first_job_number=5).create_job(1001, "a", SPEC).job_id == "m1001"
