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
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
EXAMPLE = REPO / "examples" / "elastic_train.py"
PY = sys.executable


def _as(user: str, argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(args.dir)
        self.cluster_dir = self.base / "cluster"
        self.work = self.base / "work"
        self.env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(self.cluster_dir),
                        MALLETRAIN_DEVCLUSTER_PORT=str(args.port),
                        SLURM_CONF=str(self.cluster_dir / "etc" / "slurm.conf"))
        self.socket = self.work / "state" / "submit.sock"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.batch_id: int | None = None
        self.events: list[str] = []
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ setup
    def run(self, argv: list[str], check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                             timeout=timeout, check=False, cwd=str(self.work))
        if check and res.returncode != 0:
            raise SystemExit(f"demo: {' '.join(argv[:4])} failed: {res.stderr.strip()[-500:]}")
        return res

    def setup(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("demo: run as root (it starts a local Slurm cluster and test users)")
        if self.work.exists():
            shutil.rmtree(self.work)
        for d in (self.base, self.work, self.work / "state", self.work / "out"):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
        (self.work / "out").chmod(0o1777)
        print(f"[demo] starting the Slurm dev cluster ({self.args.nodes} nodes) ...", flush=True)
        self.run([str(DEV_CLUSTER), "up", "--nodes", str(self.args.nodes), "--accounting",
                  "--users", "mt-alice,mt-bob"], timeout=600)
        probe = self.run(_as("mt-alice", [PY, "-c", "import torch, malletrain"]), check=False)
        if probe.returncode != 0:
            raise SystemExit(
                f"demo: mt-alice cannot run {PY} with torch (jobs run as the submitting user). "
                "Make the virtualenv reachable by other users, e.g. `chmod o+x` on its parent "
                f"directories.\n{probe.stderr.strip()[-300:]}")
        config = self.work / "malletrain.yaml"
        config.write_text(yaml.safe_dump({
            "slurm": {"slurm_conf": self.env["SLURM_CONF"], "max_slot_time_s": 900},
            "allocator": {"tick_interval_s": 1.0, "policy": self.args.policy},
            "state": {"database_path": str(self.work / "state" / "state.db"),
                      "snapshot_dir": str(self.work / "state" / "snapshots")},
            "coordinator": {"host": "127.0.0.1", "port": 0},
            "submit": {"socket_path": str(self.socket)},
            "metrics": {"address": "127.0.0.1:0"},
            "logging": {"level": "INFO"},
        }))
        print("[demo] starting malletrain daemon ...", flush=True)
        log = open(self.work / "daemon.log", "ab")  # noqa: SIM115 - lives with the daemon
        self.daemon = subprocess.Popen(
            [PY, "-m", "malletrain.cli", "daemon", "--config", str(config)], env=self.env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 90
        while not self.socket.exists():
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"demo: the daemon did not start; see {self.work}/daemon.log")
            time.sleep(0.2)

    def submit(self, tag: str) -> str:
        res = self.run(_as("mt-alice", [
            PY, "-m", "malletrain.cli", "submit", "--socket", str(self.socket), "--parsable",
            "-N", "1-4", "-J", tag, "-o", str(self.work / "out" / f"{tag}-%j.out"),
            "-D", str(self.work / "out"), str(EXAMPLE), "--total-samples",
            str(self.args.samples), "--step-sleep", "0.25", "--batch", "64",
            "--results", str(self.work / "out" / f"{tag}.json")]))
        job = res.stdout.strip()
        self.note(f"mt-alice submitted malleable job {job} ({tag}, 1-4 nodes)")
        return job

    def note(self, text: str) -> None:
        self.events.append(f"+{time.monotonic() - self.t0:5.0f}s  {text}")

    # ------------------------------------------------------------------ view
    def jobs(self) -> list[dict[str, Any]]:
        res = self.run([PY, "-m", "malletrain.cli", "jobs", "--all", "--json", "--socket",
                        str(self.socket)], check=False)
        return json.loads(res.stdout) if res.returncode == 0 else []

    def nodes_view(self) -> list[str]:
        squeue = self.run(["squeue", "--all", "--json"], check=False)
        sinfo = self.run(["sinfo", "-h", "-N", "-p", "batch", "-o", "%N %T"], check=False)
        where: dict[str, str] = {}
        try:
            for j in json.loads(squeue.stdout)["jobs"]:
                if j.get("job_state") not in ("RUNNING", "COMPLETING"):
                    continue
                comment = str(j.get("comment", ""))
                label = (f"{comment.split(':')[1]} slot {comment.split(':')[2]} "
                         f"({j['user_name']})" if comment.startswith("malletrain:")
                         else f"batch job {j['job_id']} ({j['user_name']})")
                from malletrain.slurm.hostlist import expand_hostlist

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
        from malletrain.daemon.cli_user import format_rows

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
                res = self.run(_as("mt-bob", ["sbatch", "--parsable", "-p", "batch", "-N", "4",
                                              "-t", "2", "-o", "/dev/null",
                                              "--wrap", "srun sleep 40"]))
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
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        pid_file = self.work / "state" / "coordinator.pid"
        if pid_file.exists():
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        self.run([str(DEV_CLUSTER), "down"], check=False, timeout=120)
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
    finally:
        demo.teardown()


if __name__ == "__main__":
    sys.exit(main())
