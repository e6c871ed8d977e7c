"""A malleable job as the user asked for it (:class:`JobSpec`), validated field by field.

Everything here is pure. The daemon validates a spec again with :meth:`JobSpec.from_dict`
(it never trusts what a client computed); property tests throw arbitrary input at both.
The ``#SBATCH`` reading that builds a spec is :mod:`malletrain.daemon.jobs.directives`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from malletrain.daemon.jobs.dependency import DependencyError, parse_dependency
from malletrain.daemon.jobs.sbatch_options import SLOT_OPTIONS, SLOT_VALUE_RE, SPANK_FLAGS
from malletrain.elastic.restart.arrays import ArrayError, parse_array
from malletrain.errors import PermanentError

_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
#: ``@`` included: centres name accounts per partition that way (IDRIS: ``six@v100``)
_ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_.+@-]{1,64}$")
#: sbatch takes a nice value up to this (``NICE_OFFSET - 3``, src/common/slurm_protocol_defs.h)
MAX_NICE = 2147483645
_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME_RE = re.compile(
    r"^(?:(?P<d>\d{1,4})-(?P<dh>\d{1,2})(?::(?P<dm>\d{1,2})(?::(?P<ds>\d{1,2}))?)?"
    r"|(?P<a>\d{1,7})(?::(?P<b>\d{1,2})(?::(?P<c>\d{1,2}))?)?)$"
)
MAX_NODES_LIMIT = 100_000
MAX_ARGS = 256
MAX_ARG_BYTES = 4096
MAX_PATH_BYTES = 4096
MAX_SCRIPT_BYTES = 1 << 20
LAUNCHERS = ("torchrun", "srun")
#: how a job changes size: in process (``ElasticJob``) or by restarting an unmodified script
MODES = ("native", "restart")
#: signals a restart-mode job may ask for before it is stopped (``--signal=B:USR1@60``)
STOP_SIGNALS = ("TERM", "INT", "USR1", "USR2", "HUP", "QUIT", "ALRM")
MAX_STOP_GRACE_S = 3600
#: samples/s; beyond any real job's rate (NaN and infinity fail the range check too)
MAX_RATE_TARGET = 1e12
MAX_EXCLUDED_NODES = 4096


class SpecError(PermanentError):
    """An invalid job specification; the message names where and what."""


def parse_time_s(text: str, where: str = "--time") -> int:
    """Slurm's ``--time`` formats -> seconds (``"30"`` = 30 minutes, like sbatch; Slurm
    keeps whole minutes, so ``00:19:59`` is 20 minutes)."""
    m = _TIME_RE.match(text.strip())
    if not m:
        raise SpecError(
            f"{where}: {text!r} is not a time (use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM "
            "or D-HH:MM:SS)"
        )
    if m.group("d") is not None:
        seconds = (int(m.group("d")) * 86400 + int(m.group("dh")) * 3600
                   + int(m.group("dm") or 0) * 60 + int(m.group("ds") or 0))
    elif m.group("c") is not None:
        seconds = int(m.group("a")) * 3600 + int(m.group("b")) * 60 + int(m.group("c"))
    elif m.group("b") is not None:
        seconds = int(m.group("a")) * 60 + int(m.group("b"))
    else:
        seconds = int(m.group("a")) * 60
    if seconds <= 0:
        raise SpecError(f"{where}: {text!r} must be longer than zero")
    return -(-seconds // 60) * 60  # whole minutes, rounded up, as Slurm keeps a time limit


#: a node count's suffixes, as Slurm reads them (``2k``: 2048 nodes)
_NODE_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}


def _node_count(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)([kKmM]?)", text)
    return int(m.group(1)) * _NODE_SUFFIX[m.group(2).lower()] if m else None


def parse_nodes(text: str, where: str = "--nodes") -> tuple[int, int]:
    """``"4"`` -> (4, 4); ``"2-8"`` -> (2, 8), like sbatch's ``--nodes=min[-max]`` (a count
    may end in ``k`` or ``m``, times 1024 or 1024*1024, as Slurm reads it)."""
    lo, sep, hi = text.strip().partition("-")
    a = 1 if sep and not lo else _node_count(lo)  # "-4": Slurm's minimum is then 1
    b = _node_count(hi) if sep else a
    if a is None or b is None:
        raise SpecError(f"{where}: {text!r} is not a node count like 4 or 2-8")
    if a < 1 or b < a or b > MAX_NODES_LIMIT:
        raise SpecError(f"{where}: {text!r} must be 1 <= min <= max <= {MAX_NODES_LIMIT}")
    return a, b


def positive_int(text: str, where: str, limit: int = 4096) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= limit:
        raise SpecError(f"{where}: {text!r} must be an integer from 1 to {limit}")
    return int(text)


def _line(text: str, where: str) -> str:
    if not text or "\n" in text or "\r" in text or "\0" in text:
        raise SpecError(f"{where}: must be one non-empty line")
    if len(text.encode()) > MAX_PATH_BYTES:
        raise SpecError(f"{where}: longer than {MAX_PATH_BYTES} bytes")
    return text


def _name(text: str, where: str) -> str:
    if not _NAME_RE.match(text):
        raise SpecError(f"{where}: {text!r} must be 1-64 characters from [A-Za-z0-9_.+-]")
    return text


def parse_export(text: str, where: str = "--export") -> tuple[str, dict[str, str]]:
    """``ALL``/``NONE``/``NIL`` or ``[ALL,]VAR[=value],...`` -> (mode, variables)."""
    text = text.strip()
    if text in ("ALL", "NONE", "NIL"):
        return ("NONE" if text == "NIL" else text), {}
    mode = "ALL"
    env: dict[str, str] = {}
    for part in text.split(","):
        if part in ("ALL", ""):
            continue
        if part in ("NONE", "NIL"):
            mode = "NONE"
            continue
        key, sep, value = part.partition("=")
        if not _ENV_KEY_RE.match(key) or "\0" in value or "\n" in value:
            raise SpecError(f"{where}: {part!r} is not VAR or VAR=value")
        if key.startswith("MALLETRAIN_"):
            raise SpecError(f"{where}: {key} is set by malletrain, not by the user")
        if sep:
            env[key] = value
        else:
            env[key] = ""  # "export this variable from the submitting environment"
    return mode, env


@dataclass(frozen=True)
class JobSpec:
    """A validated malleable job. Build with :func:`build_spec` or :meth:`from_dict`."""

    #: Absolute path of the training script (run by torchrun in every node slot).
    script: str
    args: tuple[str, ...] = ()
    name: str = "malleable"
    min_nodes: int = 1
    max_nodes: int = 1
    #: Total wall time of the job; ``None`` = until it finishes. Each slot's own ``--time``
    #: is set by the daemon from the node's predicted idle window.
    time_limit_s: int | None = None
    gpus_per_node: int = 0
    #: The GPU type asked for (``--gres=gpu:a100:4`` -> ``a100``); None: any.
    gpu_type: str | None = None
    #: Worker processes per node (``torchrun --nproc-per-node``).
    nproc_per_node: int = 1
    output: str | None = None
    error: str | None = None
    chdir: str = "/"
    export: str = "ALL"
    environment: Mapping[str, str] = field(default_factory=dict)
    account: str | None = None
    #: ``--qos``: the QOS whose limits the job is held to (one its association may use)
    qos: str | None = None
    #: ``--nice``: 0 or more; a nicer job gets less of its user's nodes (tick/allocate.py)
    nice: int = 0
    #: Profiles are pooled per kind (default: the script's file name).
    kind: str = "default"
    #: The Python interpreter that runs the workers on the nodes (the submitter's by default).
    python: str = "/usr/bin/python3"
    #: How a node slot starts its K worker processes: ``srun`` (default: ``srun --ntasks=K``
    #: starts them directly, LOCAL_RANK/LOCAL_WORLD_SIZE from Slurm's task ids) or
    #: ``torchrun`` (a torch.distributed.run agent per node that starts them). Both give the
    #: node back equally fast after SIGTERM (0.2-0.3 s, docs/benchmarks.md); srun starts a
    #: newcomer without the agent's own torch import in front of the workers', and the
    #: membership, ranks and restarts are malletrain's anyway, not the agent's.
    launcher: str = "srun"
    #: sbatch options every node slot carries unchanged (``--mem=64G``, ``--constraint=...``,
    #: ``--gres=...``): Slurm honours them per node as for the original job.
    slot_options: tuple[str, ...] = ()
    #: ``native``: a Python script written with ``ElasticJob`` rescales in process;
    #: ``restart``: a shell batch script is stopped and restarted at every size change and
    #: resumes from its own checkpoint (:mod:`malletrain.elastic.restart`).
    mode: str = "native"
    #: restart mode: the signal a generation gets before it is stopped (the script's
    #: ``--signal``), and how long it may take to checkpoint and exit after it.
    stop_signal: str = "TERM"
    stop_grace_s: int = 0
    #: ``--signal=B:...``: the signal goes to the batch shell only (the script traps it);
    #: otherwise to every process of the launch but the shell, as Slurm sends it.
    stop_shell_only: bool = False
    #: ``--rate-target``: the throughput (samples/s, as the job reports it) beyond which more
    #: nodes are worth nothing to it. With ``allocator.node_prices`` the plan meets it on the
    #: cheapest nodes (HeterPS's cost objective); None: as fast as the idle nodes allow.
    rate_target: float | None = None
    #: ``--exclude``: nodes the job never runs on (sbatch's hostlist, expanded)
    exclude: tuple[str, ...] = ()
    #: restart mode: sbatch's ``--ntasks-per-node`` (or ``-n`` over a fixed size), which a
    #: batch shell's ``srun`` without counts starts per node; None: one task per node
    tasks_per_node: int | None = None
    #: ``--dependency``: the jobs this one waits for, as sbatch writes it (judged each tick)
    dependency: str | None = None
    #: ``--array``: this job is task ``array_task_id`` of the array ``array`` names; the
    #: array is named after its first task's job number (``array_job_id``; None: this job)
    array: str | None = None
    array_task_id: int | None = None
    array_job_id: int | None = None

    def __post_init__(self) -> None:
        _check_spec(self)
        _check_slot_fields(self)
        _check_relations(self)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["args"] = list(self.args)
        d["slot_options"] = list(self.slot_options)
        d["exclude"] = list(self.exclude)
        d["environment"] = dict(self.environment)
        return d

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """Validate untrusted input (the daemon's side of the submit channel)."""
        if not isinstance(data, Mapping):
            raise SpecError("spec: expected an object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise SpecError(f"spec: unknown field(s) {', '.join(unknown)}")
        kw: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("args", "slot_options", "exclude"):
                if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                    raise SpecError(f"spec.{key}: expected a list of strings")
                kw[key] = tuple(value)
            elif key == "environment":
                if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()
                ):
                    raise SpecError("spec.environment: expected an object of strings")
                kw[key] = dict(value)
            elif key in ("min_nodes", "max_nodes", "gpus_per_node", "nproc_per_node", "nice",
                         "time_limit_s", "stop_grace_s", "tasks_per_node", "array_task_id",
                         "array_job_id"):
                if value is None and key in ("time_limit_s", "tasks_per_node",
                                             "array_task_id", "array_job_id"):
                    kw[key] = None
                elif isinstance(value, bool) or not isinstance(value, int):
                    raise SpecError(f"spec.{key}: expected an integer, got {type(value).__name__}")
                else:
                    kw[key] = value
            elif key == "stop_shell_only":
                if not isinstance(value, bool):
                    raise SpecError("spec.stop_shell_only: expected true or false")
                kw[key] = value
            elif key == "rate_target":
                if value is not None and (isinstance(value, bool)
                                          or not isinstance(value, (int, float))):
                    raise SpecError("spec.rate_target: expected a number or null")
                kw[key] = None if value is None else float(value)
            elif key in ("output", "error", "account", "qos", "gpu_type", "dependency",
                         "array"):
                if value is not None and not isinstance(value, str):
                    raise SpecError(f"spec.{key}: expected a string or null")
                kw[key] = value
            else:
                if not isinstance(value, str):
                    raise SpecError(f"spec.{key}: expected a string, got {type(value).__name__}")
                kw[key] = value
        if "script" not in kw:
            raise SpecError("spec.script: missing")
        return cls(**kw)


def _check_relations(s: JobSpec) -> None:
    """``--dependency`` and ``--array``: Slurm's grammar, and a task id of its own array."""
    if s.dependency is not None:
        try:
            parse_dependency(s.dependency)
        except DependencyError as exc:
            raise SpecError(str(exc)) from None
    if s.array is None:
        if s.array_task_id is not None or s.array_job_id is not None:
            raise SpecError("array_task_id: given without an --array")
        return
    try:
        tasks = parse_array(s.array).task_ids
    except ArrayError as exc:
        raise SpecError(str(exc)) from None
    if s.array_task_id not in tasks:
        raise SpecError(f"array_task_id: {s.array_task_id!r} is not a task of {s.array}")
    if s.array_job_id is not None and (isinstance(s.array_job_id, bool) or not isinstance(
            s.array_job_id, int) or not 0 < s.array_job_id < 1 << 40):
        raise SpecError(f"array_job_id: {s.array_job_id!r} is not a job number")


def _check_spec(s: JobSpec) -> None:
    _line(s.script, "script")
    if not s.script.startswith("/"):
        raise SpecError(f"script: {s.script!r} must be an absolute path")
    if len(s.args) > MAX_ARGS:
        raise SpecError(f"args: more than {MAX_ARGS} arguments")
    for i, a in enumerate(s.args):
        if "\0" in a or len(a.encode()) > MAX_ARG_BYTES:
            raise SpecError(f"args[{i}]: contains a NUL byte or is longer than {MAX_ARG_BYTES}")
    if not (0 < len(s.name) <= 128 and s.name.isprintable()):
        raise SpecError(f"job name: {s.name!r:.80} must be 1-128 printable characters")
    _name(s.kind, "kind")
    for key, value in (("min_nodes", s.min_nodes), ("max_nodes", s.max_nodes)):
        if (isinstance(value, bool) or not isinstance(value, int)
                or not 1 <= value <= MAX_NODES_LIMIT):
            raise SpecError(f"{key}: {value!r} must be an integer from 1 to {MAX_NODES_LIMIT}")
    if s.max_nodes < s.min_nodes:
        raise SpecError(f"max_nodes: {s.max_nodes} is smaller than min_nodes {s.min_nodes}")
    if s.time_limit_s is not None and (
        isinstance(s.time_limit_s, bool) or not isinstance(s.time_limit_s, int)
        or not 1 <= s.time_limit_s <= 365 * 86400
    ):
        raise SpecError(f"time: {s.time_limit_s!r} must be 1 s to 365 days")
    for key, value in (("gpus_per_node", s.gpus_per_node),):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
            raise SpecError(f"{key}: {value!r} must be an integer from 0 to 64")
    if (isinstance(s.nproc_per_node, bool) or not isinstance(s.nproc_per_node, int)
            or not 1 <= s.nproc_per_node <= 256):
        raise SpecError(f"nproc_per_node: {s.nproc_per_node!r} must be from 1 to 256")
    for key in ("output", "error"):
        value = getattr(s, key)
        if value is not None:
            _line(value, key)
    _line(s.chdir, "chdir")
    if not s.chdir.startswith("/"):
        raise SpecError(f"chdir: {s.chdir!r} must be an absolute path")
    _line(s.python, "python")
    if not s.python.startswith("/"):
        raise SpecError(f"python: {s.python!r} must be an absolute path")
    if s.launcher not in LAUNCHERS:
        raise SpecError(f"launcher: {s.launcher!r} must be one of {', '.join(LAUNCHERS)}")
    if s.export not in ("ALL", "NONE"):
        raise SpecError(f"export: {s.export!r} must be ALL or NONE")
    if len(s.environment) > 256:
        raise SpecError("environment: more than 256 variables")
    for var, text in s.environment.items():
        if not _ENV_KEY_RE.match(var) or var.startswith("MALLETRAIN_"):
            raise SpecError(f"environment: {var!r} is not a variable the user may set")
        if "\0" in text or len(text.encode()) > MAX_ARG_BYTES:
            raise SpecError(f"environment: {var} contains a NUL byte or is too long")
    if s.account is not None and not _ACCOUNT_RE.match(s.account):
        raise SpecError(f"account: {s.account!r} is not a valid Slurm account name")
    if s.qos is not None and not _ACCOUNT_RE.match(s.qos):
        raise SpecError(f"--qos: {s.qos!r} is not a valid Slurm QOS name")
    if not 0 <= s.nice <= MAX_NICE:  # sbatch: only operators may give a negative nice
        raise SpecError(f"--nice: {s.nice} must be between 0 and {MAX_NICE}")


def _check_slot_fields(s: JobSpec) -> None:
    if s.mode not in MODES:
        raise SpecError(f"mode: {s.mode!r} must be one of {', '.join(MODES)}")
    if s.stop_signal not in STOP_SIGNALS:
        raise SpecError(f"--signal: {s.stop_signal!r} must be one of {', '.join(STOP_SIGNALS)}")
    if (isinstance(s.stop_grace_s, bool) or not isinstance(s.stop_grace_s, int)
            or not 0 <= s.stop_grace_s <= MAX_STOP_GRACE_S):
        raise SpecError(f"--signal: a grace of {s.stop_grace_s!r} s must be 0 to "
                        f"{MAX_STOP_GRACE_S} s")
    if s.tasks_per_node is not None and (isinstance(s.tasks_per_node, bool) or not isinstance(
            s.tasks_per_node, int) or not 1 <= s.tasks_per_node <= 256):
        raise SpecError(f"--ntasks-per-node: {s.tasks_per_node!r} must be 1 to 256")
    if s.rate_target is not None and not 0 < s.rate_target <= MAX_RATE_TARGET:
        raise SpecError(f"--rate-target: {s.rate_target!r} must be a rate in samples/s "
                        f"above 0 and at most {MAX_RATE_TARGET:g}")
    if s.gpu_type is not None and not _NAME_RE.match(s.gpu_type):
        raise SpecError(f"gpu_type: {s.gpu_type!r} is not a GPU type name")
    if len(s.exclude) > MAX_EXCLUDED_NODES:
        raise SpecError(f"--exclude: more than {MAX_EXCLUDED_NODES} nodes")
    bad = next((n for n in s.exclude if not _NODE_NAME_RE.match(n)), None)
    if bad is not None:
        raise SpecError(f"--exclude: {bad!r} is not a node name")
    if len(s.slot_options) > 32:
        raise SpecError("slot_options: more than 32")
    for opt in s.slot_options:
        name, sep, value = opt.partition("=")
        if opt in SPANK_FLAGS:
            continue
        if not sep or name not in SLOT_OPTIONS or not SLOT_VALUE_RE.match(value):
            raise SpecError(f"slot_options: {opt!r} is not an option node slots may carry")


# ----------------------------------------------------------------------------- stored


def spec_from_json(text: str) -> JobSpec:
    """A stored spec (:meth:`JobSpec.to_dict` as JSON). It never changes after submission:
    the store's job list decodes it once per job and keeps it with the job's record
    (``store_rows.JobRows``), not in a memo of its own, which would keep the specs of
    jobs long gone (up to a request's 1 MiB each)."""
    return JobSpec.from_dict(json.loads(text))
