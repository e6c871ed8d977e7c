"""The worker runtime: an ordinary DDP training loop made elastic, checkpoint-free.

Usage (see ``examples/elastic_train.py`` and ``docs/elastic.md``)::

    job = ElasticJob(model, optimizer, dataset_size=len(ds),
                     rule=LinearScaling(per_rank_batch=32, base_lr=0.01),
                     total_samples=args.total_samples)
    for step in job.steps():
        with step:                      # a peer failure inside is absorbed and healed
            x, y = ds[step.indices]     # this rank's samples of this step
            loss = loss_fn(job.model(x), y)   # job.model: the DDP wrapper of this epoch
            optimizer.zero_grad(); loss.backward(); optimizer.step()
    sys.exit(0)                         # job.exit_reason says why the loop ended

How it works (measured design, docs/elastic.md): the processes live for the whole job.
At every step boundary global rank 0 reads the newest epoch number from the coordinator's store
and one small all-reduce tells everybody (1) whether a new epoch exists, (2) which members
got SIGTERM and (3) whether a rank measured the group's links slow (compress.py). On a
change every process tears down DDP and the process group and goes through
:meth:`ElasticJob._rendezvous`: wait until every process of the new epoch has arrived (or drop
the missing after ``join_timeout_s``), ``init_process_group`` on a fresh ``PrefixStore`` with the
long ``sync_timeout_s``, send the state from the freshest replica (highest step, not rank 0) to
the ranks that lag, re-wrap DDP (``init_sync=False``: it would redo the sync), apply the scaling
rule and shorten the group timeout to ``step_timeout_s`` for the steps. A collective error or
timeout inside a step (crash, SIGKILL, frozen peer) makes the survivors mark themselves alive
and write the next epoch without the missing members; the failed step is not committed.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType

import numpy as np
import torch
import torch.distributed as dist

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol.config import ElasticConfig
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.link import CoordinatorLink
from malletrain.elastic.training.compress import CompressionSwitch, SlowLinkCompression, wrap
from malletrain.elastic.training.rules import ScalingRule
from malletrain.elastic.training.sampler import DataStream, split_step, step_count
from malletrain.elastic.training.synctime import SyncTimer
from malletrain.elastic.worker.faults import backend_for, is_peer_failure
from malletrain.elastic.worker.rendezvous import Rendezvous
from malletrain.elastic.worker.signals import SigtermWatch, exit_now
from malletrain.elastic.worker.state import FAST_EXIT, ExitReason, Leave
from malletrain.elastic.worker.statesync import StateSync
from malletrain.elastic.worker.transfer import Stateful
from malletrain.elastic.worker.watcher import Watcher
from malletrain.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["ElasticConfig", "ElasticJob", "ExitReason", "Step"]


@dataclass
class Step:
    """One training step handed to the loop. Use it as a context manager."""

    index: int  # number of this step (= committed steps before it); gapless across rescales
    epoch: int  # membership epoch the step runs in
    rank: int
    world_size: int
    indices: np.ndarray  # this rank's dataset indices (may be empty on a cut last step)
    global_count: int  # samples of this step over all ranks
    lr: float
    first_of_epoch: bool  # the first step after a (re)configuration
    started_at_s: float  # time.time() when the step was handed out
    failed: bool = False
    entered: bool = False
    error: BaseException | None = field(default=None, repr=False)
    #: True once the group was aborted under this step (it overran step_timeout_s)
    aborted: Callable[[], bool] = field(default=lambda: False, repr=False)

    def __enter__(self) -> Step:
        self.entered = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is not None and is_peer_failure(exc):
            log.warning("step %d (epoch %d) failed: %s", self.index, self.epoch, exc)
            self.failed = True
            # no traceback kept: its frames hold the broken group, whose open sockets would
            # keep other survivors waiting out their timeout (benchmarks/gloo_dead_peer.py)
            self.error = exc.with_traceback(None)
            exc.__context__ = exc.__cause__ = None
            return True  # absorbed: the runtime heals the group; the step is not committed
        if exc is None and self.aborted():
            # its collectives may have returned unreduced gradients: never commit it
            log.warning("step %d (epoch %d): the group was aborted during it", self.index,
                        self.epoch)
            self.failed = True
            self.error = RuntimeError("the group was aborted: the step overran its timeout")
        return False


class ElasticJob(Rendezvous, StateSync):
    """Makes one DDP training loop elastic. One instance per process."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        dataset_size: int,
        rule: ScalingRule,
        seed: int = 0,
        shuffle: bool = True,
        total_samples: int | None = None,
        extra_state: Mapping[str, Stateful] | None = None,
        config: ElasticConfig | None = None,
        device: torch.device | None = None,
        compression: SlowLinkCompression | None = None,
    ) -> None:
        self.config = config if config is not None else ElasticConfig.from_env()
        if total_samples is not None and total_samples < 0:
            raise ConfigError(f"total_samples must be >= 0, got {total_samples}")
        self.module = model
        self.optimizer = optimizer
        self.rule = rule
        self.total_samples = total_samples
        self.extra_state = dict(extra_state or {})
        self.stream = DataStream(dataset_size, seed=seed, shuffle=shuffle)
        self.device = device if device is not None else torch.device("cpu")
        self.backend = backend_for(self.config, self.device)
        self._step_started: float | None = None  # monotonic start of the step in flight
        self._aborts = 0
        self._dirty = False
        # training position: identical on every replica, moved with the state
        self.step = 0
        self.samples_total = 0
        self.has_state = False  # trained or restored (a fresh newcomer has not)
        # membership
        self.epoch = 0
        self.membership: p.Membership | None = None
        self.rank = -1
        self.world_size = 0
        self._ddp = None
        self._formed_epoch = 0  # last epoch this process formed a group in (0: never)
        self._newest_members: tuple[str, ...] | None = None
        self.exit_reason: ExitReason | None = None
        #: (epoch, phase -> seconds) of the last reconfiguration, for logs and benchmarks
        self.last_reconfig: dict[str, float] = {}
        self._first_of_epoch = False
        self._snapshot_load_s = 0.0
        # coordinator link
        self.link = CoordinatorLink(self.config)
        self._watcher = Watcher(self)
        self._registered_seq = -1
        # progress reporting (global rank 0)
        self._report_t = time.monotonic()
        self._report_step, self._report_samples, self._report_sync_s = 0, 0, 0.0
        #: times each step's wait for the gradient all-reduce (a DDP comm hook); PowerSGD
        #: on a group whose links measure slow (opt-in: compress.py)
        self.sync_timer, self.compression = SyncTimer(), CompressionSwitch(compression)
        self.sigterm = SigtermWatch(
            self.config.sigterm_deadline_s,
            last_word=lambda: self.link.announce("sigterm", self.epoch or None, self.step,
                                                 own_client=True))

    @property
    def model(self) -> torch.nn.Module:
        """The model to call in the step: this epoch's DDP wrapper."""
        if self._ddp is None:
            raise RuntimeError("ElasticJob.model used outside of a step")
        return self._ddp

    def steps(self) -> Iterator[Step]:
        """Yield steps until the stop condition, a planned leave, SIGTERM or eviction."""
        self.sigterm.install()
        self.link.connect(first=True)
        self._watcher.start()
        try:
            self._rendezvous(failed_epoch=None, gone=set())
            while True:
                if self._finished():
                    self._finish()
                    return
                if not self._boundary():
                    continue  # re-formed: check again in the new group (newcomers do too)
                aborts = self._aborts
                step = self._make_step()
                step.aborted = partial(self._aborted_since, aborts)
                yield step
                if step.failed:
                    # an aborted step may have updated this replica: the heal resyncs it
                    self._dirty = self._dirty or self._aborts != aborts
                    self._rendezvous(failed_epoch=step.epoch, gone=set())
                    continue
                self._commit(step)
        except Leave:
            if self.exit_reason in FAST_EXIT:
                atexit.register(exit_now)
            return
        except GeneratorExit:
            self._announce("crashed")
            raise
        except BaseException:
            self._announce("crashed")
            raise
        finally:
            self._teardown()
            # join the watcher: a thread inside a store call while the interpreter shuts
            # down is one way for a process never to exit
            self._watcher.stop(join_timeout_s=3.0)
            self.sigterm.exited.set()

    def reseed(self, js: JobStore) -> None:
        """After a coordinator restart lost this job's keys: put our part back.

        Rank 0 re-publishes the current epoch (so workers and a re-attaching daemon agree on
        it again) and local rank 0 of every member in the job registers again (so the daemon
        can keep publishing it). Called by the watcher thread after a reconnect.
        """
        m = self.membership
        if m is None or self._formed_epoch == 0 or js.has_epoch(m.epoch):
            return
        if self.rank == 0:
            js.propose(m)
            log.warning("re-published epoch %d into the restarted coordinator", m.epoch)
        if self.config.local_rank == 0:
            js.register(self.link.member_info())

    def _aborted_since(self, aborts: int) -> bool:
        return self._aborts != aborts

    def _finished(self) -> bool:
        return self.total_samples is not None and self.samples_total >= self.total_samples

    def _make_step(self) -> Step:
        count = step_count(
            self.rule.global_batch(self.world_size), self.samples_total, self.total_samples
        )
        piece = split_step(self.samples_total, count, self.world_size)[self.rank]
        first = self._first_of_epoch
        self._first_of_epoch = False
        self._step_started = time.monotonic()
        self.sync_timer.end_step()  # what a failed step left behind is not this step's
        return Step(
            index=self.step,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            indices=self.stream.indices(piece),
            global_count=count,
            lr=self.rule.learning_rate(self.world_size),
            first_of_epoch=first,
            started_at_s=time.time(),
        )

    def _commit(self, step: Step) -> None:
        self._step_started = None
        self._report_sync_s += self.sync_timer.end_step()
        self.compression.committed(self.sync_timer, self.world_size)
        self.step += 1
        self.samples_total += step.global_count
        self.has_state = True
        if self.rank == 0:
            self._maybe_report(force=False)
            self._guard_single_node()

    def _maybe_report(self, force: bool) -> None:
        if force or time.monotonic() - self._report_t >= self.config.report_interval_s:
            # handed to the watcher thread: a step never waits for the store
            self._watcher.pending_report = self._build_report()

    def _build_report(self) -> p.ProgressReport:
        now = time.monotonic()
        elapsed = now - self._report_t
        steps = self.step - self._report_step
        samples = self.samples_total - self._report_samples
        report = p.ProgressReport(
            epoch=self.epoch,
            step=self.step,
            samples_total=self.samples_total,
            samples_per_s=samples / elapsed if elapsed > 0 else 0.0,
            world_size=self.world_size,
            step_time_s=elapsed / steps if steps else 0.0,
            time_s=time.time(),
            members=self.membership.members if self.membership else (),
            sync_time_s=self._report_sync_s / steps if steps else None,
        )
        self._report_t, self._report_step, self._report_samples = now, self.step, self.samples_total
        self._report_sync_s = 0.0
        return report

    def _boundary(self) -> bool:
        """The step-boundary check: True if the next step may run in the current group.

        False after a re-formation (or a failed check that led to one): the caller then runs
        the check again in the new group, so that survivors and newcomers execute the same
        sequence of collectives. Raises :class:`_Leave` if this process leaves here.
        """
        assert self.membership is not None
        members = self.membership.members
        flags = torch.zeros(2 + len(members), dtype=torch.int64)
        flags[0] = self._watcher.latest_epoch
        flags[-1] = self.compression.vote()
        if self.sigterm.at is not None:
            flags[1 + members.index(self.member_id)] = 1
        aborts, failed = self._aborts, False
        self._step_started = time.monotonic()  # the watcher bounds this collective too
        try:
            if not dist.is_initialized():  # the watcher aborted the group
                raise RuntimeError("the group was aborted")
            flags = flags.to(self.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        except Exception as exc:
            if not (is_peer_failure(exc) or self._aborts != aborts):
                raise
            log.warning("boundary all-reduce failed in epoch %d: %s", self.epoch, exc)
            failed = True
        finally:
            self._step_started = None
        if failed:  # healed outside the except: its traceback holds the broken group
            self._rendezvous(failed_epoch=self.epoch, gone=set())
            return False
        values = flags.cpu().tolist()
        leaving = {m for i, m in enumerate(members) if values[1 + i]}
        if leaving:
            self._leave_at_boundary(leaving)
            return False
        if values[0] > self.epoch:
            self._rendezvous(failed_epoch=None, gone=set())
            return False
        if values[-1] and not self.compression.on:
            self._compress()
        return True

    def _compress(self) -> None:
        """Every rank, at the same boundary: this group's links are slow, re-wrap with
        PowerSGD (compress.py) until the next re-formation."""
        sw = self.compression
        assert sw.policy is not None
        self._ddp = wrap(self.module, self.device, self.sync_timer, sw.policy)
        sw.on = True
        self.last_reconfig["compressed_at_step"] = float(self.step)
        log.info("epoch %d: all-reduce measured at %s Mbit/s on this rank (below %.0f on "
                 "one at least): PowerSGD rank %d from step %d", self.epoch,
                 f"{sw.measured_mbit_s:.0f}" if sw.measured_mbit_s else "-",
                 sw.policy.below_mbit_s, sw.policy.rank, self.step)

    def _leave_at_boundary(self, leaving: set[str]) -> None:
        """Members that got SIGTERM leave now; survivors write the next epoch themselves."""
        assert self.membership is not None
        m = self.membership
        remaining = [x for x in m.members if x not in leaving]
        if self.member_id in leaving:
            saved = self._save_snapshot() if not remaining and self.rank == 0 else True
            self._teardown()
            self._depart(saved, "sigterm",
                         ExitReason.EVICTED if not remaining else ExitReason.SIGTERM)
        sizes = dict(zip(m.members, m.local_world_sizes, strict=True))
        self._teardown()
        try:
            nxt = p.build_membership(
                m.epoch + 1, remaining, sizes, "leave", time.time(), dropped=sorted(leaving)
            )
            self.link.js.propose(nxt)
        except (RuntimeError, OSError) as exc:
            self._store_failed(exc)
        self._rendezvous(failed_epoch=None, gone=leaving)

    def _finish(self) -> None:
        if self.rank == 0:
            self._watcher.quiesce()  # no older report may land after the final one
            report = self._build_report()
            record = p.FinishRecord(
                step=self.step, samples_total=self.samples_total, time_s=time.time()
            )

            def _send() -> None:
                self.link.js.set_progress(report)
                self.link.js.set_finished(record)

            # the result must reach the coordinator: retry through an outage (bounded)
            self.link.call_with_retry(_send, "the finish record", self.config.sync_timeout_s)
            self._remove_snapshots()
        self._teardown()
        self._announce("finished")
        self.exit_reason = ExitReason.FINISHED
