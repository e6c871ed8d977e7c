"""sbatch's ``--array`` and ``--dependency`` through the real daemon on the dev cluster: an
array's tasks are malleable jobs that see Slurm's ``SLURM_ARRAY_*`` and ``%A_%a``, its
throttle runs them one after another, a job ``afterok`` the last task starts only after it,
a job whose dependency can never be satisfied fails with the reason, and a dependency on
another user's job is refused as if the job did not exist."""

from __future__ import annotations

import itertools
import json

import pytest

from .harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

#: a batch script that says what it saw, when it started and when it ended
SCRIPT = """#!/bin/bash
#SBATCH -N 1
echo "seen $SLURM_JOB_ID $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT"
echo "start $(date +%s.%N)"
sleep "${HOLD_S:-1}"
echo "end $(date +%s.%N)"
"""


def _lines(path) -> dict[str, list[str]]:
    return {ln.split()[0]: ln.split()[1:] for ln in path.read_text().splitlines()
            if ln.split() and ln.split()[0] in ("seen", "start", "end")}


def test_an_array_runs_throttled_and_a_dependent_job_runs_after_it(daemon, clean_cluster):
    d = daemon
    script = d.out / "task.sbatch"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    first = d.submit("mt-alice", "--parsable", "--array=0-2%1", "-J", "arr", "-o",
                     str(d.out / "arr-%A_%a.out"), str(script)).stdout.strip()
    tasks = [f"m{int(first[1:]) + k}" for k in range(3)]
    after = d.submit("mt-alice", "--parsable", f"--dependency=afterok:{tasks[-1]}", "-o",
                     str(d.out / "after-%j.out"), str(script)).stdout.strip()
    rows = d.jobs()
    assert [rows[t]["name"] for t in tasks] == ["arr"] * 3

    def done():
        rows = d.jobs()
        return all(rows[j]["state"] == "completed" for j in [*tasks, after])

    wait_until(done, 240, what="the three tasks and the dependent job completed",
               on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
    number = int(first[1:])
    runs = [_lines(d.out / f"arr-{number}_{k}.out") for k in range(3)]
    assert [r["seen"] for r in runs] == [
        [str(number + k), str(number), str(k), "3"] for k in range(3)]
    dependent = _lines(d.out / f"after-{int(after[1:])}.out")
    spans = [(float(r["start"][0]), float(r["end"][0])) for r in [*runs, dependent]]
    # %1: each task starts after the one before ended; the dependent job after the last
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans)), spans
    assert "Traceback" not in d.log()


def test_a_dependency_never_satisfied_fails_and_anothers_job_is_unknown(daemon,
                                                                         clean_cluster):
    d = daemon
    script = d.out / "hold.sbatch"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    target = d.submit("mt-alice", "--parsable", "--export=ALL,HOLD_S=600", "-o",
                      str(d.out / "hold-%j.out"), str(script)).stdout.strip()
    waiting = d.submit("mt-alice", "--parsable", f"--dependency=afterok:{target}", "-o",
                       str(d.out / "wait-%j.out"), str(script)).stdout.strip()
    probe = d.submit("mt-bob", f"--dependency=afterany:{target}", str(script), check=False)
    assert probe.returncode != 0
    assert f"no malleable job {target} of yours" in probe.stderr
    wait_until(lambda: d.jobs()[waiting]["reason"].startswith("Dependency"), 30,
               what="the waiting job saying why", on_timeout=lambda: json.dumps(d.jobs()))
    assert d.jobs()[waiting]["state"] == "queued"
    assert f"afterok:{target}" in d.jobs()[waiting]["reason"]
    d.cli("mt-alice", "cancel", "--socket", str(d.socket), target)
    wait_until(lambda: d.jobs()[waiting]["state"] == "failed", 60,
               what="the dependent job failed", on_timeout=lambda: json.dumps(d.jobs()))
    assert f"afterok:{target}" in d.jobs()[waiting]["message"]
    assert not (d.out / f"wait-{int(waiting[1:])}.out").exists()  # it never ran
