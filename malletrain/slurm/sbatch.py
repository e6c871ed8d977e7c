"""Job submission rendered as data: :class:`SbatchSpec` -> an ``sbatch`` argument list.

After torchx: the spec is a frozen value, ``render()`` is pure and golden-file tested
(``tests/golden/slurm/sbatch/``), and the backend runs the list without a shell.  The
script text goes to sbatch on stdin, so no temporary file is left behind and no path of
ours appears in the job.  Every option uses the ``--name=value`` form so that a value that
starts with ``-`` can never be read as another option.

``run_as`` renders ``runuser -u USER -- sbatch ...``: the job then belongs to that user (user
code never runs as the daemon's account).  runuser needs root, which the daemon has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from malletrain.errors import PermanentError

_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NODE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_SIGNAL_RE = re.compile(r"^(?:[BR]:)?(?:SIG)?[A-Z0-9]+(?:@\d+)?$")
_DEPENDENCY_RE = re.compile(r"^[a-z]+(?::[0-9_+*]+)+(?:[,?][a-z]+(?::[0-9_+*]+)+)*$")


class SbatchSpecError(PermanentError):
    """An invalid submission; the message names the field."""


def _minutes(seconds: int) -> str:
    """sbatch takes minutes; round up so a job never gets less time than asked."""
    return str(max(1, -(-seconds // 60)))


@dataclass(frozen=True)
class SbatchSpec:
    """One ``sbatch`` submission. Only what malletrain needs; ``extra_args`` for the rest."""

    #: The batch script (must start with ``#!``); sent on stdin.
    script: str
    job_name: str | None = None
    partition: str | None = None
    #: Node count; with ``max_nodes`` it renders ``--nodes=min-max``.
    nodes: int | None = None
    max_nodes: int | None = None
    ntasks_per_node: int | None = None
    time_limit_s: int | None = None
    time_min_s: int | None = None
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    output: str | None = None
    error: str | None = None
    chdir: str | None = None
    comment: str | None = None
    account: str | None = None
    qos: str | None = None
    #: e.g. ``"B:USR1@30"``.
    signal: str | None = None
    requeue: bool | None = None
    hold: bool = False
    exclusive: bool = False
    dependency: str | None = None
    #: ``--export``: ``"ALL"``, ``"NONE"`` or ``None`` (sbatch's default, ALL).
    export: str | None = None
    #: Variables for the job, passed in sbatch's environment (never on the command line).
    environment: Mapping[str, str] = field(default_factory=dict)
    #: Submit as this user (renders ``runuser -u USER --``); ``None`` = the caller.
    run_as: str | None = None
    #: Further ``--option=value`` arguments, each checked to be a long option.
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.script.startswith("#!"):
            raise SbatchSpecError("script: must start with '#!' (an interpreter line)")
        if "\0" in self.script:
            raise SbatchSpecError("script: contains a NUL byte")
        for name in ("job_name", "partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and not _NAME_RE.match(value):
                raise SbatchSpecError(f"{name}: {value!r} is not a valid Slurm name")
        for name in ("nodes", "max_nodes", "ntasks_per_node", "time_limit_s", "time_min_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise SbatchSpecError(f"{name}: must be a positive integer, got {value!r}")
        if self.max_nodes is not None and (self.nodes is None or self.max_nodes < self.nodes):
            raise SbatchSpecError("max_nodes: needs nodes and must be >= nodes")
        if (self.time_min_s is not None and self.time_limit_s is not None
                and self.time_min_s > self.time_limit_s):
            raise SbatchSpecError("time_min_s: must not exceed time_limit_s")
        for name in ("nodelist", "exclude"):
            for node in getattr(self, name):
                if not _NODE_RE.match(node):
                    raise SbatchSpecError(f"{name}: {node!r} is not a node name")
        for name in ("output", "error", "chdir", "comment"):
            value = getattr(self, name)
            if value is not None and (not value or "\n" in value or "\0" in value):
                raise SbatchSpecError(f"{name}: must be one non-empty line")
        if self.signal is not None and not _SIGNAL_RE.match(self.signal):
            raise SbatchSpecError(f"signal: {self.signal!r} is not like 'B:USR1@30'")
        if self.dependency is not None and not _DEPENDENCY_RE.match(self.dependency):
            raise SbatchSpecError(f"dependency: {self.dependency!r} is not like 'afterok:12'")
        if self.export is not None and self.export not in ("ALL", "NONE"):
            raise SbatchSpecError(f"export: must be 'ALL' or 'NONE', got {self.export!r}")
        for key, value in self.environment.items():
            if not _ENV_KEY_RE.match(key) or "\0" in value:
                raise SbatchSpecError(f"environment: invalid variable {key!r}")
        if self.run_as is not None and not _USER_RE.match(self.run_as):
            raise SbatchSpecError(f"run_as: {self.run_as!r} is not a valid user name")
        for arg in self.extra_args:
            if not arg.startswith("--") or "\n" in arg:
                raise SbatchSpecError(f"extra_args: {arg!r} must be one '--option[=value]'")

    def render(self) -> list[str]:
        """The argument list to run (script on stdin; see :meth:`render_env`)."""
        argv: list[str] = []
        if self.run_as is not None:
            argv += ["runuser", "-u", self.run_as, "--"]
        argv += ["sbatch", "--parsable"]
        opt = argv.append
        if self.job_name is not None:
            opt(f"--job-name={self.job_name}")
        if self.partition is not None:
            opt(f"--partition={self.partition}")
        if self.nodes is not None:
            count = str(self.nodes)
            if self.max_nodes is not None and self.max_nodes != self.nodes:
                count = f"{self.nodes}-{self.max_nodes}"
            opt(f"--nodes={count}")
        if self.ntasks_per_node is not None:
            opt(f"--ntasks-per-node={self.ntasks_per_node}")
        if self.time_limit_s is not None:
            opt(f"--time={_minutes(self.time_limit_s)}")
        if self.time_min_s is not None:
            opt(f"--time-min={_minutes(self.time_min_s)}")
        if self.nodelist:
            opt(f"--nodelist={','.join(self.nodelist)}")
        if self.exclude:
            opt(f"--exclude={','.join(self.exclude)}")
        for name in ("output", "error", "chdir", "comment", "account", "qos", "signal",
                     "dependency", "export"):
            value = getattr(self, name)
            if value is not None:
                opt(f"--{name}={value}")
        if self.requeue is not None:
            opt("--requeue" if self.requeue else "--no-requeue")
        if self.hold:
            opt("--hold")
        if self.exclusive:
            opt("--exclusive")
        argv += list(self.extra_args)
        return argv

    def render_env(self) -> dict[str, str]:
        """Variables to add to sbatch's environment (exported to the job by default)."""
        return dict(self.environment)


def parse_job_id(stdout: str) -> int:
    """``sbatch --parsable`` prints ``ID`` or ``ID;cluster``."""
    first = stdout.strip().split(";", 1)[0]
    if not first.isdigit():
        raise ValueError(f"sbatch printed no job id: {stdout.strip()[:80]!r}")
    return int(first)
