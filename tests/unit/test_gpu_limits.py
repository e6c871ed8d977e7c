"""GPU limits on running jobs together (``GrpTRES=gres/gpu=N``, a QOS's ``MaxTRESPerUser``
GPUs) count the GPUs of the user's regular jobs too, as Slurm does (issue 47): squeue's
``tres-alloc`` read each tick where the site holds such a limit (golden files recorded on
the three releases by ``slurm/record-golden-gpus``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_slurm_limits import _alice_and_bob, golden_texts
from tick_scenes import node

from malletrain.core.accounting import Association, Qos, SiteLimits, TresLimit
from malletrain.core.cluster import Job, JobState
from malletrain.core.options import LIVE
from malletrain.core.policies import make_policy
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.tick import decide
from malletrain.daemon.tick.limits import Usage, job_limits, regular_usage
from malletrain.slurm.backend import CliBackend
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot
from malletrain.slurm.parsers.parse_limits import parse_limits
from malletrain.slurm.parsers.parse_text import parse_job_gpus
from malletrain.slurm.versions import JOB_GPUS, Release

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RELEASES = ("slurm", "slurm-24.11", "slurm-26.05")


def _json_gpus(record: dict) -> int:
    """A JSON job record's GPUs: allocated once running, asked for before (the same
    strings squeue's ``tres-alloc`` prints, from another of Slurm's outputs)."""
    state = record["job_state"]
    running = "RUNNING" in (state if isinstance(state, list) else [state])
    tres = record["tres_alloc_str"] if running else record["tres_req_str"]
    counts = dict(item.split("=") for item in tres.split(",") if item)
    return int(counts.get("gres/gpu", 0))


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_gpu_counts_of_each_way_to_ask_for_gpus(release):
    """``--gres=gpu:2``, ``--gpus=1`` (a whole 2-GPU node: Slurm allocates and counts 2),
    ``--gpus-per-task=1`` with 2 tasks, a pending ``--gpus-per-node=a100:1`` on 2 nodes, an
    array of 1-GPU tasks (one running, the rest pending as one record) and a job without
    GPUs (absent): as the JSON records of the same moment say."""
    d = GOLDEN / release / "gpus"
    warns: list[str] = []
    gpus = parse_job_gpus((d / "job_gpus.txt").read_text(), warns)
    assert warns == []
    assert gpus == {1: 2, 2: 2, 3: 2, 4: 2, 5: 1, 7: 2}
    records = json.loads((d / "squeue.json").read_text())["jobs"]
    assert gpus == {r["job_id"]: _json_gpus(r) for r in records if _json_gpus(r)}
    assert (d / "commands.txt").read_text().startswith(f"job_gpus.txt: {' '.join(JOB_GPUS)}\n")


@pytest.mark.parametrize(("text", "gpus", "warned"), [
    ("9|cpu=2,node=1,gres/gpu=4,gres/gpu:a100=4\n", {9: 4}, ""),  # typed beside untyped
    ("9|cpu=2,node=1,gres/gpu:a100=2,gres/gpu:v100=1\n", {9: 3}, ""),  # typed only
    ("9|cpu=2,node=1\n9x|gres/gpu=2\n", {}, "cannot read line"),
    ("9|gres/gpu=two\n10|gres/gpu=1\n", {10: 1}, "not a number"),
    ("<html>502</html>\n\n", {}, "cannot read line"),
])
def test_odd_gpu_lines_are_skipped_with_a_warning(text, gpus, warned):
    warns: list[str] = []
    assert parse_job_gpus(text, warns) == gpus
    assert (warned in warns[0]) if warned else warns == []


def test_the_snapshot_carries_each_jobs_gpus():
    d = GOLDEN / "slurm" / "busy"
    texts = SnapshotTexts.read_dir(d, daemon=True)
    plain = build_snapshot(0.0, texts)
    some = plain.jobs[0].job_id
    with_gpus = build_snapshot(0.0, dataclasses.replace(texts, job_gpus=f"{some}|gres/gpu=3\n"))
    assert [j.gpus for j in plain.jobs] == [0] * len(plain.jobs)
    assert {j.job_id: j.gpus for j in with_gpus.jobs if j.gpus} == {some: 3}


def test_the_gpu_read_runs_in_the_tick_only_where_a_limit_needs_it():
    ran: list[list[str]] = []

    def runner(argv, **_kw):
        import subprocess
        ran.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")

    backend = CliBackend(runner=runner, release=Release.parse("22.05"), daemon=True,
                         parallel=False)
    backend.snapshot_texts()
    assert list(JOB_GPUS) not in ran
    backend.count_gpus = True
    ran.clear()
    assert backend.snapshot_texts().job_gpus == ""
    assert list(JOB_GPUS) in ran


def test_which_limits_need_the_jobs_gpus():
    recorded = parse_limits(golden_texts())  # GrpTRES=node=3,gres/gpu=8 on bob in theory
    assert recorded.holds_gpus
    per_job = SiteLimits(associations=(Association("x", "bob", per_job=TresLimit(gpus=8)),))
    assert not per_job.holds_gpus and not SiteLimits().holds_gpus
    qos = SiteLimits(qos={"gpu": Qos("gpu", per_user=TresLimit(gpus=4))})
    assert qos.holds_gpus


def test_regular_jobs_gpus_come_off_the_gpu_limits():
    """mt-bob (GrpTRES=node=3,gres/gpu=8 in theory, as recorded) runs a regular job on one
    node with 6 GPUs: his 2-GPU-a-node malleable job may hold 1 node, not the 2 his node
    limit leaves; a regular job waiting at the GPU limit counts if it fits beside it."""
    site = parse_limits(golden_texts())
    running = Job(41, "train", "mt-bob", "batch", JobState.RUNNING, node_count=1,
                  nodes=("r1",), gpus=6)
    used = regular_usage([running], site)
    assert used["assoc:theory/mt-bob"] == Usage(nodes=1, jobs=1, gpus=6)
    rec = dataclasses.replace(_alice_and_bob("carol").jobs[1], spec=JobSpec(
        script="/x/train.py", max_nodes=8, gpus_per_node=2))
    assert job_limits(rec, site, used).caps["assoc:theory/mt-bob"] == 1
    assert job_limits(rec, site, {}).caps["assoc:theory/mt-bob"] == 3  # nodes, GPUs 8/2
    waiting = Job(42, "train", "mt-bob", "batch", JobState.PENDING, "AssocGrpGRES",
                  node_count=1, gpus=2, submit_time=1.0)
    too_big = dataclasses.replace(waiting, job_id=43, gpus=4, submit_time=0.5)
    assert regular_usage([running, too_big, waiting], site)[
        "assoc:theory/mt-bob"] == Usage(nodes=2, jobs=2, gpus=8)


def test_decide_holds_bob_below_his_gpu_limit_beside_his_regular_job():
    """The same through the whole decision, on 8-GPU nodes: bob's GPU job gets 1 node and
    says AccountLimit while his regular job holds 6 of his 8 GPUs; carol gets the rest."""
    w = _alice_and_bob("carol")
    bob = dataclasses.replace(w.jobs[1], spec=JobSpec(script="/x/train.py", max_nodes=8,
                                                      gpus_per_node=2))
    nodes = tuple(dataclasses.replace(node(n.name, n.state), gres="gpu:a100:8")
                  for n in w.snapshot.nodes)
    regular = Job(4242, "train", "mt-bob", "batch", JobState.RUNNING, node_count=1,
                  nodes=("r1",), gpus=6)
    w = dataclasses.replace(w, jobs=(w.jobs[0], bob), snapshot=dataclasses.replace(
        w.snapshot, nodes=nodes, jobs=(*w.snapshot.jobs, regular)))
    plan = decide(w, make_policy("malletrain", LIVE))
    assert len(plan.targets["m9"]) == 1 and plan.reasons["m9"] == "AccountLimit"
    assert len(plan.targets["m1"]) == 15
    alone = dataclasses.replace(w, snapshot=dataclasses.replace(
        w.snapshot, jobs=w.snapshot.jobs[:-1]))
    assert len(decide(alone, make_policy("malletrain", LIVE)).targets["m9"]) == 2
