"""A worker's shared state: what every part of :class:`~malletrain.elastic.worker.job.ElasticJob`
reads and writes (training position, membership, the coordinator link), declared once.

The runtime is one object split by reason to change: the step loop
(:mod:`.worker`), forming groups (:mod:`.rendezvous`), moving state (:mod:`.statesync`),
the coordinator link (:mod:`.link`), SIGTERM (:mod:`.signals`) and the background watcher
(:mod:`.watcher`). Each part that is a mix-in inherits :class:`WorkerState` for the
attributes and the few calls that cross parts.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol.config import ElasticConfig
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.training.compress import CompressionSwitch
from malletrain.elastic.training.rules import ScalingRule
from malletrain.elastic.training.synctime import SyncTimer
from malletrain.elastic.worker.transfer import Stateful

if TYPE_CHECKING:
    from malletrain.elastic.protocol.link import CoordinatorLink
    from malletrain.elastic.worker.signals import SigtermWatch

log = logging.getLogger(__name__)


class ExitReason(StrEnum):
    FINISHED = "finished"  # total_samples reached
    REMOVED = "removed"  # a published membership left this member out (planned leave)
    SIGTERM = "sigterm"  # preempted
    EVICTED = "evicted"  # job evicted to zero; the state was saved (or there was none)
    STATE_LOST = "state_lost"  # the job had progressed but no replica/snapshot holds it


#: Leaves after which the process ends through :func:`exit_now`: the node goes back to
#: Slurm (or to another job) only when the slot's step ends, i.e. when this process is gone.
FAST_EXIT = frozenset({ExitReason.SIGTERM, ExitReason.EVICTED, ExitReason.REMOVED})


class Outcome(Enum):
    """How an attempt to form an epoch's group ended."""

    FORMED = 1
    RETRY = 2
    FAILED = 3


class Leave(Exception):
    """Internal: this process leaves the job (reason in ``ElasticJob.exit_reason``)."""


class WorkerState(ABC):
    config: ElasticConfig
    link: CoordinatorLink
    sigterm: SigtermWatch
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rule: ScalingRule
    extra_state: Mapping[str, Stateful]
    device: torch.device
    backend: str
    # training position: identical on every replica, moved with the state
    step: int
    samples_total: int
    has_state: bool
    # membership
    epoch: int
    membership: p.Membership | None
    rank: int
    world_size: int
    _ddp: DistributedDataParallel | None
    sync_timer: SyncTimer
    compression: CompressionSwitch
    _formed_epoch: int
    #: members of the newest epoch this process read while re-forming (None: none yet)
    _newest_members: tuple[str, ...] | None
    #: re-forming after a failed step: which members of the last group are alive is not
    #: known, so a leaving process saves the state rather than count on another
    _after_failure: bool
    _registered_seq: int
    #: monotonic start of the collective work in flight (a step, or the boundary check);
    #: the watcher aborts an NCCL group that overruns ``step_timeout_s``
    _step_started: float | None
    #: groups aborted by the watcher so far (see :meth:`_abort_group`)
    _aborts: int
    #: this replica may hold the update of a step that was not committed (the group was
    #: aborted under it): the next state sync makes every replica equal again
    _dirty: bool
    _first_of_epoch: bool
    _snapshot_load_s: float
    exit_reason: ExitReason | None
    last_reconfig: dict[str, float]

    @property
    def member_id(self) -> str:
        return self.config.member_id

    def _abort_group(self) -> None:
        """Abort every communicator (from the watcher thread) so that a hung NCCL collective
        raises. Counted: the step in flight is then not committed, and the next boundary
        re-forms instead of calling into a group that no longer exists (measured on an
        H100: the boundary all-reduce then raised ValueError and the worker crashed)."""
        self._aborts += 1
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()

    def _teardown(self, broken: bool = False) -> None:
        """End this process's group. A ``broken`` NCCL group (a failure was seen) is aborted,
        since destroying it may block on a hung communicator; a healthy one is destroyed,
        which is faster (0.36-0.41 s vs about 0.9 s for an abort, measured on an H100)."""
        self._ddp = None
        self._step_started = None
        if not dist.is_initialized():
            return  # never formed, or aborted by the watcher already
        if broken and self.backend == "nccl":
            self._abort_group()
            return
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a broken gloo group may fail to shut down cleanly
            log.warning("destroy_process_group failed: %r", exc)

    def _announce(self, reason: p.DepartureReason) -> None:
        self.link.announce(reason, self.epoch or None, self.step)

    def _depart(self, saved: bool, reason: p.DepartureReason,
                exit_reason: ExitReason) -> NoReturn:
        """Announce ``reason`` and leave; ``state_lost`` instead where this process was to
        save the job's last state and could not (the daemon fails the job with that reason,
        issue 49: the state was lost without a word)."""
        self._announce(reason if saved else "state_lost")
        self.exit_reason = exit_reason if saved else ExitReason.STATE_LOST
        raise Leave

    def _store_failed(self, exc: BaseException) -> None:
        if self.link.reconnect(exc) and self._formed_epoch == 0:
            self._registered_seq = -1  # a restarted coordinator forgot us: register again

    def _register(self) -> None:
        if self.config.local_rank != 0:
            return
        self._registered_seq = self.link.js.register(self.link.member_info())
        log.info("registered as %s (seq %d)", self.member_id, self._registered_seq)

    # calls across parts: abstract here, implemented by the part named

    @abstractmethod
    def _save_snapshot(self) -> bool: ...  # statesync

    @abstractmethod
    def _sync_state(self, cfg: p.Membership) -> None: ...  # statesync

    @abstractmethod
    def _maybe_report(self, force: bool) -> None: ...  # worker

    @abstractmethod
    def reseed(self, js: JobStore) -> None: ...  # worker
