"""How long gloo's survivors take to notice a SIGKILLed peer, in a loop of small all-reduces.

Why: benchmarks/faults.py saw recoveries of ~10 s after a worker's SIGKILL in some runs and
under 3 s in others. This isolates the collective: ``--world`` gloo processes all-reduce a
5-element tensor in a loop (as the elastic runtime's step-boundary check does), rank 2 kills
itself with SIGKILL at iteration 200 (``--kill before`` its all-reduce, or ``after`` its own
all-reduce returned, while a peer may still be sending to it), and each survivor prints
how long after that its collective raised and with what. Each survivor then destroys its
group and stays alive (as a worker does while its job heals): after leaving the ``except``
block (``--teardown outside``: the runtime since the fix) or inside it (``inside``: the
runtime before, whose handled exception's traceback held the group and its sockets).

    .venv/bin/python benchmarks/gloo_dead_peer.py [--world 4] [--timeout-s 10] [--kill after]
        [--teardown outside]

Last line: ``gloo_dead_peer world=W kill=K teardown=D timeout_s=T detect_s=[...]``
(one per survivor, sorted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time

VICTIM, KILL_AT = 2, 200


def die() -> None:
    """SIGKILL at once: the time goes to stdout first (a pipe write, microseconds; a store
    round trip here gave the peers time to finish their sends and hid the race)."""
    os.write(1, (json.dumps({"killed_at": time.time()}) + "\n").encode())
    os.kill(os.getpid(), signal.SIGKILL)


def rank_main(rank: int, world: int, port: int, timeout_s: float, when: str,
              teardown: str) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    flags = torch.zeros(5, dtype=torch.int64)
    error = ""
    for i in range(1, 10**9):
        if rank == VICTIM and i == KILL_AT and when == "before":
            die()
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if rank == VICTIM and i == KILL_AT:  # "after": the moment its own part is done
                die()
        except Exception as exc:  # the peer's death, one way or another
            print(json.dumps({"rank": rank, "failed_at": time.time(),
                              "error": str(exc).split("] ")[-1][:80]}), flush=True)
            if teardown == "inside":
                # as the runtime healed before the fix: group destroyed, but inside the
                # except block, whose traceback still holds it (its sockets stay open)
                dist.destroy_process_group()
                time.sleep(timeout_s + 2)
                return
            error = str(exc)
            break
        time.sleep(0.001)
    if error:  # outside the except block: the traceback is gone with it
        dist.destroy_process_group()
        time.sleep(timeout_s + 2)  # the heal that follows: the process stays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--timeout-s", type=float, default=10.0, help="the group's timeout "
                    "(the elastic runtime's step_timeout_s)")
    ap.add_argument("--kill", choices=["before", "after"], default="after",
                    help="the victim dies before its all-reduce, or the moment its own "
                         "all-reduce returned (a peer may still be sending to it)")
    ap.add_argument("--teardown", choices=["outside", "inside"], default="outside",
                    help="where a survivor destroys its group once its collective raised: "
                         "after leaving the except block (the runtime) or inside it")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.port, args.timeout_s, args.kill, args.teardown)
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                               "--world", str(args.world), "--timeout-s", str(args.timeout_s),
                               "--kill", args.kill, "--teardown", args.teardown],
                              stdout=subprocess.PIPE, text=True)
             for r in range(args.world)]
    rows, killed = [], 0.0
    for p in procs:
        out, _ = p.communicate(timeout=args.timeout_s * 6 + 60)
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                if "killed_at" in row:
                    killed = row["killed_at"]
                else:
                    rows.append(row)
    for row in rows:
        row["detect_s"] = round(row["failed_at"] - killed, 2)
    for row in sorted(rows, key=lambda r: r["rank"]):
        print(f"rank {row['rank']}: raised {row['detect_s']:.2f} s after the kill: "
              f"{row['error']}")
    detect = sorted(r["detect_s"] for r in rows)
    print(f"gloo_dead_peer world={args.world} kill={args.kill} teardown={args.teardown} "
          f"timeout_s={args.timeout_s:g} detect_s={detect}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
