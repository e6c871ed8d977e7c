"""The coordinator's authenticated key-value server, over real sockets in this process.

The attacks as another Unix user against a running job are in tests/security; here each rule
of the server is pinned down on its own: the handshake, the frame MAC, the namespaces, the
write rules a job's own processes live under, the realm, the bounds.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time

import pytest
import torch.distributed as dist

from malletrain.elastic.coordinator.kvserver import KVServer, ServerLimits
from malletrain.elastic.coordinator.kvspace import KEY_OVERHEAD
from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authclient import AuthClient
from malletrain.elastic.protocol.authclient import StoreRefused as ClientRefused
from malletrain.elastic.protocol.authstore import AuthStore, StoreRefused
from malletrain.elastic.protocol.keys import build_membership

MASTER = b"m" * 32


@pytest.fixture
def server():
    srv = KVServer(MASTER).start()
    srv.admit("", ["m1"])  # the daemon said its realm and its one job
    yield srv
    srv.close()


def job(srv: KVServer, job_id: str, realm: str = "") -> AuthStore:
    """A job's session; the job admitted first, as the daemon does when it hands out the
    secret (coordinator/registry.py)."""
    if srv.realm != realm or not srv.registry.admitted(job_id):
        srv.admit(realm, [job_id])
    return AuthStore("127.0.0.1", srv.port, job_id, wire.job_secret(MASTER, job_id, realm))


def admin(srv: KVServer) -> AuthClient:
    """The daemon's session: the torch-free client."""
    return AuthClient("127.0.0.1", srv.port, None, wire.admin_secret(MASTER))


def epoch(e: int, members: list[str], source: str) -> str:
    return r.encode_membership(build_membership(e, members, dict.fromkeys(members, 1),
                                                source, 0.0))


def test_the_store_api_as_torch_uses_it(server):
    s = job(server, "m1")
    s.set("mt/m1/a", b"\x00\xff")
    assert s.get("mt/m1/a") == b"\x00\xff"
    assert s.add("mt/m1/n", 3) == 3 and s.add("mt/m1/n", -1) == 2
    assert s.compare_set("mt/m1/c", "", "x") == b"x"
    assert s.compare_set("mt/m1/c", "", "y") == b"x"  # held value: the loser re-reads
    assert s.compare_set("mt/m1/c", "x", "z") == b"z"
    assert s.check(["mt/m1/a", "mt/m1/c"]) and not s.check(["mt/m1/none"])
    assert s.num_keys() == 3 and s.delete_key("mt/m1/a") and not s.delete_key("mt/m1/a")
    s.set_timeout(__import__("datetime").timedelta(seconds=0.2))
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="timed out"):
        s.get("mt/m1/none")
    assert 0.15 < time.monotonic() - t0 < 2.0


def test_a_blocked_get_wakes_when_another_session_sets_the_key(server):
    import threading

    a, b = job(server, "m1"), job(server, "m1")
    threading.Timer(0.2, lambda: b.set("mt/m1/late", "v")).start()
    assert a.get("mt/m1/late") == b"v"
    b.wait(["mt/m1/late"])


def test_wrong_secrets_are_refused_and_the_server_serves_on(server):
    for job_id, key in (("m1", b"\0" * 32), ("m1", wire.job_secret(MASTER, "m2")),
                        (None, wire.job_secret(MASTER, "m1"))):
        with pytest.raises(dist.DistNetworkError, match="authentication failed"):
            AuthStore("127.0.0.1", server.port, job_id, key, connect_timeout_s=0.5)
    assert job(server, "m1").num_keys() == 0
    assert server.counts["auth_failures"] >= 3  # an unproven refusal is tried again


def test_a_client_refuses_a_server_that_does_not_know_the_key():
    impostor = KVServer(b"x" * 32).start()  # e.g. another process that took the port
    try:
        with pytest.raises(dist.DistNetworkError):
            AuthStore("127.0.0.1", impostor.port, "m1", wire.job_secret(MASTER, "m1"),
                      connect_timeout_s=2)
    finally:
        impostor.close()


def test_a_job_names_only_its_own_keys(server):
    # the raw client: a job's own processes could send the admin requests too
    s = AuthClient("127.0.0.1", server.port, "m1", wire.job_secret(MASTER, "m1"))
    for call in (lambda: s.get("mt/m2/progress"), lambda: s.set("mt/m2/finished", "{}"),
                 lambda: s.check(["mt/m2/latest"]), lambda: s.wait(["mt/m2/x"]),
                 lambda: s.set("other/key", "1"), lambda: s.set("mt/m1", "1"),
                 lambda: s.forget_job("m2"), lambda: s.jobs(), lambda: s.set_realm("r"),
                 lambda: s.admit(["m2"], final=True), lambda: s.read_many(["mt/m2/progress"])):
        with pytest.raises(ClientRefused):
            call()
    with pytest.raises(StoreRefused):  # the workers' torch store: torch's error type
        job(server, "m1").get("mt/m2/progress")
    s.set("mt/m1/progress", "{}")  # the session goes on after refusals
    assert admin(server).jobs() == {"m1": (1, len("mt/m1/progress") + 2 + KEY_OVERHEAD)}


def test_a_job_cannot_rewrite_its_history_or_grow_itself(server):
    a, s = admin(server), job(server, "m1")
    cfg1 = epoch(1, ["s0", "s1"], "publish")
    assert a.compare_set("mt/m1/cfg/1", "", cfg1) == cfg1.encode()  # the daemon publishes
    with pytest.raises(StoreRefused, match="written once"):
        s.set("mt/m1/cfg/1", epoch(1, ["s0"], "heal"))
    with pytest.raises(StoreRefused, match="heal/leave"):  # adding or evicting: daemon only
        s.compare_set("mt/m1/cfg/2", "", epoch(2, [], "publish"))
    with pytest.raises(StoreRefused, match="never published"):
        s.compare_set("mt/m1/cfg/2", "", epoch(2, ["s0", "evil"], "heal"))
    with pytest.raises(StoreRefused):
        s.compare_set("mt/m1/cfg/2", "", "not json")
    heal = epoch(2, ["s0"], "heal")
    assert s.compare_set("mt/m1/cfg/2", "", heal) == heal.encode()  # shrinking is fine
    assert s.compare_set("mt/m1/cfg/3", "", epoch(3, [], "leave")).startswith(b"{")
    s.set("mt/m1/ev/0", "{}")
    for call in (lambda: s.set("mt/m1/ev/0", "x"), lambda: s.delete_key("mt/m1/ev/0"),
                 lambda: s.delete_key("mt/m1/cfg/1"), lambda: s.delete_key("mt/m1/finished"),
                 lambda: s.add("mt/m1/cfg/9", 1)):
        with pytest.raises(StoreRefused):
            call()


def test_a_job_may_put_its_epoch_back_into_a_coordinator_that_lost_it(server):
    s = job(server, "m1")  # no epoch at all: a restarted coordinator
    again = epoch(4, ["s0", "s1"], "publish")
    assert s.compare_set("mt/m1/cfg/4", "", again) == again.encode()
    with pytest.raises(StoreRefused):  # but only into an empty namespace
        s.compare_set("mt/m1/cfg/5", "", epoch(5, ["s0", "s1", "s2"], "publish"))


def test_a_new_realm_makes_old_secrets_useless(server):
    a = admin(server)
    old = wire.job_secret(MASTER, "m1", "db1")
    a.set_realm("db1")
    a.admit(["m1"], final=True)
    AuthStore("127.0.0.1", server.port, "m1", old).set("mt/m1/x", "1")
    a.set_realm("db2")  # a new database: ids restart at m1
    a.admit(["m1"], final=True)
    with pytest.raises(dist.DistNetworkError, match="authentication failed"):
        AuthStore("127.0.0.1", server.port, "m1", old, connect_timeout_s=0.5)
    job(server, "m1", "db2").set("mt/m1/x", "2")


def test_forget_drops_the_whole_namespace(server):
    s = job(server, "m1")
    for k in ("progress", "ev/0", "pg/3/rank_0", "pg/3/rank_1", "arrive/3/s0/0"):
        s.set(f"mt/m1/{k}", "v" * 100)
    a = admin(server)
    assert a.forget_job("m1") == 5 and a.jobs().get("m1", (0, 0)) == (0, 0)


def test_quotas_per_job(server):
    small = KVServer(MASTER, limits=ServerLimits(max_job_bytes=10_000, max_job_keys=5)).start()
    try:
        s = job(small, "m1")
        with pytest.raises(StoreRefused, match="exceed"):
            s.set("mt/m1/big", b"x" * 20_000)
        for i in range(5):
            s.set(f"mt/m1/k{i}", "1")
        with pytest.raises(StoreRefused, match="limit"):
            s.set("mt/m1/k5", "1")
        s.set("mt/m1/k0", "2")  # rewriting a key does not need a new one
        job(small, "m2").set("mt/m2/k", "1")  # another job has its own quota
    finally:
        small.close()


def test_all_jobs_together_are_bounded_and_forgetting_frees_the_room():
    srv = KVServer(MASTER, limits=ServerLimits(max_total_bytes=5_000)).start()
    try:
        a = job(srv, "m1")
        a.set("mt/m1/k", b"x" * 4_000)
        with pytest.raises(StoreRefused, match="coordinator is full"):
            job(srv, "m2").set("mt/m2/k", b"y" * 2_000)
        a.delete_key("mt/m1/k")
        job(srv, "m2").set("mt/m2/k", b"y" * 2_000)
        admin(srv).forget_job("m2")
        assert srv.usage.bytes == 0
        job(srv, "m3").set("mt/m3/k", b"z" * 4_500)
    finally:
        srv.close()


def _raw_session(srv: KVServer) -> wire.Session:
    sock = socket.create_connection(("127.0.0.1", srv.port))
    return wire.client_handshake(sock, "m1", wire.job_secret(MASTER, "m1"))


def test_a_tampered_or_replayed_frame_ends_only_that_connection(server):
    sess = _raw_session(server)
    payload = wire.encode_fields(wire.Op.SET, [b"mt/m1/k", b"v"])
    forged = b"\0" * 32 + payload  # no valid MAC
    sess.sock.sendall(struct.pack("!I", len(forged)) + forged)
    assert sess.sock.recv(10) == b""  # closed, no answer
    sess = _raw_session(server)
    sess.send(wire.Op.SET, [b"mt/m1/k", b"v"])
    sess.recv()
    sess._out_seq -= 1  # replay the same frame: its sequence number is spent
    sess.send(wire.Op.SET, [b"mt/m1/k", b"v"])
    assert sess.sock.recv(10) == b""
    assert job(server, "m1").get("mt/m1/k") == b"v"


def test_oversized_and_malformed_handshakes_are_dropped(server):
    for junk in (struct.pack("!I", 1 << 30), struct.pack("!I", 5) + b"[1,2]",
                 struct.pack("!I", 9) + b"not json!"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(junk)
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(100) == b""
    hello = json.dumps({"v": 1, "job": "../../x", "nonce": "00" * 16}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(struct.pack("!I", len(hello)) + hello)
        assert s.recv(100) == b""
    job(server, "m1").set("mt/m1/ok", "1")


def test_the_oldest_stalled_handshakes_make_room_for_new_clients():
    srv = KVServer(MASTER, limits=ServerLimits(max_pending_handshakes=8,
                                               handshake_timeout_s=30)).start()
    try:
        stalled = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(40)]
        t0 = time.monotonic()
        job(srv, "m1").set("mt/m1/k", "1")  # gets through although 40 handshakes hang
        assert time.monotonic() - t0 < 2.0
        assert srv.counts["dropped_handshakes"] >= 30
        for s in stalled:
            s.close()
    finally:
        srv.close()


def test_a_job_over_its_connection_limit_is_refused_and_the_count_stays_right():
    srv = KVServer(MASTER, limits=ServerLimits(max_connections_per_job=2)).start()
    try:
        a, b = job(srv, "m1"), job(srv, "m1")
        a.set("mt/m1/k", "1")
        third = job(srv, "m1")  # authenticated, then dropped: the job holds 2 already
        with pytest.raises(dist.DistNetworkError):
            third.get("mt/m1/k")
        assert srv.counts["refused_job_full"] == 1
        b.close()
        deadline = time.monotonic() + 5
        while srv._jobs["m1"].connections != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv._jobs["m1"].connections == 1  # the refused one was never counted
        job(srv, "m1").set("mt/m1/k", "2")  # room again
    finally:
        srv.close()


def test_attaching_with_another_master_key_is_a_clear_error(server):
    from malletrain.elastic.coordinator.handle import Coordinator, CoordinatorKeyMismatch

    with pytest.raises(CoordinatorKeyMismatch, match="has another key"):
        Coordinator.attach(f"127.0.0.1:{server.port}", b"x" * 32, timeout_s=2)
    coord = Coordinator.attach(f"127.0.0.1:{server.port}", MASTER, timeout_s=2, realm="db1")
    assert wire.parse_secret(coord.job_secret("m1")) == wire.job_secret(MASTER, "m1", "db1")
    assert server.realm == "db1"  # the daemon's session set it
