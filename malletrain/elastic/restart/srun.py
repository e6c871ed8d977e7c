"""The ``srun`` a restart-mode batch shell finds first on its PATH.

It reads the step (:mod:`.steps`), lays it out over the generation's nodes and hands each
node's share to Slurm's own ``srun`` in that node's slot (``--jobid=<slot> --overlap``), all
at once; it passes signals on to them (a script's ``trap 'kill -USR1 $pid' USR1``), ends the
others when one fails under ``--kill-on-bad-exit``, and exits with the highest exit code,
as srun does. A step that cannot run here fails at once with an ``srun: error:`` line in
the job's output: it never waits silently.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from malletrain.elastic.restart import steps
from malletrain.elastic.restart.generation import (
    GENERATION_ENV,
    SLOT_ONLY,
    GenerationView,
    step_port,
    tasks_per_node_text,
)

_FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP,
            signal.SIGCONT)
#: variables the task wrapper sets itself for each task (from the step's layout)
_PER_TASK = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME",
             "SLURM_TOPOLOGY_ADDR", "SLURM_NTASKS", "SLURM_NPROCS")


def srun_env(env: Mapping[str, str]) -> dict[str, str]:
    """What Slurm's srun is started with: no ``SLURM_*`` of the batch view (srun reads
    SLURM_NNODES, SLURM_NTASKS, SLURM_JOB_ID... as its options), SLURM_CONF kept."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def task_spec(lay: steps.StepLayout, share: steps.NodeShare, view: GenerationView,
              step: int, env: Mapping[str, str]) -> dict[str, object]:
    """What the task wrapper of one node needs (:mod:`.task`)."""
    batch = {k: v for k, v in env.items()
             if k.startswith("SLURM_") and k != "SLURM_CONF" and k not in SLOT_ONLY
             and k not in _PER_TASK}
    counts = [len(s.task_ids) for s in lay.shares]
    return {
        "epoch": view.epoch, "step": step, "node_index": share.node_index,
        "task_ids": list(share.task_ids), "ntasks": lay.ntasks,
        "step_nodes": [s.node.name for s in lay.shares],
        "step_hosts": [s.node.host for s in lay.shares],
        "tasks_per_node": tasks_per_node_text(counts), "env": batch,
        "run_dir": share.node.run_dir, "label": lay.request.label,
        "workers": view.tasks_per_node or 1,
        "port": step_port(view.job_id, view.epoch, step),
    }


def next_step_id(run_dir: str) -> int:
    """Step ids count up per node agent (one byte appended per step: atomic)."""
    path = os.path.join(run_dir, "steps")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, b".")
        return os.fstat(fd).st_size - 1
    finally:
        os.close(fd)


#: in the node agent's run directory: the last failed step of the batch shell, one line each
STEP_ERRORS = "step-errors"


def note_failure(env: Mapping[str, str], line: str) -> None:
    """Append ``line`` to the agent's :data:`STEP_ERRORS`, which it reports with the
    launch's failure (``malletrain jobs`` shows it); best effort: the job's output has it."""
    run_dir = env.get("MALLETRAIN_RUN_DIR")
    if not run_dir:
        return
    text = "".join(c if c.isprintable() else " " for c in line)[:300] + "\n"
    try:
        fd = os.open(os.path.join(run_dir, STEP_ERRORS),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def failures_size(run_dir: str | os.PathLike[str]) -> int:
    """Bytes of :data:`STEP_ERRORS` so far: a launch's own failures are those after it."""
    try:
        return os.stat(os.path.join(run_dir, STEP_ERRORS)).st_size
    except OSError:
        return 0


def last_failure(run_dir: str | os.PathLike[str], since: int) -> str:
    """The last step failure noted after byte ``since`` ("" if none)."""
    try:
        with open(os.path.join(run_dir, STEP_ERRORS), "rb") as f:
            f.seek(since)
            lines = f.read(64 * 1024).decode(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    view = GenerationView.from_json(env[GENERATION_ENV])
    try:
        lay = steps.layout(steps.parse(argv), view, env)
    except steps.StepError as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        note_failure(env, f"srun: error: {exc}")
        return 1
    for warning in lay.request.warnings:
        print(f"srun: warning: {warning}", file=sys.stderr)
    step = next_step_id(env.get("MALLETRAIN_RUN_DIR") or view.nodes[0].run_dir)
    clean = srun_env(env)
    procs: list[subprocess.Popen[bytes]] = []
    for i, share in enumerate(lay.shares):
        spec = json.dumps(task_spec(lay, share, view, step, env), separators=(",", ":"))
        procs.append(subprocess.Popen(steps.node_argv(lay, share, view, spec), env=clean,
                                      stdin=None if i == 0 else subprocess.DEVNULL))

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for s in _FORWARD:
        signal.signal(s, forward)
    ended = False
    while any(p.poll() is None for p in procs):
        if lay.request.kill_on_bad_exit and not ended and any(
                p.returncode not in (None, 0) for p in procs):
            ended = True
            forward(signal.SIGTERM, None)
        time.sleep(0.05)
    codes = [128 - p.returncode if p.returncode < 0 else p.returncode for p in procs]
    worst = max(codes, default=0)
    if worst:
        bad = [lay.shares[i].node.name for i, c in enumerate(codes) if c == worst]
        note_failure(env, f"srun: step {step} ({' '.join(argv)[:120]}) exited with code "
                          f"{worst} on {','.join(bad)}")
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if GENERATION_ENV not in os.environ:
        print("srun: error: malletrain's srun runs inside a malleable job's batch shell "
              "only", file=sys.stderr)
        return 1
    return run(args, os.environ)


if __name__ == "__main__":
    sys.exit(main())
