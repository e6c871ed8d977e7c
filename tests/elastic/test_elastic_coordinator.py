"""The coordinator as the daemon uses it: a standalone `malletrain coordinator` process that
survives the daemon (re-attach), and workers that survive the coordinator's restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from elastic_harness import (
    REPO,
    Cluster,
    attach,
    checksums_at,
    committed_steps,
    start_coordinator,
    wait_for,
)

from malletrain.elastic.coordinator.handle import Coordinator, MemberUnavailable
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import MemberInfo
from malletrain.errors import PermanentError, RetryableError

pytestmark = pytest.mark.torch
KEY = b"k" * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_daemon_restart_reattaches_to_the_standalone_coordinator(tmp_path):
    proc, address = start_coordinator(tmp_path)
    try:
        daemon = attach(tmp_path, address)
        host, port = address.rsplit(":", 1)
        secret = bytes.fromhex(daemon.job_secret("j1"))
        worker_side = JobStore(AuthStore(host, int(port), "j1", secret), "j1")  # a job's own
        for i, m in enumerate(("a", "b", "c")):
            worker_side.register(MemberInfo(m, f"node{i}", 100 + i, 1, time.time()))
        assert set(daemon.registered("j1")) == {"a", "b", "c"}
        with pytest.raises(MemberUnavailable):
            daemon.publish("j1", ["a", "zz"])
        with pytest.raises(PermanentError):
            daemon.publish("bad/job", ["a"])
        assert daemon.publish("j1", ["a", "b"]) == 1
        worker_side.depart("b", "sigterm", 1, 42)
        assert daemon.publish("j1", ["a", "c"]) == 2
        with pytest.raises(MemberUnavailable):  # departed members cannot be published
            daemon.publish("j1", ["a", "b"])
        del daemon  # the daemon is killed; the store lives on in its own process

        again = attach(tmp_path, address)
        m = again.membership("j1")
        assert (m.epoch, m.members, m.source) == (2, ("a", "c"), "publish")
        assert again.epoch("j1", 1).members == ("a", "b")
        assert set(again.registered("j1")) == set()  # a and c are in the job
        assert set(again.live_members("j1")) == {"a", "c"}
        [dep] = again.departures("j1")
        assert (dep.member_id, dep.reason, dep.step) == ("b", "sigterm", 42)
        # c's slot ended without c saying so (SIGKILL): the daemon records it, once
        assert again.depart("j1", "c") and not again.depart("j1", "c")
        assert not again.depart("j1", "b")  # it left on its own
        assert set(again.live_members("j1")) == {"a"}
        assert [(d.member_id, d.reason) for d in again.departures("j1")] == [
            ("b", "sigterm"), ("c", "failed")]
        assert again.progress("j1") is None and not again.is_finished("j1")
        again.forget("j1")
        assert again.membership("j1") is None and again.departures("j1") == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def _coordinator_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "malletrain.cli", "coordinator", *args],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)


def test_coordinator_cli_rejects_bad_input_in_one_line(tmp_path):
    key = str(tmp_path / "k")
    out = _coordinator_cli("--port", "70000", "--key-file", key)
    assert out.returncode != 0
    assert "--port 70000" in out.stderr and "Traceback" not in out.stderr
    out = _coordinator_cli("--key-file", key, "--job-secret", "m1")  # creates the key
    assert out.returncode == 0 and os.stat(key).st_mode & 0o777 == 0o600
    os.chmod(key, 0o644)  # now readable by others: refused
    out = _coordinator_cli("--key-file", key, "--job-secret", "m1")
    assert out.returncode != 0 and "must be 0600" in out.stderr and "Traceback" not in out.stderr
    os.chmod(key, 0o600)
    link = tmp_path / "link"
    link.symlink_to(key)
    out = _coordinator_cli("--key-file", str(link), "--job-secret", "m1")
    assert out.returncode != 0 and "not a regular file" in out.stderr
    out = _coordinator_cli("--key-file", key, "--job-secret", "m1")
    assert out.returncode == 0 and len(out.stdout.strip()) == 64
    out = _coordinator_cli("--key-file", key, "--job-secret", "bad/id")
    assert out.returncode != 0 and "invalid job id" in out.stderr
    with pytest.raises(RetryableError):
        Coordinator.attach(f"127.0.0.1:{_free_port()}", KEY, timeout_s=1)
    with pytest.raises(PermanentError):
        Coordinator.attach("no-port-here", KEY)


def test_workers_train_through_a_coordinator_restart(tmp_path):
    port = _free_port()
    proc, address = start_coordinator(tmp_path, port)
    cluster = Cluster(tmp_path, coord=attach(tmp_path, address))
    args = ["--dataset-size", "256", "--batch", "4", "--hidden", "32", "--step-sleep", "0.02"]
    try:
        w0 = cluster.launch("m0", *args)
        cluster.wait_registered("m0")
        e1 = cluster.coord.publish(cluster.job_id, ["m0"])
        cluster.wait_epoch(w0, e1)
        cluster.wait_step(w0, 10)

        proc.send_signal(signal.SIGKILL)  # the store and all its keys are gone
        proc.wait(10)
        before = w0.last_step()
        time.sleep(2.0)
        assert w0.last_step() >= before + 10, "training stalled while the coordinator was down"

        proc, address = start_coordinator(tmp_path, port)
        cluster.coord = attach(tmp_path, address, live_jobs=[cluster.job_id])
        # the workers put their epoch and registration back (rank 0's watcher re-seeds)
        wait_for(lambda: (m := cluster.coord.membership(cluster.job_id)) is not None
                 and m.epoch == e1 and m.members == ("m0",), 30, "re-seeded epoch", cluster)
        wait_for(lambda: "m0" in cluster.coord.live_members(cluster.job_id), 30,
                 "re-registration", cluster)
        wait_for(lambda: (p := cluster.coord.progress(cluster.job_id)) is not None
                 and p.step > before, 30, "progress reports again", cluster)

        w1 = cluster.launch("m1", *args)
        cluster.wait_registered("m1")
        e2 = cluster.coord.publish(cluster.job_id, ["m0", "m1"])
        assert e2 > e1
        cluster.wait_epoch(w1, e2)
        cluster.wait_epoch(w0, e2)
        assert len(checksums_at([w0, w1], e2)) == 1
        cluster.wait_step(w1, w1.last_step() + 5)
        # evicted to zero with no state dir: the last group's rank 0 cannot save, and says so;
        # rank 1 saves too where it is unsure rank 0 is still there (the rule of
        # `_saves_for_the_group`: "unsure: save", always safe), and then says so as well
        # (seen once in CI: rank 0's session had just been cut and re-made)
        cluster.coord.publish(cluster.job_id, [])
        assert w0.proc.wait(30) == 1
        assert w0.exit_record()["reason"] == "state_lost"
        rc1 = w1.proc.wait(30)
        assert rc1 == 0 or (rc1 == 1 and w1.exit_record()["reason"] == "state_lost"), rc1
        steps = committed_steps([w0, w1])
        assert sorted(steps) == list(range(len(steps)))  # gapless through the outage

        # the job gets a node again, but no replica and no snapshot holds its state:
        # the worker refuses to start over from step 0 (the daemon sees a "crashed" departure)
        w2 = cluster.launch("m2", *args)
        cluster.wait_registered("m2")
        cluster.coord.publish(cluster.job_id, ["m2"])
        assert w2.proc.wait(60) == 1
        assert w2.exit_record()["reason"] == "state_lost"
        assert not w2.steps()
        assert cluster.coord.departures(cluster.job_id)[-1].reason == "crashed"
    finally:
        cluster.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
