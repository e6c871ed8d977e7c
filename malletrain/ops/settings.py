"""The daemon's settings: one YAML file, loaded once into typed, frozen dataclasses.

Why this shape (kopf's frozen settings): the daemon reads its configuration once at
start and again only on SIGHUP, so every tick sees one consistent, immutable value
and nothing can change a setting behind the loop's back. Every field has a default,
so an empty file (or no ``malletrain.yaml`` sections at all) is a valid configuration for
a laptop-sized dev cluster; ``configs/malletrain.yaml`` documents every field.

Validation is strict and complete: unknown keys, wrong types, out-of-range values and
malformed YAML all raise :class:`SettingsError` (a :class:`~malletrain.errors.ConfigError`)
whose message names the file, the YAML line, the field path (``allocator.tick_interval_s``)
and what is wrong. Every problem in the file is reported at once, so an operator fixes the
file in one pass. Nothing here raises anything else for bad input.

Usage (daemon)::

    from malletrain.ops.config_file import load_settings, reload_settings

    settings = load_settings(args.config)          # ConfigError -> exit 78, one message
    interval_s = settings.allocator.tick_interval_s

    policy = make_policy(settings.allocator.policy, settings.policy_options())
    advisor = ProfilingAdvisor(settings.allocator.advisor_settings())

    # on SIGHUP, between ticks: reload_settings(args.config, settings) gives the new
    # settings, or an error (the running ones are kept), and the fields needing a restart
    # (malletrain.ops.service.reload_config wraps it with logging, metrics and sd_notify)

Relative paths in the file (``state.database_path`` ...) are resolved against the
directory of the config file, so a config and its state can travel together in tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from malletrain.core.options import LIVE, PolicyOptions
from malletrain.core.profiling.profile import AdvisorSettings
from malletrain.ops.settings_accounting import AccountingSettings
from malletrain.ops.settings_fields import (
    CPU_NODE_TYPE,
    check_address,
    check_host,
    check_name,
    check_names,
    check_optional_name,
    check_policy,
    check_prices,
    check_socket_path,
    meta,
    parse_address,
)

#: Where the packaged systemd unit looks for the configuration.
DEFAULT_CONFIG_PATH = Path("/etc/malletrain/malletrain.yaml")


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LogFormat = Literal["text", "json"]


# ---------------------------------------------------------------------------------------
# the settings tree
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlurmSettings:
    """How the daemon talks to Slurm and where scavenged work runs."""

    scavenger_partition: str = field(default="scavenger", metadata=meta(
        "Preemptible partition (low PriorityTier, PreemptMode=CANCEL, short GraceTime) in "
        "which malletrain places one single-node job per scavenged node slot.",
        check=check_name,
    ))
    partitions: tuple[str, ...] = field(default=("batch",), metadata=meta(
        "Regular partitions whose idle nodes may be scavenged; their pending jobs' planned "
        "starts bound each node's predicted idle window.",
        check=check_names,
    ))
    qos: str | None = field(default=None, metadata=meta(
        "QOS for slot jobs (--qos), e.g. a preemptible 'scavenger' QOS; null = the default.",
        check=check_optional_name,
    ))
    account: str | None = field(default=None, metadata=meta(
        "Account for slot jobs (--account); null = the submitting user's default account.",
        check=check_optional_name,
    ))
    command_timeout_s: float = field(default=10.0, metadata=meta(
        "Seconds before a Slurm command (sinfo, squeue, sbatch, scancel) counts as failed (a "
        "retryable error: the daemon keeps its last good snapshot).",
        gt=0, max=600,
    ))
    max_slot_time_s: float = field(default=3600.0, metadata=meta(
        "--time of a slot job on a node whose idle window is unbounded (nothing planned); a "
        "slot on a bounded window gets no more than that window.",
        min=60, max=7 * 24 * 3600,
    ))
    min_slot_time_s: float = field(default=60.0, metadata=meta(
        "Holes predicted shorter than this are not scavenged (Slurm's --time has minute "
        "granularity, and a rescale must have time to pay off).",
        min=60, max=24 * 3600,
    ))
    yield_ahead_s: float = field(default=10.0, metadata=meta(
        "A scavenged node that a regular job is planned to take within this many seconds (or "
        "should already have taken) is given back at once, without waiting for Slurm to "
        "preempt its slot; 0 = only when the plan is overdue. Capped at min_slot_time_s.",
        min=0, max=600,
    ))
    yield_confirm_s: float = field(default=1.0, metadata=meta(
        "A regular job planned onto scavenged nodes the moment it is submitted is left to "
        "Slurm's own preemption for this many seconds after its submission (Slurm's next "
        "scheduling or backfill pass; it often preempts other nodes than the plan names); "
        "only if it still waits then are the planned nodes given back. About the larger of "
        "1 s and bf_interval; 0 = give back at once.",
        min=0, max=60,
    ))
    yield_unplanned_s: float = field(default=10.0, metadata=meta(
        "A regular job still pending with no plan from Slurm yield_confirm_s after its "
        "submission, whose nodes scavenger slots hold, gets them given back at once, until "
        "this many seconds after its submission (later, something else blocks it). Free "
        "nodes such a job is about to take are not scavenged meanwhile. 0 = off.",
        min=0, max=600,
    ))
    arrival_probe_s: float = field(default=0.25, metadata=meta(
        "Between ticks, while scavenger slots hold nodes, ask Slurm for the ids of pending "
        "jobs this often (one short squeue answer) and start a tick at once when a new one "
        "appears, so that what is given back to a new regular job does not wait for the "
        "next tick. 0 = off (new jobs are seen at the next tick).",
        min=0, max=60,
    ))
    submit_notice: Path | None = field(default=None, metadata=meta(
        "The file slurm/job_submit.lua rewrites at every job submission (slurmctld with "
        "JobSubmitPlugins=lua; docs/install.md). Set, the arrival probe asks Slurm only when "
        "it changed, not every arrival_probe_s; unusable (missing, not a regular file, "
        "writable by group or others), it polls as without it. null = no notice.",
        restart=True,
    ))
    slurm_conf: Path | None = field(default=None, metadata=meta(
        "SLURM_CONF for every Slurm command; null = the daemon's environment (or Slurm's "
        "default, /etc/slurm/slurm.conf).",
        restart=True,
    ))


#: A size seen live only during warm-up counts with at least this many seconds of it
#: (:attr:`malletrain.core.profiling.profiler.AdvisorSettings.min_warmup_evidence_s`).
LIVE_MIN_WARMUP_EVIDENCE_S = 10.0
#: The advisor's answers may be this old while evidence only grows at sizes already known
#: (:mod:`malletrain.core.profiling.answers`): a job's model is refitted at most every 30 s, not at
#: every report of any job of its kind; a new size or a measured cost refreshes it at once.
LIVE_PROFILE_REFRESH_S = 30.0

@dataclass(frozen=True)
class AllocatorSettings:
    """The observe -> decide -> act loop and the allocation policy."""

    tick_interval_s: float = field(default=5.0, metadata=meta(
        "Seconds between two ticks (one batched Slurm query, one decision). Events such as a "
        "preemption wake the loop earlier.",
        min=0.1, max=3600,
    ))
    policy: str = field(default="malletrain", metadata=meta(
        "Allocation policy, a name from malletrain.core.policies that needs no true "
        "throughput curves: malletrain (curves learned online) or equal-share.",
        check=check_policy,
    ))
    horizon_s: float = field(default=1800.0, metadata=meta(
        "malletrain's cap on any node's predicted idle window: beyond it nothing is "
        "predictable, so an unbounded window counts as this long.",
        min=1, max=7 * 24 * 3600,
    ))
    default_scale_up_s: float = field(default=3.0, metadata=meta(
        "Assumed cost of growing a job (seconds of lost progress) until the Profiling Advisor "
        "has measured it.",
        min=0, max=3600,
    ))
    default_scale_down_s: float = field(default=1.0, metadata=meta(
        "Assumed cost of shrinking a job until measured.",
        min=0, max=3600,
    ))
    warmup_s: float = field(default=30.0, metadata=meta(
        "Progress reported within this many seconds after a job changed size is warm-up "
        "(rendezvous, first slow steps): the Profiling Advisor does not learn rates from it.",
        min=0, max=3600,
    ))

    node_prices: Mapping[str, float] = field(default_factory=dict, metadata=meta(
        "Price of a node-second per node type (the TYPE `malletrain nodes` shows: a GPU "
        "model, or cpu for nodes without GPUs; a type not named costs nothing), in a job's "
        "own work: a node priced p is used only where it adds more than p times the job's "
        "one-node throughput on its best type. A job with --rate-target then meets it on the "
        "cheapest nodes (HeterPS's cost objective). Empty: every idle node is free.",
        check=check_prices,
    ))

    def policy_options(self) -> PolicyOptions:
        """The knobs of :func:`malletrain.core.policies.make_policy` from these settings.

        Prices are in each job's own one-node work, so with prices the plan counts work in
        those units (``work_units``): a job's samples/s alone would make a fast job's nodes
        worth more than a slow job's at the same price."""
        return LIVE.with_(horizon_s=self.horizon_s, work_units=bool(self.node_prices))

    def prices_by_node_type(self) -> dict[str, float]:
        """``node_prices`` keyed as ``core.scavenger.node_type`` names types (cpu: "")."""
        return {("" if t == CPU_NODE_TYPE else t): p for t, p in self.node_prices.items()}

    def advisor_settings(self) -> AdvisorSettings:
        """The Profiling Advisor's settings
        (:class:`malletrain.core.profiling.profiler.AdvisorSettings`)."""
        return AdvisorSettings(
            default_scale_up_s=self.default_scale_up_s,
            default_scale_down_s=self.default_scale_down_s,
            warmup_s=self.warmup_s,
            # Live, a stint of a few seconds at a new size is mostly the rendezvous stall:
            # counted as throughput it flattened the curve and the daemon stopped regrowing
            # jobs (docs/daemon.md). Replays keep the core default (every stint counts).
            min_warmup_evidence_s=LIVE_MIN_WARMUP_EVIDENCE_S,
            refresh_s=LIVE_PROFILE_REFRESH_S,
        )


@dataclass(frozen=True)
class StateSettings:
    """What survives a daemon restart."""

    database_path: Path = field(default=Path("/var/lib/malletrain/state.db"), metadata=meta(
        "SQLite database (WAL) with the job queue, profiles and lifecycle history. Must be on "
        "a local disk of the login node (SQLite locking over NFS is unreliable).",
        restart=True,
    ))
    snapshot_dir: Path = field(default=Path("/var/lib/malletrain/snapshots"), metadata=meta(
        "Where a job evicted to zero nodes keeps its training state until it gets nodes "
        "again, and a job on one node its guard snapshot (one file per job: that node's loss "
        "would take every replica); must be reachable by the job's workers (a parallel file "
        "system on a real cluster).",
    ))
    keep_ended_jobs: int = field(default=1000, metadata=meta(
        "Ended jobs (completed, cancelled, failed) kept with their history for `malletrain "
        "jobs` and audits; older ones are deleted with their slots, history and actions, so "
        "the database stays bounded however many jobs come and go.",
        min=0, max=10_000_000,
    ))
    keep_ended_jobs_per_user: int = field(default=100, metadata=meta(
        "Of these, at most this many per user (the newest): one user's jobs coming and going "
        "never push other users' history out of `keep_ended_jobs`.", min=0, max=10_000_000))
    first_job_number: int = field(default=1000, metadata=meta(
        "The first job's number in a new database (Slurm's FirstJobId): scripts take ports "
        "from $SLURM_JOB_ID's last 4 digits.", min=1, max=1_000_000_000, restart=True))


@dataclass(frozen=True)
class CoordinatorSettings:
    """The elastic rendezvous, hosted by the daemon (never on a preemptible node)."""

    host: str = field(default="127.0.0.1", metadata=meta(
        "Address the coordinator listens on; compute nodes must reach it. On a real cluster "
        "use the login node's address on the cluster network.",
        check=check_host, restart=True,
    ))
    port: int = field(default=29400, metadata=meta(
        "TCP port of the coordinator; 0 = any free port.",
        min=0, max=65535, restart=True,
    ))
    heartbeat_timeout_s: float = field(default=30.0, metadata=meta(
        "A job whose workers have sent no progress report for this long is considered hung.",
        gt=0, max=24 * 3600,
    ))


@dataclass(frozen=True)
class SubmitSettings:
    """The channel users submit through (a Unix socket: the kernel says who is calling)."""

    socket_path: Path = field(default=Path("/run/malletrain/submit.sock"), metadata=meta(
        "Unix stream socket for malletrain submit/jobs/cancel; peer credentials (SO_PEERCRED) "
        "identify the user.",
        check=check_socket_path, restart=True,
    ))


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus endpoint."""

    enabled: bool = field(default=True, metadata=meta("Serve /metrics.", restart=True))
    address: str = field(default="127.0.0.1:9464", metadata=meta(
        "HOST:PORT to serve /metrics on ([::1]:9464 for IPv6; 0.0.0.0:9464 for every "
        "interface; port 0 = any free port).",
        check=check_address, restart=True,
    ))
    password_file: Path | None = field(default=None, metadata=meta(
        "A file (not readable by others) with the password Prometheus sends (basic auth) to "
        "see the per-job series where Slurm's PrivateData hides jobs; null = nobody sees "
        "them there (docs/security.md).", restart=True))

    @property
    def host(self) -> str:
        return parse_address(self.address)[0]

    @property
    def port(self) -> int:
        return parse_address(self.address)[1]


@dataclass(frozen=True)
class LoggingSettings:
    """Logs go to stderr (the journal under systemd)."""

    level: LogLevel = field(default="INFO", metadata=meta(
        "DEBUG, INFO, WARNING, ERROR or CRITICAL (case-insensitive).",
    ))
    format: LogFormat = field(default="text", metadata=meta(
        "text (one readable line) or json (one JSON object per line).",
    ))


@dataclass(frozen=True)
class LimitsSettings:
    """What users may ask of the daemon; submissions beyond these are refused with a reason."""

    max_jobs_per_user: int = field(default=8, metadata=meta(
        "Malleable jobs one user may have queued or running.",
        min=1, max=100_000,
    ))
    max_jobs_total: int = field(default=100, metadata=meta(
        "Malleable jobs in the daemon at once, all users together.",
        min=1, max=1_000_000,
    ))
    max_nodes_per_job: int = field(default=64, metadata=meta(
        "Largest --max-nodes a job may request.",
        min=1, max=1_000_000,
    ))
    max_time_s: float | None = field(default=None, metadata=meta(
        "Largest --time (total wall time) a job may request; null = no limit.",
        gt=0,
    ))


@dataclass(frozen=True)
class DaemonSettings:
    """Process-level behaviour."""

    stop_timeout_s: float = field(default=20.0, metadata=meta(
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
    accounting: AccountingSettings = field(default_factory=AccountingSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)

    def policy_options(self) -> PolicyOptions:
        """The allocator's knobs with the accounting section's division among users."""
        return self.allocator.policy_options().with_(**self.accounting.division())


def cross_checks(s: Settings) -> list[tuple[str, str]]:
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

