"""What a step costs in a restart-mode batch shell, against the same step in a plain sbatch
job, measured side by side on one dev cluster of its own.

A restart-mode job's batch shell runs on its generation's first node; its ``srun`` hands each
node's share of a step to Slurm's ``srun`` in that node's slot (``--jobid=<slot>
--overlap``), through the task wrapper that gives the tasks the job-wide view
(malletrain/elastic/restart/srun.py, task.py). Measured: the wall time of ``srun -N2 true``
and of ``srun -N2 --ntasks-per-node=2 true``, ``--steps`` times each, from the batch shell,
(a) in a 2-node generation of a restart-mode job (two agents in two slots), (b) in an
ordinary ``sbatch -N2`` job on the same cluster (Slurm's own step launch, the baseline).

Last line: ``restart_steps malletrain_p50_s=A slurm_p50_s=B ratio=A/B`` (medians over both
step shapes). Run: ``.venv/bin/python benchmarks/restart_steps.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import devslots
from rescale import start_coordinator, wait_for

LOOP = """#!/bin/bash
for i in $(seq {steps}); do
  for shape in "-N2" "-N2 --ntasks-per-node=2"; do
    t0=$(date +%s.%N); srun $shape true; t1=$(date +%s.%N)
    echo "$shape $t0 $t1" >> {out}
  done
done
echo done >> {out}
"""


def _times(path: Path) -> list[float]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith("-N"):
            out.append(float(parts[-1]) - float(parts[-2]))
    return out


def _finished(path: Path) -> bool:
    return path.exists() and path.read_text().rstrip().endswith("done")


def run_malletrain(tmp: Path, slurm: dict[str, str], steps: int) -> list[float]:
    out = tmp / "malletrain.txt"
    script = tmp / "batch.sh"
    script.write_text(LOOP.format(steps=steps, out=out))
    proc, coord = start_coordinator(tmp)
    job = "bench-steps"
    try:
        slots = [devslots.Slot(slurm, f"n{i + 1}", f"m{i}", coordinator=coord.address,
                               job=job, secret=coord.job_secret(job), script=script,
                               log=tmp / f"slot{i}.log",
                               agent_args=["--workers=1", f"--submit-dir={tmp}"])
                 for i in range(2)]
        wait_for(lambda: {"m0", "m1"} <= set(coord.registered(job)), 120, "registration")
        coord.publish(job, ["m0", "m1"])
        wait_for(lambda: _finished(out), 600, "the batch shell's steps")
        for slot in slots:
            slot.wait(60)
    finally:
        coord.close()
        proc.terminate()
        proc.wait(10)
    return _times(out)


def run_slurm(tmp: Path, slurm: dict[str, str], steps: int) -> list[float]:
    out = tmp / "slurm.txt"
    subprocess.run(["sbatch", "-N2", "--exclusive", f"--output={tmp / 'slurm.log'}"],
                   input=LOOP.format(steps=steps, out=out), env=slurm, text=True, check=True,
                   capture_output=True, timeout=60)
    wait_for(lambda: _finished(out), 600, "the plain job's steps")
    return _times(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="steps of each shape per job")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mt-steps-", dir="/tmp"))
    tmp.chmod(0o755)
    t0 = time.monotonic()
    try:
        with devslots.cluster(4) as slurm:
            ours = run_malletrain(tmp, slurm, args.steps)
            base = run_slurm(tmp, slurm, args.steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    for name, xs in (("malletrain", ours), ("slurm", base)):
        q = statistics.quantiles(xs, n=10)
        print(f"{name:10s} steps={len(xs)} p50_s={med(xs):.3f} p90_s={q[-1]:.3f} "
              f"max_s={max(xs):.3f}")
    print(f"restart_steps malletrain_p50_s={med(ours):.3f} slurm_p50_s={med(base):.3f} "
          f"ratio={med(ours) / med(base):.2f} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
