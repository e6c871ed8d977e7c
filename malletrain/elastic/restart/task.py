"""One task of a step, on its node: ``python -m malletrain.elastic.restart.task SPEC -- CMD``.

The real ``srun`` of a node's share (:mod:`.steps`) starts this in the node's slot. It gives
the task the job-wide view Slurm would give a task of a step over the generation's nodes
(``SLURM_PROCID`` among all the step's tasks, ``SLURM_NODEID``, ``SLURM_STEP_*``, the job's
``SLURM_JOB_ID`` and nodelist, not the slot's), registers with its node's agent
(:mod:`.registry`), rewrites a launcher that names its size (:mod:`.launchers`: torchrun,
accelerate, deepspeed, ``bash -c "$LAUNCHER ..."``) for the step's nodes, and becomes the
command as its supervising parent (:func:`supervise`). With ``--label`` it prefixes each
output line with the task's global id, as ``srun -l`` does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from malletrain.elastic.restart import registry, tree
from malletrain.elastic.restart.generation import SLOT_ONLY
from malletrain.elastic.restart.launchers import (
    Generation,
    Launch,
    LaunchError,
    plan_launch,
    program_name,
)
from malletrain.elastic.restart.script import find_launch
from malletrain.elastic.restart.shellwords import shell_string

#: launchers found behind a wrapper's words
_LAUNCHERS = ("torchrun", "torchrun_jsc", "accelerate", "deepspeed")


def task_env(spec: Mapping[str, Any], slot_env: Mapping[str, str]) -> tuple[dict[str, str],
                                                                            int, int]:
    """The task's environment, its global id and its local id. Pure."""
    local = int(slot_env.get("SLURM_LOCALID", "0") or 0)
    ids = spec["task_ids"]
    procid = int(ids[local]) if local < len(ids) else int(ids[0]) + local
    env = {k: v for k, v in slot_env.items() if k not in SLOT_ONLY}
    env.update(spec["env"])
    nodes = ",".join(spec["step_nodes"])
    ntasks = str(spec["ntasks"])
    env.update({
        "SLURM_STEP_ID": str(spec["step"]), "SLURM_STEPID": str(spec["step"]),
        "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(spec["node_index"]), "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_NUM_NODES": str(len(spec["step_nodes"])),
        "SLURM_STEP_NUM_TASKS": ntasks, "SLURM_NTASKS": ntasks, "SLURM_NPROCS": ntasks,
        "SLURM_STEP_TASKS_PER_NODE": spec["tasks_per_node"],
        "MALLETRAIN_RUN_DIR": spec["run_dir"],
    })
    return env, procid, local


def _generation(spec: Mapping[str, Any]) -> Generation:
    hosts = tuple(spec["step_hosts"])
    return Generation(nnodes=len(hosts), node_rank=int(spec["node_index"]),
                      master_addr=hosts[0], master_port=int(spec["port"]), nodes=hosts,
                      workers_per_node=int(spec["workers"]), run_dir=spec["run_dir"])


def command(spec: Mapping[str, Any], cmd: Sequence[str], env: dict[str, str],
            procid: int, local: int) -> list[str]:
    """The command this task runs: a launcher rewritten for the step's nodes (one per
    node), also behind a wrapper (``singularity exec $SIF torchrun ...``); a plain Python
    task given torch's rendezvous variables; anything else as written."""
    g = _generation(spec)
    ntasks_here = len(spec["task_ids"])
    if not _rewritable(cmd):
        return list(cmd)
    at, launch = _find_launcher(cmd, g)
    if launch is None:
        return list(cmd)
    if launch.kind == "srun-python":
        env.update({"MASTER_ADDR": g.master_addr, "MASTER_PORT": str(g.master_port),
                    "RANK": str(procid), "LOCAL_RANK": str(local),
                    "WORLD_SIZE": str(spec["ntasks"]), "LOCAL_WORLD_SIZE": str(ntasks_here)})
        return list(cmd)
    if ntasks_here != 1:
        return list(cmd)  # several launchers per node: the script's own arrangement
    env.update({k: v for k, v in launch.env.items() if not k.startswith("SLURM_")})
    env.update({  # what ``bash -c "$LAUNCHER ..."``'s inner launcher reads (launch.py)
        "MALLETRAIN_PYTHON": sys.executable, "MALLETRAIN_NNODES": str(g.nnodes),
        "MALLETRAIN_NODE_RANK": str(g.node_rank), "MALLETRAIN_MASTER_ADDR": g.master_addr,
        "MALLETRAIN_MASTER_PORT": str(g.master_port), "MALLETRAIN_NODES": ",".join(g.nodes),
        "MALLETRAIN_WORKERS_PER_NODE": str(g.workers_per_node)})
    for path, text in launch.files:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    return [*cmd[:at], *launch.argv]


def _find_launcher(cmd: Sequence[str], g: Generation) -> tuple[int, Launch | None]:
    """Where the launcher starts in ``cmd`` and its rewrite: at the start, or the first
    torchrun/accelerate/deepspeed after a wrapper's words (a container's ``exec IMAGE``)."""
    try:
        return 0, plan_launch(["srun", *cmd], g)
    except LaunchError:
        pass
    for at in range(1, len(cmd)):
        if program_name(cmd[at]) not in _LAUNCHERS and not (
                program_name(cmd[at]).startswith("python") and "-m" in cmd[at + 1:at + 3]):
            continue
        try:
            launch = plan_launch(["srun", *cmd[at:]], g)
        except LaunchError:
            continue
        if launch.kind in ("torchrun", "accelerate", "deepspeed"):
            return at, launch
    return 0, None


def _rewritable(cmd: Sequence[str]) -> bool:
    """A ``bash -c STRING`` is rewritten only where STRING starts with a launcher
    (``bash -c "$LAUNCHER --node_rank \\$SLURM_PROCID ..."``); any other string runs as is."""
    at = shell_string(list(cmd))
    if at is None:
        return True
    launches, problems = find_launch("#!/bin/bash\n" + cmd[at], "step")
    return (len(launches) == 1 and not problems and launches[0].lineno == 2
            and launches[0].offset == 0 and launches[0].kind != "srun-python")


def supervise(argv: list[str], env: dict[str, str], label: str | None) -> int:
    """Run the command as this process's child and stay its parent, as slurmstepd stays
    the parent of a task: a child subreaper (:mod:`.tree`), so nothing the command starts
    (a ``setsid`` daemon, a data loader orphaned by its parent) outlives it. Signals from
    the node agent go to every descendant; when the command ends, what it left is ended.
    With ``label``, each output line is prefixed with it (``srun -l``)."""
    tree.become_subreaper()
    pipe = subprocess.PIPE if label is not None else None
    proc = subprocess.Popen(argv, env=env, stdout=pipe, stderr=pipe)

    def forward(signum: int, _frame: object) -> None:
        tree.signal_all(tree.descendants(), signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP,
              signal.SIGCONT):
        signal.signal(s, forward)
    pumps = []
    if label is not None:
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, label)),
                 threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, label))]
    for t in pumps:
        t.start()
    rc = proc.wait()
    for sig in (signal.SIGTERM, signal.SIGKILL):  # what the command left behind
        if tree.wait_gone(0.0 if sig == signal.SIGTERM else 2.0, keep=None):
            break
        tree.signal_all(tree.descendants(), sig)
    tree.wait_gone(2.0, keep=None)
    for t in pumps:
        t.join(1.0)
    return 128 - rc if rc < 0 else rc


def _pump(src: IO[bytes], dst: IO[bytes], label: str) -> None:
    for line in iter(src.readline, b""):
        dst.write(label.encode() + line)
        dst.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("malletrain task: usage: task SPEC -- COMMAND...", file=sys.stderr)
        return 2
    spec, cmd = json.loads(args[0]), args[2:]
    env, procid, local = task_env(spec, os.environ)
    if not registry.register(spec["run_dir"], int(spec["epoch"])):
        print(f"malletrain: step {spec['step']} task {procid}: the job's size changed "
              "before it started; not run", file=sys.stderr)
        return 143
    run = command(spec, cmd, env, procid, local)
    width = len(str(int(spec["ntasks"]) - 1))
    try:  # an argument list, never a shell string
        return supervise(run, env, f"{procid:>{width}}: " if spec.get("label") else None)
    except OSError as exc:
        print(f"srun: error: {spec['step_nodes'][int(spec['node_index'])]}: task {procid}: "
              f"cannot run {run[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    finally:
        registry.unregister(spec["run_dir"])


if __name__ == "__main__":
    sys.exit(main())
