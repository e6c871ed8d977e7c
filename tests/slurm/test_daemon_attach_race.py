"""A job attached while a tick waits for Slurm is not judged by Slurm's older answer.

Real dev cluster, real CLI backend, real store and coordinator, an in-process daemon whose
backend answers one snapshot late: the snapshot is read, then the backend waits while the
user's slot jobs are submitted and attached. The tick must not see the job attached with
slot jobs its snapshot does not list: read after Slurm, the store showed such a job, and
its slots counted as "cancelled or vanished outside malletrain", which cancelled it.
"""

from __future__ import annotations

import threading

import pytest

from malletrain.core.cluster import ClusterSnapshot
from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.jobs.slots import slot_tag
from malletrain.daemon.service.daemon import Daemon
from malletrain.daemon.submit.channel import Peer
from malletrain.daemon.tick.actions import Transit
from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.ops.settings import Settings, StateSettings
from malletrain.slurm.backend import CliBackend
from malletrain.slurm.sbatch import SbatchSpec

pytestmark = pytest.mark.slurm

ROOT = Peer(uid=0, gid=0, pid=1, user="root")


class LateAnswer(CliBackend):
    """Slurm's answer, handed over only once ``go`` is set (after ``read`` is)."""

    def __init__(self) -> None:
        super().__init__(timeout_s=20, daemon=True)
        self.read = threading.Event()
        self.go = threading.Event()
        self.go.set()

    def snapshot(self) -> ClusterSnapshot:
        snap = super().snapshot()
        self.read.set()
        assert self.go.wait(30)
        return snap


def test_a_job_attached_during_the_slurm_read_is_not_cancelled(clean_cluster, tmp_path):
    backend = LateAnswer()
    coordinator = Coordinator.start("127.0.0.1", 0)
    settings = Settings(state=StateSettings(database_path=tmp_path / "state.db",
                                            snapshot_dir=tmp_path / "snapshots"))
    daemon = Daemon(settings, backend, coordinator=coordinator)
    slots: list[int] = []
    try:
        spec = {"script": "/bin/true", "min_nodes": 1, "max_nodes": 2, "kind": "race"}
        job_id = daemon.handle(ROOT, {"op": "submit", "spec": spec})["job_id"]
        backend.go.clear()
        ticking = threading.Thread(target=lambda: plans.append(daemon.tick()))
        plans: list = []
        ticking.start()
        assert backend.read.wait(30)  # the tick holds Slurm's answer; the user goes on
        slots += [backend.submit(SbatchSpec(
            script="#!/bin/bash\nsrun sleep 300\n", output="/dev/null", partition="scavenger",
            nodes=1, hold=True, comment=slot_tag(job_id, k))) for k in range(2)]
        daemon.handle(ROOT, {"op": "attach", "job_id": job_id, "slots": slots})
        backend.go.set()
        ticking.join(60)
        assert plans and plans[0] is not None
        cancels = [a for a in plans[0].actions if isinstance(a, Transit) and a.job_id == job_id]
        assert cancels == []
        daemon.tick()  # the next tick sees the slots: the job is allocated, not cancelled
        job = daemon.store.job(job_id)
        assert job is not None and job.state in (JobPhase.QUEUED, JobPhase.STARTING), job
    finally:
        backend.go.set()
        for sid in slots:
            backend.cancel(sid)
        daemon.close()
        coordinator.close()
