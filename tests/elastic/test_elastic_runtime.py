"""The elastic runtime with real worker processes over gloo (examples/elastic_train.py).

Each test plays the daemon: it hosts the coordinator in-process, launches members as real
processes (one process = one member, K=1, as on a CPU node), publishes epochs, sends signals,
and checks the JSON-lines logs the workers write: checksums of all replicas after every
change, a gapless sequence of committed steps, exact sample accounting.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from elastic_harness import Cluster, Worker, checksums_at, committed_steps, wait_for

from malletrain.elastic.training.sampler import DataStream

pytestmark = pytest.mark.torch

DATASET = 256


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def _args(total: int, *extra: str) -> list[str]:
    return ["--total-samples", str(total), "--dataset-size", str(DATASET), "--batch", "4",
            "--hidden", "32", *extra]


def _assert_gapless_and_exact(workers: list[Worker], total: int, check_indices: bool) -> dict:
    steps = committed_steps(workers)
    assert sorted(steps) == list(range(len(steps))), "committed steps are not gapless"
    assert sum(r["n"] for r in steps.values()) == total
    if check_indices:
        # rebuild the sample stream from every rank's indices, step by step, in rank order
        per_step: dict[int, dict[int, list[int]]] = {}
        for w in workers:
            for r in w.steps():
                per_step.setdefault(r["step"], {})[r["rank"]] = r["indices"]
        stream = [i for s in sorted(per_step) for rank in sorted(per_step[s])
                  for i in per_step[s][rank]]
        assert len(stream) == total
        ds = DataStream(DATASET, seed=0)
        for start in range(0, total, DATASET):
            block = stream[start:start + DATASET]
            assert len(set(block)) == len(block), "a sample was seen twice within an epoch"
            assert block == ds.permutation(start // DATASET)[:len(block)].tolist()
    return steps


def _assert_replicas_equal(workers: list[Worker], epoch: int, expect: int) -> None:
    sums = checksums_at(workers, epoch)
    formed = [w for w in workers if any(r["epoch"] == epoch for r in w.epochs())]
    assert len(formed) == expect, f"epoch {epoch}: {len(formed)} replicas, expected {expect}"
    assert len(sums) == 1, f"replicas differ after forming epoch {epoch}: {sums}"


def _assert_gone_right_after_its_exit_record(worker) -> None:
    """A removed member's process ends at once: its slot, and so its node, ends with it.

    A normal interpreter exit after a gloo group took 1.4-2.6 s on the 2-core machine (the
    e2e benchmark saw a removed member's slot end 2.5 s after the worker's last record).
    """
    t_end = time.monotonic() + 60
    while worker.proc.poll() is None and time.monotonic() < t_end:
        time.sleep(0.02)
    gone_at = time.time()
    assert worker.proc.poll() == 0
    record = worker.exit_record()
    assert record is not None and record["reason"] == "removed"
    gone_s = gone_at - record["t"]
    assert gone_s < 1.0, f"process alive {gone_s:.2f} s after its exit record"


def test_grow_and_shrink_1_2_3_2_1_identical_replicas_gapless_exact(cluster):
    total = 1100
    args = _args(total, "--step-sleep", "0.01", "--log-indices")
    w = {m: cluster.launch(m, *args) for m in ("m0", "m1", "m2")}
    cluster.wait_registered("m0", "m1", "m2")
    plan = [(["m0"], 1), (["m0", "m1"], 2), (["m0", "m1", "m2"], 3),
            (["m0", "m2"], 2), (["m2"], 1)]  # m1 (a middle rank), then m0 (rank 0) leave
    for members, size in plan:
        epoch = cluster.coord.publish(cluster.job_id, members)
        if members == ["m0", "m2"]:
            _assert_gone_right_after_its_exit_record(w["m1"])
        for m in members:
            cluster.wait_epoch(w[m], epoch)
        _assert_replicas_equal(list(w.values()), epoch, size)
        assert not cluster.coord.is_finished(cluster.job_id), "target too small for the plan"
        # rank 0's progress report (~1/s, and at every re-formation) follows the world size
        wait_for(lambda size=size, epoch=epoch: (p := cluster.coord.progress(cluster.job_id))
                 is not None and (p.epoch, p.world_size) == (epoch, size), 5,
                 f"a progress report at world size {size}", cluster)
        cluster.wait_step(w[members[0]], w[members[0]].last_step() + 8)
        # ... and says how long a step waited for the gradient all-reduce (synctime.py)
        wait_for(lambda size=size: (p := cluster.coord.progress(cluster.job_id)) is not None
                 and p.world_size == size and p.sync_time_s is not None
                 and 0 < p.sync_time_s < p.step_time_s, 10,
                 f"a report with the sync time at world size {size}", cluster)
    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "the job to finish",
             cluster)
    for m in w.values():
        assert m.proc.wait(30) == 0
    assert [w[m].exit_record()["reason"] for m in ("m0", "m1", "m2")] == [
        "removed", "removed", "finished"]
    assert not any(r["event"] == "failed_step" for m in w.values() for r in m.records())
    _assert_gapless_and_exact(list(w.values()), total, check_indices=True)
    result = cluster.coord.result(cluster.job_id)
    assert result is not None and result.samples_total == total
    assert cluster.coord.progress(cluster.job_id).samples_total == total
    reasons = [(d.member_id, d.reason) for d in cluster.coord.departures(cluster.job_id)]
    assert reasons == [("m1", "removed"), ("m0", "removed"), ("m2", "finished")]


def test_sigterm_then_sigkill_of_members(cluster):
    total = 1200
    w = {m: cluster.launch(m, *_args(total, "--step-sleep", "0.02")) for m in ("m0", "m1", "m2")}
    cluster.wait_registered("m0", "m1", "m2")
    e1 = cluster.coord.publish(cluster.job_id, ["m0", "m1", "m2"])
    for m in w.values():
        cluster.wait_epoch(m, e1)
    cluster.wait_step(w["m0"], w["m0"].last_step() + 5)

    # SIGTERM (Slurm preemption): announce, leave at the next boundary, well within GraceTime
    t_term = time.monotonic()
    w["m2"].proc.send_signal(signal.SIGTERM)
    assert w["m2"].proc.wait(5) == 0
    exit_s = time.monotonic() - t_term
    assert exit_s < 3.0, f"SIGTERM exit took {exit_s:.2f} s"
    print(f"SIGTERM: member gone after {exit_s:.2f} s")
    assert w["m2"].exit_record()["reason"] == "sigterm"
    wait_for(lambda: cluster.coord.membership(cluster.job_id).members == ("m0", "m1"), 10,
             "survivors to form the next epoch", cluster)
    leave = cluster.coord.membership(cluster.job_id)
    assert leave.source == "leave" and leave.dropped == ("m2",)
    cluster.wait_epoch(w["m0"], leave.epoch)
    _assert_replicas_equal(list(w.values()), leave.epoch, 2)
    cluster.wait_step(w["m0"], w["m0"].last_step() + 5)

    # SIGKILL: detected through the collective error, healed without the coordinator
    t_kill = time.monotonic()
    w["m1"].proc.send_signal(signal.SIGKILL)
    wait_for(lambda: cluster.coord.membership(cluster.job_id).members == ("m0",), 15,
             "the survivor to heal", cluster)
    healed = cluster.coord.membership(cluster.job_id)
    cluster.wait_epoch(w["m0"], healed.epoch)
    heal_s = time.monotonic() - t_kill
    assert heal_s < 8.0, f"healing after SIGKILL took {heal_s:.2f} s"
    print(f"SIGKILL: survivor re-formed after {heal_s:.2f} s")
    assert healed.source == "heal" and healed.dropped == ("m1",)
    failed = [r for r in w["m0"].records() if r["event"] == "failed_step"]
    assert len(failed) <= 1, "more than the step in flight was lost"

    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "finish", cluster)
    assert w["m0"].proc.wait(30) == 0
    _assert_gapless_and_exact(list(w.values()), total, check_indices=False)
    reasons = {(d.member_id, d.reason) for d in cluster.coord.departures(cluster.job_id)}
    assert {("m2", "sigterm"), ("m1", "failed"), ("m0", "finished")} <= reasons


def test_frozen_member_is_dropped_after_the_timeout_then_rejoins(cluster):
    total = 2000
    step_timeout_s, heal_wait_s = 2.0, 1.0
    cluster.env_extra = {"MALLETRAIN_STEP_TIMEOUT_S": str(step_timeout_s),
                         "MALLETRAIN_HEAL_WAIT_S": str(heal_wait_s)}
    w = {m: cluster.launch(m, *_args(total, "--step-sleep", "0.02")) for m in ("m0", "m1")}
    cluster.wait_registered("m0", "m1")
    e1 = cluster.coord.publish(cluster.job_id, ["m0", "m1"])
    for m in w.values():
        cluster.wait_epoch(m, e1)
    cluster.wait_step(w["m0"], w["m0"].last_step() + 5)

    os.kill(w["m1"].proc.pid, signal.SIGSTOP)  # no RST: only the timeout can tell
    t_stop = time.monotonic()
    wait_for(lambda: cluster.coord.membership(cluster.job_id).members == ("m0",), 30,
             "the frozen member to be dropped", cluster)
    dropped_s = time.monotonic() - t_stop
    print(f"SIGSTOP: frozen member dropped after {dropped_s:.2f} s")
    healed = cluster.coord.membership(cluster.job_id)
    cluster.wait_epoch(w["m0"], healed.epoch)
    # bounded by the configured step timeout (+ heal wait + one step), never the default
    assert step_timeout_s - 0.5 <= dropped_s < step_timeout_s + heal_wait_s + 3.0, dropped_s
    stepped = w["m0"].last_step()
    cluster.wait_step(w["m0"], stepped + 5)  # the survivor trains on alone

    os.kill(w["m1"].proc.pid, signal.SIGCONT)  # it wakes up, finds itself dropped, re-registers
    cluster.wait_registered("m1")
    stale_step = w["m1"].last_step()
    # the stale member becomes rank 0: the state must still come from the freshest (m0)
    e3 = cluster.coord.publish(cluster.job_id, ["m1", "m0"])
    rec1 = cluster.wait_epoch(w["m1"], e3)
    rec0 = cluster.wait_epoch(w["m0"], e3)
    assert (rec1["rank"], rec0["rank"]) == (0, 1)
    # m0 trained at least 5 steps alone after the drop; m1 may have finished the step it was
    # frozen in (the same one m0 committed last in the 2-member epoch), nothing more
    assert rec1["step"] == rec0["step"] >= stepped + 5 > stale_step
    _assert_replicas_equal(list(w.values()), e3, 2)
    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "finish", cluster)
    for m in w.values():
        assert m.proc.wait(30) == 0
    _assert_gapless_and_exact(list(w.values()), total, check_indices=False)


def test_newcomer_arrives_mid_step_without_losing_the_step_in_flight(cluster):
    total = 120
    w0 = cluster.launch("m0", *_args(total, "--step-sleep", "0.3"))
    w1 = cluster.launch("m1", *_args(total, "--step-sleep", "0.3"))
    cluster.wait_registered("m0", "m1")
    e1 = cluster.coord.publish(cluster.job_id, ["m0"])
    cluster.wait_epoch(w0, e1)
    cluster.wait_step(w0, 2)
    before = w0.last_step()
    cluster.wait_step(w0, before + 1)  # a step just ended: the next one is in flight now
    in_flight = w0.last_step() + 1
    e2 = cluster.coord.publish(cluster.job_id, ["m0", "m1"])
    first = cluster.wait_epoch(w1, e2)
    cluster.wait_epoch(w0, e2)
    _assert_replicas_equal([w0, w1], e2, 2)
    by_step = {r["step"]: r for r in w0.steps()}
    assert by_step[in_flight]["epoch"] == e1, "the step in flight was not finished"
    assert first["step"] >= in_flight + 1
    assert not any(r["event"] == "failed_step" for r in w0.records() + w1.records())
    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "finish", cluster)
    assert w0.proc.wait(30) == 0 and w1.proc.wait(30) == 0
    _assert_gapless_and_exact([w0, w1], total, check_indices=False)


def test_evicted_to_zero_saves_and_restores_never_a_stale_or_foreign_snapshot(cluster, tmp_path):
    total = 1600
    state = tmp_path / "state"
    cluster.state_dir = state
    args = _args(total, "--step-sleep", "0.02")
    w = {m: cluster.launch(m, *args) for m in ("m0", "m1")}
    cluster.wait_registered("m0", "m1")
    e1 = cluster.coord.publish(cluster.job_id, ["m0", "m1"])
    for m in w.values():
        cluster.wait_epoch(m, e1)
    cluster.wait_step(w["m0"], 15)

    # every node reclaimed at once: both get SIGTERM, the last members save within GraceTime
    t_term = time.monotonic()
    for m in w.values():
        m.proc.send_signal(signal.SIGTERM)
    for m in w.values():
        assert m.proc.wait(5) == 0
    assert time.monotonic() - t_term < 5.0
    saved = sorted(state.glob("job1.*/job1.step*.mtsnap"))
    assert len(saved) == 1
    saved_step = w["m0"].exit_record()["step"]
    assert saved[0].name == f"job1.step{saved_step:012d}.mtsnap"
    # "evicted" where the SIGTERMs met at a step boundary, "sigterm" where one came during
    # a rendezvous (seen once under CI load): either way the last state was saved, above
    assert {w[m].exit_record()["reason"] for m in w} <= {"evicted", "sigterm"}
    saved_checksum = w["m0"].exit_record()["checksum"]

    # decoys: another job's snapshot, and a newer-named file whose tags do not match
    (saved[0].parent / "otherjob.step000000999999.mtsnap").write_bytes(saved[0].read_bytes())
    forged = saved[0].parent / f"job1.step{saved_step + 500:012d}.mtsnap"
    forged.write_bytes(saved[0].read_bytes())
    forged.chmod(0o600)  # as private as a real one: only its tags give it away

    # the job gets a node again: restored from the snapshot, not from the decoys
    w2 = cluster.launch("m2", *args)
    cluster.wait_registered("m2")
    e3 = cluster.coord.publish(cluster.job_id, ["m2"])
    first = cluster.wait_epoch(w2, e3)
    wait_for(lambda: len(w2.epochs()) >= 1 and w2.epochs()[-1]["step"] == saved_step, 60,
             "the restore", cluster)
    restored = [r for r in w2.epochs() if r["step"] == saved_step]
    assert restored and restored[-1]["checksum"] == saved_checksum, (first, w2.epochs())
    assert (forged.parent / (forged.name + ".rejected")).exists()
    assert (saved[0].parent / "otherjob.step000000999999.mtsnap").exists()  # untouched, unused

    # a newcomer next to the snapshot file is synced from the live replica (fresher)
    cluster.wait_step(w2, saved_step + 10)
    w3 = cluster.launch("m3", *args)
    cluster.wait_registered("m3")
    e4 = cluster.coord.publish(cluster.job_id, ["m2", "m3"])
    joined = cluster.wait_epoch(w3, e4)
    cluster.wait_epoch(w2, e4)
    assert joined["step"] > saved_step + 10
    _assert_replicas_equal([w2, w3], e4, 2)

    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "finish", cluster)
    assert w2.proc.wait(30) == 0 and w3.proc.wait(30) == 0
    _assert_gapless_and_exact([*w.values(), w2, w3], total, check_indices=False)
    # the decoys stay in the job's directory: the snapshots are gone
    assert not list(state.glob("job1.*/job1.step*.mtsnap")), "snapshots of a finished job remain"


@pytest.mark.parametrize("how", ["evicted", "sigterm"])
def test_evicted_while_reforming_after_rank_0_left_still_saves(cluster, tmp_path, how):
    """Rank 0's member is removed; before the next epoch forms, the job is evicted to zero
    (or its last member gets SIGTERM). The first member still in the job saves: rank 0
    alone saving lost the job once in the coordinator-kill9 fault scenario."""
    total = 4000
    state = tmp_path / "state"
    cluster.state_dir = state
    args = _args(total, "--step-sleep", "0.02")
    w = {m: cluster.launch(m, *args) for m in ("m0", "m1", "m2", "m9")}
    cluster.wait_registered("m0", "m1", "m2", "m9")
    w["m9"].proc.send_signal(signal.SIGSTOP)  # a newcomer that will not arrive in time
    e1 = cluster.coord.publish(cluster.job_id, ["m0", "m1", "m2"])
    for m in ("m0", "m1", "m2"):
        cluster.wait_epoch(w[m], e1)
    cluster.wait_step(w["m1"], 15)
    cluster.coord.publish(cluster.job_id, ["m1", "m9"])  # m1 waits for m9 to arrive
    for m in ("m0", "m2"):
        assert w[m].proc.wait(30) == 0 and w[m].exit_record()["reason"] == "removed"
    time.sleep(1.0)  # m1 has read the new epoch and waits in it
    assert w["m1"].proc.poll() is None
    if how == "evicted":
        cluster.coord.publish(cluster.job_id, [])
    else:
        w["m1"].proc.send_signal(signal.SIGTERM)
    assert w["m1"].proc.wait(30) == 0
    w["m9"].proc.kill()
    saved = sorted(state.glob("job1.*/job1.step*.mtsnap"))
    assert len(saved) == 1, (saved, cluster.stderr_tail())
    saved_step = w["m1"].exit_record()["step"]
    assert saved_step >= 15 and saved[0].name == f"job1.step{saved_step:012d}.mtsnap"

    w3 = cluster.launch("m3", *args)
    cluster.wait_registered("m3")
    e4 = cluster.coord.publish(cluster.job_id, ["m3"])
    cluster.wait_epoch(w3, e4)
    assert w3.epochs()[-1]["step"] == saved_step  # restored, not started over


def test_torchrun_member_with_two_local_ranks_next_to_a_single_rank_member(cluster):
    """The launch the daemon uses: torchrun --nnodes=1 --nproc-per-node=K per node slot."""
    total = 900
    args = _args(total, "--step-sleep", "0.02")
    m0 = cluster.launch("m0", *args, nproc=2)  # K=2: global ranks offset + 0, + 1
    m1 = cluster.launch("m1", *args)
    cluster.wait_registered("m0", "m1")
    assert cluster.coord.registered(cluster.job_id)["m0"].local_world_size == 2
    e1 = cluster.coord.publish(cluster.job_id, ["m0"])
    for w in m0:
        cluster.wait_epoch(w, e1)
    assert sorted(w.epochs()[-1]["rank"] for w in m0) == [0, 1]
    cluster.wait_step(m0[0], 5)
    e2 = cluster.coord.publish(cluster.job_id, ["m1", "m0"])  # m1 first: m1 = rank 0
    first = [cluster.wait_epoch(w, e2) for w in (m1, *m0)]
    assert [r["rank"] for r in first] == [0, 1, 2] and {r["ws"] for r in first} == {3}
    _assert_replicas_equal([m1, *m0], e2, 3)
    cluster.wait_step(m1, m1.last_step() + 5)

    # Slurm preempts m0's node: torchrun forwards SIGTERM to both local ranks
    m0[0].proc.send_signal(signal.SIGTERM)
    m0[0].proc.wait(10)
    assert {w.exit_record()["reason"] for w in m0} == {"sigterm"}
    wait_for(lambda: cluster.coord.membership(cluster.job_id).members == ("m1",), 10,
             "m1 alone", cluster)
    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "finish", cluster)
    assert m1.proc.wait(30) == 0
    _assert_gapless_and_exact([m1, *m0], total, check_indices=False)


def test_a_step_whose_group_is_aborted_is_not_committed_and_the_job_heals(cluster):
    """Issue 17, items 1, 3 and 4, on CPU: the watcher aborts the group of a step that overran
    ``step_timeout_s`` (as it does for a hung NCCL collective; gloo here, forced with
    MALLETRAIN_ABORT_HUNG=1). The step's own collectives had completed, so nothing raised in
    it: it must still not be committed (it may hold unreduced gradients), and the next
    boundary must re-form instead of calling into the aborted group (on an H100 the worker
    crashed there with ValueError). The replicas end equal and the samples exact."""
    total = 400
    cluster.env_extra.update(MALLETRAIN_ABORT_HUNG="1", MALLETRAIN_STEP_TIMEOUT_S="1.5")
    args = _args(total, "--step-sleep", "0.01", "--stall-at-step", "6", "--stall-s", "3")
    w = {m: cluster.launch(m, *args) for m in ("m0", "m1")}
    cluster.wait_registered("m0", "m1")
    cluster.coord.publish(cluster.job_id, ["m0", "m1"])
    wait_for(lambda: cluster.coord.is_finished(cluster.job_id), 120, "the job to finish",
             cluster)
    for m in w.values():
        assert m.proc.wait(30) == 0, cluster.stderr_tail()
    failed = [r for m in w.values() for r in m.records() if r["event"] == "failed_step"]
    assert {r["step"] for r in failed} == {6} and all("aborted" in r["error"] for r in failed)
    _assert_gapless_and_exact(list(w.values()), total, check_indices=False)
    ends = {m.exit_record()["checksum"] for m in w.values()}
    assert len(ends) == 1, f"replicas differ at the end: {ends}"


def test_a_one_node_job_moved_to_another_node_goes_on_from_its_last_step(cluster, tmp_path):
    """A membership that keeps no member of the group (the plan moved a one-node job): the
    leaver saves, the newcomer waits for it to leave and restores that snapshot.

    Before, the newcomer formed at once: with no snapshot it refused to start (state_lost,
    three jobs of the 2 h soak), with a guard snapshot of step 1 it redid every step since.
    """
    total = 1600
    state = tmp_path / "state"
    cluster.state_dir = state
    args = _args(total, "--step-sleep", "0.02", "--log-indices")
    w0 = cluster.launch("m0", *args)
    cluster.wait_registered("m0")
    cluster.wait_epoch(w0, cluster.coord.publish(cluster.job_id, ["m0"]))
    cluster.wait_step(w0, 40)
    w1 = cluster.launch("m1", *args)
    cluster.wait_registered("m1")
    e2 = cluster.coord.publish(cluster.job_id, ["m1"])
    assert w0.proc.wait(60) == 0
    assert w0.exit_record()["reason"] == "removed"
    assert cluster.wait_epoch(w1, e2)["step"] == w0.last_step() + 1
    assert w1.proc.wait(90) == 0
    assert w1.exit_record()["reason"] == "finished"
    _assert_gapless_and_exact([w0, w1], total, check_indices=True)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_the_survivor_of_a_preemption_removed_by_the_daemon_at_once_still_saves(
        cluster, tmp_path, how):
    """The 2 h soak's job m188: m0 got SIGTERM (its slot preempted) while the daemon, not
    knowing yet, shrank the job to [m0]. Both reached the same boundary: m0 left on its
    SIGTERM (m1 keeps the state, so it did not save) and m1 found itself removed (m0 keeps
    it, so it did not save either). Nobody saved; the next group had nothing to restore.
    With SIGKILL (Slurm's kill after its grace) m1 comes from a failed step instead."""
    total = 120
    state = tmp_path / "state"
    cluster.state_dir = state
    args = _args(total, "--step-sleep", "0.3", "--log-indices")
    env = {"MALLETRAIN_GUARD_SNAPSHOT_S": "3600"}
    w0, w1 = cluster.launch("m0", *args, env=env), cluster.launch("m1", *args, env=env)
    cluster.wait_registered("m0", "m1")
    e1 = cluster.coord.publish(cluster.job_id, ["m0", "m1"])
    cluster.wait_epoch(w0, e1)
    cluster.wait_step(w0, 4)
    cluster.coord.publish(cluster.job_id, ["m0"])  # the daemon drops m1 ...
    # ... as Slurm preempts m0, within one step
    w0.proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    w0.proc.wait(30)
    assert w1.proc.wait(30) == 0
    if how == "sigkill":
        cluster.coord.depart(cluster.job_id, "m0")  # as the daemon does when the slot ends
    reasons = {r["reason"] for w in (w0, w1) if (r := w.exit_record())}
    last = max(w0.last_step(), w1.last_step())
    w2 = cluster.launch("m2", *args, env=env)
    cluster.wait_registered("m2")
    e3 = cluster.coord.publish(cluster.job_id, ["m2"])
    assert cluster.wait_epoch(w2, e3)["step"] == last + 1, reasons  # not state_lost
    assert w2.proc.wait(120) == 0
    # a SIGKILLed worker may have logged its part of the step in flight, never committed
    _assert_gapless_and_exact([w0, w1, w2], total, check_indices=how == "sigterm")


@pytest.mark.parametrize("then", ["sigterm", "evict"])
def test_survivors_of_a_sigkill_preempted_or_evicted_before_they_heal_save(cluster, tmp_path,
                                                                           then):
    """A faults run (worker-sigkill-step) lost its job: a worker was SIGKILLed and, before
    the survivors healed, a regular job preempted all of them. Each counted on the group's
    first member to save, and that was the dead one. Here m0 (rank 0) dies, and m1 gets
    SIGTERM (or the daemon evicts the job) while it heals."""
    total = 240
    state = tmp_path / "state"
    cluster.state_dir = state
    args = _args(total, "--step-sleep", "0.1")
    env = {"MALLETRAIN_GUARD_SNAPSHOT_S": "3600", "MALLETRAIN_HEAL_WAIT_S": "5"}
    w0, w1 = cluster.launch("m0", *args, env=env), cluster.launch("m1", *args, env=env)
    cluster.wait_registered("m0", "m1")
    e1 = cluster.coord.publish(cluster.job_id, ["m0", "m1"])
    cluster.wait_epoch(w1, e1)
    cluster.wait_step(w1, 4)
    w0.proc.send_signal(signal.SIGKILL)
    w0.proc.wait(10)
    time.sleep(0.5)  # m1 notices at its next collective, then waits to heal
    if then == "sigterm":
        w1.proc.send_signal(signal.SIGTERM)
    else:
        cluster.coord.depart(cluster.job_id, "m0")  # the daemon: slot ended, then evicts
        cluster.coord.publish(cluster.job_id, [])
    assert w1.proc.wait(30) == 0
    last = w1.last_step()
    cluster.coord.depart(cluster.job_id, "m0")  # as the daemon does when the slot ends
    w2 = cluster.launch("m2", *args)
    cluster.wait_registered("m2")
    e3 = cluster.coord.publish(cluster.job_id, ["m2"])
    assert cluster.wait_epoch(w2, e3)["step"] == last + 1  # not state_lost
    assert w2.proc.wait(120) == 0
    _assert_gapless_and_exact([w0, w1, w2], total, check_indices=False)


def test_a_one_node_job_killed_resumes_from_its_guard_snapshot(cluster, tmp_path):
    """One node holds every replica: its loss (here: SIGKILL of its only worker) costs the
    steps since the last guard snapshot, not the job; with two nodes nothing is written."""
    total = 1600
    state = tmp_path / "state"
    cluster.state_dir = state
    args = _args(total, "--step-sleep", "0.02", "--log-indices")
    env = {"MALLETRAIN_GUARD_SNAPSHOT_S": "0.5"}
    w0 = cluster.launch("m0", *args, env=env)
    cluster.wait_registered("m0")
    e1 = cluster.coord.publish(cluster.job_id, ["m0"])
    cluster.wait_epoch(w0, e1)
    cluster.wait_step(w0, 40)
    wait_for(lambda: any(state.glob("job1.*/job1.step*.mtsnap")), 30, "a guard snapshot",
             cluster)
    w0.proc.send_signal(signal.SIGKILL)
    w0.proc.wait(10)
    cluster.coord.depart(cluster.job_id, "m0")  # as the daemon does when the slot ends
    saved = sorted(state.glob("job1.*/job1.step*.mtsnap"))
    assert len(saved) == 1, saved  # each guard replaces the one before
    guard_step = int(saved[0].name.split(".step")[1].split(".")[0])
    assert 0 < guard_step <= w0.last_step() + 1

    w1 = cluster.launch("m1", *args, env=env)
    cluster.wait_registered("m1")
    e2 = cluster.coord.publish(cluster.job_id, ["m1"])
    assert cluster.wait_epoch(w1, e2)["step"] == guard_step  # restored, not state_lost
    cluster.wait_step(w1, guard_step + 10)
    w2 = cluster.launch("m2", *args, env=env)
    cluster.wait_registered("m2")
    e3 = cluster.coord.publish(cluster.job_id, ["m1", "m2"])
    formed_at = cluster.wait_epoch(w2, e3)["step"]
    cluster.wait_step(w2, formed_at + 40)
    newest = max(int(p.name.split(".step")[1].split(".")[0])
                 for p in state.glob("job1.*/job1.step*"))
    assert newest <= formed_at  # two nodes: no guard snapshot
    assert w1.proc.wait(60) == 0 and w2.proc.wait(60) == 0
    assert w1.exit_record()["reason"] == "finished"
    _assert_gapless_and_exact([w0, w1, w2], total, check_indices=True)
    assert not any(state.glob("job1.*"))  # a finished job leaves no snapshot behind
