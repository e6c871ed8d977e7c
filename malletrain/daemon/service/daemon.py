"""The malletrain daemon: observe -> decide -> act, every tick, against real Slurm.

One tick (:meth:`Daemon.tick`; each phase timed in ``malletrain_tick_phase_seconds``):

* observe: ONE batched Slurm snapshot (the last good one kept when Slurm does not answer:
  :class:`~malletrain.slurm.cache.SnapshotCache`), the store's jobs and slots, and per job
  what the coordinator says (:class:`~malletrain.daemon.observe.monitor.JobMonitor`, which also
  feeds progress to the Profiling Advisor);
* ``decide(world, policy) -> TickPlan`` (pure, :mod:`malletrain.daemon.tick`);
* act: :class:`~malletrain.daemon.act.actuator.Actuator` applies and records the actions, in
  the tick (tests, tools) or, in the service, off it (:mod:`.action_queue`);
* publish a metrics snapshot (read by Prometheus at scrape time) and save what was learned.

The loop around it is :mod:`.loop`; the coordinator process :mod:`.coordinator_proc`;
users' requests :mod:`.requests`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from malletrain.core.cluster import ClusterSnapshot
from malletrain.core.lifecycle import JobPhase
from malletrain.core.policies import make_policy
from malletrain.core.profiling.profiler import ProfilingAdvisor
from malletrain.core.scavenging.scavenger import node_type
from malletrain.daemon.act.action_queue import ActionQueue
from malletrain.daemon.act.actuator import ACTION_WORKERS, Actuator, Outcome, is_urgent
from malletrain.daemon.act.background import Background
from malletrain.daemon.jobs.store import JobRecord, SlotRecord, Store
from malletrain.daemon.jobs.store_files import instance_id, prepare_state_dir
from malletrain.daemon.observe.learned import LearnedState
from malletrain.daemon.observe.monitor import JobMonitor
from malletrain.daemon.service.coordinator_proc import ensure_coordinator
from malletrain.daemon.service.report import job_rows, metrics_snapshot
from malletrain.daemon.submit.channel import Peer
from malletrain.daemon.submit.requests import SUBMISSION_HOLD_S, JobRow, RequestHandler
from malletrain.daemon.submit.submissions import admit_attached, expire_submissions
from malletrain.daemon.tick import CoordView, DecideSettings, TickPlan, World, decide
from malletrain.daemon.tick.actions import Action
from malletrain.daemon.tick.views import seen_slots
from malletrain.ops.metrics import Metrics, PhaseClock
from malletrain.ops.settings import Settings
from malletrain.slurm.backend import SlurmBackend
from malletrain.slurm.cache import SnapshotCache
from malletrain.slurm.limits import LimitsReader
from malletrain.slurm.privacy import PrivacyCache

log = logging.getLogger(__name__)

#: terminal jobs are still looked at this long (to cancel leftover slot jobs).
TERMINAL_LINGER_S = 600.0


def decide_settings(settings: Settings, **overrides: float) -> DecideSettings:
    base = DecideSettings(
        scavenger_partition=settings.slurm.scavenger_partition,
        min_slot_time_s=settings.slurm.min_slot_time_s,
        max_slot_time_s=settings.slurm.max_slot_time_s,
        yield_ahead_s=settings.slurm.yield_ahead_s,
        yield_confirm_s=settings.slurm.yield_confirm_s,
        yield_unplanned_s=settings.slurm.yield_unplanned_s,
        heartbeat_timeout_s=settings.coordinator.heartbeat_timeout_s,
        node_prices=settings.allocator.prices_by_node_type(),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def limits_reader(settings: Settings) -> LimitsReader:
    """Slurm's limits as the settings' ``accounting:`` section asks them read."""
    acct = settings.accounting
    return LimitsReader(mode=acct.mode, refresh_s=acct.refresh_s, cluster=acct.cluster,
                        user_max_nodes=acct.user_max_nodes, share_weights=acct.share_weights,
                        share_weights_from=acct.share_weights_from,
                        fair_share_floor=acct.fair_share_floor,
                        account_weights=acct.account_weights)


class Daemon:
    def __init__(
        self, settings: Settings, backend: SlurmBackend, *,
        metrics: Metrics | None = None,
        coordinator: Any = None,
        decide_overrides: Mapping[str, float] | None = None,
        wake: Any = None,
        act_in_background: bool = False,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.cache = SnapshotCache(backend, max_age_s=600.0)
        self.store = Store(settings.state.database_path, settings.state.first_job_number)
        self.metrics = metrics
        self.coordinator = (coordinator if coordinator is not None
                            else ensure_coordinator(settings, self.store.realm,
                                                    live_jobs=self._live_job_ids))
        self._decide_overrides = dict(decide_overrides or {})
        self.learned = LearnedState(self.store)
        self.policy = make_policy(settings.allocator.policy, settings.policy_options())
        self.learned.restore_policy(self.policy)
        self.advisor = ProfilingAdvisor(settings.allocator.advisor_settings())
        self.learned.restore_profiles(self.advisor)
        self.monitor = JobMonitor(self.advisor, self.store, on_bad_record=self._bad_record)
        self.actuator = Actuator(backend, self.store, self.coordinator,
                                 on_slurm_call=self._slurm_call)
        self.actions: ActionQueue[Action, Outcome] | None = (
            ActionQueue(self.actuator.apply_job, Outcome, workers=ACTION_WORKERS,
                        job_of=lambda a: a.job_id, urgent=is_urgent)
            if act_in_background else None)
        self._last_plan: TickPlan | None = None
        #: what ``malletrain jobs`` shows, written by the tick, read by the channel's threads
        self._rows_lock = threading.Lock()
        self._job_nodes: dict[str, tuple[str, ...]] = {}
        self._job_members: dict[str, int] = {}
        self._profile_points: dict[str, int] = {}
        self._failures: dict[str, str] = {}  # job -> its code's last failure (CoordView)
        self._reasons: dict[str, str] = {}
        self._entitled: dict[str, int] = {}  # user -> nodes (the last plan's)
        #: for the arrival probe (daemon/observe/arrivals.py): the last snapshot's job ids, and
        #: whether any node is held (only then can a new job's start wait for the daemon)
        self.seen_job_ids: frozenset[int] = frozenset()
        self.holds_nodes = False
        #: Wall seconds of the last tick's Slurm snapshot (calls and parsing), read on
        #: its own thread while the tick reads the store and the coordinator
        self.observe_s = 0.0
        self._node_kinds: dict[str, str] = {}  # node -> type, from the last snapshot
        self._node_switches: dict[str, str] = {}  # node -> leaf switch, likewise
        self.instance = instance_id(self.settings.state.database_path.parent / "instance")
        self.state_dir = settings.state.snapshot_dir / self.instance
        prepare_state_dir(self.state_dir)
        self.privacy = PrivacyCache(backend.privacy)
        self.limits = limits_reader(settings)
        self.requests = RequestHandler(
            settings, self.store, coordinator=self.coordinator, state_dir=self.state_dir,
            rows=self.rows, wake=wake or (lambda: None), privacy=self.privacy.get,
            site_limits=self.limits.held)
        self._reconcile_interrupted()

    def _live_job_ids(self) -> list[tuple[str, int]]:
        """The jobs whose secrets the coordinator must serve, with their users' uids
        (admitted again whenever the daemon's session reconnects: a restarted coordinator
        serves none until then, and caps sessions per user)."""
        return [(j.job_id, j.uid) for j in self.store.jobs(include_terminal=False)]

    def _reconcile_interrupted(self) -> None:
        interrupted = self.store.open_actions()
        if interrupted:
            log.warning("%d Slurm action(s) were interrupted by the last stop (e.g. kill -9): "
                        "%s; reconciling from Slurm", len(interrupted),
                        ", ".join(f"{a['kind']} {a['detail']}" for a in interrupted[:5]))
            self.store.close_open_actions("interrupted; reconciled from Slurm at restart")

    def apply_settings(self, settings: Settings) -> None:
        """A reloaded config (between ticks): a changed policy is rebuilt at once."""
        old = self.settings
        self.settings = settings
        self.requests.settings = settings
        self.limits = limits_reader(settings)
        self.requests.site_limits = self.limits.held
        new = settings.allocator
        if (new.policy, settings.policy_options()) != (old.allocator.policy, old.policy_options()):
            self.learned.save_policy(self.policy)
            self.policy = make_policy(new.policy, settings.policy_options())
            self.learned.restore_policy(self.policy)
            log.info("allocation policy is now %s", new.policy)

    def handle(self, peer: Peer, req: Mapping[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            return self.requests.handle(peer, req)
        finally:
            if self.metrics is not None:
                self.metrics.observe_request(req.get("op"), time.monotonic() - t0)

    def _bad_record(self, job_id: str, what: str) -> None:
        if self.metrics is not None:
            self.metrics.count_bad_record(what)

    def _slurm_call(self, name: str, seconds: float, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.observe_slurm_call(name, seconds, ok)

    def tick(self) -> TickPlan | None:
        """Observe, decide, act: one whole tick (level-triggered; see the module doc).

        The store is read first: a job it shows attached had its slot jobs in Slurm before
        Slurm is asked, so the snapshot never misses them (read after Slurm, a job attached
        meanwhile had slots missing from an older snapshot, as if cancelled). Slurm's
        answer is then read on a thread of its own while the tick reads the coordinator, so
        a tick waits for the slower of the two, not for their sum.
        """
        t0 = time.monotonic()
        laps = self.metrics.tick_phases() if self.metrics else PhaseClock(None)
        busy = frozenset[str]()
        if self.actions is not None:
            busy = self.actions.busy_jobs()  # before the snapshot: see action_queue.py
            self._absorb(self.actions.take())
        jobs, slots = self._read_store()
        reading = Background(self._read_slurm, "slurm-read")
        try:
            jobs, coord = self._observe_jobs(jobs)
        except BaseException:
            reading.wait()  # never two reads at once: the next tick starts its own
            raise
        laps.lap("observe")
        try:
            snap = reading.result()
            laps.lap("slurm")
        except Exception as exc:
            # the cache falls back on its last good snapshot after Slurm errors and odd
            # answers; what reaches here is that, with none recent, or a fault of our own
            log.warning("no Slurm snapshot this tick: %s (%s)", exc, type(exc).__name__)
            self._publish_metrics(None, slurm_up=False)
            return None
        world = replace(self._world(snap, jobs, slots, coord), busy=busy)
        td = time.monotonic()
        plan = decide(world, self.policy)
        if self.metrics is not None:
            self.metrics.observe_decision(time.monotonic() - td)
        laps.lap("decide")
        self._remember_slots(plan, world)
        self._log_plan(plan, world)
        self._act(plan)
        laps.lap("act")
        self._last_plan = plan
        self.seen_job_ids = frozenset(j.job_id for j in snap.jobs)
        self.holds_nodes = bool(plan.held_nodes) or any(plan.targets.values())
        live = [j for j in world.jobs if not j.state.terminal]  # one store read a tick
        self._publish_metrics(plan, slurm_up=not self.cache.stale, snap=snap, jobs=live)
        self._save_learned(live)
        keep = self.settings.state
        pruned = self.store.prune_ended(keep.keep_ended_jobs,
                                        keep_per_user=keep.keep_ended_jobs_per_user,
                                        since_s=time.time() - SUBMISSION_HOLD_S)
        if pruned:
            log.info("deleted %d ended job(s) beyond state.keep_ended_jobs(_per_user)", pruned)
        laps.lap("publish")
        if self.metrics is not None:
            self.metrics.observe_tick(time.monotonic() - t0)
        return plan

    def _read_slurm(self) -> ClusterSnapshot:
        """The snapshot (on the reader thread), timed: the loop backs off when Slurm is slow."""
        self.backend.count_gpus = self.limits.holds_gpus()  # (a GPU limit: their GPUs too)
        t0 = time.monotonic()
        try:
            snap = self.cache.refresh()
        finally:
            self.observe_s = time.monotonic() - t0
        self._node_kinds = {n.name: node_type(n.gres) for n in snap.nodes if n.gres}
        self._node_switches = {n.name: n.switch for n in snap.nodes if n.switch}
        return snap

    def _read_store(self) -> tuple[list[JobRecord], dict[str, tuple[SlotRecord, ...]]]:
        """The jobs (terminal ones while they linger) and every job's slot records."""
        recent = time.time() - TERMINAL_LINGER_S
        jobs = [j for j in self.store.jobs()
                if not j.state.terminal or j.lifecycle.since_s() > recent]
        slots: dict[str, list[SlotRecord]] = {j.job_id: [] for j in jobs}
        for s in self.store.slots():  # one query, not one per job (500 jobs: ~40 ms)
            slots.get(s.job_id, []).append(s)
        return jobs, {jid: tuple(ss) for jid, ss in slots.items()}

    def _observe_jobs(self, jobs: list[JobRecord]
                      ) -> tuple[list[JobRecord], dict[str, CoordView]]:
        """What the coordinator says of each job, and the jobs with the progress it reported
        (written to the store too); node types as of the last snapshot (they change with a
        reconfiguration only)."""
        coord = self.monitor.observe(self.coordinator, jobs, self._node_kinds,
                                     self._node_switches)
        written = self.monitor.written
        jobs = [replace(j, **written[j.job_id]) if j.job_id in written else j for j in jobs]
        with self._rows_lock:
            self._job_members = {jid: len(cv.members) for jid, cv in coord.items()}
            self._failures = {jid: cv.failure for jid, cv in coord.items() if cv.failure}
        return jobs, coord

    def _world(self, snap: ClusterSnapshot, jobs: list[JobRecord],
               slots: dict[str, tuple[SlotRecord, ...]], coord: dict[str, CoordView]) -> World:
        """The store's jobs and slots and the coordinator's view, frozen with the snapshot
        (a submission whose attached slots pass is allocated now; one that expires now is
        seen failed next tick)."""
        now = time.time()
        if not self.cache.stale:  # a snapshot kept from an earlier tick may predate an attach
            jobs = admit_attached(self.store, jobs, slots, snap,
                                  self.settings.slurm.scavenger_partition)
        expire_submissions(self.store, self.backend, jobs, slots, snap, now)
        models = self.monitor.models([j for j in jobs if j.state.active],
                                     sorted(set(self._node_kinds.values()) - {""}))
        with self._rows_lock:  # read by the channel's threads: never the advisor itself
            self._profile_points = dict(self.monitor.measured_points)
        return World(
            now_s=now, snapshot=snap, jobs=tuple(jobs), slots=slots, coord=coord,
            models=models,
            settings=decide_settings(self.settings, **self._decide_overrides),
            hole_start_s=self._last_plan.hole_start_s if self._last_plan else {},
            limits=self.limits.current(),
        )

    def _log_plan(self, plan: TickPlan, world: World) -> None:
        if self._last_plan is None or plan.targets != self._last_plan.targets:
            log.info("plan: %s", "; ".join(f"{j}: {','.join(ns) or '-'}"
                                          for j, ns in sorted(plan.targets.items())) or "-")
            log.debug("plan input: models %s free %s held %s", world.models, plan.free_nodes,
                      plan.held_nodes)
        seen = set(self._last_plan.notes) if self._last_plan else set()
        for note in plan.notes:
            if note not in seen:  # a standing condition is logged when it starts, not per tick
                log.info("%s", note)

    def _act(self, plan: TickPlan) -> None:
        """Apply the plan now, or hand it to the workers (``decide`` gave the jobs that
        were busy at the snapshot no actions: ``World.busy``)."""
        if self.actions is None:
            self._absorb(self.actuator.apply(plan.actions))
            return
        self.actuator.reserve(plan.actions)  # the next tick must see these nodes as taken
        self.actions.offer(plan.actions)

    def _absorb(self, outcome: Outcome) -> None:
        """The advisor and the metrics hear what applied actions did (on the tick's thread:
        only it touches the advisor)."""
        for jid, old, new, at_s in outcome.rescales:
            if old != new:
                self.advisor.rescaled(jid, at_s, old, new)
        for jid, state in outcome.transitions:
            if state in (JobPhase.COMPLETED, JobPhase.CANCELLED, JobPhase.FAILED):
                self._job_done(jid)
        if self.metrics is not None:
            if outcome.preemptions:
                self.metrics.count_preemption(outcome.preemptions)
            for y in outcome.yields_s:
                self.metrics.observe_yield(y)

    def _remember_slots(self, plan: TickPlan, world: World) -> None:
        """Record what each slot was seen doing (:func:`~.tick.views.seen_slots`)."""
        nodes, marks = seen_slots(plan.slot_views, world)
        self.store.mark_slots(marks)  # one transaction
        with self._rows_lock:
            self._job_nodes = {**{j: self._job_nodes.get(j, ()) for j in plan.slot_views
                                  if j in world.busy}, **nodes}
            self._reasons = {**{j: self._reasons.get(j, "") for j in world.busy},
                             **plan.reasons}
            self._entitled = dict(plan.entitled)

    def _job_done(self, job_id: str) -> None:
        rec = self.store.job(job_id)
        self.advisor.forget(job_id)
        self.monitor.forget(job_id)
        if rec is not None:
            self.learned.save_profiles(self.advisor, [rec.spec.kind])
        try:
            self.coordinator.forget(job_id)
        except Exception as exc:
            log.warning("coordinator forget %s: %s", job_id, exc)

    def _save_learned(self, live: Sequence[JobRecord] | None = None) -> None:
        if live is None:
            live = self.store.jobs(include_terminal=False)
        self.learned.save_policy(self.policy)
        self.learned.save_profiles(self.advisor,
                                   {j.spec.kind for j in live} | self.monitor.typed_kinds)

    def _publish_metrics(self, plan: TickPlan | None, *, slurm_up: bool,
                         snap: ClusterSnapshot | None = None,
                         jobs: Sequence[JobRecord] = ()) -> None:
        if self.metrics is None:
            return
        if plan is None or snap is None:
            old = self.metrics.snapshot
            if old is not None:
                self.metrics.publish(replace(old, slurm_up=False, time_s=time.time()))
            return
        with self._rows_lock:
            job_nodes = dict(self._job_nodes)
        self.metrics.publish(metrics_snapshot(
            plan, snap, jobs, job_nodes=job_nodes,
            partition=self.settings.slurm.scavenger_partition,
            horizon_s=self.settings.slurm.max_slot_time_s,
            private=self.privacy.get().private_jobs, slurm_up=slurm_up))

    def rows(self) -> list[JobRow]:
        with self._rows_lock:
            views = (dict(self._job_nodes), dict(self._job_members), dict(self._profile_points),
                     dict(self._reasons), dict(self._entitled), dict(self._failures))
        return job_rows(self.store.jobs(), *views)

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the actions in flight (up to ``timeout_s``), save what was learned."""
        if self.actions is not None:
            self.actions.close(timeout_s)
            self._absorb(self.actions.take())
        self._save_learned()
        self.store.close()
