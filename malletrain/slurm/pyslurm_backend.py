"""The pyslurm implementation of :class:`~malletrain.slurm.backend.SlurmBackend`.

Used only when :func:`~malletrain.slurm.backend.select_backend` finds pyslurm importable
and built for the cluster's Slurm version (pyslurm >= 23.2's object API: ``Nodes.load()``,
``Jobs.load()``, ``Partitions.load()``, ``Reservations.load()``, ``Job(id).cancel()``...).

HONEST STATUS: this adapter has never run against a real pyslurm.  Slurm here is 22.05 and
PyPI's pyslurm (25.11) refuses to build against it, so only the selection and fallback path
is tested; the attribute names follow pyslurm's documented object API and every read goes
through ``getattr`` with a default, mapping unknown values to ``UNKNOWN`` like the CLI
parser does.  Submission reuses the CLI's tested ``sbatch`` rendering because pyslurm
submits as the calling uid, while malletrain must submit as the job's user (runuser).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from malletrain.core.cluster import (
    ClusterSnapshot,
    Job,
    JobState,
    Node,
    NodeState,
    Partition,
    Reservation,
)
from malletrain.slurm.backend import CliBackend
from malletrain.slurm.commands import render_update
from malletrain.slurm.errors import SlurmCommandError, SlurmUnavailableError
from malletrain.slurm.hostlist import expand_hostlist
from malletrain.slurm.parsers.parse import with_gpus
from malletrain.slurm.parsers.parse_json import job_state, node_state
from malletrain.slurm.privacy import Privacy
from malletrain.slurm.sbatch import SbatchSpec

log = logging.getLogger(__name__)


def _values(collection: Any) -> Iterable[Any]:
    values = getattr(collection, "values", None)
    return values() if callable(values) else collection


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return expand_hostlist(value)
    return tuple(str(v) for v in value)


class PyslurmBackend:
    """Observe and act through pyslurm's C bindings instead of forking CLI clients."""

    name = "pyslurm"

    def __init__(self, pyslurm: Any, *, cli: CliBackend) -> None:
        self._ps = pyslurm
        self._cli = cli
        self.count_gpus = False

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            rpc_error = getattr(self._ps, "RPCError", None)
            if rpc_error is not None and isinstance(exc, rpc_error):
                text = str(exc).lower()
                if "unable to contact" in text or "timed out" in text or "connect" in text:
                    raise SlurmUnavailableError(f"pyslurm {what}: {exc}") from exc
                raise SlurmCommandError(f"pyslurm {what}: {exc}") from exc
            raise

    # -- observe ----------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        taken_at = time.time()
        warns: list[str] = []
        nodes = tuple(self._node(n, warns) for n in _values(self._call("Nodes.load",
                                                                         self._ps.Nodes.load)))
        jobs = tuple(self._job(j, warns) for j in _values(self._call("Jobs.load",
                                                                      self._ps.Jobs.load)))
        parts = tuple(self._partition(p) for p in _values(self._call("Partitions.load",
                                                                      self._ps.Partitions.load)))
        resvs = tuple(self._reservation(r) for r in _values(
            self._call("Reservations.load", self._ps.Reservations.load)))
        if self.count_gpus:  # the allocated TRES as squeue prints them, on every release
            jobs = with_gpus(jobs, self._cli.job_gpus())
        return ClusterSnapshot(taken_at=taken_at, nodes=nodes, partitions=parts, jobs=jobs,
                               reservations=resvs, warnings=tuple(warns))

    def pending_job_ids(self) -> frozenset[int]:
        # one short squeue answer; pyslurm would load every job's full record to filter them
        return self._cli.pending_job_ids()

    def privacy(self) -> Privacy:
        return self._cli.privacy()  # read rarely (once a minute): the CLI's parser serves

    def jobs(self, job_ids: Sequence[int]) -> tuple[Job, ...]:
        return self._cli.jobs(job_ids)  # a few jobs: one short squeue answer

    @staticmethod
    def _node(n: Any, warns: list[str]) -> Node:
        raw = str(getattr(n, "state", "UNKNOWN") or "UNKNOWN")
        base, *flag_list = raw.split("+")
        flags = frozenset(f.upper() for f in flag_list)
        state = node_state(base, flags)
        if state is NodeState.UNKNOWN and base.lower() != "unknown":
            warns.append(f"pyslurm: node {getattr(n, 'name', '?')}: unknown state {raw!r}")
        gres = getattr(n, "configured_gres", "") or ""
        return Node(
            name=str(n.name),
            state=state,
            flags=flags,
            partitions=tuple(getattr(n, "partitions", ()) or ()),
            cpus=int(getattr(n, "total_cpus", 0) or 0),
            features=tuple(getattr(n, "active_features", ()) or ()),
            gres=gres if isinstance(gres, str) else ",".join(f"{k}:{v}" for k, v in gres.items()),
            reason=str(getattr(n, "reason", "") or ""),
            last_busy_at=_epoch(getattr(n, "last_busy_time", None)),
        )

    @staticmethod
    def _job(j: Any, warns: list[str]) -> Job:
        raw = str(getattr(j, "state", "UNKNOWN") or "UNKNOWN")
        state = job_state(raw)
        if state is None:
            warns.append(f"pyslurm: job {getattr(j, 'id', '?')}: unknown state {raw!r}")
            state = JobState.UNKNOWN
        limit_min = getattr(j, "time_limit", None)
        pending = state is JobState.PENDING
        return Job(
            job_id=int(j.id),
            name=str(getattr(j, "name", "") or ""),
            user=str(getattr(j, "user_name", "") or ""),
            partition=str(getattr(j, "partition", "") or ""),
            state=state,
            state_reason=str(getattr(j, "state_reason", "") or ""),
            node_count=int(getattr(j, "num_nodes", 0) or 0),
            nodes=() if pending else _names(getattr(j, "allocated_nodes", None)),
            planned_nodes=_names(getattr(j, "scheduled_nodes", None)) if pending else (),
            time_limit_s=int(limit_min) * 60 if isinstance(limit_min, int) and limit_min > 0
            else None,
            submit_time=_epoch(getattr(j, "submit_time", None)),
            start_time=_epoch(getattr(j, "start_time", None)),
            end_time=_epoch(getattr(j, "end_time", None)),
            comment=str(getattr(j, "comment", "") or ""),
            account=str(getattr(j, "account", "") or ""),
            qos=str(getattr(j, "qos", "") or ""),
        )

    @staticmethod
    def _partition(p: Any) -> Partition:
        max_time = getattr(p, "max_time", None)
        preempt = getattr(p, "preempt_mode", "OFF") or "OFF"
        return Partition(
            name=str(p.name),
            nodes=_names(getattr(p, "nodes", None)),
            priority_tier=int(getattr(p, "priority_tier", 1) or 1),
            preempt_mode=preempt if isinstance(preempt, str) else ",".join(preempt),
            grace_time_s=int(getattr(p, "preempt_grace_time", 0) or 0),
            max_time_s=int(max_time) * 60 if isinstance(max_time, int) else None,
            default=bool(getattr(p, "is_default", False)),
            state=str(getattr(p, "state", "UP") or "UP"),
        )

    @staticmethod
    def _reservation(r: Any) -> Reservation:
        return Reservation(
            name=str(r.name),
            nodes=_names(getattr(r, "nodes", None)),
            start_time=_epoch(getattr(r, "start_time", None)) or 0.0,
            end_time=_epoch(getattr(r, "end_time", None)) or 0.0,
        )

    # -- act ---------------------------------------------------------------------------
    def submit(self, spec: SbatchSpec) -> int:
        return self._cli.submit(spec)

    def cancel(self, job_id: int, *, missing_ok: bool = True) -> None:
        try:
            self._call("cancel", self._ps.Job(int(job_id)).cancel)
        except SlurmCommandError:
            if not missing_ok:
                raise

    def signal(self, job_id: int, sig: str, *, steps: str = "children") -> None:
        self._call("send_signal", self._ps.Job(int(job_id)).send_signal, sig, steps)

    def hold(self, job_id: int) -> None:
        self._call("hold", self._ps.Job(int(job_id)).hold)

    def release(self, job_id: int) -> None:
        self._call("release", self._ps.Job(int(job_id)).release)

    def requeue_hold(self, job_id: int) -> None:
        self._call("requeue", self._ps.Job(int(job_id)).requeue, True)

    def update(self, job_id: int, **fields: str | int | Sequence[str]) -> None:
        # Field names and values are validated once, by the CLI renderer; the update itself
        # goes through scontrol so both backends accept exactly the same fields.
        render_update(job_id, fields)
        self._cli.update(job_id, **fields)
