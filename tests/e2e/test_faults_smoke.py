"""A smoke run of ``benchmarks/faults.py`` on the session's dev cluster: two scenarios, one run.

The suite itself (13 scenarios, 3 runs each) is a benchmark, outside CI; this runs the same
code on two faults that reach far (a worker killed mid-step, the only worker of a one-node
job killed: its guard snapshot), so that the suite keeps working and those keep recovering.
The daemon killed mid-rescale is CI's in ``test_daemon_failures.py`` and
``test_daemon_e2e.py`` (each with exact samples), not run a third time here.
The regular job's wait is printed, not asserted: timing belongs to the benchmark.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from malletrain.devstack import LocalCluster

from .harness import check_python_reachable

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

FAULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"


def _load_faults():
    sys.path.insert(0, str(FAULTS.parent))
    spec = importlib.util.spec_from_file_location("faults_bench", FAULTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_worker_and_the_daemon_killed_mid_run_recover_exactly(clean_cluster, workdir):
    check_python_reachable("mt-alice", clean_cluster.env)
    faults = _load_faults()
    args = argparse.Namespace(runs=1, seed=0, slurm_down_s=10.0, dir=str(workdir), samples=16_000,
                              port=clean_cluster.port, keep=True)
    cluster = LocalCluster(clean_cluster.dir, clean_cluster.port, len(clean_cluster.nodes))
    suite = faults.Suite(args, cluster=cluster)
    suite.setup()
    rows = suite.run_all(["worker-sigkill-step", "worker-sigkill-one-node"])
    assert len(rows) == 2
    failed = [row for row in rows
              if not row["recovered"] or row["jobs_lost"] != 0 or row["samples_lost"] != 0
              or row["recover_s"] is None or row["regular_wait_s"] is None]
    if failed:  # the whole evidence (an assert's message is cut short by pytest)
        runs = workdir / "runs"
        pytest.fail("\n\n".join(f"{row}\n" + _evidence(runs / f"{row['scenario']}-0")
                                for row in failed), pytrace=False)


def _evidence(run_dir: Path) -> str:
    """The daemon's log and the slots' output of a run: what a failure is diagnosed from."""
    parts = []
    log = run_dir / "daemon.log"
    if log.exists():
        lines = [x for x in log.read_text(errors="replace").splitlines() if " DEBUG " not in x]
        parts.append("--- daemon.log (tail) ---\n" + "\n".join(lines[-60:]))
    for out in sorted((run_dir / "out").glob("*.out")):
        parts.append(f"--- {out.name} ---\n{out.read_text(errors='replace')[-1500:]}")
    return "\n".join(parts)
