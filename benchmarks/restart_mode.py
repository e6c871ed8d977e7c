"""Restart mode vs native mode: what a size change costs each, on the same model, in one run.

Model and data: those of ``benchmarks/rescale.py`` (MLP 1024 -> 12288 -> 1024, 25.2 M fp32
parameters, 192 MiB of training state with SGD momentum; 8 samples per rank per step),
2 <-> 3 members on CPU/gloo, all on this host, the coordinator in a process of its own.

* native: ``examples/elastic_train.py`` (ElasticJob), measured by ``rescale.run_malletrain``:
  up = publish([m0, m1, m2]) -> the first step at size 3 starts; down likewise to size 2.
* restart: ``examples/restart/train_ddp.py`` (plain DDP, its own checkpoint) started by a
  batch script (``srun torchrun ...``) through three node agents
  (``malletrain.elastic.restart.agent``) in node slots of a dev cluster of its own
  (``benchmarks/devslots.py``), exactly as the daemon's slots run them, stopped with
  ``--signal=USR1@30``: up = publish([m0, m1, m2]) -> the generation is stopped on every
  node (USR1: the script saves its checkpoint and exits), the batch script runs again at
  size 3 and its srun starts a torchrun in each slot -> the script's ``start`` record
  (checkpoint loaded, DDP built: its first step starts); down likewise to size 2.

``--framework accelerate``: the same with Hugging Face Accelerate on both sides, native
``examples/elastic_accelerate.py`` (``AcceleratedJob``) against
``examples/restart/train_accelerate.py`` (``save_state``/``load_state``) started by
``accelerate launch --multi_gpu`` (its torchrun path; gloo on CPU).

Each transition ``--cycles`` times; medians. Last line:
``restart_vs_native restart_up_s=<a> restart_down_s=<b> native_up_s=<c> native_down_s=<d>``.

Run: ``.venv/bin/python benchmarks/restart_mode.py [--framework accelerate]`` (about 5
minutes on 2 shared cores).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import devslots
import rescale
from rescale import REPO, records, start_coordinator, wait_for

#: framework -> (native script, restart-mode training script, its batch script's launch)
FRAMEWORKS = {
    "torch": (rescale.EXAMPLE, REPO / "examples" / "restart" / "train_ddp.py",
              "torchrun --nproc_per_node 1", "ckpt.pt"),
    "accelerate": (REPO / "examples" / "elastic_accelerate.py",
                   REPO / "examples" / "restart" / "train_accelerate.py",
                   "accelerate launch --multi_gpu --num_processes 1", "ckpt"),
}
SCRIPT = """#!/bin/bash
#SBATCH --signal=USR1@30
export OMP_NUM_THREADS=1
srun {launch} {train} --dim 1024 --hidden {hidden} --batch 8 \\
    --dataset-size 256 --epochs 100000 --checkpoint {ckpt} --jsonl {log}
"""


def run_restart(tmp: Path, cycles: int, hidden: int, framework: str,
                slurm: dict[str, str]) -> dict[str, list[float]]:
    tmp = tmp / "restart"
    tmp.mkdir()
    coord_proc, coord = start_coordinator(tmp)
    job, log = "bench-restart", tmp / "restart.jsonl"
    _, train, launch, ckpt = FRAMEWORKS[framework]
    script = tmp / "batch.sh"
    script.write_text(SCRIPT.format(launch=launch, train=train, hidden=hidden,
                                    ckpt=tmp / ckpt, log=log))
    tmp.chmod(0o755)
    procs: dict[str, devslots.Slot] = {}
    nodes = iter(f"n{i}" for i in range(1, 100))

    def launch(member: str) -> None:
        procs[member] = devslots.Slot(
            slurm, next(nodes), member, coordinator=coord.address, job=job,
            secret=coord.job_secret(job), script=script, log=tmp / f"agent-{member}.err",
            agent_args=["--workers=1", "--stop-signal=USR1", "--stop-grace-s=30",
                        f"--submit-dir={tmp}"])

    def started(world: int, after_s: float) -> float | None:
        t = [r["t"] for r in records(log)
             if r["event"] == "start" and r["world"] == world and r["t"] > after_s]
        return min(t) if t else None

    def stepping(world: int, after_s: float, n: int) -> bool:
        return sum(1 for r in records(log) if r["event"] == "step" and r["world"] == world
                   and r["t"] > after_s) >= n

    def last_step(before_s: float) -> float:
        return max(r["t"] for r in records(log) if r["event"] == "step" and r["t"] < before_s)

    out: dict[str, list[float]] = {"up": [], "down": [], "up_stall": [], "down_stall": []}
    try:
        for m in ("m0", "m1", "m2"):
            launch(m)
        wait_for(lambda: {"m0", "m1", "m2"} <= set(coord.registered(job)), 120, "registration")
        coord.publish(job, ["m0", "m1"])
        wait_for(lambda: stepping(2, 0.0, 5), 300, "warm-up at 2")
        for _ in range(cycles):
            wait_for(lambda: "m2" in coord.registered(job), 60, "m2 waiting")
            for world, members in ((3, ["m0", "m1", "m2"]), (2, ["m0", "m1"])):
                t = time.time()
                coord.publish(job, members)
                wait_for(lambda w=world, t=t: started(w, t) is not None, 300, f"start at {world}")
                begin = started(world, t) or 0.0
                key = "up" if world == 3 else "down"
                out[key].append(begin - t)
                out[f"{key}_stall"].append(begin - last_step(begin))
                wait_for(lambda w=world, t=t: stepping(w, t, 3), 300, f"steps at {world}")
            procs["m2"].wait(60)  # removed: its agent has left
            launch("m2")  # the next node, pre-started and registered as the daemon does
    finally:
        coord.publish(job, [])
        procs["m2"].terminate()  # pre-started for a next cycle, never a member: SIGTERM
        for p in procs.values():
            p.wait(60)
        coord.close()
        coord_proc.terminate()
        coord_proc.wait(10)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2, help="up/down cycles per mode")
    ap.add_argument("--hidden", type=int, default=12288, help="hidden width (smaller: smoke)")
    ap.add_argument("--keep", action="store_true", help="keep the logs (path printed)")
    ap.add_argument("--framework", choices=sorted(FRAMEWORKS), default="torch")
    args = ap.parse_args()
    rescale.MODEL_ARGS[3] = str(args.hidden)
    tmp = Path(tempfile.mkdtemp(prefix="mt-restart-"))
    print(f"logs in {tmp}", flush=True)
    try:
        native = rescale.run_malletrain(tmp, args.cycles, FRAMEWORKS[args.framework][0])
        print(f"native  up_s={rescale.fmt(native['up'])} down_s={rescale.fmt(native['down'])} "
              f"(training stall: up {rescale.fmt(native['up_stall'])} "
              f"down {rescale.fmt(native['down_stall'])})", flush=True)
        with devslots.cluster(3 + args.cycles) as slurm:
            restart = run_restart(tmp, args.cycles, args.hidden, args.framework, slurm)
        print(f"restart up_s={rescale.fmt(restart['up'])} down_s={rescale.fmt(restart['down'])} "
              f"(training stall: up {rescale.fmt(restart['up_stall'])} "
              f"down {rescale.fmt(restart['down_stall'])})", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(f"restart_vs_native restart_up_s={med(restart['up']):.2f} "
          f"restart_down_s={med(restart['down']):.2f} native_up_s={med(native['up']):.2f} "
          f"native_down_s={med(native['down']):.2f} (hidden={args.hidden}, "
          f"framework={args.framework})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
