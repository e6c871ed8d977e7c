"""``make demo`` = ``python -m malletrain.demo``: the whole system on a local Slurm cluster.

What it does, in a few minutes and on its own:

1. starts the dev cluster (``slurm/dev-cluster up``: 8 emulated nodes, batch + scavenger
   partitions, test users mt-alice and mt-bob);
2. starts ``malletrain daemon`` with a config in the demo directory;
3. mt-alice submits two malleable training jobs (``malletrain submit``, run as mt-alice);
4. after a while mt-bob submits a regular 4-node batch job, which takes its nodes back;
5. shows a live view of the nodes (who runs where) and the malleable jobs (size, samples/s);
6. stops when both jobs finished (or on Ctrl-C): daemon, coordinator and cluster go down and
   no process is left behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from malletrain.daemon.submit.cli_user import format_rows
from malletrain.devstack import (
    LocalCluster,
    LocalDaemon,
    StackError,
    as_user,
    check_python_reachable,
    run,
)
from malletrain.slurm.hostlist import expand_hostlist


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(args.dir)
        self.cluster = LocalCluster(self.base / "cluster", args.port, args.nodes)
        self.work = self.base / "work"
        self.daemon: LocalDaemon | None = None
        self.batch_id: int | None = None
        self.events: list[str] = []
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("demo: run as root (it starts a local Slurm cluster and test users)")
        if self.work.exists():
            shutil.rmtree(self.work)
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)
        print(f"[demo] starting the Slurm dev cluster ({self.args.nodes} nodes) ...", flush=True)
        self.cluster.up()
        check_python_reachable("mt-alice", self.cluster.env)
        print("[demo] starting malletrain daemon ...", flush=True)
        self.daemon = LocalDaemon(self.work, self.cluster.env, self.cluster.slurm_conf,
                                  policy=self.args.policy)
        self.daemon.start()

    def submit(self, tag: str) -> str:
        assert self.daemon is not None
        job = self.daemon.submit_example("mt-alice", tag, "1-4", self.args.samples)
        self.note(f"mt-alice submitted malleable job {job} ({tag}, 1-4 nodes)")
        return job

    def note(self, text: str) -> None:
        self.events.append(f"+{time.monotonic() - self.t0:5.0f}s  {text}")

    # ------------------------------------------------------------------ view
    def jobs(self) -> list[dict[str, Any]]:
        assert self.daemon is not None
        try:
            return list(self.daemon.jobs().values())
        except StackError:
            return []  # the daemon is busy or restarting: show the rest, try again

    def nodes_view(self) -> list[str]:
        sinfo = run(["sinfo", "-h", "-N", "-p", "batch", "-o", "%N %T"], self.cluster.env,
                    check=False)
        where: dict[str, str] = {}
        try:
            for j in self.cluster.squeue():
                if j.get("job_state") not in ("RUNNING", "COMPLETING"):
                    continue
                comment = str(j.get("comment", ""))
                label = (f"{comment.split(':')[1]} slot {comment.split(':')[2]} "
                         f"({j['user_name']})" if comment.startswith("malletrain:")
                         else f"batch job {j['job_id']} ({j['user_name']})")
                for n in expand_hostlist(j.get("nodes", "")):
                    where[n] = label
        except (ValueError, KeyError):
            pass
        lines = []
        for line in sinfo.stdout.splitlines():
            name, state = line.split(None, 1)
            lines.append(f"  {name:4} {state:10} {where.get(name, '-')}")
        return lines

    def show(self, jobs: list[dict[str, Any]]) -> None:
        out = ["\033[2J\033[H" if sys.stdout.isatty() else "",
               f"malletrain demo  (+{time.monotonic() - self.t0:.0f} s, Ctrl-C stops)", "",
               "NODES (Slurm state, who runs there)"]
        out += self.nodes_view()
        out += ["", "MALLEABLE JOBS (malletrain jobs)"]
        out += ["  " + line for line in format_rows(jobs).splitlines()]
        out += ["", "EVENTS"] + [f"  {e}" for e in self.events[-8:]]
        print("\n".join(out), flush=True)

    # ------------------------------------------------------------------ scenario
    def scenario(self) -> int:
        a = self.submit("resnet-a")
        b = self.submit("resnet-b")
        deadline = time.monotonic() + self.args.max_seconds
        batch_at = time.monotonic() + self.args.batch_after
        while time.monotonic() < deadline:
            jobs = self.jobs()
            self.show(jobs)
            by_id = {j["job_id"]: j for j in jobs}
            if self.batch_id is None and time.monotonic() > batch_at:
                res = run(as_user("mt-bob", ["sbatch", "--parsable", "-p", "batch", "-N", "4",
                                             "-t", "2", "-o", "/dev/null",
                                             "--wrap", "srun sleep 40"]),
                          self.cluster.env, cwd=self.work)
                self.batch_id = int(res.stdout.strip().split(";")[0])
                self.note(f"mt-bob submitted regular batch job {self.batch_id} (4 nodes, 40 s)")
            if all(by_id.get(j, {}).get("state") in ("completed", "failed", "cancelled")
                   for j in (a, b)):
                self.show(jobs)
                for j in (a, b):
                    row = by_id[j]
                    print(f"[demo] {j}: {row['state']}, {row['samples_total']} samples "
                          f"(asked {self.args.samples}), {row['rescales_up']} up / "
                          f"{row['rescales_down']} down, {row['preemptions']} preemption(s)")
                return 0
            time.sleep(2.0)
        print("[demo] time is up; stopping", flush=True)
        return 0

    def teardown(self) -> None:
        print("[demo] stopping daemon, coordinator and cluster ...", flush=True)
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon.stop_coordinator()
        self.cluster.down()
        print(f"[demo] done. Logs: {self.work}/daemon.log, job output in {self.work}/out",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/malletrain-demo", help="demo directory")
    ap.add_argument("--port", type=int, default=27817, help="dev cluster port base")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--samples", type=int, default=60_000, help="samples per training job")
    ap.add_argument("--batch-after", type=float, default=45.0,
                    help="seconds before mt-bob submits the regular job")
    ap.add_argument("--max-seconds", type=float, default=420.0, help="stop after this long")
    ap.add_argument("--policy", default="malletrain",
                    help="allocator.policy for the daemon (default: malletrain, the learned "
                         "policy the daemon runs by default; equal-share for comparison)")
    args = ap.parse_args(argv)
    demo = Demo(args)
    stop = {"sig": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["sig"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        demo.setup()
        return demo.scenario()
    except KeyboardInterrupt:
        print("\n[demo] interrupted", flush=True)
        return 130
    except StackError as exc:
        print(f"demo: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        demo.teardown()


if __name__ == "__main__":
    sys.exit(main())
