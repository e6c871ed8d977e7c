"""Public batch scripts of the corpus, unchanged, through grow, preemption and regrow.

Each script of ``CASES`` is a file of ``tests/data/sbatch/`` (byte for byte) submitted by
mt-alice with ``malletrain submit``, with sbatch-style command-line options where the 8-node
CPU dev cluster needs them (``-N 1-3``; ``-c``/``--mem*`` that fit a 2-CPU, 1000 MB node;
``--ntasks-per-node=1`` where a script starts one process per GPU; ``--gres=gpu:a100:4``
where it asks for V100s), as one would override them with sbatch. The dev cluster has fake
GPUs (``dev-cluster up --gpus a100:8``: empty device files slurmd counts), so the scripts'
GPU requests are honoured as written.

What the dev cluster lacks is on PATH from ``tests/data/standins/bin`` (``singularity``,
``module``, ``conda``, ...), and the public training programs the scripts name are all one
stand-in, ``tests/data/standins/train_standin.py`` (CPU DDP over gloo, its own checkpoint
per epoch), copied to the path each script runs.

Scripts run a group at a time (the 8 nodes shared): they grow, a regular 7-node job of
mt-bob preempts them, they shrink, regrow when it ends, and finish. Per script: finished?,
sizes seen (nodes x ranks per node at each start of the training program), times nodes were
taken from it (Slurm's preemption, or the daemon giving them back ahead of the regular job),
restarts, samples lost (trained after the last checkpoint before a restart, so trained
again), and the regular job's wait (polled, s) with malletrain's part of it (yield_s: from
the slot's SIGTERM to its end, in slurmctld's and slurmd's millisecond logs). Run as root::

    python benchmarks/corpus_e2e.py [--group 3] [--only NAME ...] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from yield_trace import regular_traces  # noqa: E402

from malletrain.devstack import PYTHON, LocalCluster, LocalDaemon, as_user, run  # noqa: E402

CORPUS = REPO / "tests" / "data" / "sbatch"
STANDINS = REPO / "tests" / "data" / "standins"
TRAINER = STANDINS / "train_standin.py"
GPUS = "a100:8"
NODES = 8


@dataclass(frozen=True)
class Case:
    """One corpus script: the options a user gives sbatch for this cluster, and the
    paths (relative to the submit directory, or absolute) of the programs it starts."""

    file: str
    style: str
    options: tuple[str, ...]
    programs: tuple[str, ...]
    #: helper scripts the batch script runs, from its repository: (where it expects one,
    #: ``~`` for mt-alice's home; the stand-in's file name in ``STANDINS``)
    helpers: tuple[tuple[str, str], ...] = ()
    dirs: tuple[str, ...] = ()  # directories its ``--output`` needs (sbatch creates none)


CASES: tuple[Case, ...] = (
    Case("pytorch-examples--ddp-tutorial-series--sbatch_run.sh", "head-IP srun, torchrun",
         ("--ntasks-per-node=1", "-c", "1"), ("/shared/examples/multinode_torchrun.py",)),
    Case("ml-engineering--srun-launcher.slurm", "srun bash -c, RANK=$SLURM_PROCID",
         ("--ntasks-per-node=1", "-c", "1"), ("torch-distributed-gpu-test.py",)),
    Case("multi_gpu_training--job.slurm", "srun python, module/conda, 2 tasks per node",
         ("-c", "1", "--mem=500M"), ("mnist_classify_ddp.py",)),
    Case("pytorch-examples--minGPT-ddp--sbatch_run.sh", "head-IP srun, torchrun",
         ("--ntasks-per-node=1", "-c", "1"), ("/shared/examples/mingpt/main.py",)),
    Case("pytorch-ddp-examples--run-ddp-gpu8.sh", "CSC torchrun, 4 per node",
         ("-c", "1", "-A", "mt", "--gres=gpu:a100:4"), ("mnist_ddp.py",)),
    Case("ml-engineering--lightning-launcher.slurm", "Lightning: srun bash -c python",
         ("--ntasks-per-node=1", "-c", "1"), ("torch-distributed-gpu-test.py",)),
    Case("pytorch-ddp-examples--run-accelerate-gpu8.sh",
         "singularity_wrapper + bash -c, accelerate launch",
         ("-c", "1", "--mem=500M", "-A", "mt", "--gres=gpu:a100:4"), ("mnist_accelerate.py",)),
    Case("pytorch-ddp-examples--run-lightning-gpu8.sh", "Lightning: srun python, 2 per node",
         ("--ntasks-per-node=2", "-c", "1", "-A", "mt", "--gres=gpu:a100:4"),
         ("mnist_lightning_ddp.py",)),
    Case("pytorch-ddp-examples--run-deepspeed-gpu8.sh", "DeepSpeed: srun python --deepspeed",
         ("--ntasks-per-node=2", "-c", "1", "-A", "mt", "--gres=gpu:a100:4"),
         ("mnist_deepspeed.py",)),
    Case("ml-engineering--torchrun-launcher.slurm", "srun bash -c torch.distributed.run",
         ("-c", "1"), ("torch-distributed-gpu-test.py",)),
    Case("LUMI-AI-Guide--run_ddp_srun_4.sh", "singularity run + bash -c, SLURM_PROCID",
         ("--ntasks-per-node=1", "-c", "1", "--mem-per-gpu=100M", "-A", "mt"),
         ("ddp_visiontransformer.py",)),
    Case("anemoi-house--submit_training.sh", "helper script under srun: srun ~/x.sh CMD",
         ("--ntasks-per-node=1", "-c", "1", "-A", "mt"), (),
         helpers=(("~/anemoi-house/slurm2ddp.sh", "slurm2ddp.sh"),), dirs=("slurm",)),
)
#: node features the scripts' ``--constraint`` names (NERSC Perlmutter's ``gpu``), which
#: the dev cluster's nodes are given at the start: a real site's nodes have them
FEATURES = "gpu"
USER = "mt-alice"


HOSTS_MARK = "# malletrain dev cluster: its node names, as a real cluster's resolve"


def node_names_resolve(nodes: int = NODES, hosts: Path = Path("/etc/hosts")) -> None:
    """The dev cluster's nodes are ``n1``..``nN`` on this host, names nothing resolves, where
    a real cluster's node names resolve: scripts hand ``$(scontrol show hostnames ... | head
    -n 1)`` to their program as ``MASTER_ADDR``. A stand-in: a line in /etc/hosts naming them
    127.0.0.1 (added once, never removed: other dev clusters on this host name theirs alike)."""
    names = [f"n{i}" for i in range(1, nodes + 1)]
    text = hosts.read_text()
    known = {w for line in text.splitlines() for w in line.split("#")[0].split()[1:]}
    if set(names) <= known:
        return
    with hosts.open("a") as f:
        f.write(("" if text.endswith("\n") else "\n") + f"127.0.0.1 {' '.join(names)} "
                f"{HOSTS_MARK}\n")


def node_features(env: dict[str, str], nodes: int = NODES) -> None:
    """The features of :data:`FEATURES` on every node (until slurmctld restarts)."""
    run(["scontrol", "update", f"NodeName=n[1-{nodes}]", f"AvailableFeatures={FEATURES}",
         f"ActiveFeatures={FEATURES}"], env)


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a SIGKILL
    return out


@dataclass(frozen=True)
class Outcome:
    """What a script's ``train.jsonl`` says about its run."""

    finished: bool
    worlds: tuple[int, ...]  # world sizes of its starts, in order
    nodes: tuple[int, ...]  # node counts of its starts, in order
    restarts: int
    samples_lost: int
    started_over: bool

    @staticmethod
    def of(recs: Sequence[dict]) -> Outcome:
        starts = [r for r in recs if r["event"] == "start"]
        lost, best = 0, 0
        for r in recs:
            if r["event"] == "start":
                lost += max(0, best - r["samples"])
            best = max(best, r.get("samples", 0))
        return Outcome(bool(recs) and recs[-1]["event"] == "done",
                       tuple(s["world"] for s in starts),
                       tuple(s.get("nodes", 0) for s in starts), max(0, len(starts) - 1), lost,
                       [s["samples"] for s in starts].count(0) > 1)


class Staged:
    """A case's submit directory: the script (a byte copy), the stand-in programs."""

    def __init__(self, case: Case, base: Path) -> None:
        self.case = case
        self.dir = base / case.file
        self.dir.mkdir(parents=True)
        shutil.copyfile(CORPUS / case.file, self.dir / case.file)
        self.placed: list[Path] = []
        for program in case.programs:
            path = Path(program) if program.startswith("/") else self.dir / program
            self._place(TRAINER, path)
        for where, standin in case.helpers:
            path = Path(where.replace("~", f"~{USER}", 1)).expanduser()
            self._place(STANDINS / standin, path, owner=USER)
        for d in case.dirs:
            (self.dir / d).mkdir()
            shutil.chown(self.dir / d, USER, USER)
        shutil.chown(self.dir, USER, USER)

    def _place(self, source: Path, path: Path, owner: str | None = None) -> None:
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, path)  # with its mode: a helper stays executable
        if owner:
            for x in (path.parent, path):
                shutil.chown(x, owner, owner)
        self.placed.append(path)

    @property
    def log(self) -> Path:
        return self.dir / "train.jsonl"

    def outcome(self) -> Outcome:
        return Outcome.of(records(self.log))

    def remove_placed(self) -> None:
        for path in self.placed:
            path.unlink(missing_ok=True)


def submit(daemon: LocalDaemon, staged: Staged, epochs: int, nodes: str = "1-3",
           time_limit: str = "30") -> str:
    """``malletrain submit`` as mt-alice from the script's directory; the job id."""
    home = str(Path(f"~{USER}").expanduser())  # sbatch passes on the user's own HOME
    env = dict(daemon.env, PATH=f"{STANDINS / 'bin'}:{Path(PYTHON).parent}:/usr/bin:/bin",
               HOME=home, USER=USER, LOGNAME=USER,
               STANDIN_EPOCHS=str(epochs), STANDIN_STEP_SLEEP="0.05", OMP_NUM_THREADS="1")
    argv = [PYTHON, "-m", "malletrain.cli", "submit", "--socket", str(daemon.socket),
            "--parsable", "-N", nodes, "-t", time_limit, *staged.case.options,
            str(staged.dir / staged.case.file)]
    res = run(as_user("mt-alice", argv), env, cwd=staged.dir, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{staged.case.file}: submit failed: {res.stderr[-1500:]}")
    return res.stdout.strip()


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str,
               on_timeout: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{extra}")
        time.sleep(0.5)


def jobs(daemon: LocalDaemon) -> dict[str, dict]:
    res = daemon.cli(None, "jobs", "--socket", str(daemon.socket), "--json", "-a")
    return {r["job_id"]: r for r in json.loads(res.stdout)}


def diagnostics(daemon: LocalDaemon, staged: Sequence[Staged]) -> str:
    parts = [json.dumps(jobs(daemon), indent=1)[-3000:]]
    for s in staged:
        for out in sorted(s.dir.glob("*.out"))[-2:] + sorted(s.dir.glob("*.err"))[-1:]:
            parts.append(f"--- {out}\n{out.read_text(errors='replace')[-1500:]}")
    return "\n".join(parts) + "\n--- daemon\n" + daemon.log()[-2000:]


@dataclass(frozen=True)
class GroupResult:
    outcomes: dict[str, Outcome]
    states: dict[str, str]
    #: node slots taken from the job: `malletrain jobs`'s PREEMPT (Slurm preempted them)
    #: plus its DOWN (the daemon gave them back ahead of the regular job)
    preemptions: dict[str, int]
    regular_wait_s: float
    yield_s: float | None
    messages: dict[str, str]  # `malletrain jobs`'s MESSAGE of each script's job at its end
    regrew: dict[str, bool]  # trained on 2 nodes or more after the regular job's start


_ENDED = ("completed", "failed", "cancelled")


def run_group(cluster_dir: Path, daemon: LocalDaemon, staged: Sequence[Staged], epochs: int,
              regular_nodes: int = 7, regular_s: int = 10) -> GroupResult:
    """Grow, preemption by mt-bob's regular job, regrow, finish; for every script at once.
    A script whose job ends (fails) is not waited for; the table says so."""
    ids = dict(zip((s.case.file for s in staged), (submit(daemon, s, epochs) for s in staged),
                   strict=True))
    diag = lambda: diagnostics(daemon, staged)  # noqa: E731

    def ended(s: Staged) -> bool:
        return jobs(daemon)[ids[s.case.file]]["state"] in _ENDED

    def grown(s: Staged) -> bool:  # an epoch checkpointed at 2 nodes or more
        return any(r["event"] == "epoch" and r.get("nodes", 0) >= 2 for r in records(s.log))

    wait_until(lambda: all(grown(s) or ended(s) for s in staged), 300,
               "every script to grow", on_timeout=diag)
    argv = ["sbatch", "--parsable", "-p", "batch", "-N", str(regular_nodes), "-t", "3",
            "-o", "/dev/null", "--wrap", f"srun sleep {regular_s}"]
    batch = int(run(as_user("mt-bob", argv), daemon.env).stdout.strip().split(";")[0])
    submitted = time.monotonic()

    def state() -> str:
        res = run(["squeue", "-h", "-j", str(batch), "-o", "%T"], daemon.env, check=False)
        return res.stdout.strip()

    wait_until(lambda: state() == "RUNNING", 60, "the regular job to start", on_timeout=diag)
    wait_s = time.monotonic() - submitted
    marks = {s.case.file: len(records(s.log)) for s in staged}
    wait_until(lambda: state() in ("", "COMPLETED"), 120, "the regular job to end")

    def regrown(s: Staged) -> bool:
        return any(r["event"] == "step" and r.get("nodes", 0) >= 2
                   for r in records(s.log)[marks[s.case.file]:])

    wait_until(lambda: all(regrown(s) or s.outcome().finished or ended(s) for s in staged),
               300, "every script to grow back", on_timeout=diag)
    regrew = {s.case.file: regrown(s) for s in staged}
    wait_until(lambda: all(ended(s) for s in staged), 600, "every script to end",
               on_timeout=diag)
    rows = jobs(daemon)
    traces = regular_traces(cluster_dir / "log", {batch})
    yields = [t.yield_s for t in traces if t.yield_s is not None]
    by_file = {f: rows[j] for f, j in ids.items()}
    return GroupResult(
        {s.case.file: s.outcome() for s in staged},
        {f: r["state"] for f, r in by_file.items()},
        {f: r["preemptions"] + r["rescales_down"] for f, r in by_file.items()},
        wait_s, max(yields) if yields else None,
        {f: r.get("message", "") for f, r in by_file.items()}, regrew)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", type=int, default=3, help="scripts run at once")
    ap.add_argument("--only", nargs="*", default=None, help="file names (prefixes)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--port", type=int, default=23100)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(c.file.startswith(o) for o in args.only)]
    base = Path(tempfile.mkdtemp(prefix="malletrain-corpus-e2e-", dir="/tmp"))
    base.chmod(0o755)
    node_names_resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on ^C
    cluster = LocalCluster(base / "cluster", args.port, NODES)
    cluster.up(gpus=GPUS)
    node_features(cluster.env)
    daemon = LocalDaemon(base / "work", cluster.env, cluster.slurm_conf).start()
    print(f"{'script':52} {'style':44} fin regrew {'nodes x ranks per start':23} taken "
          "restarts lost  wait_s yield_s")
    failures = 0
    try:
        for k in range(0, len(cases), args.group):
            staged = [Staged(c, base / "scripts") for c in cases[k:k + args.group]]
            t0 = time.monotonic()
            try:
                res = run_group(cluster.base, daemon, staged, args.epochs)
            except (TimeoutError, RuntimeError) as exc:
                print(f"group {[s.case.file for s in staged]} failed: {exc}", flush=True)
                failures += len(staged)
                run(["scancel", "-u", "mt-alice"], cluster.env, check=False)
                run(["scancel", "-u", "mt-bob"], cluster.env, check=False)
                time.sleep(10)
                continue
            finally:
                for s in staged:
                    s.remove_placed()
            for s in staged:
                o = res.outcomes[s.case.file]
                ok = o.finished and not o.started_over and res.states[s.case.file] == "completed"
                failures += not ok
                sizes = "→".join(f"{n}x{w // max(n, 1)}" for n, w in zip(o.nodes, o.worlds,
                                                                          strict=True))
                yield_text = "-" if res.yield_s is None else f"{res.yield_s:.2f}"
                regrew = "yes" if res.regrew[s.case.file] else "no"
                print(f"{s.case.file[:52]:52} {s.case.style[:44]:44} {'yes' if ok else 'NO ':4}"
                      f"{regrew:6}"
                      f" {sizes:23} {res.preemptions[s.case.file]:5} {o.restarts:8} "
                      f"{o.samples_lost:5} {res.regular_wait_s:6.1f} {yield_text:>7}",
                      flush=True)
                if not ok:
                    print(f"  {s.case.file}: {res.states[s.case.file]}: "
                          f"{res.messages[s.case.file]}", flush=True)
            print(f"  (group of {len(staged)}: {time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        daemon.stop()
        daemon.stop_coordinator()
        cluster.down()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{len(cases) - failures} of {len(cases)} scripts finished through grow, "
          "preemption and regrow")
    return 1 if failures else 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
