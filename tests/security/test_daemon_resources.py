"""What one user's requests can take of the daemon (issue 49, finding 2), as mt-bob against
the real daemon on the dev cluster: submit + abort in a loop, each with a spec of ~1 MB.

Before: every cycle was accepted (ended submissions did not count against
``limits.max_jobs_per_user``) and each ended job kept its whole spec in the database and in
the daemon's memory, until ``state.keep_ended_jobs`` (1,000): ~1 GB for one user. Now a
submission counts against the user's limit for ``SUBMISSION_HOLD_S`` even once it ended, and
an ended job keeps only what ``malletrain jobs`` shows.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys

import pytest

from .helpers import rss_mib

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

#: mt-bob's loop: submit a ~1 MB spec, abort it, again; what each submit got
CYCLES = r"""
import json, sys
from pathlib import Path
from malletrain.daemon.submit.channel import call
from malletrain.errors import RetryableError
sock = Path(sys.argv[1])
spec = {"script": "/bin/true", "name": "fill", "args": ["a" * 4000] * 250}
out = []
for _ in range(int(sys.argv[2])):
    try:
        job = call(sock, {"op": "submit", "spec": spec})["job_id"]
    except RetryableError:
        out.append("refused")
        continue
    call(sock, {"op": "abort", "job_id": job})
    out.append(job)
print(json.dumps(out))
"""


def test_submit_and_abort_in_a_loop_is_bounded_and_keeps_no_spec(daemon, clean_cluster):
    """``MT_CYCLES=150 pytest -s`` prints the figures of docs/security.md's resource model."""
    cycles = int(os.environ.get("MT_CYCLES", "12"))
    assert daemon.proc is not None
    before = rss_mib(daemon.proc.pid)
    res = clean_cluster.run(sys.executable, "-c", CYCLES, str(daemon.socket), str(cycles),
                            user="mt-bob", timeout_s=60 + 2 * cycles)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    accepted = [g for g in got if g != "refused"]
    files = sum(p.stat().st_size for p in daemon.state.glob("state.db*"))
    print(f"{cycles} cycles: {len(accepted)} accepted; daemon RSS {before:.1f} -> "
          f"{rss_mib(daemon.proc.pid):.1f} MiB; database + WAL {files / 2**20:.1f} MiB")
    # the default limits.max_jobs_per_user (8): the next ones within the hold are refused
    assert len(accepted) == 8 and got[8:] == ["refused"] * (cycles - 8), got
    # another user is not held back by bob's loop
    alice = daemon.cli("mt-alice", "jobs", "--json", "--socket", str(daemon.socket))
    assert alice.returncode == 0
    # an ended job keeps what `malletrain jobs` shows, not its ~1 MB spec
    db = sqlite3.connect(daemon.state / "state.db")
    try:
        rows = db.execute("SELECT job_id, state, length(spec) FROM jobs").fetchall()
    finally:
        db.close()
    assert sorted(r[0] for r in rows) == sorted(accepted)
    assert all(state == "cancelled" and size < 512 for _, state, size in rows), rows
    shown = json.loads(daemon.cli("mt-bob", "jobs", "--all", "--json", "--socket",
                                  str(daemon.socket)).stdout)
    assert {(r["name"], r["state"], r["max_nodes"]) for r in shown} == {
        ("fill", "cancelled", 1)}
