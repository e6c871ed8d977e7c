"""Rescale pause: malletrain's in-process reconfiguration vs torchrun elastic + checkpoint.

Model: MLP 1024 -> 12288 -> 1024 (25.2 M fp32 params = 96 MiB; with SGD momentum 192 MiB of
training state), 2 <-> 3 workers on CPU/gloo, all on this host. Measured in ONE run:

* malletrain (examples/elastic_train.py, one process per member, the coordinator in a
  process of its own as the daemon runs it, the newcomer pre-started and registered as the
  daemon does it):
  up   = publish([m0, m1, m2]) -> first step at world size 3 starts in the training loop
  down = publish([m0, m1])     -> first step at world size 2 starts (m2 leaves, planned)
  plus the evicted-to-zero snapshot: save (publish([])) and restore (a fresh member).
* baseline: torchrun elastic (c10d rendezvous on a store hosted here, is_host=false,
  last_call_timeout=1, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), workers restarted on every
  change and reloading a torch.save checkpoint from local disk
  (benchmarks/rescale_baseline_worker.py):
  up   = a third agent is launched -> first step at world size 3
  down = the third agent's process group gets SIGTERM (preemption) -> first step at size 2

``--device cuda`` runs every member and baseline worker on this host's GPU (cuda:0), over gloo
with CUDA tensors: NCCL refuses two ranks on one GPU, and every member shares the one GPU.

Each transition is done ``--cycles`` times; the median is reported. Last line:
``rescale down_s=<x> up_s=<y> baseline_down_s=<a> baseline_up_s=<b>``.

``--against-commit REV`` instead compares this tree's malletrain with an older commit's (e.g.
the last one with the unauthenticated TCPStore coordinator, to measure what authentication
costs): the older tree is checked out with ``git worktree`` and its own benchmark runs with
``--skip-baseline``; the two alternate ``--rounds`` times in one run. Last line:
``rescale_vs down_s=<x> up_s=<y> other_down_s=<a> other_up_s=<b> other=<rev>``.

Run: ``.venv/bin/python benchmarks/rescale.py`` (about 3 minutes on 2 shared cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from malletrain.elastic.coordinator.handle import Coordinator  # noqa: E402
from malletrain.elastic.coordinator.keyfile import read_key  # noqa: E402

EXAMPLE = REPO / "examples" / "elastic_train.py"
BASELINE = REPO / "benchmarks" / "rescale_baseline_worker.py"
MODEL_ARGS = ["--dim", "1024", "--hidden", "12288", "--batch", "8"]  # --hidden may override
#: base learning rate of the malletrain run (x world size): 0.01 diverged to NaN within 5-7
#: steps (the loss sums 1024 outputs per sample), so the replica check compared NaNs; 1e-5
#: converges (checked: every loss of the run must be finite)
LR = "1e-5"


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            out.append(json.loads(line))
    return out


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit(f"rescale: timed out after {timeout_s} s waiting for {what}")


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.update(extra)
    return env


# ------------------------------------------------------------------------------ malletrain


def start_coordinator(tmp: Path) -> tuple[subprocess.Popen, Coordinator]:
    """``malletrain coordinator`` in its own process, as the daemon starts it."""
    addr = tmp / "coordinator.addr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "malletrain.cli", "coordinator", "--port", "0",
         "--key-file", str(tmp / "coordinator.key"), "--address-file", str(addr)],
        env=child_env(), stdout=subprocess.DEVNULL)
    wait_for(addr.exists, 60, "the coordinator")
    return proc, Coordinator.attach(addr.read_text().strip(), read_key(tmp / "coordinator.key"))


def run_malletrain(tmp: Path, cycles: int, script: Path = EXAMPLE) -> dict[str, list[float]]:
    """Native mode: ``script`` (``examples/elastic_train.py`` or a script with its
    arguments and log, e.g. ``examples/elastic_accelerate.py``) on 2 <-> 3 members."""
    coord_proc, coord = start_coordinator(tmp)
    job = "bench"
    state = tmp / "state"
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}

    def launch(member: str) -> None:
        logs[member] = tmp / f"mt-{member}.jsonl"
        env = child_env(MALLETRAIN_COORDINATOR=coord.address, MALLETRAIN_JOB_ID=job,
                        MALLETRAIN_JOB_SECRET=coord.job_secret(job),
                        MALLETRAIN_MEMBER_ID=member, MALLETRAIN_STATE_DIR=str(state),
                        MALLETRAIN_BACKEND="gloo")  # one host: members may share one GPU
        with open(tmp / f"mt-{member}.err", "w") as err:
            procs[member] = subprocess.Popen(
                [sys.executable, str(script), *MODEL_ARGS, "--lr", LR, "--dataset-size", "256",
                 "--jsonl", str(logs[member])],
                env=env, stdout=subprocess.DEVNULL, stderr=err)

    def first_step_t0(member: str, epoch: int) -> float:
        steps = [r for r in records(logs[member]) if r["event"] == "step" and r["epoch"] == epoch]
        return min(r["t0"] for r in steps)

    def last_step_end(member: str, before_epoch: int) -> float:
        return max(r["t"] for r in records(logs[member])
                   if r["event"] == "step" and r["epoch"] < before_epoch)

    def stepped(member: str, epoch: int, n: int) -> bool:
        return sum(1 for r in records(logs[member])
                   if r["event"] == "step" and r["epoch"] == epoch) >= n

    def epoch_checksums(epoch: int) -> set[str]:
        return {r["checksum"] for m in logs for r in records(logs[m])
                if r["event"] == "epoch" and r["epoch"] == epoch}

    out: dict[str, list[float]] = {"up": [], "down": [], "save": [], "restore": [],
                                   "up_stall": [], "down_stall": []}
    try:
        for m in ("m0", "m1", "m2"):
            launch(m)
        wait_for(lambda: {"m0", "m1", "m2"} <= set(coord.registered(job)), 120, "registration")
        e = coord.publish(job, ["m0", "m1"])
        wait_for(lambda: stepped("m0", e, 5), 120, "warm-up at 2")
        for _ in range(cycles):
            wait_for(lambda: "m2" in coord.registered(job), 60, "m2 waiting")
            t = time.time()
            e = coord.publish(job, ["m0", "m1", "m2"])
            wait_for(lambda e=e: stepped("m0", e, 1), 120, "first step at 3")
            out["up"].append(first_step_t0("m0", e) - t)
            out["up_stall"].append(first_step_t0("m0", e) - last_step_end("m0", e))
            assert len(epoch_checksums(e)) == 1, "replicas differ after scale-up"
            wait_for(lambda e=e: stepped("m0", e, 4), 120, "steps at 3")
            t = time.time()
            e = coord.publish(job, ["m0", "m1"])
            wait_for(lambda e=e: stepped("m0", e, 1), 120, "first step at 2")
            out["down"].append(first_step_t0("m0", e) - t)
            out["down_stall"].append(first_step_t0("m0", e) - last_step_end("m0", e))
            wait_for(lambda e=e: stepped("m0", e, 3), 120, "steps at 2")
            procs["m2"].wait(30)
            launch("m2")  # the next node for the next scale-up, pre-started like the daemon does
        # evicted to zero: the last members save; a fresh member restores
        coord.publish(job, [])
        for m in ("m0", "m1"):
            procs[m].wait(60)
        ex = [r for r in records(logs["m0"]) if r["event"] == "exit"][-1]
        out["save"].append(ex["reconfig"]["snapshot_save_s"])
        wait_for(lambda: "m2" in coord.registered(job), 60, "m2 waiting")
        e = coord.publish(job, ["m2"])
        wait_for(lambda e=e: stepped("m2", e, 1), 120, "restored step")
        ep = [r for r in records(logs["m2"]) if r["event"] == "epoch" and r["epoch"] == e][-1]
        assert ep["step"] == ex["step"], "restore did not resume at the saved step"
        out["restore"].append(ep["reconfig"]["snapshot_load_s"])
        coord.publish(job, [])
        procs["m2"].wait(60)
        assert_finite_losses([r for path in logs.values() for r in records(path)])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        coord.close()
        coord_proc.terminate()
        coord_proc.wait(10)
    return out


def assert_finite_losses(recs: list[dict]) -> None:
    """Identical replicas mean nothing if the losses are NaN (equal checksums of NaNs)."""
    losses = [r["loss"] for r in recs if r["event"] == "step"]
    bad = [x for x in losses if not math.isfinite(x)]
    if not losses or bad:
        raise SystemExit(f"rescale: {len(bad)} of {len(losses)} losses are not finite")


# ------------------------------------------------------------------------------ baseline


def run_baseline(tmp: Path, cycles: int) -> dict[str, list[float]]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          multi_tenant=True, timeout=timedelta(seconds=60))
    ckpt = tmp / "baseline.ckpt"
    agents: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}

    def launch(name: str) -> None:
        logs[name] = tmp / f"bl-{name}.jsonl"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:3",
               "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{store.port}", "--rdzv-id=baseline",
               "--rdzv-conf=is_host=false,last_call_timeout=1,join_timeout=120,"
               "keep_alive_interval=1,keep_alive_max_attempt=3",
               "--max-restarts=20", "--monitor-interval=0.1",
               str(BASELINE), *MODEL_ARGS, "--ckpt", str(ckpt), "--jsonl", str(logs[name])]
        with open(tmp / f"bl-{name}.err", "w") as err:
            agents[name] = subprocess.Popen(
                cmd, env=child_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"),
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def first_step_after(ws: int, t: float) -> float | None:
        starts = [r["t0"] for n in logs for r in records(logs[n])
                  if r["event"] == "step" and r["ws"] == ws and r["t0"] >= t]
        return min(starts) if starts else None

    def stall(ws: int, t: float) -> float:
        """Training stall: last step end before the first step at ``ws`` -> that step."""
        first = first_step_after(ws, t)
        assert first is not None
        ends = [r["t"] for n in logs for r in records(logs[n])
                if r["event"] == "step" and r["ws"] != ws and r["t"] <= first]
        return first - max(ends)

    out: dict[str, list[float]] = {"up": [], "down": [], "up_stall": [], "down_stall": []}
    try:
        launch("a")
        launch("b")
        t_warm = time.time()
        wait_for(lambda: ckpt.exists() and first_step_after(2, t_warm) is not None, 240,
                 "baseline warm-up at 2")
        for i in range(cycles):
            t = time.time()
            launch(f"c{i}")
            wait_for(lambda t=t: first_step_after(3, t) is not None, 240, "baseline at 3")
            out["up"].append(first_step_after(3, t) - t)  # type: ignore[operator]
            out["up_stall"].append(stall(3, t))
            time.sleep(3.0)  # a few steps at 3 (and a checkpoint)
            t = time.time()
            os.killpg(agents[f"c{i}"].pid, signal.SIGTERM)
            wait_for(lambda t=t: first_step_after(2, t) is not None, 240, "baseline at 2")
            out["down"].append(first_step_after(2, t) - t)  # type: ignore[operator]
            out["down_stall"].append(stall(2, t))
            agents[f"c{i}"].wait(30)
            time.sleep(2.0)
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in agents.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return out


def fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def _parse_list(line: str, name: str) -> list[float]:
    text = line.split(f"{name}=[", 1)[1].split("]", 1)[0]
    return [float(v) for v in text.split(",") if v.strip()]


def run_other_tree(tmp: Path, rev: str, cycles: int, hidden: int) -> dict[str, list[float]]:
    """Run an older commit's own benchmark (malletrain only) from a git worktree."""
    tree = tmp / f"tree-{rev[:12]}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)
    try:
        res = subprocess.run(
            [sys.executable, str(tree / "benchmarks" / "rescale.py"), "--skip-baseline",
             "--cycles", str(cycles), "--hidden", str(hidden)],
            env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True,
            timeout=1800, check=False)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)
    line = next((x for x in res.stdout.splitlines() if x.startswith("malletrain up_s=")), None)
    if res.returncode != 0 or line is None:
        raise RuntimeError(f"the benchmark of {rev} failed: {res.stderr[-2000:]}")
    return {"up": _parse_list(line, "up_s"), "down": _parse_list(line, "down_s")}


def compare_with(tmp: Path, rev: str, rounds: int, cycles: int, hidden: int) -> int:
    mine: dict[str, list[float]] = {"up": [], "down": []}
    other: dict[str, list[float]] = {"up": [], "down": []}
    for r in range(rounds):
        (tmp / f"round{r}").mkdir()
        for name, run in (("this tree", lambda r=r: run_malletrain(tmp / f"round{r}", cycles)),
                          (rev, lambda: run_other_tree(tmp, rev, cycles, hidden))):
            got = run()
            into = mine if name == "this tree" else other
            for k in ("up", "down"):
                into[k] += got[k]
            print(f"round {r + 1} {name}: up_s={fmt(got['up'])} down_s={fmt(got['down'])}",
                  flush=True)
    up, down = statistics.median(mine["up"]), statistics.median(mine["down"])
    o_up, o_down = statistics.median(other["up"]), statistics.median(other["down"])
    print(f"this tree / {rev}: up {up / o_up:.3f}x down {down / o_down:.3f}x (median of "
          f"{len(mine['up'])} transitions each)")
    print(f"rescale_vs down_s={down:.3f} up_s={up:.3f} other_down_s={o_down:.3f} "
          f"other_up_s={o_up:.3f} other={rev}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2, help="up/down cycles per system")
    ap.add_argument("--hidden", type=int, default=12288,
                    help="hidden width (default: the 96 MiB model; smaller for a smoke run)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where every member's model lives (cuda: this host's first GPU)")
    ap.add_argument("--keep", action="store_true", help="keep the logs (path printed)")
    ap.add_argument("--skip-baseline", action="store_true",
                    help="malletrain only (no last line; for a quick check)")
    ap.add_argument("--against-commit", metavar="REV",
                    help="compare with REV's malletrain instead of torchrun (see above)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations with --against-commit")
    args = ap.parse_args()
    MODEL_ARGS[3] = str(args.hidden)
    MODEL_ARGS.extend(["--device", "cuda:0" if args.device == "cuda" else "cpu"])
    tmp = Path(tempfile.mkdtemp(prefix="mt-rescale-"))
    print(f"logs in {tmp}", flush=True)
    if args.against_commit:
        try:
            return compare_with(tmp, args.against_commit, args.rounds, args.cycles, args.hidden)
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    try:
        mt = run_malletrain(tmp, args.cycles)
        print(f"malletrain up_s={fmt(mt['up'])} down_s={fmt(mt['down'])} "
              f"(training stall: up {fmt(mt['up_stall'])} down {fmt(mt['down_stall'])})",
              flush=True)
        print(f"malletrain evicted-to-zero snapshot save_s={mt['save'][0]:.2f} "
              f"restore_load_s={mt['restore'][0]:.2f} (hidden={args.hidden}, "
              f"device={args.device})", flush=True)
        if args.skip_baseline:
            return 0
        bl = run_baseline(tmp, args.cycles)
        print(f"baseline   up_s={fmt(bl['up'])} down_s={fmt(bl['down'])} "
              f"(training stall: up {fmt(bl['up_stall'])} down {fmt(bl['down_stall'])})",
              flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    up, down = statistics.median(mt["up"]), statistics.median(mt["down"])
    b_up, b_down = statistics.median(bl["up"]), statistics.median(bl["down"])
    print(f"speedup down={b_down / down:.1f}x up={b_up / up:.1f}x")
    print(f"rescale down_s={down:.2f} up_s={up:.2f} baseline_down_s={b_down:.2f} "
          f"baseline_up_s={b_up:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
