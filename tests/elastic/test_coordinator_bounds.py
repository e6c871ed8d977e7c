"""Issue 49: what one job (or no secret at all) can make the coordinator and the daemon do.

In-process, on loopback, against the real server (:class:`KVServer`) and the daemon's real
handle (:class:`Coordinator`): a job's own counters cannot stall the daemon's tick, the
frames and handshakes of a client are bounded in time and counted in bytes, a secret ends
with its job, namespaces belong to a realm, and a restarted coordinator says "retry" rather
than "authentication failed" until the daemon has told it its jobs.
"""

from __future__ import annotations

import time

import pytest

from malletrain.elastic.coordinator import batchread
from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.protocol.authclient import AuthClient, StoreRefused
from malletrain.elastic.protocol.keys import MemberInfo, build_membership
from malletrain.elastic.protocol.records import RecordError, encode_membership
from malletrain.elastic.protocol.wire import Op


def _job_session(coord: Coordinator, job: str) -> AuthClient:
    host, port = coord.address.rsplit(":", 1)
    return AuthClient(host, int(port), job, bytes.fromhex(coord.job_secret(job)),
                      connect_timeout_s=3)


def _epoch(e: int, members: list[str], source: str = "heal") -> str:
    return encode_membership(build_membership(e, members, dict.fromkeys(members, 1),
                                              source, 0.0))


@pytest.fixture
def coord():
    c = Coordinator.start()
    yield c
    c.close()


def test_a_jobs_session_cannot_set_its_counters_to_values_that_stall_the_daemon(coord):
    s = _job_session(coord, "m1")
    assert s.add("mt/m1/events", 1) == 1 and s.add("mt/m1/events", 0) == 1
    for bad in (lambda: s.set("mt/m1/events", "1000000000000000"),
                lambda: s.add("mt/m1/events", 10**15),
                lambda: s.add("mt/m1/events", -1),
                lambda: s.set("mt/m1/latest", "0"),
                lambda: s.set("mt/m1/latest", "5"),  # no such epoch
                lambda: s.compare_set("mt/m1/latest", "", "1")):
        with pytest.raises(StoreRefused):
            bad()
    coord.publish("m1", [])  # epoch 1 (the daemon's)
    s.set("mt/m1/latest", "1")
    # heal epochs far past 'latest' (the daemon would scan up to them one by one)
    s.compare_set("mt/m1/cfg/2", "", _epoch(2, []))
    with pytest.raises(StoreRefused, match="past 'latest'"):
        s.compare_set("mt/m1/cfg/50", "", _epoch(50, []))
    # an ADD amount that is no integer is a refusal, not a traceback; the session goes on
    for amount in (b"--5", b"1e3", b"9" * 20):
        with pytest.raises(StoreRefused, match="not an integer"):
            s._ok(Op.ADD, [b"mt/m1/n", amount])
    assert s.add("mt/m1/n", 2) == 2


def test_a_huge_events_counter_fails_that_job_only_and_the_tick_stays_fast(coord):
    """What an old coordinator or the daemon's own bug may hold: the daemon reads it as a
    bad record of that job, in two round trips, and the other jobs as usual."""
    good = _job_session(coord, "good")
    good.add("mt/good/events", 1)
    coord.store.set("mt/bad/events", str(10**15))
    coord.store.set("mt/slow/events", str(10**6))
    started = time.monotonic()
    reads = coord.read_jobs(["bad", "slow", "good"])
    assert time.monotonic() - started < 1.0
    assert isinstance(reads["bad"], RecordError) and isinstance(reads["slow"], RecordError)
    assert not isinstance(reads["good"], RecordError)


def test_a_long_log_and_many_epochs_are_read_a_bounded_amount_per_tick(coord, monkeypatch):
    w = _job_session(coord, "m1")
    for i in range(600):
        w.add("mt/m1/events", 1)
        w.set(f"mt/m1/ev/{i}", '{"kind": "junk"}')  # refused records: counted, skipped
    for e in range(1, 41):  # epochs written by the daemon without 'latest' ever being set
        coord.store.compare_set(f"mt/m1/cfg/{e}", "", _epoch(e, [], "publish"))
    calls: list[int] = []
    real = coord.store.read_many
    monkeypatch.setattr(coord.store, "read_many",
                        lambda keys, **kw: calls.append(len(keys)) or real(keys, **kw))
    first = coord.read_jobs(["m1"])["m1"]
    assert not isinstance(first, RecordError)
    assert len(calls) == 2 and max(calls) <= 4 + batchread.EPOCH_WINDOW + 1 + 256
    assert first.bad_records == batchread.EVENTS_PER_TICK
    assert first.membership is not None and first.membership.epoch == batchread.EPOCH_WINDOW
    for _ in range(3):
        last = coord.read_jobs(["m1"])["m1"]
    assert not isinstance(last, RecordError)
    assert last.bad_records == 600 and last.membership is not None
    assert last.membership.epoch == 40


def test_registrations_still_read_in_order(coord):
    w = _job_session(coord, "m1")
    from malletrain.elastic.protocol.jobstore import JobStore
    js = JobStore(w, "m1")
    js.register(MemberInfo("a", "n1", 1, 1, time.time()))
    read = coord.read_jobs(["m1"])["m1"]
    assert not isinstance(read, RecordError) and set(read.live) == {"a"}
