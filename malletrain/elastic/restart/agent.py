"""The node agent of a restart-mode job: membership in, one batch shell per generation out.

A node slot of a restart-mode job runs this (``python -m malletrain.elastic.restart.agent``)
as the user, under the slot's ``srun``. To the daemon it is a member like an ``ElasticJob``
node: it registers (with its slot's Slurm job id and node name), follows the published
memberships and announces its departure. To the user's script it is the batch system, as
``sbatch`` runs a script: for each membership (a *generation*) the agent of the first node
runs the batch script once, unchanged, in the environment of an allocation of the
generation's nodes (:mod:`.generation`), its output appended to the user's ``--output``;
the ``srun`` on its PATH (:mod:`.srun`) places each step's tasks in the generation's node
slots, where every node's agent keeps track of them (:mod:`.registry`). When the membership
changes, every agent stops its part of the generation (the batch shell, the step tasks on
its node) and the next one starts once all of it is gone.

Stopping a generation: the script's own ``--signal`` (``USR1@60``: USR1 to every task, then
up to 60 s to checkpoint and exit; ``B:USR1@60``: to the batch shell only), then SIGTERM,
then SIGKILL after :data:`KILL_AFTER_S`. On Slurm's SIGTERM (preemption, the time limit) a
regular job waits for the node: the tasks get SIGKILL 0.1 s after it (:mod:`.stopping`), the
departure goes out meanwhile (:class:`.handover.Farewell`); the script resumes from its last
checkpoint."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol.config import ElasticConfig
from malletrain.elastic.protocol.link import STORE_ERRORS, CoordinatorLink
from malletrain.elastic.restart import batchio, handover, registry, srun, tree
from malletrain.elastic.restart.batchio import BatchIO
from malletrain.elastic.restart.generation import GenerationView, GenNode, shell_env
from malletrain.elastic.restart.script import SCRIPT_ENV
from malletrain.elastic.restart.stopping import KILL_AFTER_S, PREEMPTED, NodeStopper, StopRule

log = logging.getLogger(__name__)

#: a launch that fails on its own waits this long for a new membership before giving up
RESTART_WAIT_S = 60.0
HEARTBEAT_S = 5.0
POLL_S = 0.25
#: how often a node that runs no batch shell asks whether the job has finished
FINISHED_POLL_S = 2.0
#: the ``srun`` on the batch shell's PATH: this package's step launcher
_SHIM = "#!{python}\nimport sys\nfrom malletrain.elastic.restart.srun import main\n" \
        "sys.exit(main())\n"


@dataclass
class Running:
    """One generation on this node: its batch shell (on the first node only)."""

    epoch: int
    members: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None
    started_s: float  # unix time
    stopping: bool = False
    errors_at: int = 0  # where its step failures start in the run dir's STEP_ERRORS


class NodeAgent:
    def __init__(self, config: ElasticConfig, text: str, workers: int, stop: StopRule,
                 io: BatchIO, tasks_per_node: int | None = None) -> None:
        self.config = config
        self.text = text
        self.workers = workers
        self.tasks_per_node = tasks_per_node
        self.stop = stop
        self.io = io
        self.link = CoordinatorLink(config)
        self.run_dir = Path(tempfile.mkdtemp(prefix="malletrain-restart-"))
        self.progress_file = self.run_dir / "progress"
        self.shim_dir = self.run_dir / "bin"
        self.shim_dir.mkdir(mode=0o700)
        (self.shim_dir / "srun").write_text(_SHIM.format(python=sys.executable))
        (self.shim_dir / "srun").chmod(0o700)
        self.real_srun = shutil.which("srun") or "srun"
        self.stopper = NodeStopper(self.run_dir, self.shim_dir / "srun", self._preempted)
        self.child: Running | None = None
        self.joined = False
        self.failed_at: float | None = None
        self.sigterm_at: float | None = None
        self.woken = threading.Event()  # set by SIGTERM: the loop's wait ends at once
        self.members: dict[str, p.MemberInfo] = {}
        self.last_beat = 0.0
        self.last_finished_check = 0.0

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.link.connect(first=True)
        slot_job = os.environ.get("SLURM_JOB_ID", "")
        self.link.js.register(replace(  # where this node's share of a step is run
            self.link.member_info(), slurm_job=int(slot_job) if slot_job.isdigit() else 0,
            slurm_node=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            run_dir=str(self.run_dir)))
        log.info("member %s registered; waiting for a membership", self.config.member_id)
        while True:
            if self.sigterm_at is not None:
                return self._yield_node()
            m = self._membership()
            done = self._child_done()
            if done is not None:
                return done
            mine = m is not None and self.config.member_id in m.members
            if m is not None and mine and (self.child is None or self.child.epoch != m.epoch):
                self._stop_child(self.stop)
                if self._last_generation_stopped(m):
                    self._start(m)
            elif m is not None and not mine and self.joined:
                return self._leave_removed()
            if m is not None and mine:
                self._heartbeat(m)
            self.woken.wait(POLL_S)

    def _on_sigterm(self, _signum: int, _frame: object) -> None:
        if self.sigterm_at is None:
            self.sigterm_at = time.time()
        self.woken.set()

    def _preempted(self) -> bool:
        return self.sigterm_at is not None

    def _membership(self) -> p.Membership | None:
        try:
            return self.link.js.current()
        except STORE_ERRORS as exc:
            self.link.reconnect(exc)
            return None

    def _child_done(self) -> int | None:
        """The launch ended by itself: finished (0), or failed: wait for a new generation
        (a peer left) for :data:`RESTART_WAIT_S`, then give up with the launch's code."""
        c = self.child
        if c is not None and c.proc is None and not c.stopping:
            return self._finished_elsewhere(c)
        if c is None or c.proc is None or c.stopping or c.proc.poll() is None:
            return None
        rc = c.proc.returncode
        if self.failed_at is None:
            self.stopper.end_leftovers()  # the batch shell ended: so does what it started
        if rc == 0 and not self._peer_left(c):
            log.info("the launch finished (epoch %d)", c.epoch)
            self._call(lambda: self.link.js.set_finished(p.FinishRecord(
                step=0, samples_total=self._samples(), time_s=time.time())))
            self._call(lambda: self.link.js.depart(self.config.member_id, "finished",
                                                   c.epoch, 0))
            return 0
        now = time.monotonic()
        if self.failed_at is None:
            log.warning("the launch of epoch %d ended (exit %d) while a member left or failed; "
                        "waiting up to %.0f s for a new membership", c.epoch, rc, RESTART_WAIT_S)
            self.failed_at = now
        why = srun.last_failure(self.run_dir, c.errors_at)
        # a step srun refused (an option it cannot honour here) fails the same at any size:
        # said at once, unless a peer left meanwhile (then a new membership comes)
        refused = why.startswith("srun: error:") and not self._peer_left(c)
        if refused or now - self.failed_at > RESTART_WAIT_S:
            log.error("the launch failed (exit %d): %s", rc, why or "no step failed")
            why = why or f"the batch script exited with code {rc}"
            self._record(c.epoch, "stop")  # what the shell started has ended here
            self._call(lambda: self.link.js.depart(self.config.member_id, "crashed",
                                                   c.epoch, 0, detail=why))
            return rc if rc > 0 else 128 - rc
        return None

    def _finished_elsewhere(self, c: Running) -> int | None:
        """A node without the batch shell ends with the job: when the first node's shell
        finished it (Slurm ends a job's steps with its batch script)."""
        now = time.monotonic()
        if now - self.last_finished_check < FINISHED_POLL_S:
            return None
        self.last_finished_check = now
        try:
            done = self.link.js.finished() is not None
        except STORE_ERRORS:
            return None
        if not done:
            return None
        log.info("the job finished (epoch %d)", c.epoch)
        self._stop_child(PREEMPTED)
        self._call(lambda: self.link.js.depart(self.config.member_id, "finished", c.epoch, 0))
        return 0

    def _peer_left(self, c: Running) -> bool:
        """Did the generation end because a peer left (its script then exits 0 on a stop
        request, like this one) rather than because training is done?"""
        try:
            if self.link.js.latest_epoch() > c.epoch:
                return True
            return any(ev.kind == "depart" and ev.member_id in c.members
                       and ev.member_id != self.config.member_id
                       and ev.data.get("reason") != "finished"
                       and ev.time_s >= c.started_s - 1.0 for ev in self.link.js.events())
        except STORE_ERRORS:
            return True  # cannot tell: wait for the coordinator rather than finish the job

    def _leave_removed(self) -> int:
        """Out of the membership (a planned size change): announce first (the daemon
        re-forms the others at once), then stop the launch with the script's grace."""
        epoch = self.child.epoch if self.child else None
        self._call(lambda: self.link.js.depart(self.config.member_id, "removed", epoch, 0))
        self._stop_child(self.stop)
        log.info("left the job (removed)")
        return 0

    def _yield_node(self) -> int:
        """Slurm's SIGTERM: a regular job waits for the node. The tasks are signalled at
        once; the departure and the stop record go out meanwhile (:class:`.handover.Farewell`)."""
        c = self.child
        words = handover.Farewell(self.link.own_client, self.config.member_id,
                                  c.epoch if c else None).start()
        log.info("SIGTERM (%.0f ms ago): stopping the tasks",
                 1000 * (time.time() - (self.sigterm_at or time.time())))
        if c is not None:
            c.stopping = True
            took_s = self.stopper.stop(c.proc, c.epoch, PREEMPTED,
                                       time.time() - (self.sigterm_at or time.time()))
            log.info("epoch %d: stopped in %.2f s (%s)", c.epoch, took_s,
                     ", ".join(self.stopper.stages))
            self.child = None
        words.stopped()
        sent = words.wait()
        log.info("left the job (sigterm)%s", "" if sent else
                 ": the coordinator did not answer in time; not waiting for it")
        return 143

    def _record(self, epoch: int, state: str) -> None:
        """Once, no retry: a preempted slot must not hold its node for the coordinator."""
        try:
            handover.record(self.link.js, self.config.member_id, epoch, state)
        except STORE_ERRORS as exc:
            log.warning("could not record generation %d %s: %s", epoch, state, exc)

    def _call(self, fn: Callable[[], object]) -> None:
        self.link.call_with_retry(fn, "a record", deadline_s=10.0)

    # ------------------------------------------------------------------ generations

    def _last_generation_stopped(self, m: p.Membership) -> bool:
        """Wait for the other nodes of the last generation to stop (:mod:`.handover`);
        False if Slurm's SIGTERM came meanwhile (the loop leaves)."""
        bound_s = self.stop.grace_s + 2 * KILL_AFTER_S + 5.0
        try:
            handover.wait_for_last_generation(self.link.js, m, self.config.member_id,
                                              bound_s, POLL_S, self._preempted)
        except STORE_ERRORS as exc:  # the coordinator: start as before rather than hang
            log.warning("could not check the last generation: %s", exc)
        return not self._preempted()

    def _start(self, m: p.Membership) -> None:
        errors_at = srun.failures_size(self.run_dir)  # this launch's failures follow
        registry.set_generation(self.run_dir, m.epoch, "run")
        proc = None
        if m.members[0] == self.config.member_id:
            proc = self._start_batch(m)
        self.child = Running(m.epoch, m.members, proc, time.time(), errors_at=errors_at)
        self._record(m.epoch, "run")
        self.joined = True
        self.failed_at = None
        log.info("epoch %d: on %d node(s) as node %d%s", m.epoch, len(m.members),
                 m.members.index(self.config.member_id),
                 ": batch shell started" if proc else "")

    def _start_batch(self, m: p.Membership) -> subprocess.Popen[bytes]:
        """The batch script, as written, run once for the generation (the kernel reads
        its ``#!`` line, as slurmstepd's exec does), its output where the user said."""
        view = self._view(m)
        script = self.run_dir / f"batch-{m.epoch}.sh"
        script.write_text(self.text)
        script.chmod(0o500)
        out, err = batchio.open_streams(self.io, view.job_number, view.nodes[0].name)
        try:
            os.write(out, batchio.size_line(self.config.job_id, m.epoch, view.nodelist,
                                            len(view.nodes)))
            return subprocess.Popen([str(script)], env=shell_env(
                view, os.environ, self.io.submit_dir, self.run_dir, self.shim_dir), stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL,
                                    cwd=self.io.submit_dir, start_new_session=True)
        finally:
            os.close(out)
            os.close(err)

    def _view(self, m: p.Membership) -> GenerationView:
        self.link.js.events()  # the registrations written since (only new events are read)
        self.members = self.link.js.event_views()[0]  # a member's latest registration
        nodes = []
        for x in m.members:
            info = self.members.get(x)
            nodes.append(GenNode(name=(info.slurm_node if info and info.slurm_node
                                       else socket.gethostname()),
                                 host=info.node if info else socket.gethostname(),
                                 slot_job=info.slurm_job if info else 0,
                                 run_dir=info.run_dir if info else ""))
        return GenerationView(job_id=self.config.job_id, epoch=m.epoch, nodes=tuple(nodes),
                              name=self.io.job_name, tasks_per_node=self.tasks_per_node,
                              python=sys.executable, real_srun=self.real_srun)

    def _stop_child(self, stop: StopRule) -> None:
        """Stop this node's part of the generation (:mod:`.stopping`) and record it."""
        c = self.child
        if c is None:
            return
        c.stopping = True
        took_s = self.stopper.stop(c.proc, c.epoch, stop)
        log.info("epoch %d: stopped in %.2f s", c.epoch, took_s)
        self._record(c.epoch, "stop")
        self.child = None

    # ------------------------------------------------------------------ progress

    def _samples(self) -> int:
        """What the script wrote to ``$MALLETRAIN_PROGRESS_FILE`` (samples so far), or 0."""
        try:
            text = self.progress_file.read_text().strip().split()[-1]
        except (OSError, IndexError):
            return 0
        return int(text) if text.isdigit() and len(text) < 19 else 0

    def _heartbeat(self, m: p.Membership) -> None:
        """The first node reports progress: the script's samples if it writes them, and in
        any case that its generation is alive (the daemon's stall detector needs that)."""
        now = time.time()
        if m.members[0] != self.config.member_id or now - self.last_beat < HEARTBEAT_S:
            return
        if self.child is None or self.child.proc is None or self.child.proc.poll() is not None:
            return
        self.last_beat = now
        report = p.ProgressReport(
            epoch=m.epoch, step=0, samples_total=self._samples(), samples_per_s=0.0,
            world_size=len(m.members) * self.workers, step_time_s=0.0, time_s=now,
            members=m.members)
        try:
            self.link.js.set_progress(report)
        except STORE_ERRORS as exc:
            log.warning("progress report failed: %s", exc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="malletrain-restart-agent")
    options: tuple[tuple[str, type, object], ...] = (
        ("--workers", int, 1), ("--tasks-per-node", int, None), ("--stop-signal", str, "TERM"),
        ("--stop-grace-s", float, 0.0), ("--job-name", str, "malleable"),
        ("--submit-dir", str, os.getcwd()), ("--batch-output", str, None),
        ("--batch-error", str, None))
    for flag, kind, default in options:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--stop-shell-only", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s malletrain-agent %(levelname)s %(message)s")
    text = os.environ.pop(SCRIPT_ENV, "")
    if not text.startswith("#!"):
        print("malletrain-agent: the slot carries no batch script", file=sys.stderr)
        return 2
    config = ElasticConfig.from_env()
    stop = StopRule(signal.Signals[f"SIG{args.stop_signal}"], args.stop_grace_s,
                    args.stop_shell_only)
    if not tree.become_subreaper():
        log.warning("not a child subreaper: processes that leave the launch's tree may "
                    "outlive a stopped generation")
    array_job, task = (os.environ.get(k, "") for k in ("SLURM_ARRAY_JOB_ID",
                                                        "SLURM_ARRAY_TASK_ID"))
    array = (int(array_job), int(task)) if array_job.isdigit() and task.isdigit() else None
    io = BatchIO(args.job_name, args.submit_dir, args.batch_output, args.batch_error, array)
    agent = NodeAgent(config, text, args.workers, stop, io, args.tasks_per_node)
    try:
        rc = agent.run()
    finally:
        shutil.rmtree(agent.run_dir, ignore_errors=True)
    # leave without finalizing an interpreter that imported torch (1.4-2.6 s measured for a
    # worker): the slot, and the node, end with this process
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
