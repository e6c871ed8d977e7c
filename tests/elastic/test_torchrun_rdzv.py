"""``torchrun --rdzv_backend=malletrain`` (issue 16 §4): two real torchrun agents form their
group through the job's authenticated coordinator, not an open TCPStore; a wrong secret, or
another user's job secret, gets nowhere and disturbs nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from elastic_harness import REPO

from malletrain.elastic.coordinator.handle import Coordinator

pytestmark = [pytest.mark.torch, pytest.mark.slurm]

WORKER = """\
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item()}
open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def _agent(coord: Coordinator, tmp, job: str, secret: str, run_id: str = "t1",
           user: str | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MALLETRAIN_JOB_ID=job,
               MALLETRAIN_JOB_SECRET=secret)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            "--rdzv_backend=malletrain", f"--rdzv_endpoint={coord.address}",
            f"--rdzv_id={run_id}", "--rdzv_conf=join_timeout=120,last_call_timeout=1",
            "--max_restarts=0", str(tmp / "worker.py"), str(tmp)]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp)


@pytest.fixture
def coord():
    c = Coordinator.start("127.0.0.1", 0)
    yield c
    c.close()


def test_two_agents_form_their_group_through_the_coordinator(coord, dev_cluster, shared_tmp):
    tmp_path = shared_tmp  # mt-bob's agent runs the same file (dev_cluster: the test users)
    (tmp_path / "worker.py").write_text(WORKER)
    secret = coord.job_secret("rj")
    # an agent with a wrong secret is refused at once and never joins
    wrong = _agent(coord, tmp_path, "rj", "ab" * 32, run_id="t1")
    _, err = wrong.communicate(timeout=60)
    assert wrong.returncode != 0 and "AuthenticationRefused" in err, err[-2000:]
    # mt-bob, with his own job's secret, lands in his own job's space: alone, he never
    # meets alice's agents (his rendezvous times out), and theirs are not disturbed
    bob = _agent(coord, tmp_path, "bobjob", coord.job_secret("bobjob"), run_id="t1",
                 user="mt-bob")
    agents = [_agent(coord, tmp_path, "rj", secret) for _ in range(2)]
    for a in agents:
        _, err = a.communicate(timeout=120)
        assert a.returncode == 0, err[-3000:]
    got = sorted((json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)),
                 key=lambda d: d["rank"])
    assert [(d["rank"], d["world"], d["sum"]) for d in got] == [(0, 2, 3.0), (1, 2, 3.0)]
    # the rendezvous lived in the job's own space of the coordinator
    spaces = coord.store.jobs()  # job -> (keys, bytes)
    assert spaces["rj"][0] > 0
    # bob's agent reached the coordinator, in his job's space, and still waits there alone
    assert spaces["bobjob"][0] > 0 and bob.poll() is None, bob.stderr.read() if bob.stderr else ""
    bob.kill()
    bob.wait(30)
