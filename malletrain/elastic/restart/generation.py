"""One generation of a restart-mode job as its batch shell and its steps see it. Pure.

A generation is the job at one size: its nodes in rank order, each a node slot (the user's
own single-node Slurm job) with its node agent. The first node's agent runs the batch script
once, in the environment :func:`batch_env` builds (what ``sbatch`` gives a batch shell of
an allocation of these nodes); ``srun`` in that shell (:mod:`.srun`) reads the generation
from ``MALLETRAIN_GENERATION`` (:meth:`GenerationView.to_json`) to place each step's share
of tasks in the node slots.

``SLURM_JOB_ID`` is the malleable job's number (``m12`` -> ``12``): stable across sizes, as
scripts that compute ports or paths from it expect; each slot's own Slurm job id is an
implementation detail of the generation, used by :mod:`.srun` only.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from malletrain.elastic.restart.script import SCRIPT_ENV

#: the environment variable the batch shell (and every step's tasks) carry the view in
GENERATION_ENV = "MALLETRAIN_GENERATION"


@dataclass(frozen=True)
class GenNode:
    """One node of the generation."""

    name: str  # Slurm's node name (SLURMD_NODENAME): what -w and the nodelists use
    host: str  # the host name its agent registered (resolvable: rendezvous addresses)
    slot_job: int  # the node slot's Slurm job id (steps run in it with --overlap)
    run_dir: str  # the node agent's private directory (its task registry)


@dataclass(frozen=True)
class GenerationView:
    """What the batch shell and its steps need to know about the generation."""

    job_id: str  # malletrain's id (m12)
    epoch: int
    nodes: tuple[GenNode, ...]
    name: str  # the job's name (SLURM_JOB_NAME)
    #: sbatch's --ntasks-per-node (or -n over a fixed size); None: one task per node
    tasks_per_node: int | None
    python: str  # the interpreter of malletrain's own helpers on the nodes
    real_srun: str  # Slurm's srun (the shim on PATH hands each node's share to it)

    @property
    def job_number(self) -> int:
        return job_number(self.job_id)

    @property
    def nodelist(self) -> str:
        return ",".join(n.name for n in self.nodes)

    def node(self, name: str) -> GenNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> GenerationView:
        d = json.loads(text)
        return cls(job_id=str(d["job_id"]), epoch=int(d["epoch"]),
                   nodes=tuple(GenNode(str(n["name"]), str(n["host"]), int(n["slot_job"]),
                                       str(n["run_dir"])) for n in d["nodes"]),
                   name=str(d["name"]), tasks_per_node=(None if d["tasks_per_node"] is None
                                                        else int(d["tasks_per_node"])),
                   python=str(d["python"]), real_srun=str(d["real_srun"]))


def job_number(job_id: str) -> int:
    """``m12`` -> 12; another id -> a stable number from its checksum."""
    m = re.fullmatch(r"[A-Za-z]*(\d{1,9})", job_id)
    return int(m.group(1)) if m else zlib.crc32(job_id.encode()) % 10_000_000


def step_port(job_id: str, epoch: int, step: int) -> int:
    """The rendezvous port of a launcher step (torchrun's store): one per step, so a step
    never waits for the socket of the last generation's."""
    return 20000 + zlib.crc32(f"{job_id}:{epoch}:{step}".encode()) % 10000


def tasks_per_node_text(counts: list[int]) -> str:
    """Slurm's compressed form of tasks per node: ``[2, 2, 1]`` -> ``2(x2),1``."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)


def batch_env(view: GenerationView, slot_env: Mapping[str, str], submit_dir: str
              ) -> dict[str, str]:
    """The ``SLURM_*`` variables of the batch shell: those of an allocation of the
    generation's nodes. ``slot_env`` is the first node slot's own environment (its
    partition, account, cluster, CPUs and GPUs on the node are the allocation's too)."""
    n = len(view.nodes)
    per = view.tasks_per_node or 1
    env = {
        "SLURM_JOB_ID": str(view.job_number), "SLURM_JOBID": str(view.job_number),
        "SLURM_JOB_NAME": view.name,
        "SLURM_JOB_NODELIST": view.nodelist, "SLURM_NODELIST": view.nodelist,
        "SLURM_NNODES": str(n), "SLURM_JOB_NUM_NODES": str(n),
        "SLURM_NTASKS": str(n * per), "SLURM_NPROCS": str(n * per),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text([per] * n),
        "SLURM_SUBMIT_DIR": submit_dir, "SLURM_SUBMIT_HOST": slot_env.get(
            "SLURM_SUBMIT_HOST", ""),
        "SLURMD_NODENAME": view.nodes[0].name, "SLURM_TOPOLOGY_ADDR": view.nodes[0].name,
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_RESTART_COUNT": str(view.epoch),
        "MALLETRAIN_EPOCH": str(view.epoch),
    }
    if view.tasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(view.tasks_per_node)
    for key in ("SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_CLUSTER_NAME",
                "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_CPUS_PER_TASK",
                "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS",
                "SLURM_JOB_QOS", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_GID",
                "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_JOB_END_TIME",
                "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        if key in slot_env:
            env[key] = slot_env[key]
    if "SLURM_JOB_CPUS_PER_NODE" in slot_env:  # 64 on the slot's node -> 64(x4) on four
        head = slot_env["SLURM_JOB_CPUS_PER_NODE"].split("(")[0]
        if head.isdigit():
            env["SLURM_JOB_CPUS_PER_NODE"] = tasks_per_node_text([int(head)] * n)
    return env


#: The slot's own step variables: they describe the agent's step of the node slot, not
#: anything of the malleable job, and would mislead a batch script or Slurm's srun.
SLOT_ONLY = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
             "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_LAUNCHER_PORT",
             "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_LAUNCH_NODE_IPADDR",
             "SLURM_STEP_GPUS", "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SLURM_CPU_BIND_LIST",
             "SLURM_CPU_BIND_TYPE", "SLURM_CPU_BIND_VERBOSE", "SLURM_KILL_BAD_EXIT",
             "SLURM_UMASK", "SLURM_PTY_PORT", "SLURM_PTY_WIN_COL", "SLURM_PTY_WIN_ROW",
             "SLURM_TASK_PID", "SLURM_GTIDS", "SLURM_LABELIO", "SLURM_NODE_ALIASES")


def shell_env(view: GenerationView, slot_env: Mapping[str, str], submit_dir: str,
              run_dir: Path, shim_dir: Path) -> dict[str, str]:
    """The batch shell's whole environment: the slot's, less what only the slot (or the
    agent) needs, with the allocation's ``SLURM_*`` (:func:`batch_env`) and the ``srun``
    of ``shim_dir`` first on PATH."""
    env = {k: v for k, v in slot_env.items() if k not in SLOT_ONLY}
    for key in ("MALLETRAIN_JOB_SECRET", SCRIPT_ENV):
        env.pop(key, None)  # the user's processes need neither
    env.update(batch_env(view, slot_env, submit_dir))
    env.update({
        GENERATION_ENV: view.to_json(),
        "PATH": f"{shim_dir}:{slot_env.get('PATH', '/usr/bin:/bin')}",
        "MALLETRAIN_PYTHON": view.python,
        "MALLETRAIN_SHIM_DIR": str(shim_dir),
        "MALLETRAIN_PROGRESS_FILE": str(run_dir / "progress"),
        "MALLETRAIN_RUN_DIR": str(run_dir),  # private: the generation's own files
    })
    return env
