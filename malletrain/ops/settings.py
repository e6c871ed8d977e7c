"""The daemon's settings: one YAML file, loaded once into typed, frozen dataclasses.

Why this shape (kopf's frozen settings): the daemon reads its configuration once at
start and again only on SIGHUP, so every tick sees one consistent, immutable value
and nothing can change a setting behind the loop's back. Every field has a default,
so an empty file (or no ``malletrain.yaml`` sections at all) is a valid
configuration for a laptop-sized dev cluster; ``configs/malletrain.yaml`` documents
every field with production values.

Validation is strict and complete: unknown keys, wrong types, out-of-range values and
malformed YAML all raise :class:`SettingsError` (a :class:`~malletrain.errors.ConfigError`)
whose message names the file, the line where the YAML has one, the field path
(e.g. ``allocator.tick_interval_s``) and what is wrong. Every problem in the file is
reported at once, so an operator fixes the file in one pass. Nothing here raises
anything else for bad input.

Usage (daemon)::

    from malletrain.ops.settings import load_settings, reload_settings

    settings = load_settings(args.config)          # ConfigError -> exit 78, one message
    interval_s = settings.allocator.tick_interval_s

    policy = make_policy(settings.allocator.policy, settings.allocator.policy_options())
    advisor = ProfilingAdvisor(settings.allocator.advisor_settings())

    # on SIGHUP, between ticks (malletrain.ops.service.reload_config wraps this with logging,
    # metrics and sd_notify):
    result = reload_settings(args.config, settings)
    if result.error is not None:
        log.error("config reload rejected, keeping the running config: %s", result.error)
    else:
        for field_path in result.needs_restart:
            log.warning("%s changed but takes effect only after a restart", field_path)
        settings = result.settings

Relative paths in the file (``state.database_path`` ...) are resolved against the
directory of the config file, so a config and its state can travel together in tests.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from malletrain.core.options import LIVE, PolicyOptions
from malletrain.core.policies import POLICIES as POLICY_REGISTRY
from malletrain.core.profiler import AdvisorSettings
from malletrain.errors import ConfigError

#: Where the packaged systemd unit looks for the configuration.
DEFAULT_CONFIG_PATH = Path("/etc/malletrain/malletrain.yaml")


def daemon_policy_names() -> tuple[str, ...]:
    """Policies the daemon can run: those of core's registry that do not need the jobs' true
    throughput curves (only the simulator has those, e.g. ``malletrain-known-curves``)."""
    return tuple(name for name, spec in POLICY_REGISTRY.items() if spec.curves != "true")


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LogFormat = Literal["text", "json"]

#: sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_UNIX_PATH_MAX_BYTES = 107


# ---------------------------------------------------------------------------------------
# field helpers: metadata drives validation, documentation and reload behaviour
# ---------------------------------------------------------------------------------------
Check = Callable[[Any], "str | None"]


def _m(
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    check: Check | None = None,
    restart: bool = False,
) -> dict[str, Any]:
    """Metadata of a settings field: its documentation and its validation.

    ``min``/``max`` are inclusive bounds, ``gt`` an exclusive lower bound, ``check`` returns a
    problem or None. ``restart=True``: a SIGHUP reload cannot change it (sockets, paths).
    """
    return {"doc": doc, "min": min, "max": max, "gt": gt, "check": check, "restart": restart}


def parse_address(value: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port). Raises ValueError with the reason."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9464), got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. [::1]:9464, got {value!r}")
    if not port_text.isdigit():
        raise ValueError(f"port must be a number, got {port_text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    return host, port


def _check_address(value: str) -> str | None:
    try:
        parse_address(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_name(value: str) -> str | None:
    """Slurm partition/QOS/account names: non-empty, no whitespace, commas or shell-ish noise."""
    if not value:
        return "must not be empty"
    bad = sorted({c for c in value if c.isspace() or c in ",;'\"`$\\|&<>()*?"})
    if bad:
        return f"must not contain {''.join(bad)!r}, got {value!r}"
    return None


def _check_names(values: tuple[str, ...]) -> str | None:
    if not values:
        return "must list at least one partition"
    for value in values:
        problem = _check_name(value)
        if problem:
            return problem
    if len(set(values)) != len(values):
        return f"lists a partition twice: {list(values)}"
    return None


def _check_optional_name(value: str | None) -> str | None:
    return None if value is None else _check_name(value)


def _check_socket_path(value: Path) -> str | None:
    if len(os.fsencode(str(value))) > _UNIX_PATH_MAX_BYTES:
        size = len(os.fsencode(str(value)))
        return f"is {size} bytes long; a Unix socket path may have at most {_UNIX_PATH_MAX_BYTES}"
    return None


def _check_policy(value: str) -> str | None:
    names = daemon_policy_names()
    if value not in names:
        if value in POLICY_REGISTRY:
            return f"{value!r} needs the jobs' true throughput curves (simulator only); " \
                f"the daemon runs one of {', '.join(names)}"
        return f"must be one of {', '.join(names)}, got {value!r}"
    return None


def _check_host(value: str) -> str | None:
    if not value or any(c.isspace() for c in value):
        return f"must be a host name or address, got {value!r}"
    return None


# ---------------------------------------------------------------------------------------
# the settings tree
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlurmSettings:
    """How the daemon talks to Slurm and where scavenged work runs."""

    scavenger_partition: str = field(default="scavenger", metadata=_m(
        "Preemptible partition (low PriorityTier, PreemptMode=CANCEL, short GraceTime) in "
        "which malletrain places one single-node job per scavenged node slot.",
        check=_check_name,
    ))
    partitions: tuple[str, ...] = field(default=("batch",), metadata=_m(
        "Regular partitions whose idle nodes may be scavenged; their pending jobs' planned "
        "starts bound each node's predicted idle window.",
        check=_check_names,
    ))
    qos: str | None = field(default=None, metadata=_m(
        "QOS for slot jobs (--qos), e.g. a preemptible 'scavenger' QOS; null = the default.",
        check=_check_optional_name,
    ))
    account: str | None = field(default=None, metadata=_m(
        "Account for slot jobs (--account); null = the submitting user's default account.",
        check=_check_optional_name,
    ))
    command_timeout_s: float = field(default=10.0, metadata=_m(
        "Seconds before a Slurm command (sinfo, squeue, sbatch, scancel) counts as failed (a "
        "retryable error: the daemon keeps its last good snapshot).",
        gt=0, max=600,
    ))
    max_slot_time_s: float = field(default=3600.0, metadata=_m(
        "--time of a slot job on a node whose idle window is unbounded (nothing planned); a "
        "slot on a bounded window gets no more than that window.",
        min=60, max=7 * 24 * 3600,
    ))
    min_slot_time_s: float = field(default=60.0, metadata=_m(
        "Holes predicted shorter than this are not scavenged (Slurm's --time has minute "
        "granularity, and a rescale must have time to pay off).",
        min=60, max=24 * 3600,
    ))
    yield_ahead_s: float = field(default=10.0, metadata=_m(
        "A scavenged node that a regular job is planned to take within this many seconds (or "
        "should already have taken) is given back at once, without waiting for Slurm to "
        "preempt its slot; 0 = only when the plan is overdue. Capped at min_slot_time_s.",
        min=0, max=600,
    ))
    yield_confirm_s: float = field(default=1.0, metadata=_m(
        "A regular job planned onto scavenged nodes the moment it is submitted is left to "
        "Slurm's own preemption for this many seconds after its submission (Slurm's next "
        "scheduling or backfill pass; it often preempts other nodes than the plan names); "
        "only if it still waits then are the planned nodes given back. About the larger of "
        "1 s and bf_interval; 0 = give back at once.",
        min=0, max=60,
    ))
    yield_unplanned_s: float = field(default=10.0, metadata=_m(
        "A regular job still pending with no plan from Slurm yield_confirm_s after its "
        "submission, whose nodes scavenger slots hold, gets them given back at once, until "
        "this many seconds after its submission (later, something else blocks it). Free "
        "nodes such a job is about to take are not scavenged meanwhile. 0 = off.",
        min=0, max=600,
    ))
    arrival_probe_s: float = field(default=0.25, metadata=_m(
        "Between ticks, while scavenger slots hold nodes, ask Slurm for the ids of pending "
        "jobs this often (one short squeue answer) and start a tick at once when a new one "
        "appears, so that what is given back to a new regular job does not wait for the "
        "next tick. 0 = off (new jobs are seen at the next tick).",
        min=0, max=60,
    ))
    slurm_conf: Path | None = field(default=None, metadata=_m(
        "SLURM_CONF for every Slurm command; null = the daemon's environment (or Slurm's "
        "default, /etc/slurm/slurm.conf).",
        restart=True,
    ))


#: A size seen live only during warm-up counts with at least this many seconds of it
#: (:attr:`malletrain.core.profiler.AdvisorSettings.min_warmup_evidence_s`).
LIVE_MIN_WARMUP_EVIDENCE_S = 10.0

@dataclass(frozen=True)
class AllocatorSettings:
    """The observe -> decide -> act loop and the allocation policy."""

    tick_interval_s: float = field(default=5.0, metadata=_m(
        "Seconds between two ticks (one batched Slurm query, one decision). Events such as a "
        "preemption wake the loop earlier.",
        min=0.1, max=3600,
    ))
    policy: str = field(default="malletrain", metadata=_m(
        "Allocation policy, a name from malletrain.core.policies that needs no true "
        "throughput curves: malletrain (curves learned online) or equal-share.",
        check=_check_policy,
    ))
    horizon_s: float = field(default=1800.0, metadata=_m(
        "malletrain's cap on any node's predicted idle window: beyond it nothing is "
        "predictable, so an unbounded window counts as this long.",
        min=1, max=7 * 24 * 3600,
    ))
    default_scale_up_s: float = field(default=3.0, metadata=_m(
        "Assumed cost of growing a job (seconds of lost progress) until the Profiling Advisor "
        "has measured it.",
        min=0, max=3600,
    ))
    default_scale_down_s: float = field(default=1.0, metadata=_m(
        "Assumed cost of shrinking a job until measured.",
        min=0, max=3600,
    ))
    warmup_s: float = field(default=30.0, metadata=_m(
        "Progress reported within this many seconds after a job changed size is warm-up "
        "(rendezvous, first slow steps): the Profiling Advisor does not learn rates from it.",
        min=0, max=3600,
    ))

    def policy_options(self) -> PolicyOptions:
        """The knobs of :func:`malletrain.core.policies.make_policy` from these settings."""
        return LIVE.with_(horizon_s=self.horizon_s)

    def advisor_settings(self) -> AdvisorSettings:
        """The Profiling Advisor's settings (:class:`malletrain.core.profiler.AdvisorSettings`)."""
        return AdvisorSettings(
            default_scale_up_s=self.default_scale_up_s,
            default_scale_down_s=self.default_scale_down_s,
            warmup_s=self.warmup_s,
            # Live, a stint of a few seconds at a new size is mostly the rendezvous stall:
            # counted as throughput it flattened the curve and the daemon stopped regrowing
            # jobs (docs/daemon.md). Replays keep the core default (every stint counts).
            min_warmup_evidence_s=LIVE_MIN_WARMUP_EVIDENCE_S,
        )


@dataclass(frozen=True)
class StateSettings:
    """What survives a daemon restart."""

    database_path: Path = field(default=Path("/var/lib/malletrain/state.db"), metadata=_m(
        "SQLite database (WAL) with the job queue, profiles and lifecycle history. Must be on "
        "a local disk of the login node (SQLite locking over NFS is unreliable).",
        restart=True,
    ))
    snapshot_dir: Path = field(default=Path("/var/lib/malletrain/snapshots"), metadata=_m(
        "Where a job evicted to zero nodes keeps its training state until it gets nodes "
        "again; must be reachable by the job's workers (a parallel file system on a real "
        "cluster).",
    ))


@dataclass(frozen=True)
class CoordinatorSettings:
    """The elastic rendezvous, hosted by the daemon (never on a preemptible node)."""

    host: str = field(default="127.0.0.1", metadata=_m(
        "Address the coordinator listens on; compute nodes must reach it. On a real cluster "
        "use the login node's address on the cluster network.",
        check=_check_host, restart=True,
    ))
    port: int = field(default=29400, metadata=_m(
        "TCP port of the coordinator; 0 = any free port.",
        min=0, max=65535, restart=True,
    ))
    heartbeat_timeout_s: float = field(default=30.0, metadata=_m(
        "A job whose workers have sent no progress report for this long is considered hung.",
        gt=0, max=24 * 3600,
    ))


@dataclass(frozen=True)
class SubmitSettings:
    """The channel users submit through (a Unix socket: the kernel says who is calling)."""

    socket_path: Path = field(default=Path("/run/malletrain/submit.sock"), metadata=_m(
        "Unix stream socket for malletrain submit/jobs/cancel; peer credentials (SO_PEERCRED) "
        "identify the user.",
        check=_check_socket_path, restart=True,
    ))


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus endpoint."""

    enabled: bool = field(default=True, metadata=_m("Serve /metrics.", restart=True))
    address: str = field(default="127.0.0.1:9464", metadata=_m(
        "HOST:PORT to serve /metrics on ([::1]:9464 for IPv6; 0.0.0.0:9464 for every "
        "interface; port 0 = any free port).",
        check=_check_address, restart=True,
    ))

    @property
    def host(self) -> str:
        return parse_address(self.address)[0]

    @property
    def port(self) -> int:
        return parse_address(self.address)[1]


@dataclass(frozen=True)
class LoggingSettings:
    """Logs go to stderr (the journal under systemd)."""

    level: LogLevel = field(default="INFO", metadata=_m(
        "DEBUG, INFO, WARNING, ERROR or CRITICAL (case-insensitive).",
    ))
    format: LogFormat = field(default="text", metadata=_m(
        "text (one readable line) or json (one JSON object per line).",
    ))


@dataclass(frozen=True)
class LimitsSettings:
    """What users may ask of the daemon; submissions beyond these are refused with a reason."""

    max_jobs_per_user: int = field(default=8, metadata=_m(
        "Malleable jobs one user may have queued or running.",
        min=1, max=100_000,
    ))
    max_jobs_total: int = field(default=100, metadata=_m(
        "Malleable jobs in the daemon at once, all users together.",
        min=1, max=1_000_000,
    ))
    max_nodes_per_job: int = field(default=64, metadata=_m(
        "Largest --max-nodes a job may request.",
        min=1, max=1_000_000,
    ))
    max_time_s: float | None = field(default=None, metadata=_m(
        "Largest --time (total wall time) a job may request; null = no limit.",
        gt=0,
    ))


@dataclass(frozen=True)
class DaemonSettings:
    """Process-level behaviour."""

    stop_timeout_s: float = field(default=20.0, metadata=_m(
        "On SIGTERM the daemon finishes the tick in progress and exits; if that takes longer "
        "than this, it exits anyway (every Slurm action is recorded before it runs, so the "
        "next start reconciles it). Keep it below the unit's TimeoutStopSec.",
        gt=0, max=3600,
    ))


@dataclass(frozen=True)
class Settings:
    """Everything the daemon runs with. Build with :func:`load_settings`."""

    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    allocator: AllocatorSettings = field(default_factory=AllocatorSettings)
    state: StateSettings = field(default_factory=StateSettings)
    coordinator: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    submit: SubmitSettings = field(default_factory=SubmitSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)


def _cross_checks(s: Settings) -> list[tuple[str, str]]:
    """Rules that involve more than one field: (field path, problem)."""
    problems: list[tuple[str, str]] = []
    if s.slurm.scavenger_partition in s.slurm.partitions:
        problems.append((
            "slurm.scavenger_partition",
            f"{s.slurm.scavenger_partition!r} is also in slurm.partitions; the scavenger partition "
            "must be a separate, preemptible partition",
        ))
    if s.slurm.min_slot_time_s > s.slurm.max_slot_time_s:
        problems.append((
            "slurm.min_slot_time_s",
            f"{s.slurm.min_slot_time_s:g} is larger than slurm.max_slot_time_s "
            f"({s.slurm.max_slot_time_s:g})",
        ))
    if s.metrics.enabled and s.metrics.port != 0 and s.metrics.port == s.coordinator.port:
        problems.append(("metrics.address", f"port {s.metrics.port} is also coordinator.port"))
    if s.limits.max_jobs_per_user > s.limits.max_jobs_total:
        problems.append((
            "limits.max_jobs_per_user",
            f"{s.limits.max_jobs_per_user} is larger than limits.max_jobs_total "
            f"({s.limits.max_jobs_total})",
        ))
    return problems


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file."""

    field: str  # dotted path, "" for the document itself
    message: str
    line: int | None = None  # 1-based, where the YAML has one

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        if not self.field:
            return f"{where}: {self.message}"
        return f"{where}: {self.field}: {self.message}"


class SettingsError(ConfigError):
    """Invalid configuration: ``problems`` lists them all; the message names file, line, field."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = tuple(problems)
        if len(problems) == 1:
            text = problems[0].render(file)
        else:
            text = f"{file}: {len(problems)} problems:\n" + "\n".join(
                "  " + p.render(file) for p in problems
            )
        super().__init__(text)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(p.field for p in self.problems)


# ---------------------------------------------------------------------------------------
# YAML reading (with line numbers and duplicate-key detection)
# ---------------------------------------------------------------------------------------
def _node_lines(node: yaml.Node, out: dict[str, int], dupes: list[Problem]) -> None:
    """Record the line of each key path; report keys given twice (PyYAML keeps the last).

    Iterative with a budget: aliases can make a small file a huge tree (billion laughs), and
    line numbers are only a courtesy for error messages.
    """
    budget = 10_000
    stack: list[tuple[yaml.Node, str]] = [(node, "")]
    while stack and budget > 0:
        current, prefix = stack.pop()
        if not isinstance(current, yaml.MappingNode):
            continue
        seen: set[str] = set()
        for key_node, value_node in current.value:
            budget -= 1
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            line = key_node.start_mark.line + 1
            if key in seen:
                dupes.append(Problem(path, "is given twice", line))
            seen.add(key)
            out.setdefault(path, line)
            stack.append((value_node, path))
            if isinstance(value_node, yaml.SequenceNode):
                for i, item in enumerate(value_node.value[:100]):
                    out.setdefault(f"{path}[{i}]", item.start_mark.line + 1)


def _read_yaml(text: str, file: str) -> tuple[Any, dict[str, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = "; ".join(str(x) for x in (exc.context, exc.problem) if x) or "cannot parse"
        raise SettingsError(file, [Problem("", f"malformed YAML: {what}", line)]) from None
    except yaml.YAMLError as exc:  # e.g. a ReaderError for control characters
        raise SettingsError(file, [Problem("", f"malformed YAML: {exc}")]) from None
    except RecursionError:
        raise SettingsError(file, [Problem("", "malformed YAML: nested too deeply")]) from None
    lines: dict[str, int] = {}
    dupes: list[Problem] = []
    if node is not None:
        _node_lines(node, lines, dupes)
    if dupes:
        raise SettingsError(file, dupes)
    return data, lines


# ---------------------------------------------------------------------------------------
# conversion: YAML value -> typed value, collecting problems
# ---------------------------------------------------------------------------------------
_YAML_TYPE = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
              list: "a list", dict: "a mapping", type(None): "null"}


def _describe(value: Any) -> str:
    kind = _YAML_TYPE.get(type(value), type(value).__name__)
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} ({shown})" if value is not None else "null"


def _num(x: float) -> str:
    """A number for a message: 5 not 5.0, and no OverflowError for a 400-digit integer."""
    if isinstance(x, int):
        text = str(x)
        return text if len(text) <= 20 else text[:8] + f"...({len(text)} digits)"
    return f"{x:g}"


class _Converter:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.problems: list[Problem] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def section(self, cls: type, value: Any, path: str) -> Any:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping of settings, got {_describe(value)}")
            return cls()
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str) or key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(fields)}"
                self.fail(sub, "unknown setting" + hint)
                continue
            f = fields[key]
            before = len(self.problems)
            converted = self.value(hints[key], raw, sub)
            if len(self.problems) == before:
                self.constraints(f, converted, sub)
            if len(self.problems) == before:
                kwargs[key] = converted
        return cls(**kwargs)

    def value(self, tp: Any, raw: Any, path: str) -> Any:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.section(tp, raw, path)
        if origin in (typing.Union, types.UnionType):
            if raw is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self.value(inner, raw, path)
        if raw is None:
            self.fail(path, f"must not be null (expected {self.expected(tp)})")
            return None
        if origin is Literal:
            if isinstance(raw, str):
                for choice in args:
                    if raw.lower() == str(choice).lower():
                        return choice
            self.fail(path, f"must be one of {', '.join(map(str, args))}, got {_describe(raw)}")
            return None
        if origin is tuple:
            if not isinstance(raw, list):
                self.fail(path, f"must be a list, got {_describe(raw)}")
                return None
            return tuple(self.value(args[0], item, f"{path}[{i}]") for i, item in enumerate(raw))
        if tp is bool:
            if not isinstance(raw, bool):
                self.fail(path, f"must be true or false, got {_describe(raw)}")
            return raw
        if tp is int:
            if isinstance(raw, bool) or not isinstance(raw, int):
                self.fail(path, f"must be an integer, got {_describe(raw)}")
            return raw
        if tp is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                self.fail(path, f"must be a number, got {_describe(raw)}")
                return None
            try:
                value = float(raw)
            except OverflowError:
                self.fail(path, "is too large")
                return None
            if not math.isfinite(value):
                self.fail(path, f"must be a finite number, got {raw}")
                return None
            return value
        if tp is str:
            if not isinstance(raw, str):
                self.fail(path, f"must be a string, got {_describe(raw)} (quote it in YAML)")
            return raw
        if tp is Path:
            if not isinstance(raw, str) or not raw.strip():
                self.fail(path, f"must be a non-empty path, got {_describe(raw)}")
                return None
            if "\0" in raw:
                self.fail(path, "must not contain a NUL character")
                return None
            if raw.startswith("~"):
                self.fail(path, f"~ is not expanded (whose home?); write the full path: {raw!r}")
                return None
            p = Path(raw)
            return p if p.is_absolute() else self.base_dir / p
        raise TypeError(f"settings field type {tp!r} is not supported")  # a bug in this module

    @staticmethod
    def expected(tp: Any) -> str:
        if typing.get_origin(tp) is Literal:
            return "one of " + ", ".join(map(str, typing.get_args(tp)))
        if typing.get_origin(tp) is tuple:
            return "a list"
        return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                Path: "a path"}.get(tp, str(tp))

    def constraints(self, f: dataclasses.Field[Any], value: Any, path: str) -> None:
        meta = f.metadata
        if value is None:
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if meta.get("min") is not None and value < meta["min"]:
                self.fail(path, f"must be >= {_num(meta['min'])}, got {_num(value)}")
            elif meta.get("gt") is not None and value <= meta["gt"]:
                self.fail(path, f"must be > {_num(meta['gt'])}, got {_num(value)}")
            elif meta.get("max") is not None and value > meta["max"]:
                self.fail(path, f"must be <= {_num(meta['max'])}, got {_num(value)}")
        check = meta.get("check")
        if check is not None and not self.problems_at(path):
            problem = check(value)
            if problem:
                self.fail(path, problem)

    def problems_at(self, path: str) -> bool:
        return any(p.field == path for p in self.problems)


def parse_settings(text: str, file: str = "<config>", base_dir: Path | None = None) -> Settings:
    """Validate YAML text into :class:`Settings` (``file`` only names it in errors)."""
    data, lines = _read_yaml(text, file)
    conv = _Converter(base_dir if base_dir is not None else Path.cwd())
    if data is not None and not isinstance(data, Mapping):
        what = f"the top level must be a mapping of sections, got {_describe(data)}"
        raise SettingsError(file, [Problem("", what, 1)])
    settings = conv.section(Settings, data or {}, "")
    problems = conv.problems
    if not problems:
        problems = [Problem(path, msg) for path, msg in _cross_checks(settings)]
    if problems:
        raise SettingsError(file, [_with_line(p, lines) for p in problems])
    return settings


def _with_line(p: Problem, lines: Mapping[str, int]) -> Problem:
    path = p.field
    while path:
        if path in lines:
            return dataclasses.replace(p, line=lines[path])
        path = path.rpartition(".")[0]
    return p


def load_settings(path: str | os.PathLike[str] | None) -> Settings:
    """Read and validate a config file. ``None`` = built-in defaults (no file)."""
    if path is None:
        return Settings()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SettingsError(str(p), [Problem("", "no such file")]) from None
    except IsADirectoryError:
        raise SettingsError(str(p), [Problem("", "is a directory, not a config file")]) from None
    except OSError as exc:
        raise SettingsError(str(p), [Problem("", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(str(p), [Problem("", f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_settings(text, str(p), p.resolve().parent)


# ---------------------------------------------------------------------------------------
# SIGHUP reload
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReloadResult:
    """Outcome of a reload: the settings to run with next, or why the file was rejected.

    ``settings`` is always usable: on error it is the running settings unchanged. Fields that
    cannot change without a restart (sockets, the database) keep their running values;
    ``needs_restart`` names those that differ in the file.
    """

    settings: Settings
    error: ConfigError | None = None
    needs_restart: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def reload_settings(path: str | os.PathLike[str] | None, running: Settings) -> ReloadResult:
    """Load ``path`` again for SIGHUP; never raises for a bad file."""
    try:
        new = load_settings(path)
    except ConfigError as exc:
        return ReloadResult(settings=running, error=exc)
    sections: dict[str, Any] = {}
    needs_restart: list[str] = []
    changed: list[str] = []
    for sec in dataclasses.fields(Settings):
        old_sec, new_sec = getattr(running, sec.name), getattr(new, sec.name)
        keep: dict[str, Any] = {}
        for f in dataclasses.fields(old_sec):
            old_v, new_v = getattr(old_sec, f.name), getattr(new_sec, f.name)
            if old_v == new_v:
                continue
            path = f"{sec.name}.{f.name}"
            if f.metadata.get("restart"):
                needs_restart.append(path)
                keep[f.name] = old_v
            else:
                changed.append(path)
        sections[sec.name] = dataclasses.replace(new_sec, **keep) if keep else new_sec
    return ReloadResult(Settings(**sections), None, tuple(needs_restart), tuple(changed))


# ---------------------------------------------------------------------------------------
# introspection (config show, docs tests)
# ---------------------------------------------------------------------------------------
def field_docs() -> dict[str, str]:
    """Every leaf setting as ``"section.field" -> documentation``, in declaration order."""
    out: dict[str, str] = {}
    for sec in dataclasses.fields(Settings):
        cls = typing.get_type_hints(Settings)[sec.name]
        for f in dataclasses.fields(cls):
            out[f"{sec.name}.{f.name}"] = f.metadata["doc"]
    return out


def settings_to_dict(settings: Settings) -> dict[str, Any]:
    """Plain YAML-able data (paths as strings, tuples as lists), e.g. for ``config show``."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    result = plain(settings)
    assert isinstance(result, dict)
    return result
