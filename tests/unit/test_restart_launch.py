"""Restart mode, the pure parts: finding a script's launch line, and the launch line rewritten
for a generation (golden argument lists, torchx style)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from malletrain.elastic.restart.launchers import Generation, LaunchError, plan_launch, split_srun
from malletrain.elastic.restart.script import (
    analyse,
    declared_workers,
    is_shell_script,
    logical_lines,
)

G = Generation(nnodes=3, node_rank=1, master_addr="n4", master_port=21234,
               nodes=("n4", "n5", "n7"), workers_per_node=2, run_dir="/tmp/malletrain-restart-x")

TORCHRUN_SCRIPT = """#!/bin/bash
#SBATCH --nodes=2-4
#SBATCH --signal=B:USR1@60
module load cuda   # set-up line
export OMP_NUM_THREADS=1
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 torchrun --nnodes $SLURM_NNODES --nproc_per_node 4 \\
    --rdzv_id $RANDOM --rdzv_backend c10d --rdzv_endpoint $head_node:29500 \\
    train.py --epochs 5
echo done
"""


def test_finds_the_launch_line_across_continuations():
    plan, problems = analyse(TORCHRUN_SCRIPT, "job.sh")
    assert problems == []
    assert plan is not None and plan.interpreter == ("/bin/bash",)
    assert plan.launch.lineno == 7 and plan.launch.kind == "torchrun"
    assert declared_workers(plan.launch) == 4
    assert plan.launch.words[-3:] == ("train.py", "--epochs", "5")


def test_a_script_needs_its_hashbang_line_and_mpi_is_said_untested():
    plan, problems = analyse("srun torchrun x.py\n", "j.sh")
    assert plan is None and problems[0].startswith("j.sh:1: no #! line")
    plan, problems = analyse("#!/bin/bash\ntime srun mpirun -np 8 python train.py\n", "j.sh")
    assert problems == [] and plan is not None
    assert plan.warnings[0].startswith("j.sh:2: mpirun: an MPI launcher starts its remote")


def test_a_script_without_a_known_launcher_or_with_two_runs_as_sbatch_would():
    """The batch shell runs the script as written: no launcher to find is a warning, and
    two launch lines run one after the other, as under sbatch."""
    plan, problems = analyse("#!/bin/bash\nsrun hostname\necho hi\n", "j.sh")
    assert problems == [] and plan is not None and plan.launch is None
    assert plan.warnings and plan.warnings[0].startswith("j.sh:1: no launcher")
    plan, problems = analyse("#!/bin/bash\ntorchrun a.py\ntorchrun b.py\n", "j.sh")
    assert problems == [] and plan is not None and plan.warnings == ()
    assert [x.lineno for x in (plan.launch, *plan.alternatives)] == [2, 3]


@pytest.mark.parametrize("first", ["#!/usr/bin/env -S bash -e", "#!/bin/bash -l",
                                   "#!/usr/bin/env bash", "#!/bin/sh", "#!/usr/bin/zsh"])
def test_any_shell_in_the_hashbang_line_is_a_batch_script(first):
    assert is_shell_script(first + "\nsrun hostname\n")


def test_here_documents_and_comments_are_not_launch_lines():
    text = ("#!/bin/bash\ncat > cfg.txt <<EOF\ntorchrun not-a-command.py\nEOF\n"
            "# torchrun in a comment\nsrun python train.py\n")
    plan, problems = analyse(text, "j.sh")
    assert problems == [] and plan is not None
    assert plan.launch.lineno == 6 and plan.launch.kind == "srun-python"
    assert [n for n, _ in logical_lines(text)] == [1, 2, 5, 6, 7]


def test_shell_and_python_scripts_are_told_apart():
    assert is_shell_script("#!/bin/bash\n") and is_shell_script("#!/usr/bin/env bash\n")
    assert is_shell_script("#!/bin/sh -l\n")
    assert not is_shell_script("#!/usr/bin/env python3\n") and not is_shell_script("echo\n")


# --------------------------------------------------------------------------- rewriting


def test_torchrun_gets_the_generation_size_and_keeps_the_rest():
    argv = ["srun", "--ntasks-per-node=1", "-N", "4", "torchrun", "--nnodes", "4",
            "--nproc_per_node=4", "--rdzv_id", "77", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", "n1:29500", "--log-dir", "/tmp/l", "train.py", "--nnodes", "9"]
    launch = plan_launch(argv, G)
    assert launch.kind == "torchrun" and not launch.tasks
    assert launch.argv == (
        "torchrun", "--nnodes=3", "--node-rank=1", "--nproc-per-node=4", "--master-addr=n4",
        "--master-port=21234", "--rdzv-backend=static", "--max-restarts=0",
        "--log-dir", "/tmp/l", "train.py", "--nnodes", "9")  # the script's own flags kept
    assert launch.env["SLURM_NNODES"] == "3" and launch.env["SLURM_NODEID"] == "1"
    assert launch.env["SLURM_JOB_NODELIST"] == "n4,n5,n7"
    assert launch.env["MASTER_ADDR"] == "n4" and launch.env["MASTER_PORT"] == "21234"


def test_python_m_torch_distributed_run_and_default_workers():
    launch = plan_launch(["python3", "-m", "torch.distributed.run", "--standalone",
                          "-m", "pkg.train"], G)
    assert launch.argv == ("python3", "-m", "torch.distributed.run", "--nnodes=3",
                           "--node-rank=1", "--nproc-per-node=2", "--master-addr=n4",
                           "--master-port=21234", "--rdzv-backend=static",
                           "--max-restarts=0", "-m", "pkg.train")


def test_srun_python_becomes_one_process_per_task_with_slurm_and_torch_env():
    launch = plan_launch(["srun", "--ntasks-per-node", "2", "--gpus-per-task=1", "python",
                          "train.py", "--lr", "0.1"], G)
    assert launch.kind == "srun-python" and launch.argv == ("python", "train.py", "--lr", "0.1")
    assert launch.bind_gpus
    assert [t["RANK"] for t in launch.tasks] == ["2", "3"]
    assert [t["SLURM_PROCID"] for t in launch.tasks] == ["2", "3"]
    assert {t["WORLD_SIZE"] for t in launch.tasks} == {"6"}
    assert [t["LOCAL_RANK"] for t in launch.tasks] == ["0", "1"]
    assert launch.env["SLURM_NTASKS"] == "6" and launch.env["SLURM_TASKS_PER_NODE"] == "2(x3)"


def test_accelerate_and_deepspeed_are_rewritten():
    acc = plan_launch(["accelerate", "launch", "--multi_gpu", "--num_machines", "4",
                       "--num_processes", "16", "--main_process_ip", "x", "--mixed_precision",
                       "bf16", "train.py"], G)
    assert acc.argv == ("accelerate", "launch", "--num_machines", "3", "--machine_rank", "1",
                        "--num_processes", "6", "--main_process_ip", "n4",
                        "--main_process_port", "21234", "--rdzv_backend", "static",
                        "--same_network", "--multi_gpu", "--mixed_precision", "bf16",
                        "train.py")
    ds = plan_launch(["deepspeed", "--hostfile", "hf", "--num_gpus", "4", "train.py",
                      "--deepspeed"], G)
    hostfile = "/tmp/malletrain-restart-x/deepspeed-hostfile"
    assert ds.argv == ("deepspeed", "--hostfile", hostfile, "--no_ssh", "--num_nodes", "3",
                       "--node_rank", "1", "--num_gpus", "2", "--master_addr", "n4",
                       "--master_port", "21234", "train.py", "--deepspeed")
    # deepspeed's runner refuses more than one node without a hostfile naming them
    assert ds.files == ((hostfile, "n4 slots=2\nn5 slots=2\nn7 slots=2\n"),)
    assert ds.env["SLURM_NNODES"] == "3"


def test_deepspeed_s_hostfile_is_written_privately_before_it_runs(tmp_path):
    """``python -m malletrain.elastic.restart.launch`` writes the hostfile (0600, never
    through a link), then execs the launcher (here a stand-in ``deepspeed`` on PATH that
    prints its argv and the hostfile it was given: DeepSpeed is not installed in CI)."""
    import json
    import os

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "deepspeed"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        "print(json.dumps([sys.argv[1:], open(sys.argv[2]).read()]))\n")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "MALLETRAIN_NNODES": "2", "MALLETRAIN_NODE_RANK": "0",
           "MALLETRAIN_MASTER_ADDR": "n1", "MALLETRAIN_MASTER_PORT": "4000",
           "MALLETRAIN_NODES": "n1,n2", "MALLETRAIN_RUN_DIR": str(run_dir)}

    def launch(env):
        return subprocess.run([sys.executable, "-m", "malletrain.elastic.restart.launch",
                               "deepspeed", "train.py"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    res = launch(env)
    assert res.returncode == 0, res.stderr
    argv, hosts = json.loads(res.stdout)
    hostfile = run_dir / "deepspeed-hostfile"
    assert argv[:2] == ["--hostfile", str(hostfile)] and argv[-1] == "train.py"
    assert hosts == "n1 slots=1\nn2 slots=1\n"
    assert oct(hostfile.stat().st_mode & 0o777) == "0o600"
    hostfile.unlink()
    os.symlink(tmp_path / "elsewhere", hostfile)  # planted link: refused, nothing written
    res = launch(env)
    assert res.returncode == 2 and "cannot write" in res.stderr
    assert not (tmp_path / "elsewhere").exists()
    res = launch({k: v for k, v in env.items() if k != "MALLETRAIN_RUN_DIR"})
    assert res.returncode == 2 and "no private directory" in res.stderr


def test_not_a_launch_line_is_a_clear_error():
    with pytest.raises(LaunchError, match="not a launch line"):
        plan_launch(["srun", "hostname"], G)
    with pytest.raises(LaunchError, match="no training script"):
        plan_launch(["torchrun", "--nnodes", "2"], G)


def test_srun_options_with_and_without_values():
    opts, cmd = split_srun(["srun", "-l", "-N2", "--cpu-bind", "none", "--exclusive",
                            "--mpi=pmix", "python", "t.py"])
    assert cmd == ["python", "t.py"]
    assert opts == {"-l": "", "-N": "2", "--cpu-bind": "none", "--exclusive": "",
                    "--mpi": "pmix"}




def test_srun_options_with_an_optional_value_never_take_the_next_word():
    """srun's ``--propagate[=rlimit]``, ``--nice[=adj]``, ``--resv-ports[=n]``, ``--x11[=...]``
    take a value only as ``--opt=value`` (getopt's optional argument)."""
    for opt in ("--propagate", "--nice", "--resv-ports", "--x11", "--send-libs"):
        opts, cmd = split_srun(["srun", opt, "python", "t.py"])
        assert cmd == ["python", "t.py"] and opts == {opt: ""}, opt
    opts, cmd = split_srun(["srun", "--propagate=STACK", "--nice=10", "python", "t.py"])
    assert cmd == ["python", "t.py"] and opts == {"--propagate": "STACK", "--nice": "10"}


def test_a_launcher_behind_a_sites_container_wrapper_is_found():
    """CSC's ``apptainer_wrapper exec`` and ``singularity_wrapper exec`` (and any
    ``*-wrapper``) run the command after their own words, as ``apptainer exec`` does."""
    from malletrain.elastic.restart.launchers import launcher_kind
    for cmd, kind in ((["apptainer_wrapper", "exec", "accelerate", "launch", "t.py"],
                       "accelerate"),
                      (["singularity_wrapper", "exec", "deepspeed", "t.py"], "deepspeed"),
                      (["/opt/site/run-wrapper.sh", "torchrun", "t.py"], "torchrun"),
                      (["mywrapper", "torchrun", "t.py"], None)):
        assert launcher_kind(cmd, under_srun=True) == kind, cmd


def test_pyxis_flags_on_srun_take_no_value():
    opts, cmd = split_srun(["srun", "--container-image", "img.sqsh", "--container-mount-home",
                            "--container-mounts", "/a:/a", "--no-container-remap-root", "-l",
                            "torchrun", "t.py"])
    assert cmd == ["torchrun", "t.py"] and opts["--container-mount-home"] == ""
