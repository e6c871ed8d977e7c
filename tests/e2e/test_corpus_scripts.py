"""Public batch scripts, unchanged, through grow, a regular job's preemption and regrow.

Three scripts of the corpus (``tests/data/sbatch/``, byte for byte), of three launch styles,
run AT ONCE on the 8 nodes of a dev cluster with fake GPUs (their GPU requests honoured as
written): the head-IP ``srun`` of pytorch/examples' DDP tutorial (``srun -w $head hostname
--ip-address`` beside ``srun torchrun``), ml-engineering's ``srun bash -c "RANK=\\$SLURM_PROCID
..."``, and LUMI's ``srun singularity run $SIF bash -c "export RANK=\\$SLURM_PROCID && python
..."`` (``module``, ``MASTER_PORT="1${SLURM_JOB_ID:0-4}"``), one rank per node each. Each is
submitted by mt-alice with the sbatch options a user gives for this cluster
(:data:`benchmarks.corpus_e2e.CASES`); the programs they start are one stand-in CPU DDP
trainer, what the cluster lacks is on PATH (``tests/data/standins/``). A regular 7-node job
of mt-bob takes nodes back; every script finishes from its checkpoints, never starting
over, and the regular job waits < 30 s, malletrain's part of it within the partition's
GraceTime (Slurm's logs). Then a step that cannot run shows in `malletrain jobs` within 30 s.
``benchmarks/corpus_e2e.py`` runs all the scripts of CASES the same way.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from malletrain.devstack import LocalCluster, LocalDaemon

from .harness import check_python_reachable, grace_time_s, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from corpus_e2e import CASES, GPUS, Staged, node_names_resolve, run_group

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

AT_ONCE = ("pytorch-examples--ddp-tutorial-series--sbatch_run.sh",
           "ml-engineering--srun-launcher.slurm", "LUMI-AI-Guide--run_ddp_srun_4.sh")


@pytest.fixture
def gpu_stack(free_port_base) -> Iterator[tuple[LocalCluster, LocalDaemon, Path]]:
    """A dev cluster of its own with fake GPUs (`dev-cluster up --gpus`), and a daemon."""
    base = Path(tempfile.mkdtemp(prefix="malletrain-corpus-test-", dir="/tmp"))
    base.chmod(0o755)
    node_names_resolve()
    cluster = LocalCluster(base / "cluster", free_port_base(8), 8)
    daemon = None
    try:
        cluster.up(gpus=GPUS)
        check_python_reachable("mt-alice", cluster.env)
        daemon = LocalDaemon(base / "work", cluster.env, cluster.slurm_conf).start()
        yield cluster, daemon, base
    finally:
        if daemon is not None:
            daemon.stop()
            daemon.stop_coordinator()
        cluster.down()
        shutil.rmtree(base, ignore_errors=True)


def test_three_public_scripts_at_once_grow_are_preempted_regrow_and_finish(gpu_stack):
    cluster, daemon, base = gpu_stack
    staged = [Staged(c, base / "scripts") for c in CASES if c.file in AT_ONCE]
    assert len(staged) == len(AT_ONCE)
    try:
        res = run_group(cluster.base, daemon, staged, epochs=6)
    finally:
        for s in staged:
            s.remove_placed()
    for s in staged:
        o = res.outcomes[s.case.file]
        assert res.states[s.case.file] == "completed", (s.case.file, res)
        assert o.finished and not o.started_over, (s.case.file, o)
        assert o.restarts >= 1 and max(o.nodes) >= 2, (s.case.file, o)
        assert res.regrew[s.case.file], (s.case.file, o)  # 2+ nodes after the regular job
    assert sum(res.preemptions.values()) >= 1, res
    assert res.regular_wait_s < 30, f"the regular job waited {res.regular_wait_s:.1f} s"
    # the slots left before Slurm's kill (the figure, goal < 1 s: benchmarks/corpus_e2e.py)
    assert res.yield_s is not None, res
    print(f"yield {res.yield_s:.2f} s (signal -> last slot ended)")
    assert res.yield_s < grace_time_s(cluster.env), res

    # a step that cannot run: said at once in the job's output and, within 30 s, in
    # `malletrain jobs` (REASON StepFailed, the line in --json's failure)
    bad = base / "bad"
    bad.mkdir()
    (bad / "pty.sh").write_text("#!/bin/bash\nsrun --pty bash\n")
    shutil.chown(bad, "mt-alice", "mt-alice")
    job = daemon.cli("mt-alice", "submit", "--socket", str(daemon.socket), "--parsable", "-N",
                     "1", "-o", str(bad / "out-%j.txt"), str(bad / "pty.sh")).stdout.strip()
    submitted = time.monotonic()

    def failure() -> str:
        row = next(r for r in json.loads(daemon.cli(None, "jobs", "--socket",
                                                    str(daemon.socket), "--json").stdout)
                   if r["job_id"] == job)
        return str(row["failure"])

    wait_until(lambda: failure(), 60, what="the step's failure in malletrain jobs",
               on_timeout=lambda: daemon.log()[-2000:])
    took_s = time.monotonic() - submitted
    assert failure().startswith("srun: error: --pty cannot run in a malleable job"), failure()
    assert took_s < 30, f"the failure showed after {took_s:.1f} s"
    print(f"the step's failure showed in malletrain jobs after {took_s:.1f} s")
    table = daemon.cli(None, "jobs", "--socket", str(daemon.socket)).stdout
    assert any(line.startswith(job) and "StepFailed" in line for line in table.splitlines())
    outs = "".join(p.read_text() for p in bad.glob("out-*.txt"))
    assert "srun: error: --pty cannot run in a malleable job" in outs
    daemon.cli("mt-alice", "cancel", "--socket", str(daemon.socket), job)
