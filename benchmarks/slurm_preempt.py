"""Slurm's own part of a regular job's wait when it takes nodes from scavenger jobs.

No malletrain here: every node of an 8-node dev cluster runs a single-node scavenger job
whose payload is ``exec srun sleep`` (it leaves on the preemption SIGTERM in ~0.03 s, like a
node slot), then regular ``batch`` jobs arrive (a burst of several and single ones) and
each one's wait (submit RPC -> allocation, slurmctld.log, ms) is split by
``benchmarks/yield_trace.py`` into Slurm's preemption decision, the payload's exit and Slurm
starting the job on the freed nodes.

Several ``SchedulerParameters`` settings are measured side by side in ONE run on one
cluster, round-robin (``scontrol reconfigure`` between rounds), so that the machine's load
hits every setting alike. The first setting is the dev cluster's old one (the baseline).

Run (root, ~3 min): ``.venv/bin/python benchmarks/slurm_preempt.py``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yield_trace  # benchmarks/ is not a package

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "slurm" / "dev-cluster"
NODES = 8

#: name -> slurm.conf lines (None: the key is left out). The first is the baseline: the dev
#: cluster's old setting. ``batch_sched_delay=0``: the main scheduler may run at its next 1 s
#: tick after a batch submission (default: 3 s later); ``bf_interval=1``: backfill, which
#: preempts for every pending job in one pass, runs every second; ``Epilog``: with one,
#: every slurmd sends EPILOG_COMPLETE when a job ends, and slurmctld runs its main scheduler
#: right then (without one, a preempted job's node comes back silently and the regular job
#: waits for the next tick).
SETTINGS: dict[str, dict[str, str | None]] = {
    "old": {"SchedulerParameters": "bf_interval=2,permit_job_expansion", "Epilog": None},
    "sched": {"SchedulerParameters": "bf_interval=1,batch_sched_delay=0,permit_job_expansion",
              "Epilog": None},
    "sched+epilog": {
        "SchedulerParameters": "bf_interval=1,batch_sched_delay=0,permit_job_expansion",
        "Epilog": "/bin/true"},
}
#: one round: (offset s, nodes) of the regular jobs; a burst, then a single job later.
PATTERN = ((0.0, 2), (0.3, 1), (0.6, 2), (6.0, 1))


def as_user(user: str, argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(args.dir)
        self.conf = self.base / "etc" / "slurm.conf"
        self.env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(self.base),
                        MALLETRAIN_DEVCLUSTER_PORT=str(args.port), SLURM_CONF=str(self.conf))

    def sh(self, argv: list[str], check: bool = True) -> str:
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120,
                             check=False)
        if check and res.returncode != 0:
            raise SystemExit(f"{argv[:5]} failed: {res.stderr[-400:]}")
        return res.stdout

    def set_conf(self, lines: dict[str, str | None]) -> None:
        text = self.conf.read_text()
        for key, value in lines.items():
            text = re.sub(rf"^{key}=.*\n", "", text, flags=re.M)
            if value is not None:
                text += f"{key}={value}\n"
        self.conf.write_text(text)
        self.sh(["scontrol", "reconfigure"])
        got = {k.strip(): v.strip() for k, _, v in (
            line.partition("=") for line in self.sh(["scontrol", "show", "config"]).splitlines())}
        for key, value in lines.items():
            if got.get(key) != (value if value is not None else "(null)"):
                raise SystemExit(f"reconfigure did not apply {key}={value}: {got.get(key)}")

    def running_scavengers(self) -> int:
        out = self.sh(["squeue", "-h", "-p", "scavenger", "-t", "R", "-o", "%i"], check=False)
        return len(out.split())

    def fill(self) -> None:
        """A scavenger job on every idle node, all with their step running."""
        idle = self.sh(["sinfo", "-h", "-p", "scavenger", "-t", "idle", "-o", "%D"],
                       check=False).split()
        for _ in range(int(idle[0]) if idle else 0):
            self.sh(as_user("mt-alice", [
                "sbatch", "--parsable", "-p", "scavenger", "-N1", "--exclusive", "-t", "10",
                "-o", "/dev/null", "--wrap", "exec srun sleep 600"]))
        deadline = time.monotonic() + 60
        while self.running_scavengers() < NODES:
            if time.monotonic() > deadline:
                raise SystemExit("scavenger jobs did not all start")
            time.sleep(0.3)
        time.sleep(1.5)  # steps launched (a cancel during step launch hangs the node ~60 s)

    def round(self) -> list[int]:
        self.fill()
        t0 = time.monotonic()
        ids = []
        for offset, nodes in PATTERN:
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            out = self.sh(as_user("mt-bob", [
                "sbatch", "--parsable", "-p", "batch", f"-N{nodes}", "-t", "2",
                "-o", "/dev/null", "--wrap", "srun sleep 3"]))
            ids.append(int(out.strip().split(";")[0]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = self.sh(["squeue", "-h", "-p", "batch", "-o", "%i"], check=False)
            if not set(out.split()) & {str(i) for i in ids}:
                break
            time.sleep(0.5)
        return ids

    def main(self) -> int:
        self.sh([str(DEV), "up", "--nodes", str(NODES), "--accounting", "--users",
                 "mt-alice,mt-bob"])
        names = [n for n in SETTINGS if not self.args.only or n in self.args.only]
        ids: dict[str, set[int]] = {n: set() for n in names}
        try:
            for r in range(self.args.rounds):
                for name in names:
                    self.set_conf(SETTINGS[name])
                    ids[name].update(self.round())
                    print(f"# round {r + 1}/{self.args.rounds} {name} done", flush=True)
        finally:
            if not self.args.keep:
                self.sh([str(DEV), "down"], check=False)
        log_dir = self.base / "log"
        base_p50 = None
        for name in names:
            traces = yield_trace.regular_traces(log_dir, ids[name])
            waits = [t.wait_s for t in traces]
            print(f"## {name}: " + " ".join(f"{k}={v}" for k, v in SETTINGS[name].items()))
            for line in yield_trace.summarize(traces):
                print("#" + line)
            p50 = statistics.median(waits)
            base_p50 = p50 if base_p50 is None else base_p50
            print(f"slurm_preempt setting={name} jobs={len(waits)} wait_s_p50={p50:.2f} "
                  f"wait_s_max={max(waits):.2f} ratio_p50_vs_{names[0]}="
                  f"{p50 / base_p50 if base_p50 else float('nan'):.2f}", flush=True)
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/malletrain-bench-preempt")
    ap.add_argument("--port", type=int, default=29817)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", help=f"settings to run (of {', '.join(SETTINGS)})")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up (logs)")
    return Bench(ap.parse_args()).main()


if __name__ == "__main__":
    sys.exit(main())
