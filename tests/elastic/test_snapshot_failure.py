"""An evict-to-zero save that fails is the job's failure, said so, not a silent loss
(issue 49, finding 8): real workers, the real coordinator, the daemon's own reading of it."""

from __future__ import annotations

import pytest
from elastic_harness import Cluster

from malletrain.daemon.observe.monitor import JobMonitor

pytestmark = pytest.mark.torch


def test_a_failed_save_at_eviction_departs_as_state_lost(tmp_path):
    c = Cluster(tmp_path)
    try:
        state = tmp_path / "state"
        state.write_text("a file where the state directory should be: every save fails")
        c.state_dir = state
        w = c.launch("m0", "--total-samples", "100000", "--dataset-size", "256", "--batch",
                     "4", "--hidden", "32", "--step-sleep", "0.02")
        c.wait_registered("m0")
        e1 = c.coord.publish(c.job_id, ["m0"])
        c.wait_epoch(w, e1)
        c.wait_step(w, 10)
        c.coord.publish(c.job_id, [])  # evicted to zero nodes: m0 must save
        assert w.proc.wait(30) == 1, c.stderr_tail()
        assert w.exit_record()["reason"] == "state_lost"
        assert [d.reason for d in c.coord.departures(c.job_id)] == ["state_lost"]
        assert "could not be saved" in w.stderr.read_text()
        # what the daemon's monitor makes of the coordinator's record: the job fails
        view = JobMonitor._view(c.coord.read_jobs([c.job_id])[c.job_id])
        assert view.state_lost == {"m0"}
    finally:
        c.stop()
