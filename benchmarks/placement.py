"""Placement and compression across a slow link: packed vs spread, PowerSGD vs plain.

Issue 19's question: how much slower is a data-parallel job whose nodes sit on both sides of
a slow link, and how much of that does gradient compression win back? Four gloo workers
train one DDP model on synthetic data, in three runs of the same steps and seed:

* **packed**: all four on one "switch";
* **spread**: two on each switch, the switches joined by a slow link;
* **spread + PowerSGD**: as spread, with torch's PowerSGD DDP communication hook (rank
  ``--rank``, error feedback, from the second step on).

Then the same job as the elastic runtime runs it: four ``ElasticJob`` workers of
``examples/elastic_train.py`` (a 1024-512-1024 MLP, 4.2 MB of gradients) with
``SlowLinkCompression(below_mbit_s=--compress-below-mbit)``, packed and spread, their
coordinator on switch 1. The runtime must switch PowerSGD on by itself in the spread group
(its all-reduce measures below the threshold) and leave the packed group plain; the run
fails otherwise.

A switch is a Linux network namespace; the link between the two is a veth pair whose two
ends send at most ``--link-mbit`` (``tbf``); workers of one switch talk over its loopback
(``GLOO_SOCKET_IFNAME`` names the switch's end of the link). What it emulates, and what
not: a bandwidth limit between two groups of processes of one machine (no added latency:
netem is not in this kernel); the dev cluster's slurmd nodes all share the host's address,
so the workers here are plain processes, not node slots. It needs root (``ip netns``,
``tc``), removes what it made on exit, and is not run in CI.

Last line: ``placement packed_vs_spread=P compression_speedup=C loss_delta=D`` (P: spread
step time over packed; C: spread plain over spread compressed; D: relative difference of the
final loss over the whole data set, compressed against plain).

    .venv/bin/python benchmarks/placement.py [--steps 100] [--link-mbit 200] [--rank 32]
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--link-mbit", type=float, default=200.0, help="the slow link's rate")
    ap.add_argument("--hidden", type=int, default=1024, help="MLP width (3 layers)")
    ap.add_argument("--rank", type=int, default=32,
                    help="PowerSGD's approximation rank (4 and 8 lost 3-8 %% of the loss)")
    ap.add_argument("--port", type=int, default=29731)
    ap.add_argument("--compress-below-mbit", type=float, default=500.0,
                    help="the elastic runs' SlowLinkCompression threshold")
    ap.add_argument("--worker", type=str, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--elastic-driver", type=str, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ---------------------------------------------------------------------------- the link
#: namespace, its end of the link, its address
SWITCHES = {1: ("mt-bench-sw1", "mt-sw1", "10.99.0.1"), 2: ("mt-bench-sw2", "mt-sw2", "10.99.0.2")}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def make_link(mbit: float) -> None:
    """Two namespaces joined by a veth pair that sends ``mbit`` each way."""
    for ns, _, _ in SWITCHES.values():
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
    (ns1, end1, _), (ns2, end2, _) = SWITCHES[1], SWITCHES[2]
    ip("link", "add", end1, "netns", ns1, "type", "veth", "peer", "name", end2, "netns", ns2)
    for ns, end, addr in SWITCHES.values():
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", end)
        ip("-n", ns, "link", "set", end, "up")
        subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", end, "root", "tbf", "rate",
                        f"{mbit}mbit", "burst", "256kb", "latency", "200ms"],
                       check=True, capture_output=True, text=True)


def remove_link() -> None:
    for ns, _, _ in SWITCHES.values():  # the veth pair goes with its namespaces
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---------------------------------------------------------------------------- a worker
def worker(spec: dict[str, object]) -> None:
    """One rank: a gloo group bound to its own address, DDP, ``steps`` timed steps."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    rank = int(spec["rank"])  # type: ignore[call-overload]
    faulthandler.dump_traceback_later(float(spec["timeout_s"]), exit=True)  # type: ignore[arg-type]
    torch.set_num_threads(1)
    store = dist.TCPStore(SWITCHES[1][2], int(spec["port"]), WORLD,  # type: ignore[call-overload]
                          rank == 0, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    pg = dist.group.WORLD
    hidden = int(spec["hidden"])  # type: ignore[call-overload]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4096, 64, generator=g)
    y = torch.tanh(x @ (torch.randn(64, 64, generator=g) / 8.0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, 64))
    # one bucket: PowerSGD issues its collectives from the futures of the buckets before it,
    # and with gloo two buckets in flight deadlocked (their callbacks on two threads)
    ddp = DistributedDataParallel(model, process_group=pg, bucket_cap_mb=64)
    if spec["compress"]:
        state = powerSGD_hook.PowerSGDState(process_group=pg, matrix_approximation_rank=int(
            spec["rank_r"]), start_powerSGD_iter=2, random_seed=0)  # type: ignore[call-overload]
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    times, loss = [], float("nan")
    for step in range(int(spec["steps"])):  # type: ignore[call-overload]
        idx = torch.arange(step * 64 * WORLD + rank * 64, step * 64 * WORLD + (rank + 1) * 64)
        idx = idx % x.shape[0]
        t0 = time.perf_counter()
        out = ddp(x[idx])
        batch_loss = ((out - y[idx]) ** 2).mean()
        opt.zero_grad()
        batch_loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        loss = float(batch_loss.detach())
    with torch.no_grad():  # the same held-out measure on every run: the whole data set
        full = float(((model(x) - y) ** 2).mean())
    dist.barrier(pg)
    if rank == 0:
        Path(str(spec["out"])).write_text(json.dumps({"times": times, "loss": loss,
                                                      "full_loss": full}))
    dist.destroy_process_group()


# ------------------------------------------------------------ the elastic runtime's switch
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "elastic_train.py"


def elastic_driver(spec: dict[str, object]) -> None:
    """Inside switch 1: a coordinator on its address, four ElasticJob workers of
    examples/elastic_train.py with SlowLinkCompression (on the switches ``spec`` names), one
    membership of all four; writes every rank-0 step record to ``spec["out"]``."""
    from malletrain.elastic.coordinator.handle import Coordinator

    coord = Coordinator.start(SWITCHES[1][2], 0)
    job, tmp = "placement", Path(str(spec["tmp"]))
    procs, members = [], [f"w{i}" for i in range(WORLD)]
    try:
        for member, sw in zip(members, spec["switches"], strict=True):  # type: ignore[call-overload]
            ns, end, _ = SWITCHES[int(sw)]
            env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=end,
                       MALLETRAIN_COORDINATOR=coord.address, MALLETRAIN_JOB_ID=job,
                       MALLETRAIN_JOB_SECRET=coord.job_secret(job), MALLETRAIN_MEMBER_ID=member,
                       MALLETRAIN_LOG_LEVEL="INFO")
            argv = [sys.executable, str(EXAMPLE), "--jsonl", str(tmp / f"{member}.jsonl"),
                    "--total-samples", str(spec["samples"]), "--dim", "1024", "--hidden", "512",
                    "--batch", "64", "--lr", "0.0005",
                    "--compress-below-mbit", str(spec["below"]),
                    "--compress-rank", str(spec["rank_r"])]
            prefix = [] if int(sw) == 1 else ["ip", "netns", "exec", ns]
            with open(tmp / f"{member}.err", "w") as err:
                procs.append(subprocess.Popen(prefix + argv, env=env, stderr=err))
        deadline = time.monotonic() + 300
        while set(coord.registered(job)) < set(members):
            if time.monotonic() > deadline or any(pr.poll() is not None for pr in procs):
                raise SystemExit("elastic workers did not all register")
            time.sleep(0.1)
        coord.publish(job, members)
        codes = [pr.wait(timeout=1800) for pr in procs]
        if any(codes):
            raise SystemExit(f"an elastic worker failed ({codes}): see {tmp}")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
        coord.close()


def _p50(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else float("nan")


def elastic_run(label: str, switches: list[int], args: argparse.Namespace) -> dict[str, float]:
    """Steps before and after the switch (if any) and the bandwidth the group measured."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        spec = {"switches": switches, "tmp": tmp, "samples": 64 * WORLD * args.steps,
                "below": args.compress_below_mbit, "rank_r": args.rank}
        subprocess.run(["ip", "netns", "exec", SWITCHES[1][0], sys.executable, __file__,
                        "--elastic-driver", json.dumps(spec)], check=True)
        rank0 = [json.loads(line) for p in Path(tmp).glob("w*.jsonl")
                 for line in p.read_text().splitlines()]
    steps = sorted((r for r in rank0 if r["event"] == "step" and r["rank"] == 0),
                   key=lambda r: r["step"])
    gaps = [(b["t0"] - a["t0"], b["compressed"]) for a, b in itertools.pairwise(steps)]
    on = [g for g, c in gaps if c]
    off = sorted(g for g, c in gaps[3:] if not c)
    at = next((r["step"] for r in steps if r["compressed"]), None)
    mbit = steps[-1].get("link_mbit_s")
    print(f"{label:<18} link measured {mbit if mbit is None else f'{mbit:.0f}'} Mbit/s; "
          f"PowerSGD from step {at}; step p50 {_p50(off) * 1000:.1f} ms plain, "
          f"{_p50(on) * 1000:.1f} ms compressed", flush=True)
    return {"switched": float(at is not None)}


# ---------------------------------------------------------------------------- a run
def run(label: str, switches: list[int], args: argparse.Namespace, compress: bool,
        port: int) -> dict[str, float]:
    """The four workers of one run; the median step time (first steps excluded)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        procs = []
        for rank, sw in enumerate(switches):
            ns, end, _ = SWITCHES[sw]
            spec = {"rank": rank, "port": port, "hidden": args.hidden, "compress": compress,
                    "rank_r": args.rank, "steps": args.steps, "out": str(out),
                    "timeout_s": 30 + 10 * args.steps}
            env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=end)
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__,
                                           "--worker", json.dumps(spec)], env=env))
        codes = [p.wait(timeout=1800) for p in procs]
        if any(codes):
            raise SystemExit(f"{label}: a worker failed ({codes})")
        data = json.loads(out.read_text())
    steady = sorted(data["times"][3:])
    median = steady[len(steady) // 2]
    print(f"{label:<18} step p50 {median * 1000:8.1f} ms   final loss {data['full_loss']:.5f}",
          flush=True)
    return {"step_s": median, "loss": data["full_loss"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    if args.elastic_driver is not None:
        elastic_driver(json.loads(args.elastic_driver))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("placement.py makes network namespaces and shapes a link: run it "
                         "as root")
    remove_link()  # what an interrupted run may have left
    try:
        make_link(args.link_mbit)
        packed = run("packed", [1, 1, 1, 1], args, False, args.port)
        spread = run("spread", [1, 1, 2, 2], args, False, args.port + 1)
        squeezed = run("spread + PowerSGD", [1, 1, 2, 2], args, True, args.port + 2)
        e_packed = elastic_run("elastic, packed", [1, 1, 1, 1], args)
        e_spread = elastic_run("elastic, spread", [1, 1, 2, 2], args)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{' '.join(exc.cmd)}: {exc.stderr.strip()}: nothing measured"
                         ) from None
    finally:
        remove_link()
    print(f"{WORLD} gloo workers, a {args.hidden}-wide 3-layer MLP "
          f"({(64 * args.hidden * 2 + args.hidden ** 2) * 4 / 1e6:.1f} MB of gradients), "
          f"{args.steps} steps, link {args.link_mbit:g} Mbit/s between the two switches, "
          f"PowerSGD rank {args.rank}")
    ratio = spread["step_s"] / packed["step_s"]
    speedup = spread["step_s"] / squeezed["step_s"]
    delta = abs(squeezed["loss"] - spread["loss"]) / spread["loss"]
    ok = e_spread["switched"] and not e_packed["switched"]
    print(f"# ElasticJob with SlowLinkCompression(below_mbit_s={args.compress_below_mbit:g}): "
          f"spread {'switched' if e_spread['switched'] else 'did NOT switch'}, packed "
          f"{'switched (wrong)' if e_packed['switched'] else 'stayed plain'}")
    print(f"placement packed_vs_spread={ratio:.2f} compression_speedup={speedup:.2f} "
          f"loss_delta={delta:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
