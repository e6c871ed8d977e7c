"""A new group's state: the freshest replica (or a snapshot) sent to the ranks that lag.

The file system is touched when a job is evicted to zero nodes (the last group's rank 0
saves a snapshot, :mod:`.snapshot`) and while ONE node holds every replica (a guard
snapshot now and then: that node's loss would otherwise take the job's whole progress with
it). The next group's sync restores a snapshot when it is newer than every live replica.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.worker import snapshot
from malletrain.elastic.worker.faults import SyncError
from malletrain.elastic.worker.state import ExitReason, Leave, WorkerState
from malletrain.elastic.worker.transfer import receive_state, send_state

log = logging.getLogger(__name__)

#: a guard snapshot waits at least this many times the last one's save time: at most 2 %
#: of a single-node job's training time goes to them, whatever the state's size
GUARD_COST_RATIO = 50.0


class StateSync(WorkerState):
    #: monotonic time and duration of the last guard snapshot (:meth:`_guard_single_node`)
    _guard_at_s = float("-inf")
    _guard_save_s = 0.0
    def _payload(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "extra": {k: v.state_dict() for k, v in self.extra_state.items()},
            "position": {"step": self.step, "samples_total": self.samples_total},
        }

    def _apply(self, payload: dict[str, Any]) -> None:
        self.module.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        for k, v in self.extra_state.items():
            if k in payload.get("extra", {}):
                v.load_state_dict(payload["extra"][k])
        self.step = int(payload["position"]["step"])
        self.samples_total = int(payload["position"]["samples_total"])
        self.has_state = True

    def _sync_state(self, cfg: p.Membership) -> None:
        """Send the freshest state (by step; a newer snapshot wins over live state) to laggards.

        A group of newcomers only (a job moved off all its nodes) first waits for the last
        group to leave: its leavers save the snapshot this group restores.
        """
        table, snap = self._gather_state()
        if not any(row[0] for row in table) and self._awaited_last_holders(cfg):
            table, snap = self._gather_state()
        src, target_step, use_snapshot = p.choose_source(table)
        if target_step < 0:
            self._refuse_if_state_lost()
        if use_snapshot or any(row[3] for row in table):
            # a replica may hold an uncommitted update: make every replica equal to src
            needy = [r for r in range(self.world_size) if r != src]
        else:
            needy = [
                r for r, (h, s, _, _) in enumerate(table)
                if r != src and (target_step < 0 or not h or s != target_step)
            ]
        if use_snapshot and self.rank == src:
            self._restore(snap)
        if needy:
            self._send_to(src, needy)
        self._dirty = False

    def _gather_state(self) -> tuple[list[list[int]], snapshot.SnapshotRef | None]:
        """Every rank's [has state, step, newest snapshot step, dirty], and our snapshot."""
        snap = snapshot.find_newest(self.config.state_dir, self._snapshot_dir(create=False),
                                    self.config.job_id)
        mine = torch.tensor(
            [int(self.has_state), self.step, -1 if snap is None else snap.step,
             int(self._dirty)],
            dtype=torch.int64,
            device=self.device,
        )
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        return [t.cpu().tolist() for t in gathered], snap

    def _awaited_last_holders(self, cfg: p.Membership) -> bool:
        """No rank of ``cfg`` holds state: wait (rank 0, bounded by ``join_timeout_s``) until
        the members of the last groups (:func:`.protocol.last_holders`) have departed.
        True if it waited.

        Their departure comes after their snapshot (:meth:`_not_in` of the rendezvous saves
        before it announces), so the snapshot found afterwards is the newest there is. Without
        this wait a group that replaced a one-node group found no snapshot yet (lost the
        job), or an older guard snapshot (redid steps). A new job, or one whose last group
        left long ago, does not wait.
        """
        flag = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            try:
                flag[0] = int(self._wait_for_departures(cfg))
            except (RuntimeError, OSError) as exc:  # the store: sync with what there is
                log.warning("could not check the last group's departure: %s", exc)
        flag = flag.to(self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _wait_for_departures(self, cfg: p.Membership) -> bool:
        js = self.link.js
        progress = js.progress()
        if progress is None or progress.step <= 0:
            return False
        holders = set(p.last_holders(js.membership, cfg))
        if not holders:
            return False
        deadline = time.monotonic() + self.config.join_timeout_s
        t0 = time.monotonic()
        while True:
            gone = p.departed(js.events())
            if holders <= gone or time.monotonic() > deadline:
                break
            time.sleep(self.config.poll_interval_s)
        log.info("waited %.1f s for the last groups' %s to leave (departed: %s)",
                 time.monotonic() - t0, sorted(holders), sorted(holders & gone))
        return True

    def _restore(self, snap: snapshot.SnapshotRef | None) -> None:
        t_load = time.monotonic()
        loaded = (snapshot.load(snap, self.config.job_id, self.config.secret)
                  if snap is not None else None)
        if loaded is None:  # load() renamed it aside, so the retry picks the next one
            raise SyncError(f"snapshot {snap} became unreadable during the state sync")
        self._apply(loaded)
        self._snapshot_load_s = time.monotonic() - t_load
        log.warning("restored snapshot of step %d from %s", self.step, snap)

    def _send_to(self, src: int, needy: list[int]) -> None:
        """Broadcast the state from ``src`` to ``needy`` (in a subgroup if not everybody)."""
        group: Any = None
        if len(needy) + 1 < self.world_size:
            group = dist.new_group(sorted([src, *needy]))  # every rank must call it
        if self.rank != src and self.rank not in needy:
            return
        if self.rank == src:
            send_state(self._payload(), src, group, self.device)
        else:
            self._apply(receive_state(src, self.rank, group, self.device))
        if group is not None:
            dist.destroy_process_group(group)

    def _refuse_if_state_lost(self) -> None:
        """No replica and no snapshot has state: fine for a new job, fatal for a running one.

        If the coordinator has seen progress, the job's state is gone (evicted to zero
        without a usable MALLETRAIN_STATE_DIR, or the last replica died): starting over from
        step 0 would silently throw the training away, so every rank leaves instead. Rank 0
        decides and broadcasts, so all ranks do the same.
        """
        flag = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            try:
                progress = self.link.js.progress()
            except (RuntimeError, OSError):
                progress = None
            if progress is not None and progress.step > 0:
                flag[0] = progress.step
        flag = flag.to(self.device)
        dist.broadcast(flag, src=0)
        lost_step = int(flag.item())
        if lost_step:
            log.error(
                "job %s reached step %d before, but no replica and no snapshot in "
                "MALLETRAIN_STATE_DIR holds its state: refusing to restart from step 0",
                self.config.job_id, lost_step,
            )
            self._teardown()
            self._announce("crashed")
            self.exit_reason = ExitReason.STATE_LOST
            raise Leave

    def _snapshot_dir(self, create: bool) -> Path | None:
        """The job's private directory in MALLETRAIN_STATE_DIR (:func:`.snapshot.private_dir`)."""
        return snapshot.private_dir(self.config.state_dir, self.config.job_id,
                                    self.config.secret, create=create)

    def _save_snapshot(self) -> bool:
        """Evicted to zero: write the state to MALLETRAIN_STATE_DIR (rank 0 of the last group).

        False if the state was there and could not be saved: the caller departs with
        ``state_lost``, which fails the job with that reason (the daemon's
        :mod:`~malletrain.daemon.tick.screen`) instead of its state vanishing unnoticed.
        """
        if not self.has_state:
            return True
        if self.config.state_dir is None:
            log.error("evicted to zero without MALLETRAIN_STATE_DIR: training state is lost")
            return False
        t0 = time.monotonic()
        try:
            path = snapshot.save(self._private_dir_for_save(), self.config.job_id, self.step,
                                 self._payload(), self.config.secret)
        except OSError as exc:
            log.error("evicted to zero: the snapshot of step %d could not be saved: %s; "
                      "the training state is lost", self.step, exc)
            return False
        self.last_reconfig["snapshot_save_s"] = time.monotonic() - t0
        log.warning("saved snapshot of step %d to %s in %.2f s", self.step, path,
                    time.monotonic() - t0)
        return True

    def _remove_snapshots(self) -> None:
        """The job finished: its snapshots, and its directory once empty, go."""
        own = self._snapshot_dir(create=False)
        if self.config.state_dir is not None and self.config.state_dir.is_dir():
            # one saved before the per-job directories (an upgrade): this user's only
            snapshot.remove_older(self.config.state_dir, self.config.job_id, keep_step=None)
        if own is not None:
            snapshot.remove_older(own, self.config.job_id, keep_step=None)
            with contextlib.suppress(OSError):  # not empty: a member saved late
                own.rmdir()

    def _private_dir_for_save(self) -> Path:
        path = self._snapshot_dir(create=True)
        assert path is not None  # state_dir is set
        return path

    def _guard_single_node(self) -> None:
        """Rank 0 of a group on ONE node: a snapshot every ``guard_snapshot_s`` (or every
        :data:`GUARD_COST_RATIO` save times, if longer), taken at a step boundary.

        With two nodes or more a node's loss leaves a replica on another, and nothing is
        written. On one node every replica dies with the node (or with a SIGKILL of a
        one-process job): without this the job fails with ``state_lost``; with it the next
        group restores the guard snapshot and redoes the steps since.
        """
        m = self.membership
        if (self.rank != 0 or self.config.state_dir is None or m is None
                or len(m.members) != 1 or not self.has_state):
            return
        now = time.monotonic()
        if now - self._guard_at_s < max(self.config.guard_snapshot_s,
                                        GUARD_COST_RATIO * self._guard_save_s):
            return
        try:
            snapshot.save(self._private_dir_for_save(), self.config.job_id, self.step,
                          self._payload(), self.config.secret)
        except OSError as exc:  # a full or unreachable state dir must not stop training
            log.warning("guard snapshot of step %d not saved: %s", self.step, exc)
        self._guard_at_s = time.monotonic()
        self._guard_save_s = self._guard_at_s - now
        log.info("guard snapshot of step %d (one node holds every replica) in %.2f s",
                 self.step, self._guard_save_s)
