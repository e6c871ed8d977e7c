"""Forming a group: the newest epoch that includes this member, healed after a failure.

A change of membership (published by the daemon, or written by survivors after a failure)
makes every process tear down DDP and the process group and come here: wait until every
process of the new epoch has arrived (or drop the missing after ``join_timeout_s``),
``init_process_group`` on a fresh ``PrefixStore`` with the long ``sync_timeout_s``, send the
state from the freshest replica to the ranks that lag (:mod:`.statesync`), re-wrap DDP
(``init_sync=False``: it would redo the sync), apply the scaling rule and shorten the group
timeout to ``step_timeout_s`` for the steps. After a failure the survivors mark themselves
alive and write the next epoch without the missing members.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.training.compress import wrap
from malletrain.elastic.worker.faults import is_peer_failure
from malletrain.elastic.worker.state import ExitReason, Leave, Outcome, WorkerState

log = logging.getLogger(__name__)


class Rendezvous(WorkerState):
    _after_failure = False  # see WorkerState
    #: members that left this process's group at its last boundary (SIGTERM)
    _gone: frozenset[str] = frozenset()

    def _on_formed(self) -> None:
        """Called once a group is formed, the state synced and DDP re-wrapped: a framework
        adapter brings its own view of rank and size up to date here
        (:mod:`malletrain.elastic.worker.accelerate`)."""

    def _rendezvous(self, failed_epoch: int | None, gone: set[str]) -> None:
        """Leave the current group and form the newest epoch that includes this member."""
        t0 = time.monotonic()
        self._after_failure = failed_epoch is not None
        self._gone = frozenset(gone)
        self._teardown(broken=self._after_failure)
        heal_deadline = 0.0
        if failed_epoch is not None:
            heal_deadline = self._mark_alive(failed_epoch)
        while True:
            self._check_sigterm_waiting()
            try:
                latest = self.link.js.latest_epoch()
                cfg = self.link.js.membership(latest) if latest else None
                if self.link.js.finished() is not None:
                    self._finished_elsewhere()
            except (RuntimeError, OSError) as exc:
                self._store_failed(exc)
                time.sleep(0.5)
                continue
            if cfg is not None:
                self._newest_members = cfg.members
            if cfg is None:
                if self._registered_seq < 0:
                    self._register()
                time.sleep(self.config.poll_interval_s)
                continue
            if failed_epoch is not None and latest == failed_epoch:
                self._try_heal(cfg, heal_deadline)
                time.sleep(self.config.poll_interval_s)
                continue
            failed_epoch = None
            stale = [x for x in cfg.members if x in gone]
            if stale and self.member_id in cfg.members:
                self._propose_without(cfg, stale)
                continue
            if self.member_id not in cfg.members:
                self._not_in(cfg)
                time.sleep(self.config.poll_interval_s)
                continue
            outcome = self._form(cfg)
            if outcome is Outcome.FORMED:
                self.last_reconfig["total_s"] = time.monotonic() - t0
                self._after_failure = False
                return
            if outcome is Outcome.RETRY:
                time.sleep(self.config.poll_interval_s)
            elif outcome is Outcome.FAILED:
                self._after_failure = True
                failed_epoch = cfg.epoch
                heal_deadline = self._mark_alive(cfg.epoch)

    def _check_sigterm_waiting(self) -> None:
        """SIGTERM while not in a formed group: announce and leave.

        The first holder of the last group's state (:meth:`_saves_when_leaving`) saves a
        snapshot first: the others may be gone too (evicted to zero while re-forming). Those
        that left at the last boundary do not count: a faults run (daemon-kill9-rescale)
        redid 6 steps when rank 0 left on its SIGTERM one boundary before the others got
        theirs, and each of them counted on rank 0 to save.
        """
        if self.sigterm.at is None:
            return
        self._teardown()
        newest = self._newest_members
        still = None if newest is None else self._still_there(newest)
        saved = self._save_snapshot() if self._saves_when_leaving(still) else True
        self._depart(saved, "sigterm", ExitReason.SIGTERM)

    def _saves_when_leaving(self, still: Sequence[str] | None) -> bool:
        """:meth:`_saves_for_the_group`, unless this process re-forms after a failed step:
        then the member it would count on may be the one that died (a faults run lost a job
        when the regular job preempted every survivor of a SIGKILL before they healed, and
        the dead worker was the first of the group), so it saves (local rank 0)."""
        if self._after_failure:
            return self._formed_epoch != 0 and self.config.local_rank == 0
        return self._saves_for_the_group(still)

    def _saves_for_the_group(self, still: Sequence[str] | None) -> bool:
        """Whether this process writes the snapshot when the job may lose its last replica.

        The first member (by rank) of this process's last group that is still in ``still``
        (the newest membership it read before leaving) saves, from its local rank 0: rank 0
        itself when it is there, else the next one. Rank 0 alone was not enough: a shrink
        that removed rank 0's member, then an eviction (or SIGTERM to all) while the rest
        re-formed, left no snapshot and lost the job (seen once in the coordinator-kill9
        fault scenario). Unsure (nothing read, or none of the group in it): save. Saving is
        always safe: a snapshot older than a live replica is never used, and of two saved at
        once the newer is kept (:func:`.snapshot.remove_older`).
        """
        if self._formed_epoch == 0 or self.membership is None or self.config.local_rank != 0:
            return False
        group = self.membership.members
        kept = [m for m in group if still is not None and m in still]
        return not kept or kept[0] == self.member_id

    def _finished_elsewhere(self) -> None:
        self._teardown()
        self.exit_reason = ExitReason.FINISHED
        raise Leave

    def _mark_alive(self, epoch: int) -> float:
        try:
            js = self.link.js
            js.mark(js.keys.alive(epoch, self.member_id, self.config.local_rank))
        except (RuntimeError, OSError) as exc:
            self._store_failed(exc)
        return time.monotonic() + self.config.heal_wait_s

    def _process_keys(self, cfg: p.Membership, which: str, member: str) -> list[str]:
        key = self.link.js.keys.alive if which == "alive" else self.link.js.keys.arrive
        return [key(cfg.epoch, member, lr) for lr in range(cfg.local_world_size(member))]

    def _present_members(self, cfg: p.Membership, which: str) -> list[str]:
        return [
            m for m in cfg.members if self.link.js.all_present(self._process_keys(cfg, which, m))
        ]

    def _try_heal(self, cfg: p.Membership, deadline: float) -> None:
        """After a failure of ``cfg``: once all are alive or the wait is over, drop the rest."""
        alive = self._present_members(cfg, "alive")
        if len(alive) < len(cfg.members) and time.monotonic() < deadline:
            return
        self._propose_without(cfg, [m for m in cfg.members if m not in alive])

    def _propose_without(
        self, cfg: p.Membership, dropped: list[str], source: p.MembershipSource = "heal"
    ) -> None:
        keep = [m for m in cfg.members if m not in dropped]
        sizes = dict(zip(cfg.members, cfg.local_world_sizes, strict=True))
        nxt = p.build_membership(cfg.epoch + 1, keep, sizes, source, time.time(), dropped)
        won, _held = self.link.js.propose(nxt)
        if won:
            log.warning("epoch %d: %s without %s -> epoch %d", cfg.epoch, source, dropped,
                        nxt.epoch)
            if source == "heal":
                for m in dropped:
                    self.link.js.depart(m, "failed", cfg.epoch, self.step)

    def _not_in(self, cfg: p.Membership) -> None:
        """The newest epoch leaves this member out: planned removal, or dropped by a heal.

        Removed while no other member of this process's group stays with the state (left at
        the last boundary, e.g. on a SIGTERM, or departed), this one saves: the
        job's soak lost a job (m188) when the daemon shrank [s0, s1] to [s0] as s0 left on
        Slurm's SIGTERM, and each of the two counted on the other. After a failed step (the
        member kept may be the one that died) it saves too.
        """
        if self._formed_epoch == 0:
            if self._registered_seq < 0:
                self._register()
            return  # a newcomer waiting to be published
        # the first epoch after ours that left us out tells why
        for e in range(self._formed_epoch + 1, cfg.epoch + 1):
            m = self.link.js.membership(e)
            if m is not None and self.member_id not in m.members:
                break
        else:
            m = cfg
        if m is not None and m.source == "publish":
            saved = True
            if not cfg.members:
                before = self.link.js.membership(m.epoch - 1) if m.epoch > 1 else None
                if self._saves_when_leaving(
                        self._still_there(before.members) if before else None):
                    saved = self._save_snapshot()
            elif self._saves_when_leaving(self._still_there(m.members)):
                # moved off all its nodes: the newcomers restore this (statesync waits)
                saved = self._save_snapshot()
            self._depart(saved, "removed",
                         ExitReason.EVICTED if not cfg.members else ExitReason.REMOVED)
        # dropped by survivors (we were slow or cut off): wait to be published again
        log.warning("dropped from the job in epoch %d; registering again", cfg.epoch)
        self._formed_epoch = 0
        self.rank = -1
        self._register()

    def _still_there(self, members: Sequence[str]) -> list[str]:
        """``members`` less those known to have left (at the last boundary, ``_gone``, or
        with a departure recorded; the daemon records one for a slot that ended, maybe
        before its process has: this process itself always counts)."""
        try:
            departed = p.departed(self.link.js.events())
        except (RuntimeError, OSError):
            departed = set()
        return [x for x in members
                if x == self.member_id or (x not in self._gone and x not in departed)]

    def _form(self, cfg: p.Membership) -> Outcome:
        """Meet the other processes of ``cfg``, build the group, sync the state."""
        t_arrive = time.monotonic()
        arrived = self._arrive(cfg)
        if arrived is not None:
            return arrived
        return self._build_group(cfg, t_arrive)

    def _arrive(self, cfg: p.Membership) -> Outcome | None:
        """Wait for every process of ``cfg`` (None), or give this epoch up (RETRY).

        The ``go`` key is set once, by whoever sees all arrivals first; ``abort`` (set by a
        leaving member, a timeout, or a newer epoch) makes everybody retry the newest one.
        """
        js = self.link.js
        e = cfg.epoch
        go_key = js.keys.go(e)
        js.mark(js.keys.arrive(e, self.member_id, self.config.local_rank))
        expected = [k for m in cfg.members for k in self._process_keys(cfg, "arrive", m)]
        deadline = time.monotonic() + self.config.join_timeout_s
        while True:
            # SIGTERM before this epoch is committed: abort it, and leave without blocking it
            aborting = self.sigterm.at is not None
            if aborting and js.store.compare_set(go_key, "", "abort") == b"abort":
                self._propose_without(cfg, [self.member_id], source="leave")
                self._check_sigterm_waiting()
            if js.all_present([go_key]):
                return None if js.store.get(go_key) == b"go" else Outcome.RETRY
            if js.all_present(expected):
                js.store.compare_set(go_key, "", "go")
            elif js.has_epoch(e + 1):
                js.store.compare_set(go_key, "", "abort")
            elif time.monotonic() > deadline:
                if js.store.compare_set(go_key, "", "abort") == b"abort":
                    present = self._present_members(cfg, "arrive")
                    self._propose_without(cfg, [m for m in cfg.members if m not in present])
            else:
                time.sleep(self.config.poll_interval_s / 5)

    def _build_group(self, cfg: p.Membership, t_arrive: float) -> Outcome:
        """Everybody arrived: init the process group, sync the state, wrap DDP."""
        e = cfg.epoch
        js = self.link.js
        t_go = time.monotonic()
        self._snapshot_load_s = 0.0
        rank = cfg.rank_offset(self.member_id) + self.config.local_rank
        failed = False
        try:
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore(js.keys.pg_prefix(e), self.link.store),
                rank=rank,
                world_size=cfg.world_size,
                timeout=timedelta(seconds=self.config.sync_timeout_s),
            )
            t_init = time.monotonic()
            self.rank, self.world_size = rank, cfg.world_size
            self._sync_state(cfg)
            t_sync = time.monotonic()
            self._ddp = wrap(self.module, self.device, self.sync_timer)
            self.compression.new_group()
            group = dist.distributed_c10d._get_default_group()
            try:
                group.set_timeout(timedelta(seconds=self.config.step_timeout_s))
            except RuntimeError as exc:  # backend without a settable timeout
                log.warning("cannot shorten the group timeout for steps: %s", exc)
        except Exception as exc:
            if not is_peer_failure(exc):
                raise
            log.warning("forming epoch %d failed: %s", e, exc)
            failed = True
        if failed:  # torn down outside the except block (worker.py: _boundary)
            self._teardown(broken=True)
            return Outcome.FAILED
        lr = self.rule.learning_rate(cfg.world_size)
        for group_params in self.optimizer.param_groups:
            group_params["lr"] = lr
        self.epoch, self.membership, self._formed_epoch = e, cfg, e
        self._newest_members = cfg.members
        self._first_of_epoch = True
        self._on_formed()
        self.last_reconfig = {
            "epoch": float(e),
            "snapshot_load_s": self._snapshot_load_s,
            "arrive_s": t_go - t_arrive,
            "init_s": t_init - t_go,
            "sync_s": t_sync - t_init,
            "rewrap_s": time.monotonic() - t_sync,
        }
        log.info(
            "epoch %d formed: rank %d/%d at step %d (%s)",
            e, rank, cfg.world_size, self.step, self.last_reconfig,
        )
        if rank == 0:
            self._maybe_report(force=True)
        return Outcome.FORMED
