"""Where a regular job's wait goes when it preempts node slots: a trace from Slurm's own logs.

Used by ``benchmarks/e2e.py`` (and runnable on a kept dev-cluster directory). Slurm's
``start_time``/``submit_time`` are whole seconds, so a 0.3 s yield can read as 0 or 1 s; the
daemon's and the workers' share of the wait is best seen in the millisecond timestamps of
slurmctld.log and slurmd-<node>.log. For each regular job:

* ``submit``: ``_slurm_rpc_submit_batch_job`` (slurmctld),
* ``start``: ``sched: Allocate`` (main scheduler) or ``_start_job: Started`` (backfill),
* for each of its nodes, the last scavenger slot on that node before the start:
  ``signal`` (``*** STEP J.0 ON n CANCELLED AT``: slurmstepd got the preemption SIGTERM),
  ``step_done`` (``[J.0] done with job``: every task of the step has exited) and
  ``freed`` (``[J.batch] done with job``: the slot job itself ended).

Then ``sig - submit`` is Slurm's preemption decision, ``freed - sig`` is malletrain's yield
(workers leave, launcher and batch step end) and ``start - freed`` is Slurm scheduling the
regular job on the freed nodes. Only ``freed - sig`` is malletrain's to shorten.

Run on a kept cluster directory: ``python benchmarks/yield_trace.py /tmp/malletrain-bench-e2e``.
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from malletrain.slurm.hostlist import expand_hostlist

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")
_SUBMIT = re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+) ")
_ALLOC = re.compile(r"sched: Allocate JobId=(\d+) NodeList=(\S+) .*Partition=(\S+)")
_BF_START = re.compile(r"_start_job: Started JobId=(\d+) in (\S+) on (\S+)")
_CANCEL = re.compile(r"\[(\d+)\.0\] error: \*\*\* STEP \d+\.0 ON \S+ CANCELLED AT")
_STEP_DONE = re.compile(r"\[(\d+)\.0\] done with job")
_BATCH_DONE = re.compile(r"\[(\d+)\.batch\] done with job")
#: steps end within GraceTime + KillWait of the signal (Slurm kills them then); a "done"
#: later than this is a later placement of the requeued slot job
_PLACEMENT_GAP_S = 20.0
#: any step's end: the slot's own step 0 (the payload) ends with the batch step as far as the
#: node is concerned (measured: a late "[J.0] done" does not delay the next job), a
#: restart-mode script's steps on the node (``[J.1]``...) hold it until they have ended
_ANY_DONE = re.compile(r"\[(\d+)\.(?!0\])\w+\] done with job")


def _lines(path: Path) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if m:
            out.append((datetime.fromisoformat(m.group(1)).timestamp(), m.group(2)))
    return out


@dataclass(frozen=True)
class SlotEnd:
    """One signalled slot step on one node."""

    node: str
    slurm_job_id: int
    signal_t: float
    step_done_t: float | None
    freed_t: float | None
    #: the batch step and every step but step 0 of the slot job on the node ended (a
    #: restart-mode slot runs the script's steps there too): the node is free then
    released_t: float | None = None


@dataclass(frozen=True)
class RegularTrace:
    slurm_job_id: int
    submit_t: float
    start_t: float
    nodes: tuple[str, ...]
    slots: tuple[SlotEnd, ...]  # the slot each node was taken from (none: the node was idle)

    @property
    def wait_s(self) -> float:
        return self.start_t - self.submit_t

    @property
    def yield_s(self) -> float | None:
        """Last slot freed - its signal: malletrain's part of the wait."""
        if not self.slots:
            return None
        return max((s.freed_t or s.signal_t) for s in self.slots) - min(
            s.signal_t for s in self.slots)

    @property
    def held_s(self) -> float | None:
        """Last node released (every step of its slot ended) - the first signal."""
        if not self.slots:
            return None
        return max((s.released_t or s.freed_t or s.signal_t) for s in self.slots) - min(
            s.signal_t for s in self.slots)


def slot_ends(log_dir: Path) -> list[SlotEnd]:
    """Every signalled step 0 of a job on every node, with the step's and the job's end and
    the end of the job's last step there."""
    ends = []
    for path in sorted(log_dir.glob("slurmd-*.log")):
        node = path.stem.removeprefix("slurmd-")
        seen: dict[int, list[float | None]] = {}  # signal, step 0 done, batch done, last done
        for t, msg in _lines(path):
            if m := _CANCEL.search(msg):
                seen.setdefault(int(m.group(1)), [t, None, None, None])
            elif (m := _STEP_DONE.search(msg)) and int(m.group(1)) in seen:
                rec = seen[int(m.group(1))]
                rec[1] = rec[1] or t
            elif (m := _ANY_DONE.search(msg)) and int(m.group(1)) in seen:
                rec = seen[int(m.group(1))]
                if t - (rec[0] or t) > _PLACEMENT_GAP_S:
                    continue  # a later placement of the same (requeued) slot job
                if _BATCH_DONE.search(msg):
                    rec[2] = rec[2] or t
                rec[3] = t
        for jid, (sig, step, batch, last) in seen.items():
            assert sig is not None
            ends.append(SlotEnd(node, jid, sig, step, batch, last if batch else None))
    return ends


def regular_traces(log_dir: Path, regular_ids: set[int]) -> list[RegularTrace]:
    submit: dict[int, float] = {}
    start: dict[int, tuple[float, tuple[str, ...]]] = {}
    for t, msg in _lines(log_dir / "slurmctld.log"):
        if (m := _SUBMIT.search(msg)) and int(m.group(1)) in regular_ids:
            submit[int(m.group(1))] = t
        elif (m := _ALLOC.search(msg)) and int(m.group(1)) in regular_ids:
            start.setdefault(int(m.group(1)), (t, tuple(expand_hostlist(m.group(2)))))
        elif (m := _BF_START.search(msg)) and int(m.group(1)) in regular_ids:
            start.setdefault(int(m.group(1)), (t, tuple(expand_hostlist(m.group(3)))))
    ends = slot_ends(log_dir)
    traces = []
    for jid in sorted(regular_ids):
        if jid not in submit or jid not in start:
            continue
        t_start, nodes = start[jid]
        slots = []
        for node in nodes:
            # the slot this node was taken from: signalled after the submission, ended
            # (or still ending) before the regular job started, and no other regular job
            # ran on the node in between (then the wait was for that job, not for a slot)
            others = [t for other, (t, ns) in start.items()
                      if other != jid and node in ns and t < t_start]
            cands = [e for e in ends if e.node == node and submit[jid] - 1.0 <= e.signal_t
                     <= t_start and not any(e.signal_t < t for t in others)]
            if cands:
                slots.append(max(cands, key=lambda e: e.signal_t))
        traces.append(RegularTrace(jid, submit[jid], t_start, nodes, tuple(slots)))
    return traces


def summarize(traces: list[RegularTrace]) -> list[str]:
    """Per job one line with the three parts, then the medians/maxima."""
    lines = []
    yields, waits_pre = [], []
    for tr in traces:
        if not tr.slots:
            lines.append(f"  job {tr.slurm_job_id}: wait {tr.wait_s:5.2f} s, no slot preempted")
            continue
        sig = min(s.signal_t for s in tr.slots)
        freed = max((s.freed_t or tr.start_t) for s in tr.slots)
        workers = max((s.step_done_t or freed) for s in tr.slots) - sig
        y = freed - sig
        yields.append(y)
        waits_pre.append(tr.wait_s)
        lines.append(
            f"  job {tr.slurm_job_id}: wait {tr.wait_s:5.2f} s = Slurm signals "
            f"{sig - tr.submit_t:4.2f} s + yield {y:4.2f} s (tasks out {workers:4.2f} s) + "
            f"Slurm starts it {tr.start_t - freed:4.2f} s (the slots' nodes released "
            f"{tr.held_s or 0.0:4.2f} s after the signal); slots "
            f"{','.join(str(s.slurm_job_id) for s in tr.slots)}"
            + (f"; {len(tr.nodes) - len(tr.slots)} node(s) it waited for were running "
               "another regular job" if len(tr.slots) < len(tr.nodes) else ""))
    if yields:
        lines.append(f"  yield (signal -> slot ended) p50 {statistics.median(yields):.2f} s "
                     f"max {max(yields):.2f} s over {len(yields)} preempting jobs")
    return lines


def main(argv: list[str]) -> int:
    base = Path(argv[1]) if len(argv) > 1 else Path("/tmp/malletrain-bench-e2e")
    log_dir = base / "cluster" / "log"
    ids = {int(x) for x in argv[2:]} if len(argv) > 2 else None
    if ids is None:  # every batch-partition job in the log
        ids = set()
        for _t, msg in _lines(log_dir / "slurmctld.log"):
            alloc, started = _ALLOC.search(msg), _BF_START.search(msg)
            if alloc and alloc.group(3) == "batch":
                ids.add(int(alloc.group(1)))
            if started and started.group(2) == "batch":
                ids.add(int(started.group(1)))
    print("\n".join(summarize(regular_traces(log_dir, ids))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
