"""Node slots: the Slurm jobs through which a malleable job holds scavenged nodes.

Design (verified on the dev cluster with plain sbatch/scontrol, docs/user-guide.md and
docs/benchmarks.md record it): ``malletrain submit`` runs AS THE USER and submits
``max_nodes`` single-node batch jobs in the scavenger partition, all held (``--hold``),
tagged with the comment ``malletrain:<job>:<slot>``. The daemon, with Slurm operator
rights only, then

* grows a job by ``scontrol update JobId=S NodeList=<node> TimeLimit=<minutes>
  StartTime=now`` + ``scontrol release S`` (backfill only starts a preemptible job whose
  time limit ends before the node's next planned start, docs/slurm-backend.md;
  ``StartTime=now`` skips the ``cred_expire`` wait a requeued job would otherwise sit out),
* shrinks it by publishing a membership without that slot's member (the workers leave at a
  step boundary and the slot job ends) and then ``scontrol requeuehold S``, which puts the
  finished (or still running) job back into the held pool,
* after a preemption (Slurm SIGTERMs the step; the worker leaves, the job ends COMPLETED or
  PREEMPTED) does the same ``requeuehold``.

So user code only ever runs as the user, through Slurm, and the daemon never submits.

This module is pure: rendering the slot job (torchx style: a value, golden-tested), the
member ids, and the classification of a slot's Slurm job into a :class:`SlotStatus`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from enum import StrEnum

from malletrain.core.cluster import Job, JobState
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.elastic.restart.arrays import parse_array
from malletrain.elastic.restart.generation import job_number
from malletrain.elastic.restart.script import SCRIPT_ENV
from malletrain.slurm.sbatch import SbatchSpec

TAG_PREFIX = "malletrain"
_TAG_RE = re.compile(r"^malletrain:([A-Za-z0-9][A-Za-z0-9._-]{0,127}):(\d{1,6})$")
_MEMBER_RE = re.compile(r"^s(\d{1,6})-r(\d{1,9})$")


def slot_tag(job_id: str, slot: int) -> str:
    """The comment that marks Slurm job ``slot`` of malleable job ``job_id``."""
    return f"{TAG_PREFIX}:{job_id}:{slot}"


#: the longest comment that can be a tag (a 128-character job id, a 6-digit slot)
_MAX_TAG_CHARS = len(TAG_PREFIX) + 1 + 128 + 1 + 6


def parse_tag(comment: str) -> tuple[str, int] | None:
    """``(job, slot)`` of a slot job's comment, None for any other comment.

    Every job of the queue is asked, several times a tick, so answers are memoised; only
    for comments short enough to be a tag, since the others are any user's ``--comment``
    of any length (4,096 jobs of 1 MB each would otherwise stay in the memo).
    """
    text = comment.strip()
    return None if len(text) > _MAX_TAG_CHARS else _parse_short_tag(text)


@functools.lru_cache(maxsize=16384)
def _parse_short_tag(text: str) -> tuple[str, int] | None:
    m = _TAG_RE.match(text)
    return (m.group(1), int(m.group(2))) if m else None


def member_id(slot: int, restart_count: int) -> str:
    """One member per *incarnation* of a slot: a requeued slot is a new member.

    The slot script computes it from ``SLURM_RESTART_COUNT``, so a stale registration of a
    killed incarnation can never be mistaken for the new one.
    """
    return f"s{slot}-r{restart_count}"


@functools.lru_cache(maxsize=8192)  # every registration and departure, several times a tick
def parse_member(member: str) -> tuple[int, int] | None:
    m = _MEMBER_RE.match(member)
    return (int(m.group(1)), int(m.group(2))) if m else None


def slot_job_name(job_id: str, slot: int) -> str:
    return f"mt.{job_id}.s{slot}"[:128]


#: The per-task bootstrap of ``launcher=srun`` (argv: K, script, args...): torchrun's
#: LOCAL_RANK/LOCAL_WORLD_SIZE from Slurm's task ids, then the script as ``__main__``.
_SRUN_TASK = (
    "import os, runpy, sys; "
    "os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0'); "
    "os.environ['LOCAL_WORLD_SIZE'] = sys.argv[1]; "
    "sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


#: ``launcher=torchrun``: torchrun's own ``main`` (the same agent, arguments and worker
#: handling as ``python -m torch.distributed.run``), then ``os._exit`` instead of a normal
#: interpreter exit. Measured in the e2e benchmark (benchmarks/yield_trace.py): after
#: Slurm's SIGTERM the workers had left in 0.05 s, but the agent's exit (SignalException
#: traceback, then finalizing an interpreter that has imported torch: 1.4-2.6 s on the
#: shared 2-core machine) held the slot, and so the node, for 2.3-2.4 s more. The agent has
#: already shut its workers down when ``main`` returns or raises, so nothing is cut short.
_TORCHRUN_AGENT = """\
import os, sys
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main
try:
    main(sys.argv[1:])
    rc = 0
except SignalException as exc:  # SIGTERM (preemption): workers already stopped
    print(f"torchrun: {exc}", file=sys.stderr)
    rc = 128 + int(exc.sigval)
except SystemExit as exc:
    rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
except BaseException:  # ChildFailedError etc.: torchrun has reported it; keep the trace
    import traceback
    traceback.print_exc()
    rc = 1
sys.stdout.flush()
sys.stderr.flush()
os._exit(rc)
"""


def node_command(spec: JobSpec) -> list[str]:
    """The argument list a node slot runs (under ``srun``, so Slurm's SIGTERM reaches it)."""
    if spec.mode == "restart":
        # the node agent runs the user's script itself (malletrain.elastic.restart)
        agent = [spec.python, "-m", "malletrain.elastic.restart.agent",
                 f"--workers={spec.nproc_per_node}", f"--stop-signal={spec.stop_signal}",
                 f"--stop-grace-s={spec.stop_grace_s}",
                 *(["--stop-shell-only"] if spec.stop_shell_only else []),
                 *([f"--tasks-per-node={spec.tasks_per_node}"] if spec.tasks_per_node
                   else []),
                 f"--job-name={spec.name}", f"--submit-dir={spec.chdir}",
                 *([f"--batch-output={spec.output}"] if spec.output else []),
                 *([f"--batch-error={spec.error}"] if spec.error else [])]
        return ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", *agent]
    if spec.launcher == "srun":
        # srun starts the K workers itself; each maps its SLURM_LOCALID to LOCAL_RANK
        task = [spec.python, "-c", _SRUN_TASK, str(spec.nproc_per_node), spec.script,
                *spec.args]
        return ["srun", "--nodes=1", f"--ntasks={spec.nproc_per_node}",
                "--kill-on-bad-exit=1", *task]
    # the agent's rendezvous goes through the job's coordinator, not a store of its own
    torchrun = [spec.python, "-c", _TORCHRUN_AGENT, "--rdzv-backend=malletrain", "--nnodes=1",
                f"--nproc-per-node={spec.nproc_per_node}", spec.script, *spec.args]
    return ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", *torchrun]


def render_launcher(spec: JobSpec, job_id: str, slot: int, coordinator: str,
                    state_dir: str, secret: str, script_text: str | None = None) -> str:
    """The slot's batch script: a few lines of Python that ``exec`` an argument list.

    Python, not bash, so that no user argument is ever parsed by a shell: the command is
    embedded as a JSON list (a valid Python literal) and run with ``os.execvp``. The payload
    runs under ``srun`` so that Slurm's preemption SIGTERM reaches it at once (the batch
    shell alone is only signalled at kill time, docs/slurm-backend.md). The job's secret
    rides in the script (sent on sbatch's stdin, kept by Slurm readable only by the user and
    its operators; on the node, the user's 0500 script file), never on a command line.
    A restart-mode slot also carries the user's batch script, as submitted (``sbatch``
    keeps a copy too: editing the file later does not change a submitted job).
    """
    srun = node_command(spec)
    env = {
        "MALLETRAIN_COORDINATOR": coordinator,
        "MALLETRAIN_JOB_ID": job_id,
        "MALLETRAIN_STATE_DIR": state_dir,
    }
    env.update(spec.environment)
    if spec.array is not None and spec.array_task_id is not None:  # a task of a job array
        array_job = spec.array_job_id or job_number(job_id)
        env.update(parse_array(spec.array).env(spec.array_task_id, array_job))
    if spec.mode == "restart":
        if script_text is None:
            raise ValueError("a restart-mode slot needs the batch script's text")
        env[SCRIPT_ENV] = script_text
    env["MALLETRAIN_JOB_SECRET"] = secret  # last: a user's --export cannot replace it
    return "\n".join([
        f"#!{spec.python}",
        f"# malletrain node slot {slot} of job {job_id}: rendered by `malletrain submit`.",
        "# The daemon places it on a node (NodeList, TimeLimit) and releases it; the payload",
        "# runs as the submitting user under srun, so Slurm's SIGTERM reaches it.",
        "import os",
        f"os.environ.update({json.dumps(env, sort_keys=True)})",
        'restarts = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"',
        f'os.environ["MALLETRAIN_MEMBER_ID"] = "s{slot}-r" + restarts',
        f"argv = {json.dumps(srun)}",
        "os.execvp(argv[0], argv)",
        "",
    ])


def render_slot(
    spec: JobSpec,
    job_id: str,
    slot: int,
    *,
    coordinator: str,
    secret: str,
    state_dir: str,
    partition: str,
    qos: str | None = None,
    account: str | None = None,
    script_text: str | None = None,
) -> SbatchSpec:
    """The held single-node scavenger job of one slot (the user's ``sbatch``)."""
    return SbatchSpec(
        script=render_launcher(spec, job_id, slot, coordinator, state_dir, secret,
                               script_text),
        job_name=slot_job_name(job_id, slot),
        partition=partition,
        nodes=1,
        output=spec.output,
        error=spec.error,
        chdir=spec.chdir,
        comment=slot_tag(job_id, slot),
        account=spec.account or account,
        qos=qos,
        requeue=True,
        hold=True,
        exclusive=True,
        export=spec.export,
        # a requeued slot keeps its Slurm job id, so %j names the same file: append, or
        # every placement would truncate what the earlier ones (and their errors) wrote
        extra_args=("--open-mode=append", *slot_extra_args(spec)),
    )


def slot_extra_args(spec: JobSpec) -> tuple[str, ...]:
    """What every node slot carries beyond the pool's own options: the GPUs (with their
    type) and the user's per-node options (memory, CPUs, constraints, ``--gres``).

    Restart mode: the script's tasks per node too, so that the slot holds what the
    script's ``srun`` steps start on its node (``--ntasks-per-node=4 -c 10``: 40 CPUs), and
    Slurm refuses at submission, as sbatch would the script, what no node can hold; without
    it a step's ``srun`` fails on the node: "More processors requested than permitted"."""
    gpus: tuple[str, ...] = ()
    has_gres = any(o.startswith("--gres=") for o in spec.slot_options)
    if spec.gpus_per_node and not has_gres:
        kind = f"{spec.gpu_type}:" if spec.gpu_type else ""
        gpus = (f"--gpus-per-node={kind}{spec.gpus_per_node}",)
    tasks: tuple[str, ...] = ()
    if spec.mode == "restart" and spec.tasks_per_node and spec.tasks_per_node > 1:
        tasks = (f"--ntasks-per-node={spec.tasks_per_node}",)
    return gpus + tasks + tuple(spec.slot_options)


class SlotStatus(StrEnum):
    """What a slot's Slurm job is doing, from the daemon's point of view."""

    PARKED = "parked"  # pending and held: in the pool
    PLACING = "placing"  # pending, released: waiting for Slurm to start it
    RUNNING = "running"  # has a node
    ENDING = "ending"  # completing: the node is not free yet
    ENDED = "ended"  # finished (completed, preempted, timeout, failed...): requeue it
    CANCELLED = "cancelled"  # cancelled by its owner or an admin: never resurrected
    GONE = "gone"  # Slurm does not know it any more


_HELD_MARKERS = ("held", "requeued in held", "requeued_in_held")


def is_held(job: Job) -> bool:
    return _held_reason(job.state_reason)


@functools.lru_cache(maxsize=256)
def _held_reason(reason: str) -> bool:
    """Whether a pending reason says "held" (a few distinct texts, every slot every tick)."""
    lowered = reason.lower()
    return any(m in lowered for m in _HELD_MARKERS)


def classify(job: Job | None) -> SlotStatus:
    if job is None:
        return SlotStatus.GONE
    s = job.state
    if s is JobState.PENDING or s is JobState.REQUEUED:
        return SlotStatus.PARKED if is_held(job) else SlotStatus.PLACING
    if s in (JobState.RUNNING, JobState.CONFIGURING, JobState.SUSPENDED):
        return SlotStatus.RUNNING
    if s is JobState.COMPLETING:
        return SlotStatus.ENDING
    if s is JobState.CANCELLED:
        return SlotStatus.CANCELLED
    if s is JobState.UNKNOWN:
        return SlotStatus.ENDING  # do nothing rash on a state we cannot read
    return SlotStatus.ENDED


@dataclass(frozen=True)
class SlotView:
    """One slot as seen this tick: store record + Slurm job."""

    job_id: str
    slot: int
    slurm_job_id: int
    status: SlotStatus
    node: str | None
    time_limit_s: int | None = None
    start_time: float | None = None
    end_time: float | None = None
