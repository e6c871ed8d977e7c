"""The daemon's batched read of all jobs (READ_MANY) against a real coordinator store.

It must say exactly what the per-job reads say, for every job at once, refuse a job's
session, and split an answer that would not fit one frame.
"""

from __future__ import annotations

import time

import pytest

from malletrain.elastic.coordinator import kvserver
from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.protocol.authclient import AuthClient
from malletrain.elastic.protocol.authclient import StoreRefused as ClientRefused
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import MemberInfo, ProgressReport
from malletrain.elastic.protocol.records import RecordError

pytestmark = pytest.mark.torch


def _worker(coord: Coordinator, job: str) -> JobStore:
    host, port = coord.address.rsplit(":", 1)
    return JobStore(AuthStore(host, int(port), job, bytes.fromhex(coord.job_secret(job))), job)


def _report(samples: int) -> ProgressReport:
    return ProgressReport(epoch=1, step=samples // 64, samples_total=samples,
                          samples_per_s=10.0, world_size=1, step_time_s=0.5, time_s=time.time(),
                          members=("a",))


def _per_job(coord: Coordinator, job: str) -> tuple:
    return (coord.membership(job), coord.live_members(job), coord.progress(job),
            coord.result(job), coord.departures(job), coord.bad_records(job))


def test_batched_read_says_what_the_per_job_reads_say():
    coord = Coordinator.start()
    try:
        w1, w2 = _worker(coord, "j1"), _worker(coord, "j2")
        for m in ("a", "b"):
            w1.register(MemberInfo(m, f"n-{m}", 1, 1, time.time()))
        coord.publish("j1", ["a", "b"])
        w1.depart("b", "sigterm", 1, 7)
        w1.set_progress(_report(640))
        w2.register(MemberInfo("a", "n9", 2, 1, time.time()))  # registered, never published
        w2.append_event("register", "x", {"node": 5})  # a record that fails its schema
        reads = coord.read_jobs(["j1", "j2", "never-seen"])
        assert "never-seen" not in coord.held_bytes()  # reading creates no job space
        for job in ("j1", "j2", "never-seen"):
            got = reads[job]
            assert not isinstance(got, RecordError)
            assert (got.membership, got.live, got.progress, got.finished, got.departures,
                    got.bad_records) == _per_job(coord, job)
        assert reads["j1"].membership.members == ("a", "b")
        assert reads["j2"].bad_records == 1 and set(reads["j2"].live) == {"a"}
        # workers moved on past the daemon's last look (a heal epoch, more events): read again
        w1.propose(w1.current().__class__(2, ("a",), (1,), "heal", time.time(), ("b",)))
        w1.register(MemberInfo("c", "n-c", 3, 1, time.time()))
        again = coord.read_jobs(["j1"])["j1"]
        assert not isinstance(again, RecordError)
        assert again.membership.epoch == 2 and set(again.live) == {"a", "c"}
        # the views are kept between reads while the log does not grow (JobStore.event_views):
        # a caller changing its answer changes no later one, and a new event is seen
        again.live.clear()
        again.departures.clear()
        same = coord.read_jobs(["j1"])["j1"]
        assert not isinstance(same, RecordError)
        assert set(same.live) == {"a", "c"} and [d.member_id for d in same.departures] == ["b"]
        w1.depart("c", "sigterm", 2, 9)
        third = coord.read_jobs(["j1"])["j1"]
        assert not isinstance(third, RecordError)
        assert set(third.live) == {"a"}
        assert [d.member_id for d in third.departures] == ["b", "c"]
        assert (third.membership, third.live, third.progress, third.finished, third.departures,
                third.bad_records) == _per_job(coord, "j1")
    finally:
        coord.close()


def test_a_bad_progress_record_fails_that_job_only():
    coord = Coordinator.start()
    try:
        _worker(coord, "bad").store.set("mt/bad/progress", "{not json")
        _worker(coord, "good").set_progress(_report(64))
        reads = coord.read_jobs(["bad", "good"])
        assert isinstance(reads["bad"], RecordError)
        assert reads["good"].progress.samples_total == 64
    finally:
        coord.close()


def test_read_many_is_refused_to_a_jobs_session_and_splits_a_big_answer(monkeypatch):
    coord = Coordinator.start()
    try:
        worker = _worker(coord, "j1")
        host, port = coord.address.rsplit(":", 1)
        raw = AuthClient(host, int(port), "j1", bytes.fromhex(coord.job_secret("j1")))
        with pytest.raises(ClientRefused):  # a job's own processes may send it too
            raw.read_many(["mt/j1/progress"])
        for i in range(6):
            worker.store.set(f"mt/j1/big{i}", b"x" * 1000)
        monkeypatch.setattr(kvserver, "READ_MANY_BYTES", 2500)  # 2 values per answer
        keys = [f"mt/j1/big{i}" for i in range(6)] + ["mt/j1/absent"]
        values = coord.store.read_many(keys)
        assert values == [b"x" * 1000] * 6 + [None]
    finally:
        coord.close()
