"""Fault injection on the real dev cluster: each fault at a random moment of a running job.

Every run starts a fresh daemon on the local Slurm dev cluster and one malleable job of
mt-alice (``examples/elastic_train.py``, 1-4 nodes, real torch workers over gloo). Once the
job trains on at least two nodes (one-node scenarios, :data:`ONE_NODE`: a 1-node job with a
quarter of the samples, once it trains), the run waits a random 0-5 s (``--seed``) and
injects its fault; when the fault has ended, a regular job of mt-bob asks for every node (so it must
preempt the job's slots). Measured per run:

* ``recovered``: the job made progress again after the fault and finished with exactly its
  samples (the example's result file);
* ``recover_s``: from the end of the fault to the job's first progress after it;
* ``jobs_lost``: 1 if the job did not finish (failed, vanished, or past the deadline);
* ``samples_lost``: |samples at the end - the job's total| (0: nothing lost or counted
  twice); ``redone_steps``: steps that failed and were redone (the step in flight);
* ``regular_wait_s``: the regular job's whole wait (submit RPC to allocation, slurmctld's
  millisecond log): Slurm's preemption decision plus malletrain's yield. The same job's
  wait on idle nodes, without malletrain, is measured at set-up and printed beside it.

Scenarios (``--scenario NAME``, repeatable; default all): see ``SCENARIOS``. What the dev
cluster cannot emulate is said in docs/reliability.md (every node is a process on one
host: no network partition between nodes; the host's clock is shared with everything else).

Usage (root): ``.venv/bin/python benchmarks/faults.py [--runs 3] [--seed 0] [--scenario NAME]
[--slurm-down-s 60]``. Last line: ``faults scenarios=S runs=R recovered=C jobs_lost=J
samples_lost=L regular_wait_max_s=W recover_max_s=T``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_log import first_step_after_epoch, newest_epoch, redone_steps
from yield_trace import regular_traces

from malletrain.devstack import (
    LocalCluster,
    LocalDaemon,
    StackError,
    as_user,
    check_python_reachable,
    run,
)

NODES = 4
#: The job's samples (``--samples``): ~60 s of training on 4 nodes of this machine, so that
#: every fault lands while it trains.
SAMPLES = 60_000


@dataclass
class Run:
    """One scenario run: the daemon, the job and what was measured."""

    scenario: str
    daemon: LocalDaemon
    job: str = ""
    tag: str = ""
    #: the job's samples (a quarter of ``--samples`` for a one-node job)
    samples: int = SAMPLES
    fault_end: float = 0.0
    #: one-node scenarios: the epoch the lost replica trained in (recovery = a step in a
    #: newer one, from the step log)
    lost_epoch: int | None = None
    recover_s: float | None = None
    regular_id: int | None = None
    notes: list[str] = field(default_factory=list)


class Suite:
    """The runs on one dev cluster: its own (``cluster=None``), or one already up."""

    def __init__(self, args: argparse.Namespace, cluster: LocalCluster | None = None) -> None:
        self.args = args
        self.base = Path(args.dir)
        self.own_cluster = cluster is None
        self.cluster = cluster or LocalCluster(self.base / "cluster", args.port, NODES)
        self.log_dir = self.cluster.base / "log"
        self.env = self.cluster.env
        self.rng = random.Random(args.seed)
        self.samples = int(getattr(args, "samples", SAMPLES))
        self.base_wait_s = 0.0
        self.shims = self.base / "shims"

    # -- set-up ---------------------------------------------------------------------
    def setup(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self.own_cluster:
            self.cluster.up(epilog=True)
        check_python_reachable("mt-alice", self.env)
        self._write_shims()
        self._regular_wait(self._submit_regular())  # the first after start-up is slow
        waits = [self._regular_wait(self._submit_regular()) for _ in range(3)]
        self.base_wait_s = statistics.median(waits)

    def _write_shims(self) -> None:
        """squeue/scontrol/sinfo that answer garbage or hang while a flag file says so."""
        self.shims.mkdir(parents=True, exist_ok=True)
        self.shims.chmod(0o755)
        flag = self.shims / "mode"
        for cmd in ("squeue", "scontrol", "sinfo"):
            real = shutil.which(cmd)
            assert real, cmd
            path = self.shims / cmd
            path.write_text(
                "#!/bin/sh\n"
                f'mode=$(cat {flag} 2>/dev/null)\n'
                'if [ "$mode" = garbage ]; then echo \'{"jobs": [{"job_id": "x", '
                '"nodes": 7}], "meta":\'; exit 0; fi\n'
                'if [ "$mode" = hang ]; then sleep 30; fi\n'
                f'exec {real} "$@"\n')
            path.chmod(0o755)

    def shim_mode(self, mode: str) -> None:
        (self.shims / "mode").write_text(mode)

    def cluster_cmd(self, what: str) -> None:
        """``slurm/dev-cluster stop-controller|start-controller`` (waits for it to answer)."""
        run([str(Path(__file__).resolve().parents[1] / "slurm" / "dev-cluster"), what],
            self.env, timeout_s=120)
        deadline = time.monotonic() + 60
        while (what == "start-controller" and time.monotonic() < deadline
               and subprocess.run(["scontrol", "ping"], env=self.env,
                                  capture_output=True).returncode != 0):
            time.sleep(0.5)

    # -- the regular workload ---------------------------------------------------------
    def _submit_regular(self, nodes: int | None = None) -> int:
        """A regular job of mt-bob on ``nodes`` (default: every node) for 3 s."""
        out = run(as_user("mt-bob", ["sbatch", "--parsable", "-p", "batch",
                                     "-N", str(nodes or self.cluster.nodes),
                                     "-t", "2", "-o", "/dev/null", "--wrap", "srun sleep 3"]),
                  self.env).stdout
        return int(out.strip().split(";")[0])

    def _in_queue(self, slurm_id: int) -> bool:
        """Whether a job is still pending, running or completing (holding its nodes)."""
        out = run(["squeue", "--noheader", "--format=%i", f"--jobs={slurm_id}",
                   "--states=PENDING,RUNNING,COMPLETING"], self.env, check=False).stdout
        return str(slurm_id) in out.split()

    def _regular_wait(self, slurm_id: int, timeout_s: float = 120) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            traces = regular_traces(self.log_dir, {slurm_id})
            if traces:
                return traces[0].wait_s
            time.sleep(0.5)
        raise StackError(f"regular job {slurm_id} did not start within {timeout_s:.0f} s")

    # -- one run ----------------------------------------------------------------------
    def one(self, scenario: str, index: int) -> dict[str, object]:
        work = self.base / "runs" / f"{scenario}-{index}"
        if work.exists():
            shutil.rmtree(work)
        env = dict(self.env, PATH=f"{self.shims}:{self.env['PATH']}")
        self.shim_mode("")
        mounted = None
        if scenario in OWN_STATE_FS:
            mounted = work / "state"
            mounted.mkdir(parents=True)
            run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(mounted)],
                self.env)
        # a fixed coordinator port, as its service has: a restarted coordinator is found
        # snapshots outside that file system: on a real cluster the daemon's state is on the
        # login node's disk and evicted jobs' state on the parallel file system (and the
        # dev cluster's nodes, in their own mount namespace, do not see the tmpfs anyway)
        d = LocalDaemon(work, env, self.cluster.slurm_conf, tick_s=1.0,
                        slurm={"command_timeout_s": 5}, coordinator_port=_free_port(),
                        snapshot_dir=work / "snapshots" if mounted else None).start()
        one_node = scenario in ONE_NODE
        r = Run(scenario, d, tag=f"f{index}",
                samples=self.samples // 4 if one_node else self.samples)
        try:
            r.job = d.submit_example("mt-alice", r.tag, "1-1" if one_node else f"1-{NODES}",
                                     r.samples, step_log=True)
            if one_node:
                self._wait(lambda: self._samples(r) > 0, 180, "the job training", d)
            else:
                self._wait_two_replicas(r, d)
            time.sleep(self.rng.uniform(0.0, 5.0))
            SCENARIOS[scenario](self, r)
            r.fault_end = time.monotonic()
            self._measure_recovery(r)
            r.regular_id = self._submit_regular()
            wait = self._regular_wait(r.regular_id)
            done = self._finish(r)
        finally:
            self.shim_mode("")
            if d.alive():
                d.stop()
            d.stop_coordinator()
            run(["scancel", "--full", "--user=mt-alice"], self.env, check=False)
            run(["scancel", "--user=mt-bob"], self.env, check=False)
            time.sleep(2)
            if mounted is not None:
                run(["umount", "-l", str(mounted)], self.env, check=False)
        result = d.result(r.tag)
        samples = int(result["samples_total"]) if result else 0
        return {
            "scenario": scenario, "run": index,
            "recovered": bool(done and result and samples == r.samples
                              and r.recover_s is not None),
            "recover_s": r.recover_s, "jobs_lost": 0 if done else 1,
            "samples_lost": abs(samples - r.samples) if result else r.samples,
            "redone_steps": redone_steps(d.step_log(r.tag)),
            "regular_wait_s": wait, "notes": r.notes,
        }

    def run_all(self, scenarios: list[str]) -> list[dict[str, object]]:
        """``--runs`` runs of each scenario, one line printed per run."""
        print(f"# the regular job on idle nodes, no malletrain: wait {self.base_wait_s:.2f} s")
        rows: list[dict[str, object]] = []
        for name in scenarios:
            for i in range(self.args.runs):
                t0 = time.monotonic()
                try:
                    row = self.one(name, i)
                except StackError as exc:
                    row = {"scenario": name, "run": i, "recovered": False, "recover_s": None,
                           "jobs_lost": 1, "samples_lost": self.samples, "redone_steps": 0,
                           "regular_wait_s": None, "notes": [str(exc)[:300]]}
                rows.append(row)
                print(_line(row, time.monotonic() - t0), flush=True)
        return rows

    def _wait_two_replicas(self, r: Run, d: LocalDaemon) -> None:
        """Until the job has trained a step on 2+ nodes: then every member holds the state.

        Waiting for 2 members only is not enough: right after a grow the newcomer may not
        have received the state yet, and a kill of the one veteran then loses the job's
        progress (no replica left; the workers refuse to restart from step 0 and the job
        fails, docs/reliability.md). Seen once in CI (stop 21). Two progress reports after
        the 2-member membership: the first may still be the old group's last step.
        """
        self._wait(lambda: self._members(r) >= 2, 180, "the job on 2+ nodes", d)
        for _ in range(2):
            seen = self._samples(r)

            def trained(since: float = seen) -> bool:
                return self._members(r) >= 2 and self._samples(r) > since

            self._wait(trained, 120, "a step trained on 2+ nodes", d)

    def _members(self, r: Run) -> int:
        row = r.daemon.jobs().get(r.job, {})
        return int(row.get("members") or 0)

    def _samples(self, r: Run) -> float:
        try:
            return float(r.daemon.jobs().get(r.job, {}).get("samples_total") or 0.0)
        except StackError:
            return -1.0  # the daemon does not answer (yet)

    def _measure_recovery(self, r: Run, timeout_s: float = 60.0) -> None:
        """Seconds from the fault's end to the job's next progress (None: none in time);
        after the loss of every replica, to its first step in a new group."""
        if r.lost_epoch is not None:
            self._measure_restart(r, timeout_s)
            return
        first = self._samples(r)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self._samples(r)
            if now >= r.samples or now > first >= 0 or (first < 0 <= now and now > 0):
                r.recover_s = time.monotonic() - r.fault_end
                return
            if first < 0:
                first = now
            time.sleep(0.25)

    def _measure_restart(self, r: Run, timeout_s: float) -> None:
        assert r.lost_epoch is not None
        wall_end = time.time() - (time.monotonic() - r.fault_end)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            at = first_step_after_epoch(r.daemon.step_log(r.tag), r.lost_epoch)
            if at is not None:
                r.recover_s = max(0.0, at - wall_end)
                return
            time.sleep(0.25)

    def _finish(self, r: Run, timeout_s: float = 300.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                state = r.daemon.jobs().get(r.job, {}).get("state")
            except StackError:
                state = None  # not answering right now
            if state == "completed":
                return True
            if state in ("failed", "cancelled"):
                r.notes.append(f"job {state}")
                return False
            time.sleep(1.0)
        r.notes.append("job not done within the deadline")
        return False

    @staticmethod
    def _wait(pred: Callable[[], object], timeout_s: float, what: str, d: LocalDaemon) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise StackError(f"timed out waiting for {what}:\n{d.log()[-2000:]}")
            time.sleep(0.5)


#: scenarios whose job runs on one node (1-1), with a quarter of the samples
ONE_NODE = frozenset({"worker-sigkill-one-node"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the faults ------------------------------------------------------------------------
def _workers(tag: str) -> list[psutil.Process]:
    """The job's worker processes (examples/elastic_train.py writing out/TAG.log)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        # the Python worker itself, not srun or the slot's shell that name the script too
        if (cmd and os.path.basename(cmd[0]).startswith("python")
                and any(c.endswith("elastic_train.py") for c in cmd)
                and f"{tag}.log" in " ".join(cmd)):
            out.append(p)
    return out


def _one_worker(s: Suite, r: Run) -> psutil.Process:
    procs = _workers(r.tag)
    if not procs:
        raise StackError("no worker process found")
    return s.rng.choice(procs)


def worker_sigkill_step(s: Suite, r: Run) -> None:
    """kill -9 of one worker in the middle of training (a step in flight)."""
    _one_worker(s, r).send_signal(signal.SIGKILL)


def worker_sigkill_one_node(s: Suite, r: Run) -> None:
    """kill -9 of the only worker of a one-node job (as its node's loss: every replica gone);
    the job resumes from its guard snapshot (docs/elastic.md) and redoes the steps since."""
    _one_worker(s, r).send_signal(signal.SIGKILL)
    r.lost_epoch = newest_epoch(r.daemon.step_log(r.tag))


def worker_sigstop(s: Suite, r: Run) -> None:
    """One worker frozen (SIGSTOP) for 20 s, then let go (SIGCONT)."""
    p = _one_worker(s, r)
    p.send_signal(signal.SIGSTOP)
    time.sleep(20)
    if p.is_running():
        p.send_signal(signal.SIGCONT)


def worker_sigkill_grow(s: Suite, r: Run) -> None:
    """kill -9 of a newcomer while the job grows back (after a regular job took its nodes)."""
    s._regular_wait(s._submit_regular())  # every node: the job is evicted, then regrows
    before = {p.pid for p in _workers(r.tag)}
    s._wait(lambda: {p.pid for p in _workers(r.tag)} - before, 120, "a newcomer", r.daemon)
    time.sleep(s.rng.uniform(0.0, 2.0))  # somewhere in its start-up or first steps
    new = sorted({p.pid for p in _workers(r.tag)} - before)
    if new:
        os.kill(new[0], signal.SIGKILL)


def worker_sigkill_shrink(s: Suite, r: Run) -> None:
    """kill -9 of a worker while the job shrinks (a regular job takes half the nodes)."""
    rid = s._submit_regular(max(1, s.cluster.nodes // 2))
    time.sleep(0.5)
    for p in _workers(r.tag)[:1]:
        p.send_signal(signal.SIGKILL)
    s._regular_wait(rid)


def _regrowing(s: Suite, r: Run) -> None:
    """Evict the job with a regular job of every node; return when it places a slot again."""
    d = r.daemon
    s._regular_wait(s._submit_regular())
    mark = len(d.log())
    s._wait(lambda: "placed slot" in d.log()[mark:], 120, "a slot placement", d)


def daemon_kill9(s: Suite, r: Run) -> None:
    """kill -9 of the daemon right after it placed a slot (mid-rescale), then a restart."""
    _regrowing(s, r)
    r.daemon.kill9()
    time.sleep(2)
    r.daemon.start()


def coordinator_kill9(s: Suite, r: Run) -> None:
    """kill -9 of the job coordinator, restarted 2 s later as its service would be."""
    pid = int((r.daemon.state / "coordinator.pid").read_text())
    argv = psutil.Process(pid).cmdline()
    os.kill(pid, signal.SIGKILL)
    time.sleep(2)
    with open(r.daemon.state / "coordinator-restarted.log", "ab") as out:
        proc = subprocess.Popen(argv, env=s.env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out, start_new_session=True)
    (r.daemon.state / "coordinator.pid").write_text(f"{proc.pid}\n")


def slurmctld_down(s: Suite, r: Run) -> None:
    """slurmctld stopped for --slurm-down-s seconds, then started again."""
    s.cluster_cmd("stop-controller")
    time.sleep(s.args.slurm_down_s)
    s.cluster_cmd("start-controller")


def node_lost(s: Suite, r: Run) -> None:
    """A node holding one of the job's slots marked DOWN (as slurmctld does when slurmd dies)."""
    nodes = sorted(r.daemon.jobs()[r.job]["nodes"])
    node = nodes[-1]
    run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=faults"], s.env)
    time.sleep(10)
    run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], s.env, check=False)


def slurm_garbage(s: Suite, r: Run) -> None:
    """squeue/scontrol/sinfo answer malformed JSON for 20 s."""
    s.shim_mode("garbage")
    time.sleep(20)
    s.shim_mode("")


def slurm_hang(s: Suite, r: Run) -> None:
    """squeue/scontrol/sinfo hang (30 s each, past the daemon's timeout) for 20 s."""
    s.shim_mode("hang")
    time.sleep(20)
    s.shim_mode("")


def preempt_during_grow(s: Suite, r: Run) -> None:
    """A regular job asking for every node right when the daemon places a slot; the fault
    lasts until that job has ended and given the nodes back (3 s)."""
    _regrowing(s, r)
    regular = s._submit_regular()
    s._regular_wait(regular)
    s._wait(lambda: not s._in_queue(regular), 60, "the regular job to end", r.daemon)


def state_disk_full(s: Suite, r: Run) -> None:
    """The file system of the daemon's state (a 64 MiB tmpfs here) full for 20 s.

    The state is the SQLite store and the submit socket; evicted jobs' snapshots are on
    another file system (a real cluster's parallel file system).
    """
    ballast = r.daemon.state / "ballast"
    try:
        with open(ballast, "wb") as fh:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
    except OSError:
        pass  # ENOSPC: full
    time.sleep(20)
    ballast.unlink(missing_ok=True)


#: Scenarios whose daemon keeps its state on a small file system of its own.
OWN_STATE_FS = {"state-disk-full"}


SCENARIOS: dict[str, Callable[[Suite, Run], None]] = {
    "worker-sigkill-step": worker_sigkill_step,
    "worker-sigkill-grow": worker_sigkill_grow,
    "worker-sigkill-shrink": worker_sigkill_shrink,
    "worker-sigstop": worker_sigstop,
    "node-lost": node_lost,
    "coordinator-kill9": coordinator_kill9,
    "daemon-kill9-rescale": daemon_kill9,
    "slurmctld-down": slurmctld_down,
    "slurm-garbage": slurm_garbage,
    "slurm-hang": slurm_hang,
    "state-disk-full": state_disk_full,
    "preempt-during-grow": preempt_during_grow,
    "worker-sigkill-one-node": worker_sigkill_one_node,
}


def _line(row: dict[str, object], took_s: float) -> str:
    rec, wait = row["recover_s"], row["regular_wait_s"]
    notes = "; ".join(row["notes"])  # type: ignore[arg-type]
    return (f"{row['scenario']} run={row['run']} "
            f"recovered={'yes' if row['recovered'] else 'NO'} "
            f"recover_s={'-' if rec is None else f'{rec:.1f}'} jobs_lost={row['jobs_lost']} "
            f"samples_lost={row['samples_lost']} redone_steps={row['redone_steps']} "
            f"regular_wait_s={'-' if wait is None else f'{wait:.2f}'} ({took_s:.0f} s) {notes}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    ap.add_argument("--slurm-down-s", type=float, default=60.0)
    ap.add_argument("--samples", type=int, default=SAMPLES, help="the job's samples")
    ap.add_argument("--dir", default="/tmp/malletrain-faults")
    ap.add_argument("--port", type=int, default=27800)
    ap.add_argument("--keep", action="store_true", help="leave the dev cluster up")
    args = ap.parse_args()
    scenarios = args.scenario or list(SCENARIOS)
    suite = Suite(args)
    try:
        suite.setup()
        rows = suite.run_all(scenarios)
    finally:
        if not args.keep:
            suite.cluster.down()
    waits = [float(r["regular_wait_s"]) for r in rows if r["regular_wait_s"] is not None]
    recs = [float(r["recover_s"]) for r in rows if r["recover_s"] is not None]
    print(f"faults scenarios={len(scenarios)} runs={len(rows)} "
          f"recovered={sum(bool(r['recovered']) for r in rows)} "
          f"jobs_lost={sum(int(r['jobs_lost']) for r in rows)} "
          f"samples_lost={sum(int(r['samples_lost']) for r in rows)} "
          f"regular_wait_max_s={max(waits, default=float('nan')):.2f} "
          f"recover_max_s={max(recs, default=float('nan')):.1f}")
    return 0 if all(r["recovered"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
