"""Slot jobs rendered as data (golden), member ids, classification of Slurm states."""

import subprocess
import sys
from pathlib import Path

from malletrain.core.cluster import Job, JobState
from malletrain.daemon.jobs.slots import (
    SlotStatus,
    classify,
    member_id,
    parse_member,
    parse_tag,
    render_slot,
    slot_tag,
)
from malletrain.daemon.jobs.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden" / "slot_m7_s2.txt"
SECRET = "ab" * 32

SPEC = JobSpec(script="/home/alice/train.py", args=("--lr", "0.1; rm -rf / $(x)"), name="r",
               min_nodes=1, max_nodes=4, nproc_per_node=2, output="/home/alice/o-%j.txt",
               chdir="/home/alice", python="/opt/venv/bin/python", kind="train.py",
               environment={"FOO": "1"}, launcher="torchrun")


def rendered() -> str:
    spec = render_slot(SPEC, "m7", 2, coordinator="login1:29400", secret=SECRET,
                       state_dir="/pfs/mt/m7",
                       partition="scavenger", qos="scav")
    return "ARGV " + " ".join(spec.render()) + "\n" + spec.script


def test_slot_job_matches_golden_file():
    text = rendered()
    if not GOLDEN.exists():  # first run records it; review the diff like any golden file
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "--hold" in text and "--partition=scavenger" in text
    assert "--comment=malletrain:m7:2" in text and "--requeue" in text
    argv_line, script = text.split("\n", 1)
    assert SECRET not in argv_line  # never on a command line (ps shows it to everyone)
    assert f'"MALLETRAIN_JOB_SECRET": "{SECRET}"' in script


def test_a_users_environment_cannot_replace_the_job_secret():
    import dataclasses

    import pytest

    from malletrain.daemon.jobs.spec import SpecError

    with pytest.raises(SpecError, match="MALLETRAIN_"):
        dataclasses.replace(SPEC, environment={"MALLETRAIN_JOB_SECRET": "cd" * 32})


def test_launcher_execs_an_argument_list_without_a_shell(tmp_path):
    """Run the launcher with a fake srun: the hostile argument arrives verbatim."""
    spec = render_slot(SPEC, "m7", 2, coordinator="c:1", secret=SECRET, state_dir="/s",
                       partition="scavenger")
    script = spec.script.replace("#!/opt/venv/bin/python", f"#!{sys.executable}", 1)
    fake = tmp_path / "srun"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "print(json.dumps([sys.argv[1:], os.environ['MALLETRAIN_MEMBER_ID'], "
                    "os.environ['MALLETRAIN_JOB_ID'], os.environ['FOO']]))\n")
    fake.chmod(0o755)
    launcher = tmp_path / "slot.py"
    launcher.write_text(script)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_RESTART_COUNT": "3"}
    out = subprocess.run([sys.executable, str(launcher)], env=env, capture_output=True,
                         text=True, check=True).stdout
    import json

    argv, member, job, foo = json.loads(out)
    assert argv[-3:] == ["/home/alice/train.py", "--lr", "0.1; rm -rf / $(x)"]
    assert "--nproc-per-node=2" in argv
    assert (member, job, foo) == ("s2-r3", "m7", "1")


def test_tags_and_members_round_trip():
    assert parse_tag(slot_tag("m12", 3)) == ("m12", 3)
    assert parse_tag("malletrain:m1") is None and parse_tag("other") is None
    assert parse_member(member_id(4, 2)) == (4, 2)
    assert parse_member("s4-rx") is None


def test_the_longest_tag_is_read_and_no_other_users_long_comment_is_kept():
    longest = slot_tag("j" * 128, 999999)
    assert parse_tag(f"  {longest} ") == ("j" * 128, 999999)
    from malletrain.daemon.jobs.slots import _parse_short_tag
    before = _parse_short_tag.cache_info()
    for k in range(50):  # any user's --comment, of any length
        assert parse_tag(f"{longest}{k}" + " x" * 500_000) is None
    after = _parse_short_tag.cache_info()
    assert (after.currsize, after.misses) == (before.currsize, before.misses)


def job(state, reason=""):
    return Job(job_id=1, name="x", user="u", partition="scavenger", state=state,
               state_reason=reason)


def test_classification():
    assert classify(None) is SlotStatus.GONE
    assert classify(job(JobState.PENDING, "JobHeldUser")) is SlotStatus.PARKED
    assert classify(job(JobState.PENDING, "JobHeldAdmin")) is SlotStatus.PARKED
    assert classify(job(JobState.PENDING, "job_requeued_in_held_state")) is SlotStatus.PARKED
    assert classify(job(JobState.PENDING, "BeginTime")) is SlotStatus.PLACING
    assert classify(job(JobState.RUNNING)) is SlotStatus.RUNNING
    assert classify(job(JobState.COMPLETING)) is SlotStatus.ENDING
    for s in (JobState.COMPLETED, JobState.PREEMPTED, JobState.TIMEOUT, JobState.FAILED,
              JobState.NODE_FAIL):
        assert classify(job(s)) is SlotStatus.ENDED
    assert classify(job(JobState.CANCELLED)) is SlotStatus.CANCELLED
    assert classify(job(JobState.UNKNOWN)) is SlotStatus.ENDING


def test_srun_launcher_maps_slurm_task_ids_to_torchrun_variables(tmp_path):
    import dataclasses
    import json

    script = tmp_path / "train.py"
    script.write_text("import json, os, sys\nprint(json.dumps([os.environ['LOCAL_RANK'], "
                      "os.environ['LOCAL_WORLD_SIZE'], sys.argv, __name__]))\n")
    spec = dataclasses.replace(SPEC, launcher="srun", script=str(script), python=sys.executable,
                               nproc_per_node=3)
    text = render_slot(spec, "m7", 0, coordinator="c:1", secret=SECRET, state_dir="/s",
                       partition="scavenger").script
    argv = json.loads(text.split("argv = ", 1)[1].split("\n", 1)[0])
    assert argv[:4] == ["srun", "--nodes=1", "--ntasks=3", "--kill-on-bad-exit=1"]
    task = argv[4:]
    out = subprocess.run(task, env={"SLURM_LOCALID": "2", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    rank, size, args, name = json.loads(out)
    assert (rank, size, name) == ("2", "3", "__main__")
    assert args == [str(script), "--lr", "0.1; rm -rf / $(x)"]


def test_a_restart_mode_slot_holds_the_tasks_its_steps_start_on_the_node():
    """`--ntasks-per-node=4 -c 1` in a batch script: each slot asks Slurm for 4 tasks of 1
    CPU, so a node that cannot hold them is refused at submission (as sbatch refuses the
    script) rather than every step failing on it ("More processors requested than
    permitted", seen with pytorch-ddp-examples--run-lightning-gpu8.sh on 2-CPU nodes)."""
    from dataclasses import replace

    from malletrain.daemon.jobs.slots import slot_extra_args

    restart = replace(SPEC, mode="restart", tasks_per_node=4,
                      slot_options=("--cpus-per-task=1",))
    assert slot_extra_args(restart) == ("--ntasks-per-node=4", "--cpus-per-task=1")
    argv = render_slot(restart, "m7", 0, coordinator="c:1", secret=SECRET, state_dir="/s",
                       partition="scavenger", script_text="#!/bin/bash\nsrun true\n").render()
    assert "--ntasks-per-node=4" in argv
    # one task per node, and native mode (its slot's own srun starts the workers): unchanged
    assert slot_extra_args(replace(restart, tasks_per_node=1)) == ("--cpus-per-task=1",)
    assert slot_extra_args(replace(restart, mode="native")) == ("--cpus-per-task=1",)
