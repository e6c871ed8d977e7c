"""The launch line at a given size: one pure rewrite per launcher, golden-tested.

The user's launch line names its size for the allocation it was written for (``--nnodes 4``,
``--rdzv_endpoint $head:29500``, ``--num_processes 16``). In restart mode the size is
malletrain's: each generation of the job runs on ``nnodes`` slots, this node being
``node_rank``, the group's store on ``master_addr:master_port``. So the options that say
*where and how many* are replaced and every other option and argument is kept as written.
``srun`` in front is dropped: the node slot already is the node's Slurm step, and a nested
step would ask Slurm for nodes the slot does not have.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from malletrain.elastic.restart.shellwords import prefix_command, shell_string
from malletrain.errors import PermanentError

#: what a node's copy of the launch line runs first: this package's launcher, which gets the
#: line's evaluated argument list (the shell's expansion, never a string of ours)
LAUNCH_PREFIX = '"$MALLETRAIN_PYTHON" -m malletrain.elastic.restart.launch '


class LaunchError(PermanentError):
    """A launch line malletrain cannot run at a changing size."""


@dataclass(frozen=True)
class Generation:
    """Where one generation of a restart-mode job runs, as seen from one node."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nodes: tuple[str, ...]
    #: worker processes per node when the line does not say (the job's GPUs or ``--ntasks``)
    workers_per_node: int = 1
    #: the node agent's private directory (0700), where a launch's own files go
    run_dir: str = ""


@dataclass(frozen=True)
class Launch:
    """What a node runs: one command (``exec``), or one process per task (``srun python``)."""

    kind: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    #: ``srun python``: the tasks of this node, each an environment on top of ``env``
    tasks: tuple[dict[str, str], ...] = ()
    #: ``srun --gpus-per-task`` / ``--gpu-bind``: each task gets its own share of the GPUs
    bind_gpus: bool = False
    #: (path, text) written before the command runs (deepspeed's hostfile)
    files: tuple[tuple[str, str], ...] = ()


# ------------------------------------------------------------------------------------ srun

#: srun options that take no value, or an optional one (getopt's optional argument: a value
#: only as ``--opt=value``, never the next word: ``srun --propagate python t.py``).
_SRUN_FLAGS = frozenset({
    "--propagate", "--nice", "--resv-ports", "--x11", "--send-libs", "--oom-kill-step",
    "--external-launcher", "--quit-on-interrupt",
    # pyxis's flags (a SPANK plugin's srun options)
    "--container-mount-home", "--no-container-mount-home", "--container-remap-root",
    "--no-container-remap-root", "--container-writable", "--container-readonly",
    "--container-entrypoint", "--no-container-entrypoint",
    "--exclusive", "--overlap", "--kill-on-bad-exit", "-K", "--label", "-l", "--unbuffered",
    "-u", "--quiet", "-Q", "--verbose", "-v", "--exact", "--overcommit", "-O", "--no-allocate",
    "-Z", "--pty", "--disable-status", "-X", "--preserve-env", "-E", "--oversubscribe", "-s",
    "--multi-prog", "--spread-job", "--use-min-nodes", "--whole", "--contiguous", "--hold",
    "-H", "--immediate", "-I", "--no-kill", "-k", "--test-only", "--mpi=none", "--reboot",
})


#: a whole word that is one variable the static reading could not expand (``$SRUN_ARGS``)
_UNEXPANDED = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)$")


def split_srun(tokens: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``srun [opts] cmd...`` -> ({option: value}, cmd...). Tokens not starting with srun
    come back unchanged with no options."""
    if not tokens or tokens[0].rsplit("/", 1)[-1] != "srun":
        return {}, list(tokens)
    opts: dict[str, str] = {}
    i = 1
    while i < len(tokens) and (tokens[i].startswith("-") or _UNEXPANDED.match(tokens[i])):
        tok = tokens[i]
        if not tok.startswith("-"):  # ``srun $SRUN_ARGS cmd`` read before the shell runs
            i += 1
            continue
        if tok == "--":
            i += 1
            break
        name, eq, value = tok.partition("=")
        if eq or tok in _SRUN_FLAGS or name in _SRUN_FLAGS:
            opts[name] = value
            i += 1
        elif not tok.startswith("--") and len(tok) > 2:  # -N4: short option with its value
            opts[tok[:2]] = tok[2:]
            i += 1
        else:
            opts[name] = tokens[i + 1] if i + 1 < len(tokens) else ""
            i += 2
    return opts, list(tokens[i:])


def program_name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


def _is_python(word: str) -> bool:
    return bool(_PYTHON_RE.match(program_name(word)))


def _python_module(cmd: Sequence[str]) -> str | None:
    """``python [-u|-O|-B...] -m MODULE``: MODULE (interpreter flags without a value)."""
    for i, word in enumerate(cmd[1:], start=1):
        if word == "-m":
            return cmd[i + 1] if i + 1 < len(cmd) else None
        if not re.match(r"^-[uOBsSEIq]+$", word):
            return None
    return None


def _head_len(cmd: Sequence[str]) -> int:
    """Words of ``python [flags] -m MODULE`` (or of a launcher named by itself: 1)."""
    if _is_python(cmd[0]) and _python_module(cmd):
        return cmd.index("-m") + 2
    return 1


#: programs that run a command given after their own words: the launcher is behind them
WRAPPERS = frozenset({
    "numactl", "taskset", "nice", "ionice", "chrt", "env", "stdbuf", "nsys", "ncu",
    "singularity", "apptainer", "shifter", "podman-hpc", "enroot", "ch-run", "conda",
    "micromamba", "uv", "pixi", "with-proxy", "time", "nohup", "xargs",
})


#: a site's own container or environment wrapper: CSC's ``apptainer_wrapper exec``,
#: ``singularity_wrapper exec``, a ``run-in-container.sh``-like ``*-wrapper``
_WRAPPER_NAME = re.compile(r"^(?:apptainer|singularity)[\w.-]*$|^[\w.-]+[_-]wrapper(?:\.sh)?$")


def is_wrapper(word: str) -> bool:
    """Whether a program runs the command given after its own words (:data:`WRAPPERS`)."""
    name = program_name(word)
    return name in WRAPPERS or bool(_WRAPPER_NAME.match(name))


def behind_wrappers(cmd: Sequence[str]) -> int:
    """Where the program starts in ``cmd``: after wrappers (``numactl --membind=0-3 nsys
    profile -s none python3 ...``: at ``python3``) when a launcher or Python follows them;
    0 when ``cmd`` starts with no wrapper or none follows."""
    if not cmd or not is_wrapper(cmd[0]):
        return 0
    for at in range(1, len(cmd)):
        name = program_name(cmd[at])
        if name in ("torchrun", "torchrun_jsc", "deepspeed") or _is_python(cmd[at]) or (
                name == "accelerate" and cmd[at + 1:at + 2] == ["launch"]):
            return at
    return 0


def launcher_kind(cmd: Sequence[str], under_srun: bool) -> str | None:
    """Which launcher a command (srun already split off) is, or None if it is none; a
    launcher behind wrappers (:func:`behind_wrappers`) counts."""
    cmd = list(cmd[behind_wrappers(cmd):])
    if not cmd:
        return None
    first = program_name(cmd[0])
    if first in ("torchrun", "torchrun_jsc"):  # JSC's torchrun, its options the same
        return "torchrun"
    if first == "accelerate" and len(cmd) > 1 and cmd[1] == "launch":
        return "accelerate"
    if first == "deepspeed":
        return "deepspeed"
    if _is_python(cmd[0]):
        module = _python_module(cmd)
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            return "torchrun"
        if module == "accelerate.commands.launch":
            return "accelerate"
        if under_srun and "-c" not in cmd[1:2]:  # ``srun python -c "import torch"``: a check
            return "srun-python"
    return None


# ----------------------------------------------------------------------------- option lists


def _drop(args: Sequence[str], flags: frozenset[str], drop: frozenset[str]
          ) -> tuple[list[str], list[str], dict[str, str]]:
    """Split ``[options] program args`` -> (kept options, program+args, dropped values).

    Options are matched with ``-`` and ``_`` alike (``--nproc-per-node``/``--nproc_per_node``).
    """
    kept: list[str] = []
    dropped: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        name, eq, value = args[i].partition("=")
        norm = name.replace("_", "-")
        takes_value = not eq and norm not in flags
        if takes_value:
            value = args[i + 1] if i + 1 < len(args) else ""
        if norm in drop:
            dropped[norm] = value
        else:
            kept += args[i:i + 2] if takes_value else [args[i]]
        i += 2 if takes_value else 1
    if i < len(args) and args[i] == "--":
        i += 1
    return kept, list(args[i:]), dropped


_TORCHRUN_FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--run-path",
                             "--virtual-local-rank"})
_TORCHRUN_SIZE = frozenset({"--nnodes", "--node-rank", "--master-addr", "--master-port",
                            "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
                            "--standalone", "--max-restarts", "--local-addr",
                            "--nproc-per-node"})


def _torchrun(cmd: list[str], g: Generation) -> tuple[str, ...]:
    head = cmd[:_head_len(cmd)]
    kept, program, dropped = _drop(cmd[len(head):], _TORCHRUN_FLAGS, _TORCHRUN_SIZE)
    if not program:
        raise LaunchError("torchrun: no training script on the launch line")
    nproc = dropped.get("--nproc-per-node") or str(g.workers_per_node)
    return (*head, f"--nnodes={g.nnodes}", f"--node-rank={g.node_rank}",
            f"--nproc-per-node={nproc}", f"--master-addr={g.master_addr}",
            f"--master-port={g.master_port}", "--rdzv-backend=static", "--max-restarts=0",
            *kept, *program)


_ACCELERATE_FLAGS = frozenset({
    "--multi-gpu", "--cpu", "--use-cpu", "--use-deepspeed", "--use-fsdp", "--use-megatron-lm",
    "--same-network", "--tpu", "-m", "--module", "--no-python", "--debug", "-q", "--quiet",
    "--dynamo-use-fullgraph", "--dynamo-use-dynamic", "--enable-cpu-affinity", "--tpu-use-cluster",
    "--tpu-use-sudo", "--use-xpu", "--ipex", "--downcast-bf16", "--fsdp-use-orig-params",
})
_ACCELERATE_SIZE = frozenset({"--num-machines", "--machine-rank", "--main-process-ip",
                              "--main-process-port", "--num-processes", "--rdzv-backend",
                              "--same-network", "--rdzv-conf"})


def _accelerate(cmd: list[str], g: Generation) -> tuple[str, ...]:
    head = cmd[:_head_len(cmd)] if _is_python(cmd[0]) else cmd[:2]  # ``accelerate launch``
    kept, program, _ = _drop(cmd[len(head):], _ACCELERATE_FLAGS, _ACCELERATE_SIZE)
    if not program:
        raise LaunchError("accelerate launch: no training script on the launch line")
    return (*head, "--num_machines", str(g.nnodes), "--machine_rank", str(g.node_rank),
            "--num_processes", str(g.nnodes * g.workers_per_node), "--main_process_ip",
            g.master_addr, "--main_process_port", str(g.master_port), "--rdzv_backend",
            "static", "--same_network", *kept, *program)


_DEEPSPEED_FLAGS = frozenset({"--no-ssh", "--no-local-rank", "--force-multi", "--module",
                              "--no-python", "--elastic-training", "--bind-cores-to-rank",
                              "--save-pid", "--enable-each-rank-log-x"})
_DEEPSPEED_SIZE = frozenset({"--num-nodes", "--num-gpus", "--node-rank", "--master-addr",
                             "--master-port", "--hostfile", "-H", "--include", "-i",
                             "--exclude", "-e", "--launcher", "--launcher-args", "--no-ssh",
                             "--force-multi", "--ssh-port"})


def _deepspeed(cmd: list[str], g: Generation, env: dict[str, str]) -> Launch:
    """deepspeed's own runner, one node at a time (``--no_ssh``). It still reads the job's
    hosts from a hostfile (without one, more than one node is refused: "no extra nodes
    available via hostfile", deepspeed 0.18), so the generation's nodes are written to one in
    the agent's private directory."""
    kept, program, _ = _drop(cmd[1:], _DEEPSPEED_FLAGS, _DEEPSPEED_SIZE)
    if not program:
        raise LaunchError("deepspeed: no training script on the launch line")
    if not g.run_dir:
        raise LaunchError("deepspeed: no private directory for its hostfile (not started by "
                          "a malletrain node agent)")
    hostfile = f"{g.run_dir}/deepspeed-hostfile"
    hosts = "".join(f"{node} slots={g.workers_per_node}\n" for node in g.nodes)
    argv = (cmd[0], "--hostfile", hostfile, "--no_ssh", "--num_nodes", str(g.nnodes),
            "--node_rank", str(g.node_rank), "--num_gpus", str(g.workers_per_node),
            "--master_addr", g.master_addr, "--master_port", str(g.master_port), *kept,
            *program)
    return Launch("deepspeed", argv, env, files=((hostfile, hosts),))


def slurm_env(g: Generation, tasks_per_node: int) -> dict[str, str]:
    """The ``SLURM_*`` and ``MASTER_*`` variables a generation's processes see: the job's
    current size, not the single-node slot's."""
    nodelist = ",".join(g.nodes)
    total = g.nnodes * tasks_per_node
    return {
        "MASTER_ADDR": g.master_addr, "MASTER_PORT": str(g.master_port),
        "SLURM_NNODES": str(g.nnodes), "SLURM_JOB_NUM_NODES": str(g.nnodes),
        "SLURM_STEP_NUM_NODES": str(g.nnodes), "SLURM_NODEID": str(g.node_rank),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist, "SLURM_NTASKS": str(total),
        "SLURM_NPROCS": str(total), "SLURM_STEP_NUM_TASKS": str(total),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{g.nnodes})",
    }


def _srun_python(cmd: list[str], srun: dict[str, str], g: Generation) -> Launch:
    per_node = srun.get("--ntasks-per-node")
    total = srun.get("--ntasks") or srun.get("-n")
    if per_node and per_node.isdigit():
        k = int(per_node)
    elif total and total.isdigit() and not per_node:
        k = g.workers_per_node  # a whole-job count: per node from the job's spec
    else:
        k = g.workers_per_node
    env = slurm_env(g, k)
    tasks = []
    for local in range(k):
        rank = g.node_rank * k + local
        tasks.append({"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE":
                      str(g.nnodes * k), "LOCAL_WORLD_SIZE": str(k), "GROUP_RANK":
                      str(g.node_rank), "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local)})
    bind = bool(srun.get("--gpus-per-task") or srun.get("--gpu-bind"))
    return Launch("srun-python", tuple(cmd), env, tuple(tasks), bind_gpus=bind)


def plan_launch(argv: Sequence[str], g: Generation) -> Launch:
    """The launch line's evaluated argument list -> what this node runs in generation g."""
    srun, cmd = split_srun(argv)
    under_srun = bool(argv) and program_name(argv[0]) == "srun"
    at = shell_string(cmd)
    if at is not None:
        # ``bash -c "$LAUNCHER --node_rank \$SLURM_PROCID ..."``: bash runs the string as
        # written (its quotes, $(...)), its command prefixed like the script's launch line,
        # with this node's SLURM_PROCID; the launcher it reaches is planned in that process
        env = {**slurm_env(g, 1), "SLURM_PROCID": str(g.node_rank), "SLURM_LOCALID": "0"}
        string = prefix_command(cmd[at], LAUNCH_PREFIX)
        return Launch("shell", (*cmd[:at], string, *cmd[at + 1:]), env)
    kind = launcher_kind(cmd, under_srun)
    if kind == "srun-python":
        return _srun_python(cmd, srun, g)
    env = slurm_env(g, 1)
    head, cmd = cmd[:behind_wrappers(cmd)], cmd[behind_wrappers(cmd):]  # numactl ... torchrun
    if kind == "torchrun":
        return Launch(kind, (*head, *_torchrun(cmd, g)), env)
    if kind == "accelerate":
        return Launch(kind, (*head, *_accelerate(cmd, g)), env)
    if kind == "deepspeed":
        launch = _deepspeed(cmd, g, env)
        return replace(launch, argv=(*head, *launch.argv))
    raise LaunchError(f"not a launch line malletrain can run: {' '.join(argv)[:200]!r}")
