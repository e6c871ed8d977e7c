"""The worker's background thread: the newest epoch, progress reports, stuck NCCL steps."""

from __future__ import annotations

import logging
import threading
import time

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.worker.state import WorkerState

log = logging.getLogger(__name__)


class Watcher:
    """Background link to the coordinator: polls the newest epoch, sends progress.

    The main thread never talks to the store during steps, so a slow, frozen or restarted
    coordinator cannot stall training: the job keeps its current membership, this thread
    reconnects (own client, short timeouts) and rank 0 re-publishes its epoch if the
    restarted store lost it.
    """

    def __init__(self, job: WorkerState) -> None:
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

    def quiesce(self, join_timeout_s: float = 3.0) -> None:
        """Stop, and drop a report not yet sent: the caller sends the last one itself.

        The job's finish: a report this thread still held, or was sending on its own
        connection, could otherwise land after the final one and leave the coordinator's
        progress short of the job's total (seen in CI: 1088 of 1100 samples).
        """
        self.stop(join_timeout_s)
        self.pending_report = None

    def _run(self) -> None:
        cfg = self.job.config
        js: JobStore | None = None
        reconnected = False
        while not self._stop.is_set():
            try:
                if js is None:
                    js = self.job.link.own_client(2.0)
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
        """NCCL only: a step or boundary check past ``step_timeout_s`` is aborted from here.

        A hung NCCL collective blocks the main thread in a CUDA sync with no host-side
        timeout; aborting the communicators makes it raise, the step is not committed and
        the group is healed like after any peer failure. (gloo's own timeout already bounds
        its collectives.) On CPU the tests drive this path with gloo and a short timeout.
        """
        job = self.job
        started = job._step_started
        abort = job.config.abort_hung
        if started is None or not (job.backend == "nccl" if abort is None else abort):
            return
        if time.monotonic() - started > job.config.step_timeout_s:
            log.error("step in flight for more than %.1f s: aborting the NCCL group",
                      job.config.step_timeout_s)
            job._step_started = None
            job._abort_group()
