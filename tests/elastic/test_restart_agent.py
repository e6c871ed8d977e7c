"""The restart-mode node agents in real node slots on the dev cluster, around a real
coordinator (the daemon's part played by the test: it publishes the memberships).

Each agent runs as a slot does: a single-node Slurm job whose step is the agent. The first
node's agent runs a real bash batch script once per generation, whose ``srun
--ntasks-per-node=2 python task.py`` places two tasks on every node of the generation,
each in its node's slot; the task records what it sees and how it is stopped. Checked: each
generation runs at the published size with the Slurm/torch environment of that size, a size
change stops the old generation with the script's --signal on every node (and nothing of it
survives, orphans included), a removed member leaves, progress written to
$MALLETRAIN_PROGRESS_FILE reaches the coordinator, and a batch script that exits 0 finishes
the job.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from elastic_harness import REPO, attach, start_coordinator, wait_for

from malletrain.elastic.restart.generation import job_number

pytestmark = pytest.mark.slurm

TASK = """\
import json, os, signal, subprocess, sys, time
out = sys.argv[1]
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NNODES", "SLURM_NODEID", "SLURM_PROCID",
        "SLURM_NTASKS", "MASTER_PORT", "MALLETRAIN_EPOCH", "SETUP_RAN")
me = {k: os.environ.get(k) for k in keys}
tag = f"{out}/e{me['MALLETRAIN_EPOCH']}-r{me['RANK']}"
def stop(signum, frame):
    open(tag + ".stopped", "w").write(signal.Signals(signum).name)
    if os.path.exists(f"{out}/slow-stop"):
        time.sleep(60)  # a checkpoint that takes longer than the grace
    if os.path.exists(f"{out}/checkpoint-s"):  # a checkpoint within the grace
        time.sleep(float(open(f"{out}/checkpoint-s").read()))
        open(tag + ".saved", "w").write(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGUSR1, stop)
orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)  # escapes the group
me["orphan"] = orphan.pid
me["t"] = time.time()
open(tag + ".tmp", "w").write(json.dumps(me))
os.replace(tag + ".tmp", tag + ".json")  # the test reads it while this runs: whole or absent
if os.path.exists(f"{out}/finish"):
    sys.exit(0)
n = 0
while True:
    n += 8
    if me["RANK"] == "0":
        open(os.environ["MALLETRAIN_PROGRESS_FILE"], "w").write(str(n))
    time.sleep(0.05)
"""

SCRIPT = """#!/bin/bash
#SBATCH --signal=USR1@20
export SETUP_RAN=yes
srun --ntasks-per-node=2 {python} {task} {out}
"""


SLOT = """#!/bin/bash
export PYTHONPATH={repo} MALLETRAIN_COORDINATOR={address} MALLETRAIN_JOB_ID=rj
export MALLETRAIN_JOB_SECRET={secret} MALLETRAIN_MEMBER_ID={member}
export MALLETRAIN_SCRIPT_TEXT="$(cat {script})"
exec srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 {python} -m malletrain.elastic.restart.agent \\
    --workers=2 --tasks-per-node=2 --stop-signal=USR1 --stop-grace-s=20 --submit-dir={tmp}
"""


@dataclass
class Slot:
    """One node slot (a Slurm job running the agent), seen as a process."""

    cluster: object
    job_id: int

    def state(self) -> str:
        return self.cluster.job_state(self.job_id)

    def wait(self, timeout_s: float) -> str:
        """The slot's end state once it has ended (COMPLETED: the agent exited 0)."""
        wait_for(lambda: self.state() not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"),
                 timeout_s, f"slot job {self.job_id} to end")
        return self.state()

    def terminate(self) -> None:
        """Slurm ending the slot (preemption): SIGTERM to its steps, then SIGKILL."""
        self.cluster.run("scancel", str(self.job_id))


@pytest.fixture
def setup(clean_cluster, tmp_path):
    tmp_path.chmod(0o755)
    proc, address = start_coordinator(tmp_path)
    coord = attach(tmp_path, address)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "task.py").write_text(TASK)
    script = tmp_path / "batch.sh"
    script.write_text(SCRIPT.format(python=sys.executable, task=tmp_path / "task.py", out=out))
    agents: dict[str, Slot] = {}
    nodes = iter(range(1, 9))

    def launch(member: str) -> Slot:
        text = SLOT.format(repo=REPO, address=address, secret=coord.job_secret("rj"),
                           member=member, script=script, python=sys.executable, tmp=tmp_path)
        job = clean_cluster.sbatch(f"--nodelist=n{next(nodes)}", "--exclusive",
                                   f"--chdir={tmp_path}", script=text,
                                   output=str(tmp_path / f"{member}.log"))
        agents[member] = Slot(clean_cluster, job)
        return agents[member]

    yield coord, out, launch, agents
    for slot in agents.values():
        if slot.state() in ("PENDING", "RUNNING"):
            slot.terminate()
    clean_cluster.scancel_all()
    coord.close()
    proc.terminate()
    proc.wait(10)


def seen(out: Path, epoch: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"e{epoch}-r*.json"))]


def test_generations_run_at_the_published_size_and_stop_cleanly(setup):
    coord, out, launch, _ = setup
    a, b = launch("a"), launch("b")
    wait_for(lambda: {"a", "b"} <= set(coord.registered("rj")), 60, "registration")
    e1 = coord.publish("rj", ["a", "b"])
    wait_for(lambda: len(seen(out, e1)) == 4, 60, "4 tasks of generation 1")
    first = seen(out, e1)
    assert sorted(r["RANK"] for r in first) == ["0", "1", "2", "3"]
    assert {(r["WORLD_SIZE"], r["SLURM_NNODES"], r["SLURM_NTASKS"], r["SETUP_RAN"])
            for r in first} == {("4", "2", "4", "yes")}
    assert sorted(r["SLURM_NODEID"] for r in first) == ["0", "0", "1", "1"]
    wait_for(lambda: (p := coord.progress("rj")) is not None and p.samples_total > 0, 30,
             "progress from $MALLETRAIN_PROGRESS_FILE")

    e2 = coord.publish("rj", ["a"])  # b is removed; a restarts at one node
    assert b.wait(60) == "COMPLETED"
    wait_for(lambda: len(seen(out, e2)) == 2, 60, "2 tasks of generation 2")
    assert {r["WORLD_SIZE"] for r in seen(out, e2)} == {"2"}
    # every task of generation 1 was asked with the script's signal, and nothing survived
    assert sorted(p.read_text() for p in out.glob(f"e{e1}-r*.stopped")) == ["SIGUSR1"] * 4
    for r in first:
        assert not psutil.pid_exists(r["orphan"]) or \
            psutil.Process(r["orphan"]).status() == psutil.STATUS_ZOMBIE
    assert coord.departures("rj")[-1].member_id == "b"
    assert coord.departures("rj")[-1].reason == "removed"

    (out / "finish").write_text("")  # the next generation's launch exits 0 at once
    e3 = coord.publish("rj", [])
    assert a.wait(60) == "COMPLETED"  # removed too (an empty membership)
    assert coord.result("rj") is None and e3 > e2


def test_a_launch_that_exits_0_finishes_the_job(setup):
    coord, out, launch, _ = setup
    (out / "finish").write_text("")
    a = launch("a")
    wait_for(lambda: "a" in coord.registered("rj"), 60, "registration")
    coord.publish("rj", ["a"])
    assert a.wait(60) == "COMPLETED"
    assert coord.result("rj") is not None
    assert coord.departures("rj")[-1].reason == "finished"


def test_sigterm_leaves_at_once_and_announces_it(setup):
    coord, out, launch, _ = setup
    a = launch("a")
    wait_for(lambda: "a" in coord.registered("rj"), 60, "registration")
    e = coord.publish("rj", ["a"])
    wait_for(lambda: len(seen(out, e)) == 2, 60, "the tasks")
    t = time.monotonic()
    a.terminate()  # Slurm preempting the slot
    assert a.wait(30) == "CANCELLED"
    assert time.monotonic() - t < 10  # SIGTERM skips the 20 s grace of --signal
    assert coord.departures("rj")[-1].reason == "sigterm"


def test_slurm_sigterm_cuts_a_graceful_stop_short(setup):
    """A member asked to leave gets the script's --signal and its grace (20 s here); if Slurm
    preempts the slot meanwhile, the agent must not sit out the grace: the regular job is
    waiting for the node."""
    coord, out, launch, _ = setup
    (out / "slow-stop").write_text("")
    launch("a")
    b = launch("b")
    wait_for(lambda: {"a", "b"} <= set(coord.registered("rj")), 60, "registration")
    e = coord.publish("rj", ["a", "b"])
    wait_for(lambda: len(seen(out, e)) == 4, 60, "the tasks")
    coord.publish("rj", ["a"])  # b: USR1, then up to 20 s
    wait_for(lambda: len(list(out.glob(f"e{e}-r*.stopped"))) == 4, 30, "the stop signal")
    t = time.monotonic()
    b.terminate()  # Slurm preempts b's slot during its graceful stop
    assert b.wait(30) in ("COMPLETED", "CANCELLED")
    assert time.monotonic() - t < 5.0  # SIGKILL 0.1 s after SIGTERM, not the 20 s grace


def test_the_next_generation_starts_once_the_last_one_has_stopped(setup):
    """A job moved off its node: the newcomer's launch (which would read the checkpoint)
    starts only after the leaver's generation has saved and stopped, within its grace."""
    coord, out, launch, _ = setup
    (out / "checkpoint-s").write_text("3")
    a = launch("a")
    wait_for(lambda: "a" in coord.registered("rj"), 60, "registration")
    e1 = coord.publish("rj", ["a"])
    wait_for(lambda: len(seen(out, e1)) == 2, 60, "the tasks of generation 1")
    launch("b")
    wait_for(lambda: "b" in coord.registered("rj"), 60, "registration of b")
    e2 = coord.publish("rj", ["b"])  # a removed, b added: no node stays
    wait_for(lambda: len(seen(out, e2)) == 2, 60, "the tasks of generation 2")
    saved = [float(p.read_text()) for p in out.glob(f"e{e1}-r*.saved")]
    assert len(saved) == 2
    assert min(r["t"] for r in seen(out, e2)) > max(saved)
    assert a.wait(30) == "COMPLETED"


STEPS_SCRIPT = """#!/bin/bash
nodes=( $( scontrol show hostnames "$SLURM_JOB_NODELIST" ) )
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "${{nodes[0]}}" hostname --ip-address)
echo "ip=$head_node_ip nodes=${{nodes[*]}} job=$SLURM_JOB_ID" > {out}/batch.txt
srun -l --ntasks-per-node=1 bash -c \\
    'echo "$SLURM_PROCID $SLURMD_NODENAME $SLURM_STEP_NUM_TASKS $SLURM_JOB_ID"' > {out}/step.txt
srun -N1 -w n99 true 2> {out}/bad.txt; echo "rc=$?" >> {out}/bad.txt
srun -n 3 -m cyclic bash -c 'echo "$SLURM_PROCID $SLURM_NODEID"' | sort > {out}/cyclic.txt
"""


def test_the_batch_shell_runs_once_and_its_srun_steps_reach_every_node(setup):
    """The idiom of pytorch/examples and torchtune: the head node's address from a one-task
    step on it, then a step on every node; a step that cannot run fails at once."""
    coord, out, launch, _ = setup
    (out.parent / "batch.sh").write_text(STEPS_SCRIPT.format(out=out))
    a, b = launch("a"), launch("b")
    wait_for(lambda: {"a", "b"} <= set(coord.registered("rj")), 60, "registration")
    coord.publish("rj", ["a", "b"])
    assert a.wait(60) == "COMPLETED" and b.wait(60) == "COMPLETED"  # the shell exited 0
    batch = (out / "batch.txt").read_text().split()
    assert batch[0] not in ("ip=", "") and batch[1:3] == ["nodes=n1", "n2"], batch
    assert batch[3] == f"job={job_number('rj')}"  # the job's number, not a slot's id
    assert sorted((out / "step.txt").read_text().splitlines()) == [
        f"0: 0 n1 2 {job_number('rj')}", f"1: 1 n2 2 {job_number('rj')}"]
    bad = (out / "bad.txt").read_text()
    assert "srun: error: --nodelist n99: not a node of this job now (its nodes: n1,n2)" in bad
    assert bad.strip().endswith("rc=1")
    assert (out / "cyclic.txt").read_text().split("\n")[:3] == ["0 0", "1 1", "2 0"]
    assert coord.result("rj") is not None  # finished: the batch shell exited 0


def test_a_member_placed_again_under_its_id_is_reached_in_its_new_slot(setup):
    """A member id that registers again (a slot placed anew) is found where it is now:
    the batch shell's steps go to its new slot, not the ended one."""
    coord, out, launch, _ = setup
    launch("a")
    b = launch("b")
    wait_for(lambda: {"a", "b"} <= set(coord.registered("rj")), 60, "registration")
    e1 = coord.publish("rj", ["a", "b"])
    wait_for(lambda: len(seen(out, e1)) == 4, 60, "4 tasks of generation 1")
    coord.publish("rj", ["a"])
    assert b.wait(60) == "COMPLETED"
    launch("b")  # on another node, under the same member id
    wait_for(lambda: "b" in coord.registered("rj"), 60, "b registered again")
    e3 = coord.publish("rj", ["a", "b"])
    wait_for(lambda: len(seen(out, e3)) == 4, 60, "4 tasks of generation 3")
    assert sorted(r["SLURM_NODEID"] for r in seen(out, e3)) == ["0", "0", "1", "1"]
