"""The submit notice on a real slurmctld: ``slurm/job_submit.lua`` (JobSubmitPlugins=lua in
the dev cluster) rewrites ``run/submit-notice`` at every submission, and the arrival probe
that reads it asks Slurm only then: no ``squeue`` on a quiet queue, a wake-up within a
fraction of a second of a real user's ``sbatch``.
"""

from __future__ import annotations

import stat
import threading
import time

import pytest

from malletrain.daemon.observe.arrivals import ArrivalProbe, SubmitNotice
from malletrain.slurm.select import select_backend

pytestmark = pytest.mark.slurm


def test_the_probe_asks_slurm_only_when_a_job_is_submitted(clean_cluster):
    backend = select_backend(timeout_s=20)
    path = clean_cluster.dir / "run" / "submit-notice"
    first = clean_cluster.sbatch("--hold", "--partition=batch", wrap="sleep 60", user="mt-bob")
    st = path.stat()  # written by slurmctld's user, root here; only it may write
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022

    calls: list[float] = []

    def query() -> frozenset[int]:
        calls.append(time.monotonic())
        return backend.pending_job_ids()

    woken = threading.Event()
    notice = SubmitNotice(path)
    probe = ArrivalProbe(query, woken.set, 0.25, notice)
    probe.expect([first], armed=True)
    probe.start()
    try:
        time.sleep(1.5)  # a quiet queue: the notice does not change
        assert notice.problem is None and calls == [] and not woken.is_set()
        t0 = time.monotonic()
        second = clean_cluster.sbatch("--hold", "--partition=batch", wrap="sleep 60",
                                      user="mt-alice")
        assert woken.wait(3.0), "the probe did not wake on the submission"
        woke_s = time.monotonic() - t0
        assert second in backend.pending_job_ids()
        print(f"woken {woke_s:.3f} s after sbatch started; {len(calls)} squeue call(s)")
        assert woke_s < 1.0, woke_s  # sbatch's own round trip included
        assert 1 <= len(calls) <= 2
    finally:
        probe.stop()
