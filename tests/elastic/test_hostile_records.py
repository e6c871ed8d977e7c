"""A job's own user writes junk into its job records in the coordinator (a buggy or hostile
worker: the secret lets it write its own job's keys): the daemon's Job Monitor keeps that
job's last good view, counts the bad record, marks the job, and serves every other job as
before (issue 15, "hostile input isolated"). Another user cannot write there at all
(tests/security/test_coordinator_attacks.py).

Real parts: the standalone coordinator process, the daemon's JobMonitor, Profiling Advisor
and SQLite store; the writer is mt-alice, a separate account of the dev cluster, running its
own Python process with her job's secret (given on stdin, never on a command line).
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest
from elastic_harness import attach, start_coordinator

from malletrain.core.lifecycle import JobPhase
from malletrain.core.profiling.profiler import ProfilingAdvisor
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.observe.monitor import JobMonitor
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import MemberInfo, ProgressReport

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

ATTACK = """
import sys
from malletrain.elastic.protocol.authstore import AuthStore
host, port, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = AuthStore(host, port, job, bytes.fromhex(sys.stdin.read().strip()))
pre = f"mt/{job}/"
store.set(pre + "progress", '{"epoch": 1, "samples_total": "lots", "junk": [1, 2]}')
n = store.add(pre + "events", 1) - 1
store.set(pre + f"ev/{n}", '{"kind": "evict", "member_id": "s0-r0", "time_s": 0, "data": {}}')
try:  # the coordinator's write rules refuse it (issue 49): the daemon never reads it
    store.set(pre + "latest", "not a number")
except Exception as exc:
    print("latest refused:", type(exc).__name__)
print("written")
"""


def _report(samples: int, t: float) -> ProgressReport:
    return ProgressReport(epoch=1, step=samples // 64, samples_total=samples,
                          samples_per_s=64.0, world_size=1, step_time_s=1.0, time_s=t,
                          members=("s0-r0",))


def test_junk_written_by_a_jobs_own_user_stays_with_that_job(dev_cluster, tmp_path):
    proc, address = start_coordinator(tmp_path)
    store = Store(tmp_path / "state.db")
    try:
        jobs = [store.create_job(1000 + i, user, JobSpec(script="/x/train.py", max_nodes=2))
                for i, user in enumerate(("mt-alice", "mt-carol"))]
        victim, other = (j.job_id for j in jobs)
        for jid in (victim, other):  # slots attached: the daemon reads the coordinator for it
            store.transition(jid, JobPhase.QUEUED, "slots attached")
        coord = attach(tmp_path, address)
        host, port = address.rsplit(":", 1)
        writers = {jid: JobStore(AuthStore(host, int(port), jid,
                                           bytes.fromhex(coord.job_secret(jid))), jid)
                   for jid in (victim, other)}
        for js in writers.values():  # what the jobs' own workers write
            js.register(MemberInfo("s0-r0", "n1", 100, 1, time.time()))
        coord.publish(victim, ["s0-r0"])
        coord.publish(other, ["s0-r0"])
        now = time.time()
        writers[victim].set_progress(_report(640, now))
        writers[other].set_progress(_report(640, now))
        bad: list[tuple[str, str]] = []
        monitor = JobMonitor(ProfilingAdvisor(), store,
                             on_bad_record=lambda job, what: bad.append((job, what)))
        first = monitor.observe(coord, store.jobs())
        assert first[victim].samples_total == 640 and bad == []

        res = dev_cluster.run(sys.executable, "-c", ATTACK, host, port, victim,
                              user="mt-alice", timeout_s=60, input=coord.job_secret(victim))
        assert "written" in res.stdout, res.stderr
        assert "latest refused: StoreRefused" in res.stdout, res.stdout
        writers[other].set_progress(_report(1280, now + 5))

        second = monitor.observe(coord, store.jobs())
        assert second[other].samples_total == 1280  # the other job is served as before
        assert second[victim] == first[victim]  # the victim keeps its last good view
        assert {job for job, _ in bad} == {victim} and len(bad) >= 1
        reported = len(bad)
        monitor.observe(coord, store.jobs())  # the junk is still there: not reported again
        assert len(bad) == reported
        rec = store.job(victim)
        assert rec is not None and "bad record" in rec.message
        assert store.job(other).samples_total == 1280
        # the junk event is skipped, the victim's real registration still counts
        assert set(coord.live_members(other)) == {"s0-r0"}
        assert json.dumps(second[victim].samples_total)  # plain, validated values only
    finally:
        store.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0

