"""Regular jobs' GPUs against a GPU limit, on a real cluster with GPUs (issue 47).

A second, small dev cluster (2 nodes of two typed GPUs, slurmdbd tracking ``gres/gpu``):
an administrator gives mt-bob ``GrpTRES=gres/gpu=3``; bob runs a regular job on 2 GPUs.
What the daemon reads with its own readers (``sacctmgr`` through :class:`LimitsReader`,
one tick's snapshot through :class:`CliBackend` with the GPU read on) leaves bob's
1-GPU-a-node malleable job 1 node under that limit, as Slurm counts it. About 15 s.
"""

from __future__ import annotations

import functools
import subprocess
import time
from pathlib import Path

import pytest

from malletrain.core.lifecycle import Lifecycle
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import JobRecord
from malletrain.daemon.tick.limits import Usage, job_limits, regular_usage
from malletrain.slurm.backend import CliBackend
from malletrain.slurm.limits import LimitsReader

DEV_CLUSTER = Path(__file__).resolve().parents[2] / "slurm" / "dev-cluster"
pytestmark = pytest.mark.slurm
ACCOUNT = "gpulimit"


def test_a_regular_jobs_gpus_come_off_its_users_gpu_limit(extra_cluster, shared_tmp):
    c = extra_cluster("gpus", 2)

    def run(*argv: str, user: str | None = None) -> str:
        return c.run(*argv, user=user, timeout_s=120).stdout

    run(str(DEV_CLUSTER), "up", "--nodes", "2", "--gpus", "a100:2", "--accounting",
        "--users", "mt-bob")
    run("sacctmgr", "-i", "add", "account", ACCOUNT, "Description=gpus", "Organization=t")
    run("sacctmgr", "-i", "add", "user", "mt-bob", f"account={ACCOUNT}",
        f"DefaultAccount={ACCOUNT}")
    run("sacctmgr", "-i", "modify", "user", "mt-bob", "set", "GrpTRES=gres/gpu=3")
    job_id = int(run("sbatch", "--parsable", "-p", "batch", "-N", "1", "--gres=gpu:2",
                     f"--chdir={shared_tmp}", "--output=/dev/null", "--wrap=sleep 120",
                     user="mt-bob").strip())
    c.wait_until(lambda: "RUNNING" in run("squeue", "-h", "-j", str(job_id), "-o", "%T"),
                 30, period_s=0.3, what="bob's regular job to start")

    reader = LimitsReader(mode="on", run=functools.partial(subprocess.run, env=c.env))
    assert reader.holds_gpus(), reader.last_error
    backend = CliBackend(env=c.env, daemon=True)
    regular = next(j for j in backend.snapshot().jobs if j.job_id == job_id)
    assert (regular.account, regular.gpus) == (ACCOUNT, 0)  # not read unless asked
    backend.count_gpus = True
    regular = next(j for j in backend.snapshot().jobs if j.job_id == job_id)
    assert (regular.account, regular.gpus) == (ACCOUNT, 2)

    site = reader.current()
    assert site is not None
    used = regular_usage([regular], site)
    assert used[f"assoc:{ACCOUNT}/mt-bob"] == Usage(nodes=1, jobs=1, gpus=2)
    bob = JobRecord("m1", 1, 1001, "mt-bob", JobSpec(script="/x/t.py", max_nodes=2,
                                                      gpus_per_node=1),
                    Lifecycle.new(time.time()), time.time())
    assert job_limits(bob, site, used).caps[f"assoc:{ACCOUNT}/mt-bob"] == 1
    assert job_limits(bob, site, {}).caps[f"assoc:{ACCOUNT}/mt-bob"] == 3
