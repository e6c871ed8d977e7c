"""``malletrain nodes`` on the real dev cluster: issue 2's "Done when", Slurm down, no sinfo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from malletrain.slurm.backend import CliBackend
from malletrain.slurm.cache import SnapshotCache
from malletrain.slurm.errors import SlurmUnavailableError
from malletrain.slurm.sbatch import SbatchSpec

pytestmark = pytest.mark.slurm

#: slurm/dev-cluster's bf_interval: plans are at most this old.
BF_INTERVAL_S = 2


def nodes_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "malletrain.cli", "nodes", *args],
        capture_output=True, text=True, timeout=60, check=False,
        env=env if env is not None else dict(os.environ),
    )


def nodes_json() -> list[dict]:
    res = nodes_cli("--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_done_when_busy_idle_and_planned_windows(clean_cluster):
    c = clean_cluster
    objs = nodes_json()
    assert [o["name"] for o in objs] == [f"n{i}" for i in range(1, 9)]
    assert all(o["state"] == "idle" and o["idle_window_s"] is None for o in objs)

    long_job = c.sbatch("-N", "4", "-t", "30", wrap="srun sleep 1800")
    c.wait_until(lambda: c.job_state(long_job) == "RUNNING", what="the 4-node job")
    wide = c.sbatch("-N", "8", wrap="srun sleep 60")

    def planned() -> bool:
        info = c.scontrol_job(wide)
        return info.get("SchedNodeList", "(null)") not in ("(null)", "")

    c.wait_until(planned, timeout_s=15, what="the backfill plan of the 8-node job")
    before = time.time()
    objs = {o["name"]: o for o in nodes_json()}
    after = time.time()
    start = _epoch(c.scontrol_job(wide)["StartTime"])
    busy = sorted(n for n, o in objs.items() if o["state"] == "allocated")
    idle = sorted(n for n, o in objs.items() if o["idle"])
    assert len(busy) == 4 and len(idle) == 4 and set(busy) | set(idle) == set(c.nodes)
    assert all(objs[n]["idle_window_s"] == 0 for n in busy)
    for name in idle:
        window = objs[name]["idle_window_s"]
        assert objs[name]["claimed_by"] == f"job {wide}"
        # the window is the planned start seen from the moment of the query
        assert start - after - BF_INTERVAL_S - 1 <= window <= start - before + BF_INTERVAL_S + 1
    assert 29 * 60 <= objs[idle[0]]["idle_window_s"] <= 30 * 60

    table = nodes_cli()
    assert table.returncode == 0
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert all(f"job {wide}" in rows[n] for n in idle)


def _epoch(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def test_slurm_down_is_a_retryable_error_and_one_clear_line(clean_cluster):
    """... for a tick's reads, ``malletrain nodes``, and the actions: 22.05's scontrol says
    "Unexpected message received for job N" for each job of an update or release then."""
    c = clean_cluster
    backend = CliBackend(timeout_s=20)
    held = backend.submit(SbatchSpec(script="#!/bin/sh\nsleep 60\n", partition="scavenger",
                                     hold=True, time_limit_s=300, output="/dev/null"))
    cache = SnapshotCache(backend)
    good = cache.refresh()
    c.dev_cluster("stop-controller")
    try:
        for act in (lambda: backend.update(held, TimeLimit=3, NodeList="n1"),
                    lambda: backend.release(held)):
            with pytest.raises(SlurmUnavailableError):
                act()
        stale = cache.refresh()  # the backend raised; the cache kept the last good view
        assert isinstance(cache.last_error, SlurmUnavailableError)
        assert "slurmctld" in str(cache.last_error)
        assert stale.taken_at == good.taken_at and "stale" in stale.warnings[-1]
        res = nodes_cli()
        assert res.returncode == 75  # EX_TEMPFAIL: try again later
        assert res.stdout == ""
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr
        assert lines[0].startswith("malletrain nodes: error:") and "slurmctld" in lines[0]
    finally:
        c.dev_cluster("start-controller")
    c.wait_until(lambda: c.node_states() and all(
        s == "idle" for s in c.node_states().values()), timeout_s=60,
        what="nodes idle again after the controller restart")


def test_missing_sinfo_is_a_clear_permanent_error(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty))
    res = nodes_cli(env=env)
    assert res.returncode == 65
    assert res.stderr.strip() == (
        "malletrain nodes: error: sinfo: command not found "
        "(is Slurm's client installed and on PATH?)")


def test_missing_slurm_conf_names_the_variable(dev_cluster):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    res = nodes_cli(env=env)
    assert res.returncode == 65
    assert "SLURM_CONF" in res.stderr and "Traceback" not in res.stderr
