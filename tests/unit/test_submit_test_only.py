"""`malletrain submit --test-only [--json]`: offline (no daemon, no Slurm), like sbatch's."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LLM = """#!/usr/bin/env python3
#SBATCH --job-name=llm
#SBATCH -N 2-8
#SBATCH --gres=gpu:a100:4
#SBATCH --time=1-00:00:00
#SBATCH --mem=0
#SBATCH --mail-type=END
import torch
"""

BAD = """#!/usr/bin/env python3
#SBATCH --begin=now+1hour
#SBATCH -N 4-2
#SBATCH --bogus
print(1)
"""


def submit(tmp_path, text, *flags):
    script = tmp_path / "job.py"
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(REPO), MALLETRAIN_SOCKET=str(tmp_path / "none"))
    return subprocess.run([sys.executable, "-m", "malletrain.cli", "submit", "--test-only",
                           *flags, str(script), "--lr", "0.1"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60), script


def test_json_says_what_would_run(tmp_path):
    res, script = submit(tmp_path, LLM, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {k: out[k] for k in ("accepted", "name", "min_nodes", "max_nodes", "time_s",
                                "gpus_per_node", "gpu_type", "workers_per_node")} == {
        "accepted": True, "name": "llm", "min_nodes": 2, "max_nodes": 8, "time_s": 86400,
        "gpus_per_node": 4, "gpu_type": "a100", "workers_per_node": 4}
    assert out["slot_options"] == ["--mem=0", "--gres=gpu:a100:4"]
    assert out["per_node_command"][:3] == ["srun", "--nodes=1", "--ntasks=4"]
    assert out["per_node_command"][-3:] == [str(script), "--lr", "0.1"]
    assert out["warnings"] == [f"{script}:7: --mail-type ignored: malletrain sends no mail; "
                               "watch `malletrain jobs`"]
    assert out["rate_target"] is None
    res, _ = submit(tmp_path, LLM, "--json", "--rate-target", "800")
    assert json.loads(res.stdout)["rate_target"] == 800.0


def test_a_refused_script_lists_every_problem_and_exits_non_zero(tmp_path):
    res, script = submit(tmp_path, BAD)
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert [ln.split(": ", 1)[0] for ln in lines] == [f"{script}:{n}" for n in (2, 3, 4)]
    res, _ = submit(tmp_path, BAD, "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["accepted"] is False
    assert len(json.loads(res.stdout)["errors"]) == 3


def test_a_shell_batch_script_runs_in_restart_mode(tmp_path):
    res, _ = submit(tmp_path, "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=4\n"
                    "#SBATCH --signal=B:USR1@90\nmodule load x\nsrun python train.py\n",
                    "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["mode"], out["launcher"], out["launch_line"]) == ("restart", "srun-python", 6)
    assert (out["workers_per_node"], out["stop_signal"], out["stop_grace_s"]) == (4, "USR1", 90)
    assert out["per_node_command"][4:7] == [sys.executable, "-m",
                                            "malletrain.elastic.restart.agent"]


def test_a_script_without_a_launcher_runs_and_one_of_another_language_is_refused(tmp_path):
    res, script = submit(tmp_path, "#!/bin/bash\n#SBATCH -N 2\nsrun hostname\n")
    assert res.returncode == 0
    assert f"{script}:1: no launcher malletrain recognises" in res.stderr
    res, script = submit(tmp_path, "#!/usr/bin/perl\nprint 1;\n")
    assert res.returncode == 1
    assert res.stderr.startswith(f"{script}:1: a '/usr/bin/perl' script")


def test_any_sbatch_option_on_the_command_line_overrides_the_script_as_with_sbatch(tmp_path):
    """A public script asks for what this cluster has not (`--mem-per-gpu=60G`, a
    partition, 8 tasks per node); the user overrides it on the command line, as with sbatch,
    with options `submit` has no flag of its own for, in one or two words or a short form."""
    text = ("#!/bin/bash\n#SBATCH --partition=standard-g\n#SBATCH --nodes=4\n"
            "#SBATCH --gpus-per-node=8\n#SBATCH --ntasks-per-node=8\n"
            "#SBATCH --mem-per-gpu=60G\nsrun python train.py\n")
    res, _ = submit(tmp_path, text, "--json", "-N", "1-3", "--mem-per-gpu", "100M",
                    "-p", "batch", "--ntasks-per-node=1", "--exclusive", "-q", "low",
                    "--container-image=img.sqsh")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["min_nodes"], out["max_nodes"], out["tasks_per_node"]) == (1, 3, 1)
    # the slot's sbatch reads the last --mem-per-gpu, the command line's
    assert out["slot_options"][-3:-1] == ["--mem-per-gpu=60G", "--mem-per-gpu=100M"]
    assert out["slot_options"][-1] == "--container-image=img.sqsh"
    warned = [w for w in out["warnings"] if w.startswith("command line:")]
    # --qos is honoured (the daemon checks the association may use it): no warning
    assert [w.split(": ")[1].split()[0] for w in warned] == [
        "--partition", "--exclusive", "--container-image"]
    # refused options are refused with sbatch's table's reason, not argparse's
    res, _ = submit(tmp_path, text, "-w", "n1", "--begin=now")
    assert res.returncode == 1
    assert "command line: --nodelist cannot be used for a malleable job" in res.stderr
    assert "command line: --begin cannot be used for a malleable job" in res.stderr


def test_an_optional_value_is_read_after_equals_only_as_getopt_reads_it(tmp_path):
    """sbatch's ``--exclusive[=user|mcs|topo]`` and ``--nice[=N]`` take a value only as
    ``--opt=value``: ``--exclusive=user`` on the command line is the option with its value
    (argparse refused it), ``--nice job.py`` the flag and then the script, and the same
    words after the script are the script's own arguments, untouched."""
    text = "#!/bin/bash\n#SBATCH -N 2\nsrun python train.py\n"
    res, script = submit(tmp_path, text, "--json", "--exclusive=user", "--nice", "-N", "3")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["min_nodes"] == 3
    assert "command line: --exclusive ignored: node slots always hold a whole node" in \
        out["warnings"]
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(REPO), MALLETRAIN_SOCKET=str(tmp_path / "none"))
    res = subprocess.run([sys.executable, "-m", "malletrain.cli", "submit", "--test-only",
                          "--json", "--nice=10", str(script), "--exclusive=user", "--nice"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not [w for w in json.loads(res.stdout)["warnings"] if "exclusive" in w]
    res, _ = submit(tmp_path, text, "--exclusive=bogus")
    assert res.returncode == 1
    assert "--exclusive" in res.stderr and "bogus" in res.stderr
