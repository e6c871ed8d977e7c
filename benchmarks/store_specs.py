"""What jobs' specs cost the daemon's store: N jobs with a ~800 KB spec each (200 exported
variables of 4 KB: near a request's 1 MiB), ended (cancelled) or live, then a fresh ``Store``
on the database (a restarted daemon) and two ``store.jobs()`` reads (the first builds every
record, the next is a tick's).

Issue 49: each ended job kept its whole spec until ``state.keep_ended_jobs`` (1,000); an
ended job now keeps ~150 bytes of it. Live jobs are bounded by ``limits.max_jobs_total``.

Last line: ``store_specs jobs=N ended=B db_mib=X first_ms=Y next_ms=Z rss_mib=R``.
Run: ``.venv/bin/python benchmarks/store_specs.py [--jobs 1000] [--live]`` (seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from malletrain.core.lifecycle import JobPhase  # noqa: E402
from malletrain.daemon.jobs.spec import JobSpec  # noqa: E402
from malletrain.daemon.jobs.store import Store  # noqa: E402

SPEC = JobSpec(script="/home/bob/train.py", min_nodes=1, max_nodes=3,
               environment={f"V{k}": "x" * 4000 for k in range(200)})


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--live", action="store_true", help="leave the jobs live (not ended)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mt-specs-") as d:
        db = Path(d) / "state.db"
        s = Store(db)
        for _ in range(args.jobs):
            rec = s.create_job(1001, "bob", SPEC)
            if not args.live:
                s.transition(rec.job_id, JobPhase.CANCELLED, "submission aborted")
        s.close()
        s = Store(db)
        base = rss_mib()
        t0 = time.perf_counter()
        s.jobs()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        s.jobs()
        again = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in Path(d).iterdir()) / 2**20
        print(f"store_specs jobs={args.jobs} ended={not args.live} db_mib={size:.1f} "
              f"first_ms={first * 1000:.0f} next_ms={again * 1000:.1f} "
              f"rss_mib={rss_mib() - base:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
