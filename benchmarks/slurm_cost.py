"""What one daemon tick costs Slurm on a centre-sized queue, per Slurm release.

    .venv/bin/python benchmarks/slurm_cost.py --slurm-version 24.11 [--jobs 50000]

Starts that release's dev cluster itself (slurm/dev-cluster, ``MaxJobCount`` raised; the
first run of 24.11/26.05 makes its Debian root), fills the queue with ``--jobs`` held jobs
submitted in bulk (``sbatch --hold``, 8 at a time), plus a running regular job, a pending
one with a backfill plan and a running scavenger job, then measures:

* ``tick_wall_ms``: the median wall time of the Slurm calls of a steady-state tick of the
  daemon's backend (``CliBackend(daemon=True).snapshot_texts()``: its calls, run at once),
  over ``--repeat`` ticks; ``parse_ms`` beside it: turning those
  answers into a snapshot (``build_snapshot``);
* ``tick_calls``: the client calls of that tick, and ``tick_rpcs``: the RPCs slurmctld
  counted for it (``sdiag``'s counts by message type, before and after, less sdiag's own);
* ``json_vs_plain``: the wall time of ``squeue --all --states=all --json`` over the same
  queue (the baseline: what every tick read before) against the daemon's job list.

Stops the cluster at the end (``--keep`` leaves it up for a rerun with the same queue).
Last line: ``slurm_cost version=V jobs=J tick_calls=C tick_rpcs=R tick_wall_ms=W
parse_ms=P json_vs_plain=X``.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from malletrain.slurm.backend import CliBackend
from malletrain.slurm.parsers.parse import build_snapshot
from malletrain.slurm.versions import FORMAT_ENV, JOBS_PLAIN, jobs_format

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "slurm" / "dev-cluster"
_RPC_RE = re.compile(r"^\s*([A-Z_]+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def cluster_env(version: str, port: int) -> dict[str, str]:
    base = Path(f"/tmp/malletrain-slurmcost-{version}")
    env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(base),
               MALLETRAIN_DEVCLUSTER_PORT=str(port), SLURM_CONF=str(base / "etc" / "slurm.conf"))
    if version != "22.05":
        env["PATH"] = f"{base / 'bin'}:{env['PATH']}"
    return env


def run(env: dict[str, str], *argv: str, timeout_s: float = 600) -> str:
    res = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                         timeout=timeout_s, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {res.stderr.strip()[:300]}")
    return res.stdout


def fill_queue(env: dict[str, str], jobs: int) -> None:
    have = len(run(env, "squeue", "--all", "--states=all", "--noheader", "--format=%A")
               .split())
    missing = max(0, jobs - have)
    t0 = time.monotonic()

    def submit(i: int) -> None:
        run(env, "sbatch", "--parsable", "--hold", "-N1", "-t", "10", "--output=/dev/null",
            f"--job-name=held{i}", "--wrap=true")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, range(missing)))
    print(f"queue: {have} jobs there, {missing} submitted in {time.monotonic() - t0:.0f} s",
          file=sys.stderr, flush=True)


def add_live_jobs(env: dict[str, str]) -> None:
    """What makes a tick non-trivial: running work, a backfill plan, a scavenger slot."""
    run(env, "sbatch", "-N4", "-t", "30", "--output=/dev/null", "--wrap=srun sleep 3000")
    run(env, "sbatch", "-N7", "-t", "10", "--output=/dev/null", "--wrap=srun sleep 60")
    run(env, "sbatch", "-p", "scavenger", "-N1", "-t", "5", "--comment=malletrain:bench/0",
        "--output=/dev/null", "--wrap=srun sleep 3000")
    time.sleep(3)  # a backfill pass (bf_interval=1)


def rpc_counts(env: dict[str, str]) -> dict[str, int]:
    text = run(env, "sdiag")
    section = text.split("by message type", 1)[1].split("by user", 1)[0]
    return {name: int(n) for name, n in _RPC_RE.findall(section)}


def timed_s(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(env: dict[str, str], repeat: int) -> dict[str, float]:
    calls: list[list[str]] = []

    def runner(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.run(argv, **kw)  # type: ignore[call-overload, no-any-return]

    backend = CliBackend(env=env, runner=runner, daemon=True, timeout_s=120)
    snap = backend.snapshot()  # reads the release and the periodic answers
    assert len(snap.jobs) >= 3 and snap.warnings == (), snap.warnings[:3]
    calls.clear()
    before = rpc_counts(env)
    backend.snapshot()
    after = rpc_counts(env)
    rpcs = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    rpcs.pop("REQUEST_STATS_INFO", None)  # sdiag's own
    tick_calls = len(calls)
    print(f"tick calls: {[' '.join(c[:4]) for c in calls]}; RPCs: "
          f"{ {k: v for k, v in rpcs.items() if v} }", file=sys.stderr)
    tick_s = timed_s(backend.snapshot_texts, repeat)
    texts = backend.snapshot_texts()
    parse_s = timed_s(lambda: build_snapshot(0.0, texts), repeat)
    plain_env = {**env, FORMAT_ENV: jobs_format(secrets.token_hex(12))}
    plain_s = timed_s(lambda: run(plain_env, *JOBS_PLAIN), repeat)
    json_s = timed_s(lambda: run(env, "squeue", "--all", "--states=all", "--json"),
                     max(1, min(repeat, 2)))
    return {"tick_calls": tick_calls, "tick_rpcs": sum(rpcs.values()),
            "tick_wall_ms": tick_s * 1e3, "parse_ms": parse_s * 1e3,
            "plain_ms": plain_s * 1e3, "json_ms": json_s * 1e3, "jobs": len(snap.jobs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slurm-version", default="22.05", choices=("22.05", "24.11", "26.05"))
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--port", type=int, default=29400)
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    args = ap.parse_args()
    env = cluster_env(args.slurm_version, args.port)
    run(env, str(DEV), "up", "--nodes", "8", "--slurm-version", args.slurm_version,
        "--max-jobs", str(args.jobs + 10_000))
    try:
        fill_queue(env, args.jobs)
        add_live_jobs(env)
        m = measure(env, args.repeat)
    finally:
        if not args.keep:
            run(env, str(DEV), "down")
    print(f"baseline: squeue --json of the whole queue {m['json_ms']:.0f} ms; the plain job "
          f"list {m['plain_ms']:.0f} ms")
    print(f"slurm_cost version={args.slurm_version} jobs={m['jobs']} "
          f"tick_calls={m['tick_calls']} tick_rpcs={m['tick_rpcs']} "
          f"tick_wall_ms={m['tick_wall_ms']:.0f} parse_ms={m['parse_ms']:.0f} "
          f"json_vs_plain={m['json_ms'] / m['plain_ms']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
