"""`malletrain jobs` through the real daemon follows Slurm's PrivateData (issue 15, item 7).

With ``PrivateData=jobs`` set on the dev cluster, mt-alice sees her job, mt-bob (another
user) sees nothing of it, and root (an operator) sees it; squeue hides it from bob the same
way, which is what malletrain follows.
"""

from __future__ import annotations

import json

import pytest

from .harness import Daemon

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]


def test_another_user_does_not_see_a_job_where_slurm_keeps_jobs_private(clean_cluster,
                                                                         workdir):
    conf = clean_cluster.conf_path
    text = conf.read_text()
    conf.write_text(text + "PrivateData=jobs\n")
    clean_cluster.run("scontrol", "reconfigure")
    d = None
    try:
        d = Daemon(workdir, clean_cluster.conf_path, clean_cluster.env,
                   policy="malletrain").start()
        job = d.submit_example("mt-alice", "private", "1-1", 10**9)

        def visible(user: str | None) -> list[str]:
            res = d.cli(user, "jobs", "--json", "--socket", str(d.socket))
            return [row["job_id"] for row in json.loads(res.stdout)]

        assert visible("mt-alice") == [job]
        assert visible("mt-bob") == []
        assert visible(None) == [job]  # root: an operator sees every job
        slot_ids = clean_cluster.run("squeue", "-h", "-o", "%i", user="mt-bob").stdout.split()
        assert slot_ids == []  # Slurm hides alice's slot jobs from bob too
    finally:
        conf.write_text(text)
        clean_cluster.run("scontrol", "reconfigure")
        if d is not None:
            d.stop()
            d.stop_coordinator()
        clean_cluster.scancel_all()
