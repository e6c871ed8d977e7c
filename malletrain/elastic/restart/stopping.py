"""How a node agent stops its part of a generation, as Slurm stops a job on a node.

What runs on a node for a generation: on the first node, the batch shell and everything it
started (a process tree the agent, a child subreaper, always finds: :mod:`.tree`); on every
node, the tasks of the steps placed there (children of the slot's ``slurmstepd``, found
through :mod:`.registry`). A stop is the script's own ``--signal`` with its grace, then
SIGTERM, then SIGKILL; the next generation starts only once nothing of this one is left.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from malletrain.elastic.restart import registry, tree

log = logging.getLogger(__name__)

#: after the stop signal's grace (or SIGTERM), a generation is killed this much later
KILL_AFTER_S = 5.0
#: after Slurm's SIGTERM, the launch is killed this much later: a regular job waits for the
#: node meanwhile (issue 16's bound: < 1 s added wait, of which Slurm's own path takes
#: 0.3-0.5 s). In the e2e benchmark (--restart-mode) 1.0 s gave waits up to 2.4 s; 0.3 s
#: held the node 0.48 s (p50, max 0.87 s) from Slurm's signal to the slot's end, 0.1 s
#: 0.25 s (max 0.61 s). Too short for any checkpoint anyway: a script keeps what it
#: checkpointed before; the --signal grace is for planned stops, not for preemptions.
PREEMPT_KILL_AFTER_S = 0.1
#: on a preemption, the batch shell's ``srun`` clients are spared the SIGKILL: each ends once
#: its step's tasks (killed on their nodes by Slurm and the nodes' agents) have reported their
#: exit, so that every step ends the way Slurm ends it. A step whose client was killed first
#: kept its node's slurmstepd (no task left) until slurmd's own kill, ~3 s after the signal
#: (KillWait): the regular job waited for that. Killed this long after all else, regardless.
STEP_CLIENTS_S = 1.0


@dataclass(frozen=True)
class StopRule:
    """How a generation is asked to stop: the script's ``--signal``."""

    signum: int
    grace_s: float
    shell_only: bool  # ``B:``: the batch shell only (it traps the signal and passes it on)
    kill_after_s: float = KILL_AFTER_S  # from SIGTERM to SIGKILL


#: Slurm's SIGTERM: no grace, SIGKILL soon after
PREEMPTED = StopRule(signal.SIGTERM, 0.0, False, PREEMPT_KILL_AFTER_S)


class NodeStopper:
    """Stops what a generation runs on this node."""

    def __init__(self, run_dir: Path, shim: Path, preempted: Callable[[], bool]) -> None:
        self.run_dir = run_dir
        self.shim = str(shim)
        self.preempted = preempted
        #: the last stop's stages, seconds after its start (``SIGTERM +0.00``): for the log
        self.stages: list[str] = []

    def stop(self, shell: subprocess.Popen[bytes] | None, epoch: int, rule: StopRule,
             slurm_term_age_s: float | None = None) -> float:
        """The stop signal (to the batch shell only for ``B:``, else to every process but
        the shell and to the step tasks on this node), up to its grace to exit, then
        SIGTERM to all, then SIGKILL :data:`KILL_AFTER_S` later; the seconds it took.
        The batch shell's ``srun`` clients do not get the stop signal: each node's agent
        signals its own tasks, as slurmstepd does, and no task gets it twice.
        ``slurm_term_age_s``: Slurm's SIGTERM reached every process of the slot that long
        ago (a preemption): SIGKILL comes ``rule.kill_after_s`` after it, on the clock,
        not after scans of the process table (0.1-0.3 s each stage on a loaded node)."""
        registry.set_generation(self.run_dir, epoch, "stop")  # before any scan: no task
        t0 = time.monotonic()  # of this generation can start after it
        self.stages = []
        shell_pid = shell.pid if shell is not None else None
        if rule.grace_s > 0 and self.busy():
            clients = self._step_clients()
            targets = [x for x in tree.descendants() if x.pid not in clients
                       and (x.pid == shell_pid) == rule.shell_only]
            if not rule.shell_only:
                registry.signal_tasks(registry.live_tasks(self.run_dir), rule.signum)
            tree.signal_all(targets, rule.signum)
            # a graceful stop gives way to Slurm's SIGTERM (the regular job must not wait)
            self._wait_quiet(rule.grace_s, self.preempted)
        spare: set[int] = set()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.busy():
                break
            # Slurm's srun ends its step on every node on SIGTERM (as when a job is
            # cancelled): the step's tasks on nodes whose agent is gone end too
            self.stages.append(f"{sig.name} +{time.monotonic() - t0:.2f}")
            if sig == signal.SIGKILL and slurm_term_age_s is not None:
                spare = self._step_clients()
            tree.signal_all([x for x in tree.descendants() if x.pid not in spare], sig)
            registry.signal_tasks(registry.live_tasks(self.run_dir), sig)
            if sig == signal.SIGTERM and slurm_term_age_s is not None:
                time.sleep(max(0.0, t0 - slurm_term_age_s + rule.kill_after_s
                               - time.monotonic()))
                continue
            self._wait_stage(rule.kill_after_s if sig == signal.SIGTERM else 5.0)
        if spare and not self._wait_quiet(STEP_CLIENTS_S, lambda: False):
            self._end_clients(t0)
        if shell is not None:
            shell.poll()
        tree.reap_orphans(keep=None)
        return time.monotonic() - t0

    def _end_clients(self, t0: float) -> None:
        """The step clients that did not end with their steps' tasks: killed."""
        self.stages.append(f"clients SIGKILL +{time.monotonic() - t0:.2f}")
        tree.signal_all(tree.descendants(), signal.SIGKILL)
        self._wait_quiet(KILL_AFTER_S, lambda: False)

    def busy(self) -> bool:
        return bool(tree.descendants() or registry.live_tasks(self.run_dir))

    def end_leftovers(self) -> None:
        """What the ended batch shell left behind on this node (Slurm ends a job's steps
        and processes with its batch script)."""
        if not self.busy():
            return
        log.info("ending what the batch script left behind")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            tree.signal_all(tree.descendants(), sig)
            registry.signal_tasks(registry.live_tasks(self.run_dir), sig)
            # Slurm's SIGTERM cuts it short: the agent's preemption stop takes over
            if self._wait_quiet(KILL_AFTER_S, self.preempted) or self.preempted():
                break
        tree.reap_orphans(keep=None)

    def _step_clients(self) -> set[int]:
        """The batch shell's ``srun`` processes (this package's and Slurm's under it)."""
        out: set[int] = set()
        for proc in tree.descendants():
            with contextlib.suppress(psutil.Error):
                if self.shim in proc.cmdline():
                    out.add(proc.pid)
                    out.update(x.pid for x in proc.children(recursive=True))
        return out

    def _wait_quiet(self, wait_s: float, cut_short: Callable[[], bool]) -> bool:
        """Wait until nothing of the generation is left on this node (reaping as it
        goes); True if so. ``cut_short()`` ends the wait early."""
        end = time.monotonic() + wait_s
        while True:
            tree.reap_orphans(keep=None)
            if not self.busy():
                return True
            if time.monotonic() >= end or cut_short():
                return False
            time.sleep(0.05)

    def _wait_stage(self, wait_s: float) -> None:
        """Wait for the generation to end; Slurm's SIGTERM (before or during the wait)
        cuts it to :data:`PREEMPT_KILL_AFTER_S`: the regular job's wait comes first."""
        start = time.monotonic()
        self._wait_quiet(wait_s, lambda: self.preempted() and
                         time.monotonic() - start > PREEMPT_KILL_AFTER_S)
