"""The malletrain daemon: observe -> decide -> act, every tick, against real Slurm.

One tick (:meth:`Daemon.tick`):

* observe: ONE batched Slurm snapshot (kept when Slurm does not answer, via
  :class:`~malletrain.slurm.backend.SnapshotCache`), the store's jobs and slots, and per job
  the coordinator's membership, live registrations, newest progress report and finish record;
* feed progress to the Job Monitor / Profiling Advisor;
* ``decide(world, policy) -> TickPlan`` (pure, :mod:`malletrain.daemon.decide`);
* act: :class:`~malletrain.daemon.actuator.Actuator` applies and records the actions;
* publish a metrics snapshot (read by Prometheus at scrape time).

The coordinator (the membership store the workers talk to) runs as a SEPARATE process,
started detached by the daemon when none answers at the configured address, so that a
``kill -9`` of the daemon does not touch training: the workers keep stepping, and the
restarted daemon attaches to the same coordinator, reads the store (SQLite) and Slurm, and
carries on. Signals: SIGTERM/SIGINT stop the loop after the tick in progress (its Slurm
actions finish and are recorded); SIGHUP reloads the config between ticks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from malletrain.core.cluster import ClusterSnapshot, JobState
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import ThroughputModel
from malletrain.core.policies import PolicyOptions, make_policy
from malletrain.core.profiler import ProfilingAdvisor
from malletrain.daemon.actuator import Actuator
from malletrain.daemon.arrivals import ArrivalProbe
from malletrain.daemon.channel import ChannelServer, Peer
from malletrain.daemon.decide import (
    CoordView,
    DecideSettings,
    JobModel,
    Registration,
    TickPlan,
    World,
    decide,
)
from malletrain.daemon.slots import SlotStatus, parse_tag, slot_tag
from malletrain.daemon.spec import JobSpec, SpecError
from malletrain.daemon.store import JobRecord, Store
from malletrain.errors import PermanentError, RetryableError
from malletrain.ops.metrics import JobStatus, Metrics, MetricsSnapshot
from malletrain.ops.settings import Settings
from malletrain.slurm.backend import SlurmBackend, SnapshotCache

log = logging.getLogger(__name__)

#: a job stuck in "submitting" this long (its submit command died) is given up.
SUBMIT_TIMEOUT_S = 600.0
#: terminal jobs are still looked at this long (to cancel leftover slot jobs).
TERMINAL_LINGER_S = 600.0
#: Seconds to the next tick while nodes are being given back ahead of a regular job
#: (``TickPlan.follow_up``): its backfill plan moves each pass and may name more of our
#: nodes; e2e runs saw a second give-back wait one whole 1 s tick, which the job waited too.
FOLLOW_UP_TICK_S = 0.25
#: What a live cluster needs beyond a replay (docs/allocator.md, "Live robustness"): a fixed
#: 10 % keep margin on top of the measured rate noise (co-location and placement make live
#: rates move between measurements; without it two jobs traded nodes on the dev cluster) and
#: a hole-model prior floor (a small cluster's few holes are not representative). Measured:
#: the e2e test passed with these; without them the jobs did not regrow after the batch job.
LIVE_POLICY = {"keep_margin": 0.1, "hole_prior_floor": 0.1}


def decide_settings(settings: Settings, **overrides: float) -> DecideSettings:
    base = DecideSettings(
        scavenger_partition=settings.slurm.scavenger_partition,
        min_slot_time_s=settings.slurm.min_slot_time_s,
        max_slot_time_s=settings.slurm.max_slot_time_s,
        yield_ahead_s=settings.slurm.yield_ahead_s,
        yield_confirm_s=settings.slurm.yield_confirm_s,
        yield_unplanned_s=settings.slurm.yield_unplanned_s,
        heartbeat_timeout_s=settings.coordinator.heartbeat_timeout_s,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- coordinator


def _coordinator_files(settings: Settings) -> tuple[Path, Path, Path]:
    base = settings.state.database_path.parent
    return base / "coordinator.addr", base / "coordinator.pid", base / "coordinator.log"


def ensure_coordinator(settings: Settings, timeout_s: float = 60.0) -> Any:
    """Attach to the running coordinator, or start one detached and attach to it."""
    from malletrain.elastic.coordinator import Coordinator

    addr_file, pid_file, log_file = _coordinator_files(settings)
    candidates = []
    if addr_file.exists():
        candidates.append(addr_file.read_text().strip())
    if settings.coordinator.port:
        candidates.append(f"{settings.coordinator.host}:{settings.coordinator.port}")
    for address in candidates:
        try:
            coord = Coordinator.attach(address, timeout_s=2.0)
            log.info("attached to the running coordinator at %s", address)
            return coord
        except (RetryableError, PermanentError) as exc:
            log.info("no coordinator at %s (%s)", address, exc)
    addr_file.unlink(missing_ok=True)
    addr_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "malletrain.cli", "coordinator",
            "--host", settings.coordinator.host, "--port", str(settings.coordinator.port),
            "--address-file", str(addr_file)]
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PermanentError(f"the coordinator exited at start (see {log_file})")
        if addr_file.exists() and addr_file.read_text().strip():
            address = addr_file.read_text().strip()
            log.info("started the coordinator (pid %d) at %s", proc.pid, address)
            return Coordinator.attach(address, timeout_s=10.0)
        time.sleep(0.1)
    raise RetryableError(f"the coordinator did not come up within {timeout_s:.0f} s")


def stop_coordinator(settings: Settings) -> None:
    """Stop a coordinator started by :func:`ensure_coordinator` (demo/tests; not on restart)."""
    import signal as _signal

    addr_file, pid_file, _ = _coordinator_files(settings)
    if pid_file.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().strip()), _signal.SIGTERM)
        pid_file.unlink(missing_ok=True)
    addr_file.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- daemon


@dataclass(frozen=True)
class JobRow:
    """One line of ``malletrain jobs``."""

    job_id: str
    user: str
    name: str
    state: str
    nodes: tuple[str, ...]
    #: members of the current membership (nodes actually training; <= len(nodes))
    members: int
    min_nodes: int
    max_nodes: int
    samples_total: int
    samples_per_s: float
    profile_points: int
    rescales_up: int
    rescales_down: int
    preemptions: int
    message: str


def _policy_options(settings: Settings) -> PolicyOptions:
    return replace(settings.allocator.policy_options(), **LIVE_POLICY)


class Daemon:
    def __init__(
        self,
        settings: Settings,
        backend: SlurmBackend,
        *,
        metrics: Metrics | None = None,
        coordinator: Any = None,
        decide_overrides: Mapping[str, float] | None = None,
        wake: Any = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.cache = SnapshotCache(backend, max_age_s=600.0)
        self.store = Store(settings.state.database_path)
        self.metrics = metrics
        self.coordinator = coordinator if coordinator is not None else ensure_coordinator(settings)
        self._decide_overrides = dict(decide_overrides or {})
        self.policy = make_policy(settings.allocator.policy, _policy_options(settings))
        self._restore_policy_state()
        self.advisor = ProfilingAdvisor(settings.allocator.advisor_settings())
        for kind, data in self.store.profiles().items():
            try:
                self.advisor.load_profile(kind, data)
            except ValueError as exc:
                log.warning("stored profile %r ignored: %s", kind, exc)
        self.actuator = Actuator(backend, self.store, self.coordinator,
                                 on_slurm_call=self._slurm_call)
        self._wake = wake
        self._last_progress: dict[str, tuple[float, int]] = {}
        self._last_plan: TickPlan | None = None
        self._rows_lock = threading.Lock()
        self._job_nodes: dict[str, tuple[str, ...]] = {}
        self._job_members: dict[str, int] = {}
        self._profile_points: dict[str, int] = {}
        #: for the arrival probe (daemon/arrivals.py): the last snapshot's job ids, and
        #: whether any node is held (only then can a new job's start wait for the daemon)
        self.seen_job_ids: frozenset[int] = frozenset()
        self.holds_nodes = False
        #: the JSON last written per ("profile", kind) / ("policy", name): save only changes
        self._saved: dict[tuple[str, str], str] = {}
        self.instance = self._instance_id()
        self.state_dir = settings.state.snapshot_dir / self.instance
        self._prepare_state_dir()
        interrupted = self.store.open_actions()
        if interrupted:
            log.warning("%d Slurm action(s) were interrupted by the last stop (e.g. kill -9): "
                        "%s; reconciling from Slurm", len(interrupted),
                        ", ".join(f"{a['kind']} {a['detail']}" for a in interrupted[:5]))
            self.store.close_open_actions("interrupted; reconciled from Slurm at restart")

    def apply_settings(self, settings: Settings) -> None:
        """A reloaded config (between ticks): a changed policy is rebuilt at once."""
        old = self.settings.allocator
        self.settings = settings
        new = settings.allocator
        if (new.policy, new.policy_options()) != (old.policy, old.policy_options()):
            self._save_policy_state()
            self.policy = make_policy(new.policy, _policy_options(settings))
            self._restore_policy_state()
            log.info("allocation policy is now %s", new.policy)

    def _restore_policy_state(self) -> None:
        """Give the policy what it learned before (a restart or a reload rebuilds it)."""
        load = getattr(self.policy, "load_state", None)
        if load is None:
            return
        data = self.store.policy_state(self.policy.name)
        if data is None:
            return
        try:
            load(data)
            log.info("policy %s: learned state restored from the store", self.policy.name)
        except ValueError as exc:
            log.warning("stored state of policy %s ignored: %s", self.policy.name, exc)

    def _save_policy_state(self) -> None:
        dump = getattr(self.policy, "state_dict", None)
        if dump is None:
            return
        data = dump()
        text = json.dumps(data, sort_keys=True)
        if self._saved.get(("policy", self.policy.name)) != text:
            self.store.save_policy_state(self.policy.name, data)
            self._saved[("policy", self.policy.name)] = text

    def _instance_id(self) -> str:
        path = self.settings.state.database_path.parent / "instance"
        if path.exists():
            return path.read_text().strip()
        token = secrets.token_hex(4)
        path.write_text(token + "\n")
        return token

    def _prepare_state_dir(self) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.state_dir.chmod(0o1777)  # written by the jobs' users, like /tmp
        except OSError as exc:
            log.warning("cannot prepare %s for evicted-job state: %s", self.state_dir, exc)

    def _slurm_call(self, name: str, seconds: float, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.observe_slurm_call(name, seconds, ok)

    def _wake_loop(self) -> None:
        if self._wake is not None:
            self._wake()

    # ------------------------------------------------------------------ observe

    def _observe_coordinator(self, jobs: list[JobRecord]) -> dict[str, CoordView]:
        out: dict[str, CoordView] = {}
        for job in jobs:
            if job.state in (JobPhase.SUBMITTING,) or job.state.terminal:
                continue
            jid = job.job_id
            try:
                m = self.coordinator.membership(jid)
                live = self.coordinator.live_members(jid)
                prog = self.coordinator.progress(jid)
                fin = self.coordinator.result(jid)
                gone = self.coordinator.departures(jid)
            except Exception as exc:  # the store may be restarting; keep going
                log.warning("coordinator read for %s failed: %s", jid, exc)
                continue
            out[jid] = CoordView(
                epoch=m.epoch if m else 0,
                members=tuple(m.members) if m else (),
                live={k: Registration(v.node, v.registered_at_s) for k, v in live.items()},
                departed={d.member_id: d.time_s for d in gone},
                sigtermed=frozenset(d.member_id for d in gone if d.reason == "sigterm"),
                samples_total=prog.samples_total if prog else None,
                samples_per_s=prog.samples_per_s if prog else 0.0,
                progress_at_s=prog.time_s if prog else None,
                finished_samples=fin.samples_total if fin else None,
            )
            self._monitor(job, out[jid], prog)
        return out

    def _monitor(self, job: JobRecord, cv: CoordView, prog: Any) -> None:
        """Job Monitor: progress reports feed the Profiling Advisor and the store."""
        if prog is None:
            return
        last = self._last_progress.get(job.job_id)
        if last is not None and last[0] == prog.time_s:
            return
        self.advisor.register(job.job_id, job.spec.kind)
        nodes = max(1, len(prog.members) or prog.world_size // max(1, job.spec.nproc_per_node))
        # A report without new samples (the group is forming, or a step is slower than the
        # report interval) says nothing about throughput; feeding it would teach the advisor
        # a rate of 0 and make the allocator evict a job that merely started. Hangs are the
        # stalled-job detector's business, not the curve's.
        if last is None or prog.samples_total > last[1]:
            self._last_progress[job.job_id] = (prog.time_s, prog.samples_total)
            self.advisor.observe(job.job_id, prog.time_s, nodes, float(prog.samples_total))
        total = prog.samples_total if cv.finished_samples is None else cv.finished_samples
        self.store.update_job(job.job_id, samples_total=int(total),
                              samples_per_s=float(prog.samples_per_s),
                              last_progress_s=float(prog.time_s))

    def _models(self, jobs: list[JobRecord]) -> dict[str, JobModel]:
        out = {}
        for job in jobs:
            self.advisor.register(job.job_id, job.spec.kind)
            up, down = self.advisor.scale_costs(job.job_id)
            start = self.advisor.start_cost_s(job.job_id)
            model = self.advisor.model(job.job_id)
            if model.rate(job.spec.max_nodes) <= 0.0:
                # nothing measured worth the name yet: compete as a linear job, never as
                # "worth nothing" (that would evict it)
                model = ThroughputModel(((1, 1.0),), optimistic_slope=1.0)
            # how far the curve is measured: the policy explores beyond it on free nodes only
            model = replace(model, measured_max_nodes=max(
                self.advisor.measured_sizes(job.job_id), default=0))
            out[job.job_id] = JobModel(model, up, down, start,
                                       self.advisor.rate_noise(job.job_id))
        return out

    # ------------------------------------------------------------------ tick

    def tick(self) -> TickPlan | None:
        t0 = time.monotonic()
        try:
            snap = self.cache.refresh()
        except Exception as exc:
            log.warning("no Slurm snapshot this tick (and none recent to fall back on): %s", exc)
            self._publish_metrics(None, slurm_up=False)
            return None
        now = time.time()
        recent = now - TERMINAL_LINGER_S
        jobs = [j for j in self.store.jobs()
                if not j.state.terminal or j.lifecycle.since_s() > recent]
        self._expire_submissions(jobs, snap, now)
        coord = self._observe_coordinator(jobs)
        with self._rows_lock:
            self._job_members = {jid: len(cv.members) for jid, cv in coord.items()}
            # read by the channel's threads: never let them touch the advisor itself
            self._profile_points = {j.job_id: len(self.advisor.measured_sizes(j.job_id))
                                    for j in jobs if j.state.active}
        jobs = [self.store.job(j.job_id) or j for j in jobs]  # progress just written
        slots = {j.job_id: tuple(self.store.slots(j.job_id)) for j in jobs}
        world = World(
            now_s=now, snapshot=snap, jobs=tuple(jobs), slots=slots, coord=coord,
            models=self._models([j for j in jobs if j.state.active]),
            settings=decide_settings(self.settings, **self._decide_overrides),
            hole_start_s=self._last_plan.hole_start_s if self._last_plan else {},
        )
        td = time.monotonic()
        plan = decide(world, self.policy)
        if self.metrics is not None:
            self.metrics.observe_decision(time.monotonic() - td)
        self._remember_slots(plan)
        if self._last_plan is None or plan.targets != self._last_plan.targets:
            log.info("plan: %s", "; ".join(f"{j}: {','.join(ns) or '-'}"
                                          for j, ns in sorted(plan.targets.items())) or "-")
            log.debug("plan input: models %s free %s held %s", world.models, plan.free_nodes,
                      plan.held_nodes)
        seen = set(self._last_plan.notes) if self._last_plan else set()
        for note in plan.notes:
            if note not in seen:  # a standing condition is logged when it starts, not per tick
                log.info("%s", note)
        outcome = self.actuator.apply(plan.actions)
        for jid, old, new in outcome.rescales:
            if old != new:
                self.advisor.rescaled(jid, time.time(), old, new)
        for jid, state in outcome.transitions:
            if state in (JobPhase.COMPLETED, JobPhase.CANCELLED, JobPhase.FAILED):
                self._job_done(jid)
        if self.metrics is not None:
            if outcome.preemptions:
                self.metrics.count_preemption(outcome.preemptions)
            for y in outcome.yields_s:
                self.metrics.observe_yield(y)
        self._last_plan = plan
        self.seen_job_ids = frozenset(j.job_id for j in snap.jobs)
        self.holds_nodes = bool(plan.held_nodes) or any(plan.targets.values())
        self._publish_metrics(plan, slurm_up=not self.cache.stale, snap=snap)
        self._save_profiles()
        if self.metrics is not None:
            self.metrics.observe_tick(time.monotonic() - t0)
        if plan.actions:
            log.debug("tick: %d action(s) in %.3f s", len(plan.actions), time.monotonic() - t0)
        return plan

    def _remember_slots(self, plan: TickPlan) -> None:
        """Record what each slot was seen doing (preemption = running, then ended unasked)."""
        nodes: dict[str, tuple[str, ...]] = {}
        for jid, views in plan.slot_views.items():
            recs = {r.slot: r for r in self.store.slots(jid)}
            mine = []
            for v in views:
                rec = recs.get(v.slot)
                if rec is None:
                    continue
                if v.status is SlotStatus.RUNNING:
                    mine.append(v.node or "?")
                    if rec.last_status != "running" or rec.last_node != v.node:
                        self.store.mark_slot(jid, v.slot, last_status="running",
                                             last_node=v.node)
                elif v.status in (SlotStatus.PARKED, SlotStatus.PLACING, SlotStatus.CANCELLED,
                                  SlotStatus.GONE) and rec.last_status != v.status.value:
                    self.store.mark_slot(jid, v.slot, last_status=v.status.value)
            nodes[jid] = tuple(sorted(mine))
        with self._rows_lock:
            self._job_nodes = nodes

    def _expire_submissions(self, jobs: list[JobRecord], snap: ClusterSnapshot, now: float
                            ) -> None:
        for job in jobs:
            if job.state is JobPhase.SUBMITTING and now - job.created_s > SUBMIT_TIMEOUT_S:
                for sj in snap.jobs:
                    tag = parse_tag(sj.comment)
                    if tag and tag[0] == job.job_id and sj.state.is_active:
                        self.backend.cancel(sj.job_id)
                self.store.transition(job.job_id, JobPhase.FAILED,
                                      "the submit command never attached its slot jobs")

    def _job_done(self, job_id: str) -> None:
        rec = self.store.job(job_id)
        self.advisor.forget(job_id)
        if rec is not None:
            data = self.advisor.profile_dict(rec.spec.kind)
            if data is not None:
                self.store.save_profile(rec.spec.kind, data)
        try:
            self.coordinator.forget(job_id)
        except Exception as exc:
            log.warning("coordinator forget %s: %s", job_id, exc)

    def _save_profiles(self) -> None:
        """Persist what was learned, every tick, but only what changed since the last save.

        Each kind's profile and the policy's state are small JSON documents, so comparing
        them each tick is cheap, and a ``kill -9`` loses no measurement: with a 30 s save
        interval a restarted daemon had forgotten the 2-node rate it had just measured and
        re-learned it from a one-second, stalled stint (docs/daemon.md).
        """
        self._save_policy_state()
        kinds = {j.spec.kind for j in self.store.jobs(include_terminal=False)}
        for kind in kinds:
            data = self.advisor.profile_dict(kind)
            if data is None:
                continue
            text = json.dumps(data, sort_keys=True)
            if self._saved.get(("profile", kind)) != text:
                self.store.save_profile(kind, data)
                self._saved[("profile", kind)] = text

    def _publish_metrics(self, plan: TickPlan | None, *, slurm_up: bool,
                         snap: ClusterSnapshot | None = None) -> None:
        if self.metrics is None:
            return
        if plan is None or snap is None:
            old = self.metrics.snapshot
            if old is not None:
                self.metrics.publish(replace(old, slurm_up=False, time_s=time.time()))
            return
        part = self.settings.slurm.scavenger_partition
        total = sum(1 for n in snap.nodes if part in n.partitions)
        horizon = self.settings.slurm.max_slot_time_s
        scavenged = sum(1 for vs in plan.slot_views.values() for v in vs
                        if v.status is SlotStatus.RUNNING)
        windows = [n.window_s for n in plan.free_nodes + plan.held_nodes]
        predicted = sum(horizon if w is None else min(w, horizon) for w in windows)
        with self._rows_lock:
            job_nodes = dict(self._job_nodes)
        jobs = tuple(
            JobStatus(job_id=j.job_id, user=j.user, state=j.state.value,
                      nodes=len(job_nodes.get(j.job_id, ())), samples_per_s=j.samples_per_s,
                      samples_total=j.samples_total, rescales_up=j.rescales_up,
                      rescales_down=j.rescales_down)
            for j in self.store.jobs(include_terminal=False)
        )
        self.metrics.publish(MetricsSnapshot(
            time_s=time.time(), total_nodes=total, idle_nodes=len(plan.free_nodes),
            scavenged_nodes=scavenged, predicted_idle_node_seconds=predicted, jobs=jobs,
            slurm_up=slurm_up,
        ))

    # ------------------------------------------------------------------ requests

    def handle(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "submit":
            return self._submit(peer, req)
        if op == "attach":
            return self._attach(peer, req)
        if op == "abort":
            return self._abort(peer, req)
        if op == "jobs":
            return {"jobs": [asdict(row) for row in self.rows()]}
        if op == "cancel":
            return self._cancel(peer, req)
        raise PermanentError(f"unknown request {op!r}")

    def _submit(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        spec = JobSpec.from_dict(req.get("spec"))
        lim = self.settings.limits
        if spec.max_nodes > lim.max_nodes_per_job:
            raise SpecError(f"--max-nodes {spec.max_nodes} is above this site's limit of "
                            f"{lim.max_nodes_per_job}")
        if lim.max_time_s is not None and (spec.time_limit_s is None
                                           or spec.time_limit_s > lim.max_time_s):
            raise SpecError(f"--time must be at most {lim.max_time_s:.0f} s at this site")
        if self.store.count_jobs(peer.uid) >= lim.max_jobs_per_user:
            raise RetryableError(f"you already have {lim.max_jobs_per_user} malleable jobs "
                                 "(limits.max_jobs_per_user); wait for one to finish")
        if self.store.count_jobs() >= lim.max_jobs_total:
            raise RetryableError("the daemon is full (limits.max_jobs_total); try later")
        rec = self.store.create_job(peer.uid, peer.user, spec)
        log.info("job %s submitted by %s (uid %d): %s, %d-%d nodes", rec.job_id, peer.user,
                 peer.uid, spec.name, spec.min_nodes, spec.max_nodes)
        return {
            "job_id": rec.job_id,
            "coordinator": self.coordinator.address,
            "state_dir": str(self.state_dir),
            "partition": self.settings.slurm.scavenger_partition,
            "qos": self.settings.slurm.qos,
            "account": self.settings.slurm.account,
        }

    def _own(self, peer: Peer, req: Mapping[str, Any]) -> JobRecord:
        job_id = req.get("job_id")
        if not isinstance(job_id, str) or len(job_id) > 64:
            raise PermanentError("job_id: expected a job id like m12")
        rec = self.store.job(job_id)
        if rec is None:
            raise PermanentError(f"no job {job_id}")
        if rec.uid != peer.uid and peer.uid != 0:
            raise PermanentError(f"job {job_id} belongs to {rec.user}, not to you")
        return rec

    def _attach(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        rec = self._own(peer, req)
        if rec.uid != peer.uid:
            raise PermanentError("only the job's owner attaches its slot jobs")
        if rec.state is not JobPhase.SUBMITTING:
            raise PermanentError(f"job {rec.job_id} is {rec.state.value}, not submitting")
        ids = req.get("slots")
        if (not isinstance(ids, list) or len(ids) != rec.spec.max_nodes
                or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0
                           for i in ids) or len(set(ids)) != len(ids)):
            raise PermanentError(f"slots: expected {rec.spec.max_nodes} distinct Slurm job ids")
        snap = self.backend.snapshot()  # fresh: the slots were submitted a moment ago
        for k, sid in enumerate(ids):
            sj = snap.job(sid)
            problem = None
            if sj is None:
                problem = "is unknown to Slurm"
            elif sj.user != peer.user:
                problem = f"belongs to {sj.user}, not to {peer.user}"
            elif sj.comment != slot_tag(rec.job_id, k):
                problem = f"is not tagged {slot_tag(rec.job_id, k)!r}"
            elif sj.partition != self.settings.slurm.scavenger_partition:
                problem = f"is in partition {sj.partition}, not the scavenger partition"
            elif sj.state is not JobState.PENDING or sj.node_count > 1:
                problem = "is not a pending single-node job"
            if problem:
                raise PermanentError(f"slot job {sid} {problem}")
        self.store.add_slots(rec.job_id, list(ids))
        self.store.transition(rec.job_id, JobPhase.QUEUED,
                              f"{len(ids)} slot jobs attached ({ids[0]}..{ids[-1]})")
        self._wake_loop()
        return {"job_id": rec.job_id}

    def _abort(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        rec = self._own(peer, req)
        if rec.state is JobPhase.SUBMITTING:
            self.store.transition(rec.job_id, JobPhase.CANCELLED, "submission aborted")
        return {"job_id": rec.job_id}

    def _cancel(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        rec = self._own(peer, req)
        if rec.state.terminal or rec.state in (JobPhase.CANCELLING, JobPhase.COMPLETING):
            return {"job_id": rec.job_id, "state": rec.state.value}
        to = JobPhase.CANCELLED if rec.state is JobPhase.SUBMITTING else JobPhase.CANCELLING
        self.store.transition(rec.job_id, to, f"cancelled by {peer.user}")
        self._wake_loop()
        return {"job_id": rec.job_id, "state": to.value}

    def rows(self) -> list[JobRow]:
        with self._rows_lock:
            job_nodes = dict(self._job_nodes)
            job_members = dict(self._job_members)
            points = dict(self._profile_points)
        out = []
        for j in self.store.jobs():
            out.append(JobRow(
                job_id=j.job_id, user=j.user, name=j.spec.name, state=j.state.value,
                nodes=job_nodes.get(j.job_id, ()) if not j.state.terminal else (),
                members=job_members.get(j.job_id, 0) if j.state.active else 0,
                min_nodes=j.spec.min_nodes, max_nodes=j.spec.max_nodes,
                samples_total=j.samples_total,
                samples_per_s=j.samples_per_s if j.state.active else 0.0,
                profile_points=points.get(j.job_id, 0) if j.state.active else 0,
                rescales_up=j.rescales_up, rescales_down=j.rescales_down,
                preemptions=j.preemptions, message=j.lifecycle.history[-1].reason,
            ))
        return out

    def close(self) -> None:
        self._save_profiles()
        self.store.close()


# ----------------------------------------------------------------------------- run


def run_daemon(settings: Settings, config_path: str | None, backend: SlurmBackend,
               *, decide_overrides: Mapping[str, float] | None = None) -> int:
    """The service's main loop (signals, reload, metrics, systemd notifications)."""
    from prometheus_client import CollectorRegistry

    from malletrain.ops.metrics import serve
    from malletrain.ops.service import ControlSignals, reload_config
    from malletrain.ops.systemd import Notifier

    signals = ControlSignals(stop_deadline_s=settings.daemon.stop_timeout_s)
    signals.install()
    notifier = Notifier.from_environment()
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server = serve(settings.metrics.address, registry) if settings.metrics.enabled else None
    daemon = Daemon(settings, backend, metrics=metrics, decide_overrides=decide_overrides,
                    wake=signals.wake)
    channel = ChannelServer(settings.submit.socket_path, daemon.handle).start()
    probe = ArrivalProbe(backend.pending_job_ids, signals.wake,
                         settings.slurm.arrival_probe_s).start()
    notifier.ready(f"scavenging through partition {settings.slurm.scavenger_partition}")
    log.info("daemon running (instance %s, coordinator %s, socket %s)", daemon.instance,
             daemon.coordinator.address, settings.submit.socket_path)
    try:
        while not signals.stop_requested:
            if signals.take_reload():
                settings = reload_config(config_path, settings, metrics=metrics,
                                         notifier=notifier)
                daemon.apply_settings(settings)
                probe.interval_s = settings.slurm.arrival_probe_s
            plan = None
            try:
                plan = daemon.tick()
            except Exception:
                log.exception("tick failed; the next tick starts from a fresh snapshot")
            probe.expect(daemon.seen_job_ids, armed=daemon.holds_nodes)
            notifier.watchdog()
            sleep_s = settings.allocator.tick_interval_s
            if plan is not None and plan.follow_up:
                sleep_s = min(sleep_s, FOLLOW_UP_TICK_S)
            signals.wait(notifier.max_sleep_s(sleep_s))
    finally:
        notifier.stopping("stopping: the tick in progress has finished")
        log.info("stopping (signal %s)", signals.stop_signal)
        channel.stop()
        probe.stop()
        if server is not None:
            server.stop()
        daemon.close()
        signals.restore()
    return 0

