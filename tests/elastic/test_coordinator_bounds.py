"""Issue 49: what one job (or no secret at all) can make the coordinator and the daemon do.

In-process, on loopback, against the real server (:class:`KVServer`) and the daemon's real
handle (:class:`Coordinator`): a job's own counters cannot stall the daemon's tick, the
frames and handshakes of a client are bounded in time and counted in bytes, a secret ends
with its job, namespaces belong to a realm, and a restarted coordinator says "retry" rather
than "authentication failed" until the daemon has told it its jobs.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from malletrain.elastic.coordinator import batchread, keyfile
from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.coordinator.kvserver import KVServer, ServerLimits
from malletrain.elastic.coordinator.kvspace import FD_HEADROOM
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authclient import (
    AuthClient,
    AuthenticationRefused,
    CoordinatorUnreachable,
    StoreRefused,
)
from malletrain.elastic.protocol.keys import ID_RE, MemberInfo, build_membership
from malletrain.elastic.protocol.records import RecordError, encode_membership
from malletrain.elastic.protocol.wire import Op
from malletrain.errors import ConfigError


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


# ---------------------------------------------------------------------- finding 3: secrets end


def test_a_secret_ends_with_its_job_and_cannot_re_create_its_namespace():
    master = os.urandom(32)
    coord = Coordinator.start(master=master, realm="db1")
    try:
        host, port = coord.address.rsplit(":", 1)
        open_session = _job_session(coord, "m1")
        open_session.set("mt/m1/progress", "{}")
        secret = bytes.fromhex(coord.job_secret("m1"))
        coord.forget("m1")  # the job ended
        with pytest.raises((CoordinatorUnreachable, StoreRefused)):
            open_session.set("mt/m1/progress", "{}")  # its open session is closed
        for job, key in (("m1", secret), ("m7", wire.job_secret(master, "m7", "db1"))):
            t0 = time.monotonic()  # the ended job, and one the daemon never registered
            with pytest.raises(AuthenticationRefused) as refused:
                AuthClient(host, int(port), job, key, connect_timeout_s=5)
            assert refused.value.proven and time.monotonic() - t0 < 1.0
        assert "m1" not in coord.held_bytes() and "m7" not in coord.held_bytes()
    finally:
        coord.close()


# ---------------------------------------------------------------------- finding 6: realms


def test_a_new_realm_drops_what_an_old_jobs_user_planted():
    master = os.urandom(32)
    old = Coordinator.start(master=master, realm="dbA")
    try:
        _job_session(old, "m1").set("mt/m1/finished", '{"step": 1}')  # the old m1's user
        # the database is reset (ids restart at m1), the coordinator still runs
        new = Coordinator.attach(old.address, master, realm="dbB", live_jobs=lambda: ["m1"])
        assert new.store.read_many(["mt/m1/finished"]) == [None]
        assert new.result("m1") is None
        with pytest.raises(AuthenticationRefused):  # the old m1's secret is useless
            AuthClient(*_hp(old), "m1", wire.job_secret(master, "m1", "dbA"),
                       connect_timeout_s=0.5)
    finally:
        old.close()


def _hp(coord: Coordinator) -> tuple[str, int]:
    host, port = coord.address.rsplit(":", 1)
    return host, int(port)


# ---------------------------------------------------------------------- finding 10: restart


def test_a_restarted_coordinator_says_retry_until_the_daemon_registered_its_jobs():
    master = os.urandom(32)
    srv = KVServer(master).start()  # restarted after a kill -9: no realm, no jobs yet
    try:
        result: dict[str, object] = {}

        def worker() -> None:  # a slot starting right then (its first connection)
            try:
                c = AuthClient("127.0.0.1", srv.port, "m1",
                               wire.job_secret(master, "m1", "db1"), connect_timeout_s=20)
                c.set("mt/m1/progress", "{}")
                result["ok"] = True
            except Exception as exc:
                result["error"] = repr(exc)

        t = threading.Thread(target=worker)
        t.start()
        time.sleep(2.0)
        assert "error" not in result  # not told "authentication failed" meanwhile
        assert srv.counts["auth_failures"] >= 2  # it was asked to retry, more than once
        Coordinator.attach(f"127.0.0.1:{srv.port}", master, realm="db1",
                           live_jobs=lambda: ["m1"])  # the daemon reconnects
        t.join(20)
        assert result == {"ok": True}
    finally:
        srv.close()


# ---------------------------------------------------------------------- findings 4, 5: time, fds


def _raw_job_session(srv: KVServer, job: str = "m1") -> wire.Session:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    return wire.client_handshake(sock, job, wire.job_secret(MASTER, job, ""))


MASTER = b"b" * 32


def test_stalled_frames_are_dropped_whole_and_counted_before_they_are_buffered():
    limits = ServerLimits(frame_timeout_s=1.0, max_job_bytes=4 << 20)
    srv = KVServer(MASTER, limits=limits).start()
    srv.admit("", ["m1"])
    try:
        stalled = []
        for _ in range(12):  # each announces a 1 MiB frame and sends all but its last byte
            sess = _raw_job_session(srv)
            n = wire.MAX_VALUE_BYTES
            sess.sock.sendall(struct.pack("!I", n) + b"\0" * (n - 1))
            stalled.append(sess)
        time.sleep(0.3)
        space = srv._jobs["m1"]
        assert space.inflight <= limits.max_job_bytes  # 4 counted; the rest never buffered
        assert srv.usage.bytes <= limits.max_job_bytes
        deadline = time.monotonic() + 5
        for sess in stalled:  # every one is closed at its frame's deadline
            sess.sock.settimeout(max(deadline - time.monotonic(), 0.1))
            assert _closed(sess.sock)
        assert space.inflight == 0 and srv.usage.bytes == 0
        assert srv.counts["bad_frames"] >= 4
        ok = _raw_job_session(srv)  # the job's own requests go on
        ok.send(wire.Op.SET, [b"mt/m1/k", b"v"])
        assert ok.recv()[0] == wire.Status.OK
    finally:
        srv.close()


def _closed(sock: socket.socket) -> bool:
    """True once the server closed the connection (answers before that are skipped)."""
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_handshake_trickled_a_byte_at_a_time_ends_at_its_whole_deadline():
    srv = KVServer(MASTER, limits=ServerLimits(handshake_timeout_s=1.0)).start()
    srv.admit("", [])
    try:
        hello = struct.pack("!I", 60) + b'{"v": 1, "job": "m1", "nonce": "' + b"0" * 32
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        t0 = time.monotonic()
        with contextlib.suppress(OSError):
            for byte in hello:  # one byte every 0.3 s: each read well inside 1 s
                s.sendall(bytes([byte]))
                time.sleep(0.3)
                if time.monotonic() - t0 > 4:
                    break
        s.settimeout(3)
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(100) == b""
        assert time.monotonic() - t0 < 3.0
    finally:
        srv.close()


def test_one_jobs_idle_sessions_lock_out_neither_other_jobs_nor_the_daemon():
    limits = ServerLimits(max_connections=12, max_connections_per_job=6,
                          max_admin_connections=2)
    srv = KVServer(MASTER, limits=limits).start()
    srv.admit("", ["m1", "m2", "m3"])
    try:
        held = []
        for _ in range(10):  # one job opens more idle sessions than it may hold
            sess = _raw_job_session(srv, "m1")
            held.append(sess)
        time.sleep(0.3)
        assert srv._jobs["m1"].connections == 6
        assert srv.counts["refused_job_full"] == 4
        for _ in range(6):  # another job fills the rest of the jobs' room
            held.append(_raw_job_session(srv, "m2"))
        t0 = time.monotonic()  # the daemon's session still gets in, at once
        admin = AuthClient("127.0.0.1", srv.port, None, wire.admin_secret(MASTER),
                           connect_timeout_s=3)
        assert admin.num_keys() == 0 and time.monotonic() - t0 < 1.0
    finally:
        srv.close()


def test_one_users_jobs_together_lock_out_neither_another_user_nor_the_daemon():
    limits = ServerLimits(max_connections=12, max_connections_per_job=4,
                          max_connections_per_user=6, max_admin_connections=2)
    srv = KVServer(MASTER, limits=limits).start()
    srv.admit("", ["b1", "b2", "b3"], uid=1002)  # bob's three jobs
    srv.admit("", ["a1"], uid=1001)  # alice's
    try:
        held = [_raw_job_session(srv, job) for job in ("b1", "b2", "b3") for _ in range(4)]
        time.sleep(0.3)
        assert sum(srv._jobs[j].connections for j in ("b1", "b2", "b3")) == 6
        alice = [_raw_job_session(srv, "a1") for _ in range(4)]  # all four get in
        time.sleep(0.3)
        assert srv._jobs["a1"].connections == 4
        admin = AuthClient("127.0.0.1", srv.port, None, wire.admin_secret(MASTER),
                           connect_timeout_s=3)
        assert admin.num_keys() == 0
        del held, alice
    finally:
        srv.close()


def test_limits_that_the_file_descriptors_cannot_hold_refuse_to_start():
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    too_many = ServerLimits(max_connections=hard + 1)
    with pytest.raises(ConfigError, match="LimitNOFILE"):
        KVServer(MASTER, limits=too_many)
    # the packaged unit gives the default limits their descriptors and threads
    unit = (Path(__file__).resolve().parents[2] / "configs"
            / "malletrain-coordinator.service").read_text()
    nofile = int(re.search(r"^LimitNOFILE=(\d+)$", unit, re.M).group(1))
    tasks = int(re.search(r"^TasksMax=(\d+)$", unit, re.M).group(1))
    need = ServerLimits().max_sockets + FD_HEADROOM
    assert nofile >= need and tasks >= need


# ---------------------------------------------------------------------- finding 11


def test_malformed_hellos_are_refused_quietly(caplog):
    srv = KVServer(MASTER).start()
    srv.admit("", [])
    try:
        nested = b"[" * 1000
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                s.sendall(struct.pack("!I", len(nested)) + nested)
                with contextlib.suppress(ConnectionResetError):
                    s.recv(100)
        time.sleep(0.3)
        assert srv.counts["auth_failures"] == 50 and srv.counts["errors"] == 0
        logged = [r for r in caplog.records if r.name.endswith("kvserver")]
        assert len(logged) <= 7 and not any(r.exc_info for r in logged)
    finally:
        srv.close()


def test_the_key_file_is_checked_on_the_descriptor_it_is_read_from(tmp_path, monkeypatch):
    good = tmp_path / "good.key"
    keyfile.create_key(good)
    swapped = tmp_path / "coordinator.key"
    swapped.write_text("ab" * 32 + "\n")
    swapped.chmod(0o644)  # readable by everyone: what an attacker swapped in
    real_lstat = os.lstat
    # the race: a check by name sees the good file, the open gets the other one
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: real_lstat(
        good if str(p) == str(swapped) else p, *a, **k))
    with pytest.raises(ConfigError, match="0600"):
        keyfile.read_key(swapped)


def test_an_id_with_a_trailing_newline_is_no_id():
    assert ID_RE.match("m1") and not ID_RE.match("m1\n")
    with pytest.raises(ValueError):
        wire.job_secret(MASTER, "m1\n")


def test_a_coordinator_run_by_hand_with_open_serves_any_job_until_a_daemon_names_a_realm():
    srv = KVServer(MASTER, open_jobs=True).start()
    try:
        c = AuthClient("127.0.0.1", srv.port, "demo", wire.job_secret(MASTER, "demo"))
        Coordinator.attach(f"127.0.0.1:{srv.port}", MASTER).publish("demo", [])  # by hand
        AuthClient("127.0.0.1", srv.port, "demo", wire.job_secret(MASTER, "demo")).set(
            "mt/demo/progress", "{}")
        c.close()
        Coordinator.attach(f"127.0.0.1:{srv.port}", MASTER, realm="db1")  # a daemon's
        with pytest.raises(AuthenticationRefused):
            AuthClient("127.0.0.1", srv.port, "demo", wire.job_secret(MASTER, "demo"),
                       connect_timeout_s=0.5)
    finally:
        srv.close()
