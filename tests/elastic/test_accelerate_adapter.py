"""Native mode for Hugging Face Accelerate: ``examples/elastic_accelerate.py`` (Accelerate's
own loop on :class:`~malletrain.elastic.worker.accelerate.AcceleratedJob`) grown and shrunk in
process by real worker processes over gloo: Accelerate's rank, size and collectives follow
every membership, the replicas stay identical, no step is lost or repeated.
"""

from __future__ import annotations

import pytest
from elastic_harness import REPO, Cluster, checksums_at, committed_steps

from malletrain.errors import ConfigError

pytestmark = pytest.mark.torch

SCRIPT = REPO / "examples" / "elastic_accelerate.py"


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, script=SCRIPT)
    yield c
    c.stop()


def _args(total: int) -> list[str]:
    return ["--total-samples", str(total), "--dataset-size", "256", "--batch", "4",
            "--hidden", "32", "--step-sleep", "0.01"]


def test_accelerate_follows_grow_and_shrink_in_process(cluster):
    total = 900
    w = {"m0": cluster.launch("m0", *_args(total)), "m1": cluster.launch("m1", *_args(total))}
    w["m2"] = cluster.launch("m2", *_args(total), nproc=2)  # torchrun, two local ranks
    cluster.wait_registered("m0", "m1", "m2")
    workers = [w["m0"], w["m1"], *w["m2"]]
    for members, size in ((["m0"], 1), (["m0", "m2"], 3), (["m0", "m1", "m2"], 4),
                          (["m1"], 1)):
        epoch = cluster.coord.publish(cluster.job_id, members)
        formed = [x for m in members for x in (w[m] if isinstance(w[m], list) else [w[m]])]
        for x in formed:
            cluster.wait_epoch(x, epoch)
            cluster.wait_step(x, max(r["step"] for r in x.epochs() if r["epoch"] == epoch) + 5)
        assert len(checksums_at(workers, epoch)) == 1, f"replicas differ at epoch {epoch}"
        for x in formed:  # Accelerate's view is the membership's, at every step of it
            steps = [r for r in x.steps() if r["epoch"] == epoch]
            assert steps and all(r["acc_ws"] == size == r["ws"] and r["acc_rank"] == r["rank"]
                                 and r["acc_main"] == (r["rank"] == 0)
                                 and r["gathered_from"] == size for r in steps)
    for x in workers:
        assert x.proc.wait(120) == 0, cluster.stderr_tail()
    steps = committed_steps(workers)
    assert sorted(steps) == list(range(len(steps)))  # gapless: nothing lost or repeated
    assert sum(r["n"] for r in steps.values()) == total
    assert all(r["gathered"] == r["n"] for r in steps.values())  # every rank's samples
    assert cluster.coord.result(cluster.job_id).samples_total == total


def test_what_native_mode_cannot_rescale_is_refused_with_the_reason():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from torch import nn, optim

    from malletrain.elastic.training.rules import LinearScaling
    from malletrain.elastic.worker.accelerate import AcceleratedJob

    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be 1"):
        AcceleratedJob(acc, model, optim.SGD(model.parameters(), lr=0.1), dataset_size=8,
                       rule=LinearScaling(per_rank_batch=2, base_lr=0.1))
    AcceleratorState._reset_state(reset_partial_state=True)
