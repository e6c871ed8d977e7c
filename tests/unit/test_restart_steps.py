"""``srun`` inside a restart-mode batch shell, the pure part: a step's options read as srun
reads them, its tasks laid out over the generation's nodes, and the real ``srun`` each node
runs (golden argument lists, torchx style)."""

from __future__ import annotations

import json

import pytest

from malletrain.elastic.restart import steps
from malletrain.elastic.restart.generation import (
    GenerationView,
    GenNode,
    batch_env,
    job_number,
    tasks_per_node_text,
)
from malletrain.elastic.restart.steps import StepError, layout, node_argv, parse

VIEW = GenerationView(
    job_id="m12", epoch=3, name="llm", tasks_per_node=None, python="/py", real_srun="/usr/bin/srun",
    nodes=tuple(GenNode(f"n{i}", f"host{i}", 100 + i, f"/tmp/r{i}") for i in (4, 5, 7)))


def shares(argv: list[str], env: dict[str, str] | None = None, view: GenerationView = VIEW):
    lay = layout(parse(argv), view, env or {})
    return [(s.node.name, s.node_index, s.task_ids) for s in lay.shares]


@pytest.mark.parametrize(("argv", "expect"), [
    # no counts: every node, one task each (the job gave no --ntasks-per-node)
    (["hostname"], [("n4", 0, (0,)), ("n5", 1, (1,)), ("n7", 2, (2,))]),
    # the head-node idiom: one task on a named node
    (["--nodes=1", "--ntasks=1", "-w", "n5", "hostname", "--ip-address"], [("n5", 0, (0,))]),
    (["-N2", "--ntasks-per-node=2", "python", "t.py"],
     [("n4", 0, (0, 1)), ("n5", 1, (2, 3))]),
    # -n over nodes, balanced as srun does with -N; cyclic hands out round robin
    (["-N", "2", "-n", "5", "x"], [("n4", 0, (0, 1, 2)), ("n5", 1, (3, 4))]),
    (["-n5", "-m", "cyclic", "-N2", "x"], [("n4", 0, (0, 2, 4)), ("n5", 1, (1, 3))]),
    (["-x", "n4", "x"], [("n5", 0, (0,)), ("n7", 1, (1,))]),
    (["--relative=2", "-N1", "x"], [("n7", 0, (0,))]),
    # -n alone fills nodes at the job's tasks per node (1 here)
    (["-n", "2", "x"], [("n4", 0, (0,)), ("n5", 1, (1,))]),
])
def test_steps_are_laid_out_as_srun_lays_them_out(argv, expect):
    assert shares(argv) == expect


def test_input_variables_count_when_the_command_line_does_not():
    env = {"SLURM_NTASKS_PER_NODE": "2", "SLURM_NTASKS": "6"}
    assert [len(t) for _, _, t in shares(["x"], env)] == [2, 2, 2]
    assert shares(["-N1", "x"], env) == [("n4", 0, (0, 1))]
    per8 = GenerationView(**{**VIEW.__dict__, "tasks_per_node": 8})
    # srun -n$((N*8)) in a job of 8 tasks per node: 8 per node, as written for it
    assert [len(t) for _, _, t in shares(["-n24", "x"], view=per8)] == [8, 8, 8]


@pytest.mark.parametrize(("argv", "message"), [
    (["-w", "n9", "x"], "--nodelist n9: not a node of this job now (its nodes: n4,n5,n7)"),
    (["-N", "4", "x"], "asks for 4 node(s); the job has 3 now (n4,n5,n7)"),
    (["--multi-prog", "conf"], "--multi-prog cannot run in a malleable job"),
    (["--pty", "bash"], "--pty cannot run in a malleable job"),
    (["--bogus", "x"], "unrecognized option '--bogus'"),
    (["--n", "2", "x"], "option '--n' is ambiguous"),
    (["-N2"], "no command to run"),
    (["-n", "5", "--ntasks-per-node=1", "x"], "5 tasks at 1 per node need 5 nodes"),
    (["a", ":", "b"], "heterogeneous steps"),
])
def test_a_step_that_cannot_run_fails_with_a_reason(argv, message):
    with pytest.raises(StepError) as err:
        layout(parse(argv), VIEW, {})
    assert str(err.value).startswith(message), str(err.value)


def test_options_are_read_as_getopt_long_reads_them():
    req = parse(["--ntasks-per-n=2", "--kill", "--lab", "-lu", "--gpus-per-task=1",
                 "--cpu-bind=cores", "--container-image", "img.sqsh", "--mpi=pmix",
                 "--jobid", "77", "-c8", "--export", "ALL,X=1", "torchrun", "-x", "1"])
    assert req.per_node == 2 and req.kill_on_bad_exit and req.label
    assert req.passthrough == ("--unbuffered", "--gpus-per-task=1", "--cpu-bind=cores",
                               "--container-image=img.sqsh", "--cpus-per-task=8",
                               "--export=ALL,X=1")
    assert req.command == ("torchrun", "-x", "1")  # the command's own options are its own
    assert parse(["-p", "debug", "x"]).warnings == (
        "srun --partition ignored: a step runs in the job's own nodes",)


def test_each_node_runs_slurms_srun_in_its_slot_next_to_the_agent():
    lay = layout(parse(["-N2", "--ntasks-per-node=2", "-K", "--gpus-per-task=1", "python",
                        "t.py"]), VIEW, {})
    argv = node_argv(lay, lay.shares[1], VIEW, "SPEC")
    assert argv == ["/usr/bin/srun", "--jobid=105", "--overlap", "--immediate=30",
                    "--nodes=1", "--ntasks=2", "--kill-on-bad-exit=1", "--gpus-per-task=1",
                    "/py", "-m",
                    "malletrain.elastic.restart.task", "SPEC", "--", "python", "t.py"]


def test_the_batch_environment_is_an_allocation_of_the_generations_nodes():
    slot = {"SLURM_JOB_ID": "105", "SLURM_JOB_PARTITION": "scavenger",
            "SLURM_JOB_ACCOUNT": "proj", "SLURM_CLUSTER_NAME": "lab",
            "SLURM_JOB_CPUS_PER_NODE": "64", "SLURM_GPUS_ON_NODE": "4"}
    view = GenerationView(**{**VIEW.__dict__, "tasks_per_node": 4})
    env = batch_env(view, slot, "/home/alice/run")
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == "12"  # m12, stable across sizes
    assert (env["SLURM_NNODES"], env["SLURM_JOB_NUM_NODES"], env["SLURM_NTASKS"]) == \
        ("3", "3", "12")
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "n4,n5,n7"
    assert (env["SLURM_TASKS_PER_NODE"], env["SLURM_NTASKS_PER_NODE"]) == ("4(x3)", "4")
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "64(x3)"
    assert (env["SLURM_JOB_PARTITION"], env["SLURM_JOB_ACCOUNT"], env["SLURM_GPUS_ON_NODE"]) \
        == ("scavenger", "proj", "4")
    assert env["SLURM_SUBMIT_DIR"] == "/home/alice/run" and env["SLURM_JOB_NAME"] == "llm"
    assert "SLURM_NTASKS_PER_NODE" not in batch_env(VIEW, slot, "/")


def test_the_view_travels_as_json_and_ids_are_numbers():
    assert GenerationView.from_json(VIEW.to_json()) == VIEW
    assert json.loads(VIEW.to_json())["nodes"][0]["slot_job"] == 104
    assert job_number("m12") == 12 and 0 <= job_number("weird") < 10_000_000
    assert tasks_per_node_text([2, 2, 1]) == "2(x2),1"


def test_srun_option_table_has_a_role_for_every_option():
    roles = {role for _, role in steps._LONG.values()}
    assert roles == {"place", "pass", "drop", "refuse"}
    assert all(name in steps._LONG for name in steps._SHORT.values())


SPEC = {"epoch": 3, "step": 2, "node_index": 1, "task_ids": [1], "ntasks": 3,
        "step_nodes": ["n4", "n5", "n7"], "step_hosts": ["host4", "host5", "host7"],
        "tasks_per_node": "1(x3)", "env": {"SLURM_JOB_ID": "12", "SLURM_NNODES": "3"},
        "run_dir": "/tmp/r5", "label": False, "workers": 1, "port": 23456}


def test_a_task_sees_the_job_wide_view_not_its_slots():
    from malletrain.elastic.restart.task import task_env
    slot = {"SLURM_JOB_ID": "105", "SLURM_LOCALID": "0", "SLURM_PROCID": "0",
            "SLURM_STEP_ID": "7", "SLURM_NODELIST": "n5", "HOME": "/home/a"}
    env, procid, local = task_env(SPEC, slot)
    assert (procid, local) == (1, 0)
    assert (env["SLURM_JOB_ID"], env["SLURM_PROCID"], env["SLURM_NODEID"]) == ("12", "1", "1")
    assert (env["SLURM_STEP_ID"], env["SLURM_STEP_NODELIST"], env["SLURM_NTASKS"]) == \
        ("2", "n4,n5,n7", "3")
    assert env["HOME"] == "/home/a"


@pytest.mark.parametrize("wrapper", [["singularity", "exec", "--nv", "img.sif"],
                                     ["apptainer", "exec", "img.sif"], []])
def test_a_launcher_behind_a_container_wrapper_is_run_at_the_steps_size(wrapper):
    from malletrain.elastic.restart.task import command
    cmd = [*wrapper, "torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_endpoint",
           "n1:29500", "--rdzv_backend", "c10d", "train.py", "--lr", "1"]
    env: dict[str, str] = {}
    out = command(SPEC, cmd, env, 1, 0)
    assert out[:len(wrapper)] == wrapper and out[len(wrapper)] == "torchrun"
    assert out[-3:] == ["train.py", "--lr", "1"]
    rest = " ".join(out[len(wrapper):])
    assert "n1:29500" not in rest and "--nnodes 2 " not in rest
    assert "--nnodes=3 --node-rank=1" in rest
    assert "--master-addr=host4 --master-port=23456" in rest


def test_anything_else_runs_as_written():
    from malletrain.elastic.restart.task import command
    for cmd in (["hostname", "--ip-address"], ["bash", "-c", "echo hi; torchrun x.py"],
                ["shifter", "bash", "-c", "python train.py"]):
        assert command(SPEC, cmd, {}, 1, 0) == cmd


def test_a_step_that_cannot_run_is_noted_for_the_agent_and_said_in_the_output(tmp_path,
                                                                             capsys):
    """`srun --pty bash` in a batch shell: `srun: error:` in the job's output at once, and
    the same line in the agent's run directory, which its departure carries to `malletrain
    jobs` (only the lines after the launch's start: an earlier generation's are not its)."""
    from malletrain.elastic.restart import srun

    env = {"MALLETRAIN_GENERATION": VIEW.to_json(), "MALLETRAIN_RUN_DIR": str(tmp_path)}
    srun.note_failure(env, "srun: step 0 (x) exited with code 143 on n4")  # a stop, before
    start = srun.failures_size(tmp_path)
    assert srun.last_failure(tmp_path, start) == ""
    assert srun.run(["--pty", "bash"], env) == 1
    said = "srun: error: --pty cannot run in a malleable job"
    assert capsys.readouterr().err.startswith(said)
    assert srun.last_failure(tmp_path, start).startswith(said)
    assert srun.last_failure(tmp_path / "none", 0) == ""  # no run dir: nothing, no error
