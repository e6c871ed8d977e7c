"""End-to-end benchmark: a replayed regular workload with and without malletrain scavenging.

One run, two phases on the same local Slurm dev cluster (8 nodes), the same job stream:

1. **baseline**: a time-compressed slice of the ALCF Theta 2022 log (``data/traces``, vendored) is
   submitted as regular ``batch`` jobs (as mt-bob); nothing else runs.
2. **scavenging**: the same stream, while ``malletrain daemon`` runs two malleable training
   jobs of mt-alice (examples/elastic_train.py, 1-4 nodes each) on whatever is idle.

Measured, side by side:

* each regular job's wait (start - submit) in both phases; ``yield_delay`` = wait with
  scavenging - wait without, per job (what scavenging costs the regular workload);
* ``scavenged_fraction``: over the scavenging phase after start-up (from the first
  membership), sum over 1 s samples of the nodes training in a malleable job's membership,
  divided by the idle node-seconds the malleable jobs could use (nodes without a regular job,
  capped by the sum of their max sizes);
* ``lost_steps``: steps the workers started but did not commit (``failed_step`` records in
  their logs), next to the number of preemptions.

Waits are taken from slurmctld.log's millisecond timestamps (submit RPC -> allocation), in
both phases alike; Slurm's own ``submit_time``/``start_time`` are whole seconds, which turns
a 0.2 s yield into a 0 or 1 s delay at random (the whole-second figures are printed too).
For every regular job that took nodes from slots, ``benchmarks/yield_trace.py`` splits the
wait into Slurm's preemption decision, malletrain's yield (signal -> slot job ended) and
Slurm starting the job on the freed nodes.

The stream is time-compressed (the default slice: 1036 s of Theta arrivals in 150 s, ~60 s
jobs run 10 s) but a newcomer's start-up (Python, torch, group formation; 9-18 s here, with
8 "nodes" sharing 2 cores) is not, so idle intervals are a few seconds to tens of seconds
where Theta's real median is ~8 min. ``scavenged_fraction`` counts that start-up against
malletrain; ``scavenged_fraction_after_startup`` leaves out the node-seconds in which a slot
already holds its node but its worker is still starting (the newcomer's start-up, a cost of
the machine, paid once per hole), and is the figure comparable with the issue's target
("after start-up"). Both are printed.

``--aa`` replays the stream a second time without scavenging before the scavenging phase
and prints Slurm's own run-to-run difference the same way (the second baseline's wait minus
the first's): the delay figure is a difference of two waits that each depend on where a
submission falls in Slurm's 1 s scheduling tick, so part of it is Slurm's noise, not
malletrain's cost.

``--restart-mode`` runs the two malleable jobs as examples/restart's unmodified batch script
(restart mode) instead; ``lost_steps`` then does not apply and ``redone_samples`` counts the
samples trained twice because a restart went back to an older checkpoint. Its
``scavenged_fraction_after_startup`` counts a node as training once its agent is in the
membership, before the restarted script's own start-up: it overstates restart mode.

Prints one line per regular job, then the last line
``e2e yield_delay_s_max=<x> yield_delay_s_p50=<y> scavenged_fraction=<z> lost_steps=<n>``.

The dev cluster runs with the scheduler settings of a scavenging site and an Epilog
(``slurm/dev-cluster up --epilog``; docs/slurm-backend.md §9); ``--no-epilog`` and
``--scheduler-parameters`` compare other settings on the same code.

Run (root; ~10 min on 2 cores): ``.venv/bin/python benchmarks/e2e.py``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from malletrain.devstack import LocalCluster, LocalDaemon, as_user, run
from malletrain.slurm.hostlist import expand_hostlist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yield_trace  # benchmarks/ is not a package
from step_log import redone_steps

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "alcf-theta-2022.swf"  # data/README.md
RESTART_EXAMPLE = REPO / "examples" / "restart"
NODES = 8
THETA_NODES = 4360


@dataclass(frozen=True)
class RegularJob:
    index: int
    offset_s: float
    nodes: int
    run_s: int


def load_stream(path: Path, first: int, count: int, span_s: float) -> list[RegularJob]:
    """``count`` consecutive Theta jobs from ``first``, scaled to 8 nodes and ``span_s``."""
    rows = []
    with path.open() as f:
        for line in f:
            if line.startswith(";") or not line.strip():
                continue
            fields = line.split()
            rows.append((float(fields[1]), float(fields[3]), int(fields[4])))
    rows = rows[first:first + count]
    t0 = rows[0][0]
    spread = max(r[0] for r in rows) - t0 or 1.0
    jobs = []
    for i, (submit, run_s, nodes) in enumerate(rows):
        scaled_nodes = max(1, min(NODES, round(nodes / THETA_NODES * NODES * 4)))
        jobs.append(RegularJob(i, (submit - t0) / spread * span_s, scaled_nodes,
                               int(min(45, max(10, run_s / 400)))))
    return jobs


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(args.dir)
        self.cluster = LocalCluster(self.base / "cluster", args.port, NODES)
        self.env = self.cluster.env
        self.work = self.base / "work"
        self.daemon: LocalDaemon | None = None
        self.ids: dict[str, dict[int, int]] = {}  # phase tag -> stream index -> Slurm id

    def sh(self, argv: list[str]) -> str:
        return run(argv, self.env, cwd=self.work).stdout

    def setup(self) -> None:
        if self.work.exists():
            shutil.rmtree(self.work)
        self.base.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(mode=0o755)
        # --epilog: a site's Epilog, so a preempted slot's node is scheduled at once
        # (docs/slurm-backend.md §9); --no-epilog for the dev cluster's plain default
        self.cluster.up(epilog=self.args.epilog)
        if self.args.scheduler_parameters:  # e.g. the dev cluster's old setting, to compare
            conf = Path(self.cluster.slurm_conf)
            conf.write_text(re.sub(r"^SchedulerParameters=.*$",
                                   f"SchedulerParameters={self.args.scheduler_parameters}",
                                   conf.read_text(), flags=re.M))
            self.sh(["scontrol", "reconfigure"])
            shown = self.sh(["scontrol", "show", "config"])
            if f"= {self.args.scheduler_parameters}\n" not in shown:
                raise SystemExit("scontrol reconfigure did not apply --scheduler-parameters")

    # ------------------------------------------------------------------ a phase
    def run_stream(self, stream: list[RegularJob], tag: str,
                   sampler: Callable[[dict[int, dict]], None] | None = None
                   ) -> dict[int, float]:
        """Submit the stream on schedule; return index -> wait seconds."""
        t0 = time.monotonic()
        pending = list(stream)
        ids: dict[int, int] = self.ids.setdefault(tag, {})
        submitted: dict[int, float] = {}
        started: dict[int, float] = {}
        deadline = t0 + self.args.span + 400
        while time.monotonic() < deadline:
            now = time.monotonic()
            while pending and now - t0 >= pending[0].offset_s:
                j = pending.pop(0)
                out = self.sh(as_user("mt-bob", [
                    "sbatch", "--parsable", "-p", "batch", "-N", str(j.nodes), "-t", "2",
                    "-J", f"{tag}{j.index}", "-o", "/dev/null", "--wrap", f"srun sleep {j.run_s}"]))
                ids[j.index] = int(out.strip().split(";")[0])
                submitted[j.index] = time.monotonic()
            by_id = {int(x["job_id"]): x for x in self.cluster.squeue()}
            for idx, sid in ids.items():
                if idx in started:
                    continue
                rec = by_id.get(sid)
                if rec and rec.get("job_state") in ("RUNNING", "COMPLETING", "COMPLETED"):
                    started[idx] = time.monotonic()
            if sampler is not None:
                sampler(by_id)
            if not pending and len(started) == len(stream):
                break
            time.sleep(0.25)
        # the poll has 0.25 s resolution; Slurm's own times are whole seconds: use both,
        # start_time - submit_time from Slurm for the wait (same clock, same rounding)
        waits = {}
        by_id = {int(x["job_id"]): x for x in self.cluster.squeue()}
        for idx, sid in ids.items():
            rec = by_id.get(sid)
            if rec and rec.get("start_time") and rec.get("submit_time"):
                waits[idx] = float(rec["start_time"]) - float(rec["submit_time"])
            elif idx in started:
                waits[idx] = started[idx] - submitted[idx]
        return waits

    def wait_regular_done(self) -> None:
        for _ in range(400):
            if not any(x.get("partition") == "batch" and x.get("job_state") in
                       ("PENDING", "RUNNING", "COMPLETING") for x in self.cluster.squeue()):
                return
            time.sleep(0.5)

    # ------------------------------------------------------------------ daemon
    def start_daemon(self) -> LocalDaemon:
        self.daemon = LocalDaemon(self.work, self.env, self.cluster.slurm_conf,
                                  policy=self.args.policy, tick_s=1.0)
        return self.daemon.start()

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon.stop_coordinator()
        self.cluster.down()

    # ------------------------------------------------------------------ main
    def main(self) -> int:
        stream = load_stream(TRACE, self.args.first, self.args.jobs, self.args.span)
        self.setup()
        try:
            print(f"# policy {self.args.policy}, launcher {self.args.launcher}, epilog "
                  f"{self.args.epilog}, SchedulerParameters "
                  f"{self.args.scheduler_parameters or '(dev cluster default)'}", flush=True)
            print(f"# stream: {len(stream)} Theta 2022 jobs from #{self.args.first}, nodes "
                  f"{[j.nodes for j in stream]}, run s {[j.run_s for j in stream]}", flush=True)
            base = self.run_stream(stream, "base")
            self.wait_regular_done()
            if self.args.aa:  # the same stream again, Slurm alone: its own run-to-run spread
                self.run_stream(stream, "base2")
                self.wait_regular_done()
            daemon = self.start_daemon()
            if self.args.restart_mode:
                mall = [submit_restart(daemon, tag) for tag in ("ma", "mb")]
            else:
                mall = [daemon.submit_example("mt-alice", tag, "1-4", self.args.samples,
                                              step_sleep_s=0.05, batch_per_rank=16,
                                              launcher=self.args.launcher, step_log=True)
                        for tag in ("ma", "mb")]
            # start-up: wait until both train on every node they can have (the first
            # workers on an empty cluster), then replay the same stream
            for _ in range(240):
                rows = daemon.jobs()
                members = sum(rows.get(j, {}).get("members", 0) for j in mall)
                cap = sum(rows.get(j, {}).get("max_nodes", 0) for j in mall)
                if (all(rows.get(j, {}).get("members", 0) > 0 for j in mall)
                        and members >= min(NODES, cap)):
                    break
                time.sleep(0.5)
            samples = {"usable": 0.0, "training": 0.0, "starting": 0.0}
            last = [time.monotonic()]
            # one line per 1 s sample, to trace a scavenging shortfall after the run
            trace = (self.base / "samples.jsonl").open("w")

            def sample(by_id: dict) -> None:
                now = time.monotonic()
                if now - last[0] < 1.0:
                    return
                last[0] = now
                regular: set[str] = set()
                slots_running = 0
                slot_nodes: dict[str, list[str]] = {}  # slot state -> nodes
                for x in by_id.values():
                    state = str(x.get("job_state"))
                    if str(x.get("comment", "")).startswith("malletrain:"):
                        slots_running += state == "RUNNING"
                        slot_nodes.setdefault(state, []).extend(
                            expand_hostlist(x.get("nodes", "")) or ["-"])
                    elif state in ("RUNNING", "COMPLETING"):
                        regular.update(expand_hostlist(x.get("nodes", "")))
                    elif state == "PENDING":
                        slot_nodes.setdefault("regular_pending", []).append(
                            f"{x.get('job_id')}:{x.get('state_reason', '')}")
                rows = [r for r in daemon.jobs().values() if r["state"] not in
                        ("completed", "cancelled", "failed")]
                cap = sum(r["max_nodes"] for r in rows)
                samples["usable"] += min(NODES - len(regular), cap)
                members = sum(r["members"] for r in rows)
                samples["training"] += members
                # slots that hold a node whose worker is not in the membership yet
                samples["starting"] += max(0, slots_running - members)
                trace.write(json.dumps({
                    "t": round(now, 2), "usable": min(NODES - len(regular), cap),
                    "training": members, "starting": max(0, slots_running - members),
                    "regular": sorted(regular), "slots": slot_nodes,
                    "jobs": {r["job_id"]: [r["state"], r["members"]] for r in rows}}) + "\n")

            scav = self.run_stream(stream, "scav", sampler=sample)
            trace.close()
            self.wait_regular_done()
            rows = daemon.jobs()
        finally:
            self.stop()
        lost = sum(redone_steps(daemon.step_log(tag))
                   for tag in (("ma", "mb") if not self.args.restart_mode else ()))
        log_dir = self.base / "cluster" / "log"
        ms = {}
        for tag in ("base", "base2", "scav") if self.args.aa else ("base", "scav"):
            ids = self.ids.get(tag, {})
            by_slurm = {tr.slurm_job_id: tr for tr in
                        yield_trace.regular_traces(log_dir, set(ids.values()))}
            ms[tag] = {idx: by_slurm[sid].wait_s for idx, sid in ids.items()
                       if sid in by_slurm}
            if tag == "scav":
                print("# where the waits with scavenging went (slurmctld/slurmd logs):")
                print("\n".join("#" + line for line in
                                yield_trace.summarize(list(by_slurm.values()))))
        delays, delays_whole_s = [], []
        for j in stream:
            if j.index in base and j.index in scav:
                delays_whole_s.append(scav[j.index] - base[j.index])
            if j.index in ms["base"] and j.index in ms["scav"]:
                wb, ws = ms["base"][j.index], ms["scav"][j.index]
                d = ws - wb
                delays.append(d)
                print(f"job {j.index:2d} nodes={j.nodes} run={j.run_s:2d}s "
                      f"wait_without={wb:5.2f}s wait_with={ws:5.2f}s "
                      f"delay={d:+.2f}s", flush=True)
        preemptions = sum(r.get("preemptions", 0) for r in rows.values())
        frac = samples["training"] / samples["usable"] if samples["usable"] else 0.0
        after = samples["usable"] - samples["starting"]
        frac_after = samples["training"] / after if after > 0 else 0.0
        print("# malleable jobs: " + ", ".join(
            f"{r['job_id']} {r['state']} {r['samples_total']} samples, "
            f"{r['rescales_up']} up/{r['rescales_down']} down, {r['preemptions']} preemptions"
            for r in rows.values()))
        print(f"# training node-s {samples['training']:.0f} of usable idle node-s "
              f"{samples['usable']:.0f}, of which {samples['starting']:.0f} node-s a slot's "
              f"worker was starting; preemptions {preemptions}; waits without: "
              f"{sorted(round(w, 2) for w in ms['base'].values())}")
        if delays_whole_s:
            print(f"# with Slurm's whole-second times: delay max {max(delays_whole_s):.2f} s, "
                  f"p50 {statistics.median(delays_whole_s):.2f} s")
        dmax = max(delays) if delays else float("nan")
        dp50 = statistics.median(delays) if delays else float("nan")
        aa = ""
        if self.args.aa:
            # Slurm's own spread: the second baseline's wait minus the first's, per job
            same = [ms["base2"][i] - ms["base"][i] for i in ms["base"] if i in ms["base2"]]
            if same:
                print(f"# Slurm alone, twice (A/A): delay max {max(same):.2f} s, p50 "
                      f"{statistics.median(same):.2f} s, per job "
                      f"{[round(d, 2) for d in same]}")
                aa = f" slurm_aa_delay_s_max={max(same):.2f}"
        if self.args.restart_mode:
            redone = {tag: restart_redone_samples(daemon.out / tag / "train.jsonl")
                      for tag in ("ma", "mb")}
            print(f"# restart mode: samples trained again after a restart {redone}")
            aa += f" redone_samples={sum(redone.values())} mode=restart"
        print(f"e2e yield_delay_s_max={dmax:.2f} yield_delay_s_p50={dp50:.2f} "
              f"scavenged_fraction={frac:.3f} scavenged_fraction_after_startup="
              f"{frac_after:.3f} lost_steps={lost}{aa}", flush=True)
        return 0


def submit_restart(daemon: LocalDaemon, tag: str) -> str:
    """``--restart-mode``: the unmodified batch script of examples/restart, as mt-alice, its
    checkpoint and log in ``out/TAG``; its malletrain job id."""
    work = daemon.out / tag
    work.mkdir(exist_ok=True)
    work.chmod(0o777)
    for name in ("train.sbatch", "train_ddp.py"):
        shutil.copy(RESTART_EXAMPLE / name, work / name)
        (work / name).chmod(0o755)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # torchrun, as an activated env has
    res = daemon.submit("mt-alice", "--parsable", "-N", "1-4", "-J", tag,
                        "-o", str(work / "slot-%j.out"),
                        f"--export=ALL,EPOCHS=100000,STEP_SLEEP=0.05,CKPT_DIR={work},"
                        f"TRAIN_PY={work / 'train_ddp.py'},PATH={path}",
                        str(work / "train.sbatch"))
    return res.stdout.strip()


def restart_redone_samples(log: Path) -> int:
    """Samples a restart-mode job trained twice: at each restart, how far behind the
    furthest step so far its checkpoint put it back."""
    furthest = redone = 0
    if not log.exists():
        return 0
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec["event"] == "start":
                redone += max(0, furthest - rec["samples"])
            furthest = max(furthest, rec.get("samples", 0))
    return redone


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/malletrain-bench-e2e")
    ap.add_argument("--port", type=int, default=28817)
    ap.add_argument("--first", type=int, default=1000, help="first Theta job of the slice")
    ap.add_argument("--jobs", type=int, default=12, help="regular jobs in the stream")
    ap.add_argument("--span", type=float, default=150.0, help="seconds the stream spans")
    ap.add_argument("--samples", type=int, default=400_000, help="samples per malleable job")
    ap.add_argument("--launcher", default="srun", choices=("torchrun", "srun"),
                    help="how node slots start their workers (malletrain submit --launcher; "
                    "srun, the default there too)")
    ap.add_argument("--epilog", action=argparse.BooleanOptionalAction, default=True,
                    help="run the dev cluster with an Epilog, as sites have (default: yes)")
    ap.add_argument("--scheduler-parameters", default="",
                    help="override the dev cluster's SchedulerParameters (to compare settings)")
    ap.add_argument("--aa", action="store_true",
                    help="replay the stream twice without scavenging first, and print Slurm's "
                    "own run-to-run wait difference (an A/A check of the delay figure)")
    ap.add_argument("--restart-mode", action="store_true",
                    help="the malleable jobs are examples/restart's unmodified batch script "
                    "(restart mode) instead of examples/elastic_train.py (native mode)")
    ap.add_argument("--policy", default="malletrain",
                    help="allocator.policy for the daemon (equal-share for comparison)")
    return Bench(ap.parse_args()).main()


if __name__ == "__main__":
    sys.exit(main())
