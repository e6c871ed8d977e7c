"""Launch lines as real batch scripts write them: built in variables, run through ``bash -c``,
after ``clear;``, in ``if``/``else`` branches (the static reading of :mod:`shellwords`), and
the ``bash -c`` string run by bash on the node, through the launcher."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from malletrain.elastic.restart import shellwords as sh
from malletrain.elastic.restart.launchers import (
    Generation,
    plan_launch,
    split_srun,
)
from malletrain.elastic.restart.script import analyse, declared_workers, logical_lines

# the shape of BigScience's and ml-engineering's launchers (written for this test)
VARIABLES_SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
GPUS_PER_NODE=8
MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
export LAUNCHER="python -u -m torch.distributed.run \\
    --nproc_per_node $GPUS_PER_NODE \\
    --rdzv_endpoint $MASTER_ADDR:6000 \\
    --role \\$(hostname -s): \\
    "
export CMD="train.py --steps ${STEPS:-100}"
SRUN_ARGS=" \\
    --wait=60
    "
clear; srun $SRUN_ARGS --jobid $SLURM_JOB_ID bash -c "$LAUNCHER --node_rank \\$SLURM_PROCID \\
$CMD" 2>&1 | tee -a log.txt
"""


def test_a_launcher_built_in_variables_and_run_by_bash_c_is_found():
    plan, problems = analyse(VARIABLES_SCRIPT, "job.sh")
    assert problems == []
    assert plan is not None and plan.launch.kind == "torchrun"
    assert plan.launch.lineno == 14
    assert declared_workers(plan.launch) == 8
    # the static reading: $GPUS_PER_NODE and ${STEPS:-100} known, $MASTER_ADDR (a command
    # substitution) and $SLURM_PROCID (set at run time) left as written
    words = plan.launch.words
    assert words[:4] == ("srun", "--wait=60", "--jobid", "$SLURM_JOB_ID")
    assert "$MASTER_ADDR:6000" in words and words[-3:] == ("train.py", "--steps", "100")


def test_launch_lines_in_branches_of_one_if_are_alternatives():
    text = ("#!/bin/bash\nif [ -n \"$SALLOC_MODE\" ]; then\n    srun torchrun a.py\n"
            "else\n    srun torchrun b.py\nfi\n")
    plan, problems = analyse(text, "j.sh")
    assert problems == [] and plan is not None
    assert [x.lineno for x in (plan.launch, *plan.alternatives)] == [3, 5]


def test_quoted_strings_over_lines_here_strings_and_comment_markers():
    text = ('#!/bin/bash\nexport CMD=" \\\n  train.py --x 1\n  "\n# <<< conda initialize <<<\n'
            'LR=`bc <<< "3/10"`\nsrun torchrun $CMD\n')
    lines = logical_lines(text)
    assert [n for n, _ in lines] == [1, 2, 5, 6, 7, 8]
    plan, problems = analyse(text, "j.sh")
    assert problems == [] and plan is not None and plan.launch.lineno == 7
    assert plan.launch.words[-3:] == ("train.py", "--x", "1")


def test_segments_split_commands_not_redirections():
    assert sh.segments("a 2>&1 | b; c && d >&2 & e # f; g") == [
        (0, "a 2>&1 "), (8, " b"), (11, " c "), (16, " d >&2 "), (24, " e ")]
    assert sh.segments("echo 'a;b' \"c|d\"") == [(0, "echo 'a;b' \"c|d\"")]


def test_srun_python_c_is_a_check_not_a_launch_and_unexpanded_srun_args_are_skipped():
    text = ("#!/bin/bash\nsrun --jobid $SLURM_JOBID python -c 'import torch'\n"
            "srun $EXTRA python train.py\n")
    plan, problems = analyse(text, "j.sh")
    assert problems == [] and plan is not None and plan.launch.lineno == 3
    assert split_srun(["srun", "$EXTRA", "--jobid", "$ID", "python", "x.py"]) == (
        {"--jobid": "$ID"}, ["python", "x.py"])


def test_python_m_accelerate_commands_launch_is_accelerate():
    g = Generation(nnodes=2, node_rank=1, master_addr="n1", master_port=4000, nodes=("n1", "n2"),
                   workers_per_node=4)
    launch = plan_launch(["python", "-u", "-m", "accelerate.commands.launch", "--machine_rank",
                          "7", "--config_file", "a.yaml", "train.py"], g)
    assert launch.kind == "accelerate"
    assert launch.argv[:3] == ("python", "-u", "-m") and launch.argv[3] == (
        "accelerate.commands.launch")
    assert "--machine_rank" in launch.argv and "7" not in launch.argv
    assert launch.argv[-3:] == ("--config_file", "a.yaml", "train.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bash_c_runs_through_bash_and_reaches_torchrun_at_the_generation_size(tmp_path):
    """The launcher as a process on one 'node': ``srun bash -c STRING``, where STRING names
    torchrun for another size and ``$SLURM_PROCID``, and uses ``$(...)``. Bash runs it; the
    launcher it reaches rewrites torchrun; the worker sees the generation's world."""
    script = tmp_path / "w.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({'argv': sys.argv[1:], 'world': os.environ['WORLD_SIZE'],"
                      " 'rank': os.environ['RANK'], 'procid': os.environ['SLURM_PROCID']},"
                      " open(sys.argv[1], 'w'))\n")
    out = tmp_path / "out.json"
    env = {"MALLETRAIN_NNODES": "1", "MALLETRAIN_NODE_RANK": "0",
           "MALLETRAIN_MASTER_ADDR": "127.0.0.1", "MALLETRAIN_MASTER_PORT": str(_free_port()),
           "MALLETRAIN_NODES": "localhost", "MALLETRAIN_WORKERS_PER_NODE": "1",
           "MALLETRAIN_PYTHON": sys.executable,
           "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    string = (f"{sys.executable} -m torch.distributed.run --nnodes 16 --nproc_per_node 1 "
              f"--node_rank $SLURM_PROCID --rdzv_endpoint nowhere:1 {script} {out} "
              "--tag $(echo rank$SLURM_PROCID)")
    res = subprocess.run([sys.executable, "-m", "malletrain.elastic.restart.launch", "--",
                          "srun", "--jobid", "12", "bash", "-c", string],
                         env=env, timeout=120, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got == {"argv": [str(out), "--tag", "rank0"], "world": "1", "rank": "0",
                   "procid": "0"}


# -- the shapes of real scripts the corpus holds (awsome-distributed-training's arrays,
# HALOs' and LUMI's ``bash -c`` strings, swiss-ai's numactl/nsys prefix, Megatron-DeepSpeed's
# ``eval "$run_cmd"``); each written for this test in the shape its script has

ARRAY_SCRIPT = """#!/bin/bash
GPUS_PER_NODE=8 # 4 for G5.12x
declare -a TORCHRUN_ARGS=(
    # the launcher's own options
    --nproc_per_node=$GPUS_PER_NODE
    --nnodes=$SLURM_JOB_NUM_NODES
    --rdzv_endpoint=$(hostname)
)
TORCHRUN_ARGS+=(--rdzv_backend=c10d)
srun -l "${TORCHRUN_ARGS[@]}" train.py
"""


def test_a_bash_array_expands_to_its_elements_word_for_word():
    variables: dict[str, str] = {}
    lines = logical_lines(ARRAY_SCRIPT)
    for _, line in lines:
        sh.assign(line, variables)
    assert variables["GPUS_PER_NODE"] == "8"  # the comment after the value is no part of it
    srun = sh.words(sh.expand(lines[-2][1], variables))
    assert srun == ["srun", "-l", "--nproc_per_node=8", "--nnodes=$SLURM_JOB_NUM_NODES",
                    "--rdzv_endpoint=$(hostname)", "--rdzv_backend=c10d", "train.py"]


def test_a_torchrun_built_from_an_array_is_read_with_its_workers():
    script = ARRAY_SCRIPT.replace('srun -l "${TORCHRUN_ARGS[@]}"',
                                  'srun -l torchrun "${TORCHRUN_ARGS[@]}"')
    plan, problems = analyse(script, "job.sh")
    assert not problems and plan is not None and plan.launch is not None
    assert plan.launch.kind == "torchrun" and declared_workers(plan.launch) == 8


def test_a_comment_that_ends_in_a_backslash_continues_nothing():
    text = "#!/bin/bash\n    # srun --gpus 4 \\\nrun_cmd=x\necho $run_cmd\n"
    assert [line for _, line in logical_lines(text)][1:] == [
        "    # srun --gpus 4 \\", "run_cmd=x", "echo $run_cmd", ""]


def test_a_command_substitution_is_one_word_and_its_pipe_is_its_own():
    line = "srun --gpus $(( N * 4 )) --gpus-per-node $(nvidia-smi -L | wc -l) python3 t.py"
    assert len(sh.segments(line)) == 1
    assert sh.words(line) == ["srun", "--gpus", "$(( N * 4 ))", "--gpus-per-node",
                              "$(nvidia-smi -L | wc -l)", "python3", "t.py"]


def test_each_command_of_a_bash_c_string_is_seen_after_the_srun_before_it():
    line = ("srun --ntasks-per-node=1 bash -c 'source env.sh; cd run && "
            "accelerate launch --num_processes 2 train.py'")
    found = [w[2:4] for w in sh.resolved_commands(line, {})]
    assert found == [["source", "env.sh"], ["cd", "run"], ["accelerate", "launch"]]


def test_eval_of_a_command_kept_in_a_variable_is_read_as_that_command():
    variables = {"SRUN_EXEC": "srun -N 2 -n 8 -l", "run_cmd": "${SRUN_EXEC} python3 t.py"}
    variables["run_cmd"] = sh.expand(variables["run_cmd"], variables)
    assert sh.resolved_commands('eval "${run_cmd}"', variables) == [
        ["srun", "-N", "2", "-n", "8", "-l", "python3", "t.py"]]


def test_a_launcher_behind_numactl_and_nsys_is_found_and_rewritten_behind_them():
    script = ("#!/bin/bash\nsrun -l bash -c \"RANK=\\$SLURM_PROCID numactl --membind=0-3 "
              "nsys profile -s none torchrun --nnodes 4 --nproc_per_node 4 t.py\"\n")
    plan, problems = analyse(script, "job.sh")
    assert not problems and plan is not None and plan.launch is not None
    assert plan.launch.kind == "torchrun" and declared_workers(plan.launch) == 4
    g = Generation(nnodes=2, node_rank=1, master_addr="n1", master_port=29500,
                   nodes=("n1", "n2"), workers_per_node=4, run_dir="/tmp/r")
    launch = plan_launch(["numactl", "--membind=0-3", "torchrun", "--nnodes", "4",
                          "--nproc_per_node", "4", "t.py"], g)
    assert launch.argv[:3] == ("numactl", "--membind=0-3", "torchrun")
    assert "--nnodes=2" in launch.argv and "4" not in launch.argv[3:5]


def test_a_shell_string_is_found_after_the_shells_own_options():
    """``bash -lc``, ``sh -xeuc``, ``bash -l -c``, ``bash --login -c``, ``bash -euo pipefail
    -c`` and ``bash -c -x`` all run the first word that is not an option, as the shell does."""
    for cmd, at in ((["bash", "-lc", "torchrun t.py"], 2), (["sh", "-xeuc", "s"], 2),
                    (["bash", "-l", "-c", "s"], 3), (["bash", "--login", "-c", "s"], 3),
                    (["bash", "-euo", "pipefail", "-c", "s"], 4), (["bash", "-c", "-x", "s"], 3),
                    (["/bin/bash", "--rcfile", "f", "-c", "s"], 4)):
        assert sh.shell_string(cmd) == at, cmd
    for cmd in (["bash", "-x", "run.sh"], ["bash", "run.sh", "-c"], ["bash", "-lc"],
                ["python", "-c", "x"]):
        assert sh.shell_string(cmd) is None, cmd
    script = ('#!/bin/bash\nSRUN="srun --mpi=pmix"\nCMD="uv run python -m torch.distributed.run'
              ' --nproc_per_node=4 t.py"\n$SRUN bash -lc "\n  set -e\n  cd /opt\n  $CMD\n"\n')
    plan, problems = analyse(script, "job.sh")
    assert not problems and plan is not None and plan.launch is not None
    assert plan.launch.kind == "torchrun" and declared_workers(plan.launch) == 4


def test_a_continuation_at_the_end_of_the_file_and_jscs_torchrun():
    """A last line ending in ``\\`` continues nothing (bash runs it); JSC's ``torchrun_jsc``
    takes torchrun's options and is read as torchrun."""
    script = "#!/bin/bash\nsrun --cpu_bind=v python t.py \\\n  --lr 1 \\\n"
    plan, problems = analyse(script, "job.sh")
    assert not problems and plan is not None and plan.launch is not None
    assert plan.launch.kind == "srun-python" and plan.launch.words[-2:] == ("--lr", "1")
    plan, _ = analyse('#!/bin/bash\nsrun bash -c "torchrun_jsc --nproc_per_node=4 t.py"\n',
                      "job.sh")
    assert plan is not None and plan.launch is not None
    assert plan.launch.kind == "torchrun" and declared_workers(plan.launch) == 4
