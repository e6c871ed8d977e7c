"""Restart mode end to end: an unmodified torchrun batch script on the real dev cluster.

``examples/restart/train.sbatch`` (a batch script as torchrun users write it: ``scontrol show
hostnames``, ``srun torchrun --rdzv_endpoint $head_node:29500``, ``--signal=B:USR1@30``) and
``examples/restart/train_ddp.py`` (plain DDP with its own checkpoint; no malletrain in it)
are submitted as written by mt-alice. The job grows, a regular job of mt-bob takes nodes
back (Slurm preempts the slots), the job shrinks, grows back when the regular job has ended,
and reaches its last epoch from its checkpoints: it never starts over.
"""

from __future__ import annotations

import itertools
import json
import pwd
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from malletrain.slurm.hostlist import expand_hostlist

from .harness import grace_time_s, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from yield_trace import regular_traces  # Slurm's millisecond logs

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "restart"
EPOCHS = 10


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _submit_as_written(d, files: tuple[str, str], nodes: str, epochs: int, out: str) -> str:
    """Copy an example batch script and its training script, submit them unchanged as
    mt-alice; the job id. As a user whose environment has torch activated (conda activate,
    module load): the launcher is on the PATH the job is submitted with, and --export=ALL
    carries it to the nodes."""
    for name in files:
        shutil.copy(EXAMPLES / name, d.out / name)
        (d.out / name).chmod(0o755)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    res = d.submit("mt-alice", "--parsable", "-N", nodes, "-o", str(d.out / f"{out}-%j.out"),
                   f"--export=ALL,EPOCHS={epochs},STEP_SLEEP=0.05,PATH={path}",
                   str(d.out / files[0]))
    return res.stdout.strip()


def _diagnostics(d, job: str, out: str) -> Callable[[], str]:
    def text() -> str:
        outs = "".join(p.read_text()[-1500:] for p in sorted(d.out.glob(f"{out}-*.out"))[-3:])
        return json.dumps(d.jobs().get(job), indent=1) + outs + d.log()[-2500:]
    return text


def _assert_resumed_and_done(records: list[dict]) -> list[dict]:
    """Every start after the first resumed from a checkpoint (never from 0, never back);
    the run ended with ``done``. The starts, for more checks."""
    starts = [r for r in records if r["event"] == "start"]
    assert [s["samples"] for s in starts].count(0) == 1, starts  # never started over
    assert all(b["samples"] >= a["samples"] for a, b in itertools.pairwise(starts))
    assert records[-1]["event"] == "done"
    return starts


def test_unmodified_torchrun_script_grows_is_preempted_regrows_and_finishes(daemon,
                                                                          clean_cluster):
    d = daemon
    job = _submit_as_written(d, ("train.sbatch", "train_ddp.py"), "1-3", EPOCHS, "r")
    log = d.out / "train.jsonl"
    diagnostics = _diagnostics(d, job, "r")

    def trained_at(world: int) -> bool:
        return any(r["event"] == "step" and r["world"] == world for r in _records(log))

    def checkpointed_at(world: int) -> bool:
        return any(r["event"] == "epoch" and r["world"] == world for r in _records(log))

    # an epoch's checkpoint at 3 nodes first: a preemption can take any node at once, so
    # the generation that loses its peers cannot save, and resumes from the last epoch
    wait_until(lambda: checkpointed_at(3), 180, what="the job to train an epoch on 3 nodes",
               on_timeout=diagnostics)
    assert d.jobs()[job]["state"] == "running"

    # mt-bob's regular job needs 7 of the 8 nodes: 5 are idle, 2 of the job's go back
    batch = clean_cluster.sbatch("-p", "batch", "-N", "7", "-t", "3", wrap="srun sleep 20",
                                 user="mt-bob")
    submitted = time.monotonic()
    wait_until(lambda: clean_cluster.job_state(batch) == "RUNNING", 60,
               what="the batch job to start", on_timeout=diagnostics)
    wait_s = time.monotonic() - submitted
    batch_nodes = set(expand_hostlist(clean_cluster.scontrol_job(batch)["NodeList"]))
    wait_until(lambda: trained_at(1) and not set(d.jobs()[job]["nodes"]) & batch_nodes, 90,
               what="the job to go on on the node left", on_timeout=diagnostics)

    wait_until(lambda: clean_cluster.job_state(batch) in ("COMPLETED", ""), 90,
               what="the batch job to end")
    steps_before_regrow = len(_records(log))
    wait_until(lambda: any(r["event"] == "step" and r["world"] >= 2
                           for r in _records(log)[steps_before_regrow:]), 120,
               what="the job to grow back", on_timeout=diagnostics)
    wait_until(lambda: d.jobs()[job]["state"] == "completed", 300, what="the job to finish",
               on_timeout=diagnostics)

    result = json.loads((d.out / "results.json").read_text())
    assert result["epochs"] == EPOCHS and result["samples"] == EPOCHS * 4096
    starts = _assert_resumed_and_done(_records(log))
    assert len(starts) >= 3  # first start, and a restart at each size change at least
    assert {s["world"] for s in starts} >= {1, 3}
    assert d.jobs()[job]["preemptions"] + d.jobs()[job]["rescales_down"] >= 1
    assert wait_s < 30, f"the batch job waited {wait_s:.1f} s for the scavenged nodes"
    # malletrain's part of that wait, from slurmctld's and the slurmds' millisecond logs:
    # the job's slots on the batch job's nodes were signalled (by Slurm's preemption, or
    # cancelled by the daemon ahead of it) and had ended within the partition's GraceTime,
    # before Slurm's kill; the --signal grace is not the regular job's to wait for (restart
    # mode stops at once for it). The figure (goal < 1 s): benchmarks/e2e.py --restart-mode.
    (trace,) = regular_traces(clean_cluster.dir / "log", {batch})
    assert trace.slots, "the batch job took none of the malleable job's nodes"
    assert trace.yield_s is not None, trace
    print(f"yield {trace.yield_s:.2f} s (signal -> last slot ended)")
    assert trace.yield_s < grace_time_s(clean_cluster.env), trace
    assert (d.out / "results.json").stat().st_uid == pwd.getpwnam("mt-alice").pw_uid
    assert "Traceback" not in d.log()


def test_unmodified_accelerate_script_grows_and_finishes_from_its_checkpoints(daemon,
                                                                             clean_cluster):
    """``accelerate launch`` (Hugging Face Accelerate's own launcher, with its
    ``--multi_gpu`` torchrun path; the processes join over gloo on these CPU nodes): the
    launch line is rewritten for each size, the script resumes from its ``save_state``
    checkpoint at the new size and reaches its last epoch without starting over."""
    d = daemon
    job = _submit_as_written(d, ("train_accelerate.sbatch", "train_accelerate.py"), "1-2", 4,
                             "a")
    log = d.out / "train.jsonl"
    diagnostics = _diagnostics(d, job, "a")
    wait_until(lambda: d.jobs()[job]["state"] == "completed", 300, what="the job to finish",
               on_timeout=diagnostics)
    result = json.loads((d.out / "results.json").read_text())
    assert result["epochs"] == 4 and result["samples"] == 4 * 4096
    records = _records(log)
    starts = _assert_resumed_and_done(records)
    assert any(r["event"] == "step" and r["world"] == 2 for r in records), starts
    assert "Traceback" not in d.log()
