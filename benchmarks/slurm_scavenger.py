"""Cost of one daemon tick's pure work at supercomputer scale, with its baselines side by side.

1. Idle windows (``core.scavenger.node_windows``) for 4,000 nodes, 2,000 pending jobs each
   planned on 16 nodes and 50 reservations, against the naive baseline the module avoids:
   for every node, scan every job and reservation (O(nodes x jobs)).
2. Parsing a ``squeue --json``/``sinfo --json`` pair of that size (``build_snapshot``),
   built by replicating records RECORDED from the dev cluster (tests/golden/slurm/busy),
   against ``json.loads`` of the same texts alone (the floor any parser pays).

3. With ``--live`` (needs ``SLURM_CONF`` of a running dev cluster): one real tick
   (``CliBackend.snapshot()``: a full snapshot's client calls + parsing) with the calls run at once
   (the default) against the same calls one after the other, and one ``sinfo --json``.

Usage: ``.venv/bin/python benchmarks/slurm_scavenger.py [--repeat 5] [--live]``.  Prints the
median of ``--repeat`` runs for each side and the ratio; both sides run in the same process.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from malletrain.core.cluster import ClusterSnapshot, Job, JobState, Node, NodeState, Reservation
from malletrain.core.scavenging.scavenger import is_idle, node_windows
from malletrain.slurm.backend import CliBackend
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "slurm" / "busy"
NODES = 4000
JOBS = 2000
PLANNED_PER_JOB = 16
RESERVATIONS = 50
NOW = 1_000_000.0


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic_snapshot() -> ClusterSnapshot:
    nodes = tuple(
        Node(name=f"n{i}", state=NodeState.IDLE if i % 10 < 3 else NodeState.ALLOCATED,
             partitions=("batch", "scavenger"))
        for i in range(NODES)
    )
    jobs = tuple(
        Job(job_id=j, name="p", user="u", partition="batch", state=JobState.PENDING,
            start_time=NOW + 5 * j,
            planned_nodes=tuple(f"n{(j * 37 + k) % NODES}" for k in range(PLANNED_PER_JOB)))
        for j in range(1, JOBS + 1)
    )
    resvs = tuple(
        Reservation(name=f"r{r}", nodes=tuple(f"n{(r * 80 + k) % NODES}" for k in range(8)),
                    start_time=NOW + 3600 + r, end_time=NOW + 7200)
        for r in range(RESERVATIONS)
    )
    return ClusterSnapshot(taken_at=NOW, nodes=nodes, jobs=jobs, reservations=resvs)


def naive_windows(snap: ClusterSnapshot, now: float) -> dict[str, float | None]:
    """The baseline: per node, scan all jobs and reservations."""
    out: dict[str, float | None] = {}
    for node in snap.nodes:
        if not is_idle(node):
            out[node.name] = 0.0
            continue
        best: float | None = None
        for job in snap.jobs:
            if (job.state is JobState.PENDING and job.start_time is not None
                    and node.name in job.planned_nodes):
                best = job.start_time if best is None else min(best, job.start_time)
        for resv in snap.reservations:
            if resv.end_time > now and node.name in resv.nodes:
                best = resv.start_time if best is None else min(best, resv.start_time)
        out[node.name] = None if best is None else max(0.0, best - now)
    return out


def big_texts() -> SnapshotTexts:
    sinfo = json.loads((GOLDEN / "nodes.json").read_text())
    squeue = json.loads((GOLDEN / "squeue.json").read_text())
    node_tpl = sinfo["nodes"][0]
    sinfo["nodes"] = []
    for i in range(NODES):
        rec = copy.deepcopy(node_tpl)
        rec["name"] = f"n{i}"
        sinfo["nodes"].append(rec)
    job_tpls = squeue["jobs"]
    squeue["jobs"] = []
    for j in range(1, 5001):
        rec = copy.deepcopy(job_tpls[j % len(job_tpls)])
        rec["job_id"] = j
        squeue["jobs"].append(rec)
    planned = "".join(f"{j} 2026-11-22T01:00:00 n[{j % 3000}-{j % 3000 + 15}]\n"
                      for j in range(1, JOBS + 1))
    return SnapshotTexts(
        nodes_json=json.dumps(sinfo), squeue_json=json.dumps(squeue),
        partitions=(GOLDEN / "partitions.txt").read_text(),
        reservations=(GOLDEN / "reservations.txt").read_text(), planned=planned,
        topology=(GOLDEN / "topology.txt").read_text(),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--live", action="store_true", help="also time a tick on $SLURM_CONF")
    args = ap.parse_args()

    snap = synthetic_snapshot()
    ours = {w.name: w.window_s for w in node_windows(snap, NOW)}
    assert ours == naive_windows(snap, NOW), "the two methods disagree"
    ours_s = median_s(lambda: node_windows(snap, NOW), args.repeat)
    naive_s = median_s(lambda: naive_windows(snap, NOW), max(1, min(args.repeat, 3)))
    print(f"idle_windows nodes={NODES} pending_jobs={JOBS} planned_per_job={PLANNED_PER_JOB} "
          f"ours_ms={ours_s * 1e3:.1f} naive_ms={naive_s * 1e3:.1f} "
          f"speedup={naive_s / ours_s:.0f}x")

    texts = big_texts()
    parsed = build_snapshot(NOW, texts)
    assert len(parsed.nodes) == NODES and len(parsed.jobs) == 5000
    parse_s = median_s(lambda: build_snapshot(NOW, texts), args.repeat)
    loads_s = median_s(lambda: (json.loads(texts.nodes_json), json.loads(texts.squeue_json)),
                       args.repeat)
    size = len(texts.nodes_json) + len(texts.squeue_json)
    print(f"parse nodes={NODES} jobs=5000 json_bytes={size} "
          f"build_snapshot_ms={parse_s * 1e3:.1f} json_loads_only_ms={loads_s * 1e3:.1f} "
          f"ratio={parse_s / loads_s:.2f}")

    if args.live:
        parallel, sequential = CliBackend(parallel=True), CliBackend(parallel=False)
        snap = parallel.snapshot()
        par_s = median_s(parallel.snapshot, args.repeat)
        seq_s = median_s(sequential.snapshot, args.repeat)
        one_s = median_s(lambda: subprocess.run(["sinfo", "--json"], capture_output=True,
                                                check=True), args.repeat)
        print(f"live_tick nodes={len(snap.nodes)} jobs={len(snap.jobs)} calls=6 "
              f"parallel_ms={par_s * 1e3:.1f} sequential_ms={seq_s * 1e3:.1f} "
              f"one_sinfo_json_ms={one_s * 1e3:.1f} speedup={seq_s / par_s:.1f}x")


if __name__ == "__main__":
    main()
