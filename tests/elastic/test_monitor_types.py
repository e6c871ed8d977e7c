"""The daemon's Job Monitor on a cluster of several node types (issue 19 §1): each job is
also profiled per type, from the progress made on that type only, and the models it hands
the tick carry the throughput per type. Real coordinator, store and advisor."""

from __future__ import annotations

import time

import pytest

from malletrain.core.lifecycle import JobPhase
from malletrain.core.profiling.profiler import ProfilingAdvisor
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.observe.monitor import JobMonitor
from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import MemberInfo, ProgressReport

NODE_TYPES = {"g1": "v100", "g2": "v100", "p1": "p100"}


@pytest.fixture
def coord():
    c = Coordinator.start("127.0.0.1", 0)
    yield c
    c.close()


def _queued_job(coord, tmp_path, nodes: tuple[str, ...]):
    """A queued job in a real store, and its members s0-r0, s1-r0, ... registered with the
    real coordinator on ``nodes``: (store, job, its job store, the registration time)."""
    store = Store(tmp_path / "state.db")
    job = store.create_job(1000, "alice", JobSpec(script="/x/train.py", max_nodes=2))
    store.transition(job.job_id, JobPhase.QUEUED, "slots attached")
    host, port = coord.address.rsplit(":", 1)
    js = JobStore(AuthStore(host, int(port), job.job_id,
                            wire.parse_secret(coord.job_secret(job.job_id))), job.job_id)
    now = time.time()
    for k, node in enumerate(nodes):
        js.register(MemberInfo(f"s{k}-r0", node, 100, 1, now))
    return store, job, js, now


def test_profiles_per_node_type_see_only_their_own_progress(coord, tmp_path):
    store, job, js, now = _queued_job(coord, tmp_path, ("g1", "g2", "p1"))
    monitor = JobMonitor(ProfilingAdvisor(), store)
    samples, t = 0, now - 1000

    def run(members: tuple[str, ...], per_s: float, seconds: int) -> None:
        nonlocal samples, t
        for _ in range(seconds // 10):
            t += 10
            samples += int(per_s * 10)
            js.set_progress(ProgressReport(epoch=1, step=samples // 64, samples_total=samples,
                                           samples_per_s=per_s, world_size=len(members),
                                           step_time_s=1.0, time_s=t, members=members))
            monitor.observe(coord, store.jobs(), NODE_TYPES)

    run(("s0-r0", "s1-r0"), 60.0, 200)  # two V100s
    run(("s2-r0",), 20.0, 200)          # then one P100
    run(("s0-r0", "s1-r0"), 60.0, 100)  # back on the V100s: 600 samples there, not 4,600
    models = monitor.models(store.jobs(), ["p100", "v100"])[job.job_id]
    assert models.by_type["v100"].rate(2) == pytest.approx(60.0, rel=0.1)
    assert models.by_type["p100"].rate(1) == pytest.approx(20.0, rel=0.1)
    assert monitor.typed_kinds == {f"{job.spec.kind}@v100", f"{job.spec.kind}@p100"}
    # one type only: no per-type models (the policy's plain path)
    assert monitor.models(store.jobs(), ["v100"])[job.job_id].by_type == {}
    monitor.forget(job.job_id)
    assert not monitor.progress.keys(job.job_id)


def test_step_times_of_a_group_across_two_switches_set_the_jobs_spread_factor(coord,
                                                                              tmp_path):
    """Reports of the job on two nodes of one switch, then on two switches (issue 19 §2):
    the steps across switches are kept apart and their slowdown is the job's spread
    factor, which the models hand to the tick (core/allocation/spread.py)."""
    store, job, js, now = _queued_job(coord, tmp_path, ("a1", "a2", "b1"))
    switches = {"a1": "swA", "a2": "swA", "b1": "swB"}
    monitor = JobMonitor(ProfilingAdvisor(), store)
    samples, t = 0, now - 1000
    for members, step_s, sync_s in ((("s0-r0", "s1-r0"), 0.1, 0.02),
                                    (("s0-r0", "s2-r0"), 0.4, 0.32)):
        for _ in range(5):
            t += 10
            samples += int(64 / step_s * 10)
            js.set_progress(ProgressReport(
                epoch=1, step=samples // 64, samples_total=samples, samples_per_s=64 / step_s,
                world_size=2, step_time_s=step_s, sync_time_s=sync_s, time_s=t,
                members=members))
            monitor.observe(coord, store.jobs(), None, switches)
    model = monitor.models(store.jobs())[job.job_id]
    assert model.spread_factor == pytest.approx(0.25, rel=0.05)
    # without a topology every group counts as packed: no factor is learned
    other = JobMonitor(ProfilingAdvisor(), store)
    other.observe(coord, store.jobs())
    assert other.models(store.jobs())[job.job_id].spread_factor == 1.0
