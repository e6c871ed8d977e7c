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

How it works (measured design, ELASTIC-NOTES section 2): the processes live for the whole job.
At every step boundary global rank 0 reads the newest epoch number from the coordinator's store
and one small all-reduce tells everybody (1) whether a new epoch exists and (2) which members
got SIGTERM. On a change every process tears down DDP and the process group and goes through
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
import contextlib
import io
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import Enum, StrEnum
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from malletrain.elastic import protocol as p
from malletrain.elastic import snapshot
from malletrain.elastic.coordinator import parse_address
from malletrain.elastic.jobstore import JobStore
from malletrain.elastic.rules import ScalingRule
from malletrain.elastic.sampler import DataStream, split_step, step_count
from malletrain.errors import ConfigError

log = logging.getLogger(__name__)

#: substrings of errors raised by gloo/NCCL when a peer dies, hangs or the group is torn down.
_PEER_FAILURE_HINTS = (
    "connection",
    "timed out",
    "timeout",
    "broken pipe",
    "gloo",
    "nccl",
    "socket",
    "peer",
    "closed",
    "abort",
)


class SyncError(RuntimeError):
    """The state sync of a new epoch could not complete; the epoch is healed like a failure."""


def is_peer_failure(exc: BaseException) -> bool:
    """True for errors that mean "the group is broken", not "the user's code is wrong"."""
    if isinstance(exc, (dist.DistError, SyncError)):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(hint in text for hint in _PEER_FAILURE_HINTS)
    return False


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


# ---------------------------------------------------------------------------- configuration


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r}: not a number") from None
    if value <= 0:
        raise ConfigError(f"environment variable {name}={raw!r}: must be > 0")
    return value


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise ConfigError(f"environment variable {name}={raw!r}: not a non-negative integer")
    return int(raw)


@dataclass(frozen=True)
class ElasticConfig:
    """Where this process belongs and the timeouts it uses (env contract: coordinator.py)."""

    coordinator: str
    job_id: str
    member_id: str
    state_dir: Path | None = None
    local_rank: int = 0
    local_world_size: int = 1
    #: "auto": nccl for a CUDA device, gloo otherwise (MALLETRAIN_BACKEND overrides)
    backend: str = "auto"
    step_timeout_s: float = 10.0
    sync_timeout_s: float = 120.0
    join_timeout_s: float = 30.0
    heal_wait_s: float = 2.0
    report_interval_s: float = 1.0
    poll_interval_s: float = 0.05
    #: after SIGTERM, the process is forced out (os._exit) after this long, whatever it does.
    sigterm_deadline_s: float = 4.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ElasticConfig:
        env = os.environ if env is None else env
        missing = [
            k
            for k in ("MALLETRAIN_COORDINATOR", "MALLETRAIN_JOB_ID", "MALLETRAIN_MEMBER_ID")
            if not env.get(k)
        ]
        if missing:
            raise ConfigError(
                f"missing environment variable(s) {', '.join(missing)}: an elastic worker is "
                "started by the malletrain daemon, or by hand next to `malletrain coordinator`"
            )
        parse_address(env["MALLETRAIN_COORDINATOR"])  # host:port, or a one-line error
        p.check_id("job id", env["MALLETRAIN_JOB_ID"])
        p.check_id("member id", env["MALLETRAIN_MEMBER_ID"])
        state_dir = env.get("MALLETRAIN_STATE_DIR") or None
        cfg = cls(
            coordinator=env["MALLETRAIN_COORDINATOR"],
            job_id=env["MALLETRAIN_JOB_ID"],
            member_id=env["MALLETRAIN_MEMBER_ID"],
            state_dir=Path(state_dir) if state_dir else None,
            local_rank=_env_int(env, "LOCAL_RANK", 0),
            local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", 1) or 1,
            step_timeout_s=_env_float(env, "MALLETRAIN_STEP_TIMEOUT_S", cls.step_timeout_s),
            sync_timeout_s=_env_float(env, "MALLETRAIN_SYNC_TIMEOUT_S", cls.sync_timeout_s),
            join_timeout_s=_env_float(env, "MALLETRAIN_JOIN_TIMEOUT_S", cls.join_timeout_s),
            heal_wait_s=_env_float(env, "MALLETRAIN_HEAL_WAIT_S", cls.heal_wait_s),
            backend=env.get("MALLETRAIN_BACKEND") or cls.backend,
            sigterm_deadline_s=_env_float(
                env, "MALLETRAIN_SIGTERM_DEADLINE_S", cls.sigterm_deadline_s
            ),
        )
        return replace(cfg, **overrides)


# ---------------------------------------------------------------------------- the step


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
            self.error = exc
            return True  # absorbed: the runtime heals the group; the step is not committed
        return False


class ExitReason(StrEnum):
    FINISHED = "finished"  # total_samples reached
    REMOVED = "removed"  # a published membership left this member out (planned leave)
    SIGTERM = "sigterm"  # preempted
    EVICTED = "evicted"  # job evicted to zero; the state was saved (or there was none)
    STATE_LOST = "state_lost"  # the job had progressed but no replica/snapshot holds it


class _Outcome(Enum):
    FORMED = 1
    RETRY = 2
    FAILED = 3


class _Leave(Exception):
    """Internal: this process leaves the job (reason in ``ElasticJob.exit_reason``)."""


# ---------------------------------------------------------------------------- the runtime


class ElasticJob:
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
        self.backend = self.config.backend
        if self.backend == "auto":
            self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.backend == "nccl":
            # torchrun sets 1 (TearDown): a timed-out collective would kill EVERY survivor.
            # 2 (CleanUpOnly) aborts the communicators and raises in this process instead,
            # so the runtime can heal; the watcher also aborts a step that overruns.
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = os.environ.get(
                "MALLETRAIN_NCCL_ASYNC_ERROR_HANDLING", "2"
            )
        self._step_started: float | None = None  # monotonic start of the step in flight
        # training position: identical on every replica, moved with the state
        self.step = 0
        self.samples_total = 0
        self.has_state = False  # trained or restored (a fresh newcomer has not)
        # membership
        self.epoch = 0
        self.membership: p.Membership | None = None
        self.rank = -1
        self.world_size = 0
        self._ddp: DistributedDataParallel | None = None
        self._formed_epoch = 0  # last epoch this process formed a group in (0: never)
        self.exit_reason: ExitReason | None = None
        #: (epoch, phase -> seconds) of the last reconfiguration, for logs and benchmarks
        self.last_reconfig: dict[str, float] = {}
        self._first_of_epoch = False
        self._snapshot_load_s = 0.0
        # coordinator link
        self._store: dist.TCPStore | None = None
        self._js: JobStore | None = None
        self._lock = threading.Lock()
        self._watcher = _Watcher(self)
        self._registered_seq = -1
        # progress reporting (global rank 0)
        self._report_t = time.monotonic()
        self._report_step = 0
        self._report_samples = 0
        # SIGTERM
        self._sigterm_at: float | None = None
        self._exited = threading.Event()

    # ------------------------------------------------------------------ public

    @property
    def model(self) -> torch.nn.Module:
        """The model to call in the step: this epoch's DDP wrapper."""
        if self._ddp is None:
            raise RuntimeError("ElasticJob.model used outside of a step")
        return self._ddp

    @property
    def member_id(self) -> str:
        return self.config.member_id

    def steps(self) -> Iterator[Step]:
        """Yield steps until the stop condition, a planned leave, SIGTERM or eviction."""
        self._install_sigterm()
        self._connect(first=True)
        self._watcher.start()
        try:
            self._rendezvous(failed_epoch=None, gone=set())
            while True:
                if self._finished():
                    self._finish()
                    return
                if not self._boundary():
                    continue  # re-formed: check again in the new group (newcomers do too)
                step = self._make_step()
                yield step
                if step.failed:
                    self._rendezvous(failed_epoch=step.epoch, gone=set())
                    continue
                self._commit(step)
        except _Leave:
            if self.exit_reason in _FAST_EXIT:
                atexit.register(_exit_now)
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
            self._exited.set()

    # ------------------------------------------------------------------ coordinator link

    def _connect(self, first: bool) -> None:
        host, port_text = self.config.coordinator.rsplit(":", 1)
        timeout = timedelta(seconds=30 if first else 2)
        try:
            store = dist.TCPStore(host, int(port_text), is_master=False, timeout=timeout)
        except (RuntimeError, ValueError) as exc:
            if first:
                raise ConfigError(
                    f"cannot reach the coordinator MALLETRAIN_COORDINATOR="
                    f"{self.config.coordinator}: {exc}"
                ) from exc
            raise
        store.set_timeout(timedelta(seconds=max(10.0, self.config.sync_timeout_s)))
        with self._lock:
            self._store = store
            self._js = JobStore(store, self.config.job_id)

    @property
    def js(self) -> JobStore:
        assert self._js is not None
        return self._js

    def _store_failed(self, exc: BaseException) -> None:
        """A main-thread store call failed (rendezvous/announce): reconnect, blocking.

        Only the re-forming path gets here; it cannot proceed without the coordinator anyway.
        Steps never call the store from the main thread (see :class:`_Watcher`).
        """
        log.warning("coordinator call failed (%s); reconnecting", exc)
        try:
            self._connect(first=False)
            if self._formed_epoch == 0:
                self._registered_seq = -1  # a restarted coordinator forgot us: register again
        except (RuntimeError, ValueError, OSError) as again:
            log.warning("coordinator still unreachable: %s", again)
            time.sleep(1.0)

    def _call_with_retry(self, fn: Callable[[], None], what: str, deadline_s: float) -> bool:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                fn()
                return True
            except (RuntimeError, OSError) as exc:
                if time.monotonic() > deadline:
                    log.error("could not send %s to the coordinator: %s", what, exc)
                    return False
                self._store_failed(exc)

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
            js.register(self._member_info())

    def _member_info(self) -> p.MemberInfo:
        return p.MemberInfo(
            member_id=self.member_id,
            node=socket.gethostname(),
            pid=os.getpid(),
            local_world_size=self.config.local_world_size,
            registered_at_s=time.time(),
        )

    def _register(self) -> None:
        if self.config.local_rank != 0:
            return
        self._registered_seq = self.js.register(self._member_info())
        log.info("registered as %s (seq %d)", self.member_id, self._registered_seq)

    def _announce(self, reason: p.DepartureReason) -> None:
        """Best effort: tell the coordinator this member leaves (local rank 0 only)."""
        if self.config.local_rank != 0 or self._js is None:
            return
        try:
            self.js.depart(self.member_id, reason, self.epoch or None, self.step)
        except (RuntimeError, OSError) as exc:
            log.warning("could not announce departure (%s): %s", reason, exc)

    # ------------------------------------------------------------------ SIGTERM

    def _install_sigterm(self) -> None:
        """SIGTERM sets a flag acted on at the next step boundary, plus a hard deadline.

        The Python-level handler runs only when the main thread returns to the interpreter,
        which a blocked collective may not do for ``step_timeout_s``. The wakeup fd is written
        by the C-level handler at once, so a helper thread starts the deadline immediately.
        """
        if threading.current_thread() is not threading.main_thread():
            log.warning("ElasticJob not on the main thread: SIGTERM handling disabled")
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
            if self._sigterm_at is None:
                self._sigterm_at = time.monotonic()

        signal.signal(signal.SIGTERM, _on_sigterm)
        threading.Thread(target=self._sigterm_watch, args=(read_fd,), daemon=True).start()

    def _sigterm_watch(self, read_fd: int) -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            if signal.SIGTERM in data:
                break
        if self._sigterm_at is None:
            self._sigterm_at = time.monotonic()
        # Kernel-level backstop: if even the forced exit below cannot run (the interpreter
        # is finalizing, daemon threads are frozen), SIGALRM's default action ends us.
        signal.alarm(math.ceil(self.config.sigterm_deadline_s) + 1)
        deadline = self._sigterm_at + self.config.sigterm_deadline_s
        if not self._exited.wait(max(0.0, deadline - time.monotonic())):
            log.error("still training %.1f s after SIGTERM; forcing exit",
                      self.config.sigterm_deadline_s)
            self._announce_on_fresh_client("sigterm")
        else:
            # The loop has ended; the script may still finish up, but the process must be
            # gone before Slurm's GraceTime whatever happens at interpreter shutdown.
            time.sleep(max(0.0, deadline - time.monotonic()))
            log.error("process still alive %.1f s after SIGTERM; forcing exit",
                      self.config.sigterm_deadline_s)
        os._exit(0)

    def _announce_on_fresh_client(self, reason: p.DepartureReason) -> None:
        """Announce from a helper thread: never share the main thread's store client."""
        if self.config.local_rank != 0:
            return
        host, port_text = self.config.coordinator.rsplit(":", 1)
        try:
            store = dist.TCPStore(host, int(port_text), is_master=False,
                                  timeout=timedelta(seconds=1))
            JobStore(store, self.config.job_id).depart(
                self.member_id, reason, self.epoch or None, self.step
            )
        except (RuntimeError, ValueError, OSError) as exc:
            log.warning("could not announce departure (%s): %s", reason, exc)

    # ------------------------------------------------------------------ the step loop

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
        self.step += 1
        self.samples_total += step.global_count
        self.has_state = True
        if self.rank == 0:
            self._maybe_report(force=False)

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
        )
        self._report_t, self._report_step, self._report_samples = now, self.step, self.samples_total
        return report

    def _boundary(self) -> bool:
        """The step-boundary check: True if the next step may run in the current group.

        False after a re-formation (or a failed check that led to one): the caller then runs
        the check again in the new group, so that survivors and newcomers execute the same
        sequence of collectives. Raises :class:`_Leave` if this process leaves here.
        """
        assert self.membership is not None
        members = self.membership.members
        flags = torch.zeros(1 + len(members), dtype=torch.int64)
        flags[0] = self._watcher.latest_epoch
        if self._sigterm_at is not None:
            flags[1 + members.index(self.member_id)] = 1
        try:
            flags = flags.to(self.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        except Exception as exc:
            if not is_peer_failure(exc):
                raise
            log.warning("boundary all-reduce failed in epoch %d: %s", self.epoch, exc)
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
        return True

    def _leave_at_boundary(self, leaving: set[str]) -> None:
        """Members that got SIGTERM leave now; survivors write the next epoch themselves."""
        assert self.membership is not None
        m = self.membership
        remaining = [x for x in m.members if x not in leaving]
        if self.member_id in leaving:
            if not remaining and self.rank == 0:
                self._save_snapshot()
            self._teardown()
            self._announce("sigterm")
            self.exit_reason = ExitReason.EVICTED if not remaining else ExitReason.SIGTERM
            raise _Leave
        sizes = dict(zip(m.members, m.local_world_sizes, strict=True))
        self._teardown()
        try:
            nxt = p.build_membership(
                m.epoch + 1, remaining, sizes, "leave", time.time(), dropped=sorted(leaving)
            )
            self.js.propose(nxt)
        except (RuntimeError, OSError) as exc:
            self._store_failed(exc)
        self._rendezvous(failed_epoch=None, gone=leaving)

    # ------------------------------------------------------------------ (re)configuration

    def _teardown(self) -> None:
        self._ddp = None
        self._step_started = None
        if dist.is_initialized():
            if self.backend == "nccl":
                # a communicator may be hung or broken: abort it, destroy could block
                with contextlib.suppress(Exception):
                    dist.distributed_c10d._abort_process_group()
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a broken group may fail to shut down cleanly
                log.debug("destroy_process_group: %s", exc)

    def _check_sigterm_waiting(self) -> None:
        """SIGTERM while not in a formed group: announce and leave.

        Rank 0 of the last group this process was in saves a snapshot first if it holds
        trained state: the others may be gone too (evicted to zero while re-forming), and a
        snapshot older than a live replica is never used, so saving is always safe.
        """
        if self._sigterm_at is None:
            return
        self._teardown()
        if self.rank == 0 and self._formed_epoch > 0:
            self._save_snapshot()
        self._announce("sigterm")
        self.exit_reason = ExitReason.SIGTERM
        raise _Leave

    def _rendezvous(self, failed_epoch: int | None, gone: set[str]) -> None:
        """Leave the current group and form the newest epoch that includes this member."""
        t0 = time.monotonic()
        self._teardown()
        heal_deadline = 0.0
        if failed_epoch is not None:
            heal_deadline = self._mark_alive(failed_epoch)
        while True:
            self._check_sigterm_waiting()
            try:
                latest = self.js.latest_epoch()
                cfg = self.js.membership(latest) if latest else None
                if self.js.finished() is not None:
                    self._finished_elsewhere()
            except (RuntimeError, OSError) as exc:
                self._store_failed(exc)
                time.sleep(0.5)
                continue
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
            if outcome is _Outcome.FORMED:
                self.last_reconfig["total_s"] = time.monotonic() - t0
                return
            if outcome is _Outcome.RETRY:
                time.sleep(self.config.poll_interval_s)
            elif outcome is _Outcome.FAILED:
                failed_epoch = cfg.epoch
                heal_deadline = self._mark_alive(cfg.epoch)

    def _finished_elsewhere(self) -> None:
        self._teardown()
        self.exit_reason = ExitReason.FINISHED
        raise _Leave

    def _mark_alive(self, epoch: int) -> float:
        try:
            self.js.mark(self.js.keys.alive(epoch, self.member_id, self.config.local_rank))
        except (RuntimeError, OSError) as exc:
            self._store_failed(exc)
        return time.monotonic() + self.config.heal_wait_s

    def _process_keys(self, cfg: p.Membership, which: str, member: str) -> list[str]:
        key = self.js.keys.alive if which == "alive" else self.js.keys.arrive
        return [key(cfg.epoch, member, lr) for lr in range(cfg.local_world_size(member))]

    def _present_members(self, cfg: p.Membership, which: str) -> list[str]:
        return [
            m for m in cfg.members if self.js.all_present(self._process_keys(cfg, which, m))
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
        won, _held = self.js.propose(nxt)
        if won:
            log.warning("epoch %d: %s without %s -> epoch %d", cfg.epoch, source, dropped,
                        nxt.epoch)
            if source == "heal":
                for m in dropped:
                    self.js.depart(m, "failed", cfg.epoch, self.step)

    def _not_in(self, cfg: p.Membership) -> None:
        """The newest epoch leaves this member out: planned removal, or dropped by a heal."""
        if self._formed_epoch == 0:
            if self._registered_seq < 0:
                self._register()
            return  # a newcomer waiting to be published
        # the first epoch after ours that left us out tells why
        for e in range(self._formed_epoch + 1, cfg.epoch + 1):
            m = self.js.membership(e)
            if m is not None and self.member_id not in m.members:
                break
        else:
            m = cfg
        if m is not None and m.source == "publish":
            if not cfg.members and self.rank == 0:
                self._save_snapshot()
            self._announce("removed")
            self.exit_reason = ExitReason.EVICTED if not cfg.members else ExitReason.REMOVED
            raise _Leave
        # dropped by survivors (we were slow or cut off): wait to be published again
        log.warning("dropped from the job in epoch %d; registering again", cfg.epoch)
        self._formed_epoch = 0
        self.rank = -1
        self._register()

    def _form(self, cfg: p.Membership) -> _Outcome:
        """Meet the other processes of ``cfg``, build the group, sync the state."""
        js = self.js
        e = cfg.epoch
        go_key = js.keys.go(e)
        js.mark(js.keys.arrive(e, self.member_id, self.config.local_rank))
        expected = [k for m in cfg.members for k in self._process_keys(cfg, "arrive", m)]
        deadline = time.monotonic() + self.config.join_timeout_s
        t_arrive = time.monotonic()
        while True:
            # SIGTERM before this epoch is committed: abort it, and leave without blocking it
            aborting = self._sigterm_at is not None
            if aborting and js.store.compare_set(go_key, "", "abort") == b"abort":
                self._propose_without(cfg, [self.member_id], source="leave")
                self._check_sigterm_waiting()
            if js.all_present([go_key]):
                if js.store.get(go_key) == b"go":
                    break
                return _Outcome.RETRY
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
        t_go = time.monotonic()
        self._snapshot_load_s = 0.0
        assert self._store is not None
        rank = cfg.rank_offset(self.member_id) + self.config.local_rank
        try:
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore(js.keys.pg_prefix(e), self._store),
                rank=rank,
                world_size=cfg.world_size,
                timeout=timedelta(seconds=self.config.sync_timeout_s),
            )
            t_init = time.monotonic()
            self.rank, self.world_size = rank, cfg.world_size
            self._sync_state()
            t_sync = time.monotonic()
            self._ddp = DistributedDataParallel(
                self.module,
                init_sync=False,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
            )
            group = dist.distributed_c10d._get_default_group()
            try:
                group.set_timeout(timedelta(seconds=self.config.step_timeout_s))
            except RuntimeError as exc:  # backend without a settable timeout
                log.warning("cannot shorten the group timeout for steps: %s", exc)
        except Exception as exc:
            if not is_peer_failure(exc):
                raise
            log.warning("forming epoch %d failed: %s", e, exc)
            self._teardown()
            return _Outcome.FAILED
        lr = self.rule.learning_rate(cfg.world_size)
        for group_params in self.optimizer.param_groups:
            group_params["lr"] = lr
        self.epoch, self.membership, self._formed_epoch = e, cfg, e
        self._first_of_epoch = True
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
        return _Outcome.FORMED

    # ------------------------------------------------------------------ state

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

    def _sync_state(self) -> None:
        """Send the freshest state (by step; a newer snapshot wins over live state) to laggards."""
        snap = snapshot.find_latest(self.config.state_dir, self.config.job_id)
        mine = torch.tensor(
            [int(self.has_state), self.step, -1 if snap is None else snap.step],
            dtype=torch.int64,
            device=self.device,
        )
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        table = [t.cpu().tolist() for t in gathered]
        src, target_step, use_snapshot = p.choose_source(table)
        if target_step < 0:
            self._refuse_if_state_lost()
        if use_snapshot:
            needy = [r for r in range(self.world_size) if r != src]
        else:
            needy = [
                r for r, (h, s, _) in enumerate(table)
                if r != src and (target_step < 0 or not h or s != target_step)
            ]
        if use_snapshot and self.rank == src:
            t_load = time.monotonic()
            loaded = snapshot.load(snap, self.config.job_id) if snap is not None else None
            if loaded is None:  # load() renamed it aside, so the retry picks the next one
                raise SyncError(f"snapshot {snap} became unreadable during the state sync")
            self._apply(loaded)
            self._snapshot_load_s = time.monotonic() - t_load
            log.warning("restored snapshot of step %d from %s", self.step, snap)
        if not needy:
            return
        group = None
        if len(needy) + 1 < self.world_size:
            group = dist.new_group(sorted([src, *needy]))
        if self.rank != src and self.rank not in needy:
            return
        if self.rank == src:
            skeleton, tensors = split_tensors(self._payload())
            head = _to_bytes(skeleton)
            flats = _flatten_by_dtype(tensors)
        else:
            head = torch.empty(0, dtype=torch.uint8)
        head = self._broadcast_bytes(head, src, group)
        if self.rank == src:
            for flat in flats:
                dist.broadcast(flat.to(self.device), src=src, group=group)
        else:
            skeleton = torch.load(io.BytesIO(head.numpy().tobytes()), weights_only=True)
            tensors = []
            for dtype_name, shapes in skeleton["groups"]:
                dtype = getattr(torch, dtype_name)
                total = sum(math.prod(shape) for shape in shapes)
                wire = torch.empty(total, dtype=dtype, device=self.device)
                dist.broadcast(wire, src=src, group=group)
                flat = wire.cpu()
                offset = 0
                for shape in shapes:
                    n = math.prod(shape)
                    tensors.append(flat[offset : offset + n].view(shape))
                    offset += n
            self._apply(join_tensors(skeleton, tensors))
        if group is not None:
            dist.destroy_process_group(group)

    def _broadcast_bytes(self, data: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        """Broadcast a uint8 tensor of unknown length from ``src`` (length first)."""
        size = torch.tensor([data.numel()], dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=src, group=group)
        if self.rank != src:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        wire = data.to(self.device)  # NCCL sends device tensors only; gloo: the same tensor
        dist.broadcast(wire, src=src, group=group)
        return wire.cpu()

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
                progress = self.js.progress()
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
            raise _Leave

    def _save_snapshot(self) -> None:
        """Evicted to zero: write the state to MALLETRAIN_STATE_DIR (rank 0 of the last group)."""
        if not self.has_state:
            return
        if self.config.state_dir is None:
            log.error("evicted to zero without MALLETRAIN_STATE_DIR: training state is lost")
            return
        t0 = time.monotonic()
        path = snapshot.save(self.config.state_dir, self.config.job_id, self.step, self._payload())
        self.last_reconfig["snapshot_save_s"] = time.monotonic() - t0
        log.warning("saved snapshot of step %d to %s in %.2f s", self.step, path,
                    time.monotonic() - t0)

    # ------------------------------------------------------------------ the end

    def _finish(self) -> None:
        if self.rank == 0:
            report = self._build_report()
            record = p.FinishRecord(
                step=self.step, samples_total=self.samples_total, time_s=time.time()
            )

            def _send() -> None:
                self.js.set_progress(report)
                self.js.set_finished(record)

            # the result must reach the coordinator: retry through an outage (bounded)
            self._call_with_retry(_send, "the finish record", self.config.sync_timeout_s)
            if self.config.state_dir is not None:
                snapshot.remove_older(self.config.state_dir, self.config.job_id, keep_step=None)
        self._teardown()
        self._announce("finished")
        self.exit_reason = ExitReason.FINISHED


#: Leaves after which the process ends through :func:`_exit_now`: the node goes back to
#: Slurm (or to another job) only when the slot's step ends, i.e. when this process is gone.
_FAST_EXIT = frozenset({ExitReason.SIGTERM, ExitReason.EVICTED, ExitReason.REMOVED})


def _exit_now() -> None:
    """Leave at interpreter exit without running C++ static destructors.

    Registered after a SIGTERM / eviction / planned (``removed``) leave, when the node must
    be given back at once: in torch 2.13 the exit of such a worker hung in
    ``TorchLibraryInit::~TorchLibraryInit`` (a dispatcher table walk that never ended) in 3 of
    5 runs of the eviction test, after the Python code had finished; and even when it ends,
    a normal interpreter exit after a gloo group took 1.4-2.6 s on the shared 2-core machine
    (a removed member's slot ended 2.5 s after its last log line in the e2e benchmark, while
    the regular job waiting for that node sat pending). Being registered late, this runs
    before torch's own atexit handlers: the script's code after the step loop still runs,
    ``atexit`` hooks registered before the leave do not; stdio and logging are flushed
    first. The exit status is 0, as for any leave the runtime asked for.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


_TENSOR = "__malletrain_tensor__"


def split_tensors(payload: Any) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Separate a nested state into a small skeleton and its tensors (in a fixed order).

    The state travels as the skeleton (a few KB, pickled with torch.save) plus one flat
    buffer per dtype, so that 192 MiB of parameters and optimizer state are sent and
    received with memory copies instead of a pickle round trip (which cost the newcomer
    0.9-2.3 s for that size). Tensors are regrouped by dtype; the skeleton records the order.
    """
    tensors: list[torch.Tensor] = []

    def walk(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj.detach().cpu())
            return (_TENSOR, len(tensors) - 1)
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(walk(v) for v in obj)
        return obj

    tree = walk(payload)
    order = sorted(range(len(tensors)), key=lambda i: str(tensors[i].dtype))
    groups: list[list[Any]] = []
    slot_of = {}
    for i in order:
        name = str(tensors[i].dtype).removeprefix("torch.")
        if not groups or groups[-1][0] != name:
            groups.append([name, []])
        slot_of[i] = sum(len(g[1]) for g in groups)
        groups[-1][1].append(list(tensors[i].shape))
    ordered = [tensors[i] for i in order]
    return {"tree": tree, "groups": groups, "slots": slot_of}, ordered


def join_tensors(skeleton: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    """Inverse of :func:`split_tensors` (``tensors`` in the skeleton's group order)."""
    slots = skeleton["slots"]

    def walk(obj: Any) -> Any:
        if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == _TENSOR:
            return tensors[slots[obj[1]]]
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(walk(v) for v in obj)
        return obj

    return walk(skeleton["tree"])


def _to_bytes(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def _flatten_by_dtype(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """One contiguous buffer per dtype (``tensors`` already grouped by dtype)."""
    flats: list[torch.Tensor] = []
    group: list[torch.Tensor] = []
    for t in tensors:
        if group and t.dtype != group[0].dtype:
            flats.append(torch.cat([g.reshape(-1) for g in group]))
            group = []
        group.append(t)
    if group:
        flats.append(torch.cat([g.reshape(-1) for g in group]))
    return flats


class _Watcher:
    """Background link to the coordinator: polls the newest epoch, sends progress.

    The main thread never talks to the store during steps, so a slow, frozen or restarted
    coordinator cannot stall training: the job keeps its current membership, this thread
    reconnects (own client, short timeouts) and rank 0 re-publishes its epoch if the
    restarted store lost it.
    """

    def __init__(self, job: ElasticJob) -> None:
        self.job = job
        self.latest_epoch = 0
        self.pending_report: p.ProgressReport | None = None
        self.down_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="malletrain-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_timeout_s: float = 0.0) -> None:
        self._stop.set()
        if join_timeout_s > 0 and self._thread.is_alive():
            self._thread.join(join_timeout_s)

    def _run(self) -> None:
        cfg = self.job.config
        host, port_text = cfg.coordinator.rsplit(":", 1)
        js: JobStore | None = None
        reconnected = False
        while not self._stop.is_set():
            try:
                if js is None:
                    store = dist.TCPStore(
                        host, int(port_text), is_master=False, timeout=timedelta(seconds=2)
                    )
                    js = JobStore(store, cfg.job_id)
                    if reconnected:
                        log.warning("coordinator reachable again")
                        self.job.reseed(js)
                    self.down_since = None
                self._abort_overrun_step()
                self.latest_epoch = js.latest_epoch()
                report = self.pending_report
                if report is not None:
                    self.pending_report = None
                    js.set_progress(report)
            except (RuntimeError, OSError, ValueError) as exc:
                if self.down_since is None:
                    log.warning("coordinator unreachable (%s); training on, reconnecting", exc)
                    self.down_since = time.monotonic()
                js, reconnected = None, True
                self._stop.wait(1.0)
                continue
            self._stop.wait(cfg.poll_interval_s)

    def _abort_overrun_step(self) -> None:
        """NCCL only: a step past ``step_timeout_s`` is aborted from here.

        A hung NCCL collective blocks the main thread in a CUDA sync with no host-side
        timeout; aborting the communicators makes it raise, and the step is healed like any
        peer failure. (gloo's own timeout already bounds its collectives; abort would not
        unblock them.) UNVERIFIED: no GPU was available where this was written.
        """
        job = self.job
        started = job._step_started
        if job.backend != "nccl" or started is None:
            return
        if time.monotonic() - started > job.config.step_timeout_s:
            log.error("step in flight for more than %.1f s: aborting the NCCL group",
                      job.config.step_timeout_s)
            job._step_started = None
            with contextlib.suppress(Exception):
                dist.distributed_c10d._abort_process_group()
