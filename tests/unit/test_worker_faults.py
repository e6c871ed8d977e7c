"""Issue 17's CPU-testable pieces: setup errors are not peer failures, the GPU check before
NCCL, and which replica a heal copies after an aborted step."""

from __future__ import annotations

import pytest

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.worker.faults import gpu_problem, is_peer_failure


@pytest.mark.parametrize("text", [
    "NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage: Duplicate GPU detected : "
    "rank 1 and rank 0 both on CUDA device 1a000",
    "CUDA error: invalid device ordinal",
])
def test_setup_errors_are_not_healed_as_peer_failures(text):
    assert not is_peer_failure(RuntimeError(text))


def test_peer_failures_still_are():
    assert is_peer_failure(RuntimeError("[gloo] Connection closed by peer"))
    assert is_peer_failure(RuntimeError("NCCL communicator was aborted on rank 0"))
    assert not is_peer_failure(ValueError("shapes do not match"))


@pytest.mark.parametrize(("k", "visible", "index", "expect"), [
    (2, 2, 0, None), (1, 8, 7, None), (4, 8, None, None),
    (2, 1, 0, "2 worker processes on this node but 1 GPU(s) visible"),
    (1, 0, 0, "no GPU is visible"),
    (1, 2, 5, "device cuda:5 does not exist"),
])
def test_gpu_problem(k, visible, index, expect):
    got = gpu_problem(k, visible, index)
    assert (got is None) if expect is None else (got is not None and expect in got)


@pytest.mark.parametrize(("table", "expected"), [
    # equal steps: the clean replica is copied, not the one that may hold an aborted update
    ([[1, 9, -1, 1], [1, 9, -1, 0]], (1, 9, False)),
    # all dirty: the lowest rank is copied (the caller then copies it to every rank)
    ([[1, 9, -1, 1], [1, 9, -1, 1]], (0, 9, False)),
    # a fresher replica wins even when dirty (the others lag a committed step)
    ([[1, 10, -1, 1], [1, 9, -1, 0]], (0, 10, False)),
    ([[1, 9, -1], [1, 9, -1]], (0, 9, False)),  # three-column rows still read
])
def test_choose_source_prefers_clean_replicas(table, expected):
    assert p.choose_source(table) == expected


def test_a_failed_step_keeps_its_error_without_the_frames_that_hold_the_group():
    """The traceback of a failed collective holds c10d's frames and with them the broken
    process group: kept through the heal, its sockets stay open and another survivor
    waits out its whole timeout (benchmarks/gloo_dead_peer.py --teardown inside: 10 s)."""
    from malletrain.elastic.worker.job import Step

    held = object()

    def collective(group: object) -> None:
        raise RuntimeError("[gloo] Connection closed by peer")

    step = Step(index=3, epoch=1, rank=0, world_size=2, indices=None, global_count=8,
                lr=0.1, first_of_epoch=False, started_at_s=0.0)
    with step:
        try:
            collective(held)
        except RuntimeError as inner:
            raise RuntimeError("step failed: gloo connection closed") from inner
    assert step.failed and "gloo" in str(step.error)
    assert step.error.__traceback__ is None
    assert step.error.__cause__ is None and step.error.__context__ is None
