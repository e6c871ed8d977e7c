"""Store growth: what 10,000 submit+cancel cycles leave behind in the daemon's state.

Each cycle goes through the real parts: the daemon's request handler takes a submission
(real SQLite store), the job's processes write what a short-lived job writes to the real
coordinator through their own authenticated session (a registration, a membership, progress,
a process group's rendezvous keys), the owner cancels, and the daemon ends the job as its tick
does (the coordinator forgets the job; ended jobs beyond ``state.keep_ended_jobs`` are
deleted). Measured side by side in one run: the same cycles with pruning off (the behaviour
before: every job row kept, only the job's known coordinator keys deleted, its process-group
keys left behind).

Last line: ``store_growth cycles=N db_bytes=X coordinator_bytes=Y baseline_db_bytes=A
baseline_coordinator_bytes=B`` (growth over the run: database + WAL, bytes the coordinator
still holds). Target (issue 15): under 10 MB per 10,000 cycles.

Run: ``.venv/bin/python benchmarks/store_growth.py [--cycles 10000]`` (about a minute).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from malletrain.daemon.jobs.spec import JobSpec  # noqa: E402
from malletrain.daemon.jobs.store import Store  # noqa: E402
from malletrain.daemon.submit.channel import Peer  # noqa: E402
from malletrain.daemon.submit.requests import RequestHandler  # noqa: E402
from malletrain.elastic.coordinator.handle import Coordinator  # noqa: E402
from malletrain.elastic.protocol.authstore import AuthStore  # noqa: E402
from malletrain.elastic.protocol.jobstore import JobStore  # noqa: E402
from malletrain.elastic.protocol.keys import MemberInfo  # noqa: E402
from malletrain.ops.settings import Settings  # noqa: E402

SPEC = JobSpec(script="/home/alice/train.py", args=("--epochs", "90"), name="resnet50",
               min_nodes=1, max_nodes=4, kind="train.py")
PEER = Peer(uid=1001, gid=1001, pid=1, user="alice")


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def one_job_writes(coord: Coordinator, job_id: str) -> None:
    """What a short job's processes write: its own session, as on a node."""
    host, port = coord.address.rsplit(":", 1)
    session = AuthStore(host, int(port), job_id, bytes.fromhex(coord.job_secret(job_id)))
    js = JobStore(session, job_id)
    js.register(MemberInfo("s0-r0", "n1", 4242, 1, time.time()))
    coord.publish(job_id, ["s0-r0"])
    for rank in range(2):  # the process group's rendezvous keys (names gloo chooses)
        session.set(f"{js.keys.pg_prefix(1)}rank_{rank}", b"\0" * 300)
    session.add(f"{js.keys.pg_prefix(1)}init/", 2)
    session.close()


def run(tmp: Path, cycles: int, prune: bool) -> tuple[int, int]:
    db = tmp / "state.db"
    store = Store(db)
    coord = Coordinator.start("127.0.0.1", 0)
    handler = RequestHandler(Settings(), store, backend=None, coordinator=coord,  # type: ignore[arg-type]
                             state_dir=tmp, rows=list, wake=lambda: None)
    keep = Settings().state.keep_ended_jobs if prune else 10**9
    start_db = db_bytes(db)
    try:
        for _ in range(cycles):
            job_id = handler.handle(PEER, {"op": "submit", "spec": SPEC.to_dict()})["job_id"]
            one_job_writes(coord, job_id)
            handler.handle(PEER, {"op": "abort", "job_id": job_id})
            if prune:
                coord.forget(job_id)  # the daemon's end of a job
                store.prune_ended(keep)
            else:  # before: only the keys the protocol knows by name were deleted
                JobStore(coord.store, job_id).forget()
        held = sum(coord.held_bytes().values())
        return db_bytes(db) - start_db, held
    finally:
        coord.close()
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=10_000)
    args = ap.parse_args()
    results = {}
    for prune in (True, False):
        with tempfile.TemporaryDirectory(prefix="mt-growth-") as d:
            t0 = time.monotonic()
            results[prune] = run(Path(d), args.cycles, prune)
            name = "pruned" if prune else "baseline (no pruning)"
            print(f"{name}: database +{results[prune][0] / 1e6:.2f} MB, coordinator holds "
                  f"{results[prune][1] / 1e6:.2f} MB after {args.cycles} cycles "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    (db, held), (b_db, b_held) = results[True], results[False]
    print(f"store_growth cycles={args.cycles} db_bytes={db} coordinator_bytes={held} "
          f"baseline_db_bytes={b_db} baseline_coordinator_bytes={b_held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
