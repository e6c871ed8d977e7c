"""The dev cluster itself: the session fixture, users, idempotent up, a clean down."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

DEV_CLUSTER = Path(__file__).resolve().parents[2] / "slurm" / "dev-cluster"
pytestmark = pytest.mark.slurm


def test_fixture_cluster_has_8_idle_nodes_in_two_partitions(clean_cluster):
    res = clean_cluster.run("sinfo", "-h", "-o", "%P %D %t")
    rows = sorted(line.split() for line in res.stdout.splitlines())
    assert rows == [["batch*", "8", "idle"], ["scavenger", "8", "idle"]]
    assert os.environ["SLURM_CONF"] == str(clean_cluster.conf_path)


def test_partitions_are_configured_for_preemption(clean_cluster):
    res = clean_cluster.run("scontrol", "show", "partition", "-o")
    lines = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert "PriorityTier=10" in lines["PartitionName=batch"]
    assert "PreemptMode=OFF" not in lines["PartitionName=batch"]
    assert "PriorityTier=1 " in lines["PartitionName=scavenger"]
    assert "PreemptMode=CANCEL" in lines["PartitionName=scavenger"]
    assert "GraceTime=5 " in lines["PartitionName=scavenger"]


def test_unprivileged_user_job_runs_on_two_nodes(clean_cluster, shared_tmp):
    out = shared_tmp / "job.out"
    job_id = clean_cluster.sbatch(
        "-N", "2", wrap="srun -l bash -c 'echo $SLURMD_NODENAME $(id -un)'",
        user="mt-alice", output=str(out),
    )
    clean_cluster.wait_until(lambda: clean_cluster.job_state(job_id) == "COMPLETED",
                             timeout_s=30, what="job completion")
    lines = sorted(out.read_text().split("\n"))
    assert [x for x in lines if x] == ["0: n1 mt-alice", "1: n2 mt-alice"]


def test_up_again_with_same_config_returns_at_once(dev_cluster):
    t0 = time.monotonic()
    dev_cluster.dev_cluster("up", "--nodes", "8", "--accounting", "--users", "mt-alice,mt-bob")
    assert time.monotonic() - t0 < 3.0
    assert dev_cluster.ctld_up()


def test_down_leaves_no_process_even_with_a_running_job(free_port_base):
    """A second, small cluster: up, a job with steps on 2 nodes, down -> nothing left."""
    base = Path(tempfile.mkdtemp(prefix="malletrain-devcluster-down-", dir="/tmp"))
    env = dict(os.environ)
    env.update(
        MALLETRAIN_DEVCLUSTER_DIR=str(base),
        MALLETRAIN_DEVCLUSTER_PORT=str(free_port_base(2)),
        SLURM_CONF=str(base / "etc" / "slurm.conf"),
    )

    def dc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(DEV_CLUSTER), *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    try:
        assert dc("up", "--nodes", "2", "--users", "").returncode == 0
        unshare_pid = int((base / "run" / "unshare.pid").read_text())
        (init_pid,) = _children(unshare_pid)
        namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
        sub = subprocess.run(
            ["sbatch", "--parsable", "-N", "2", "-o", "/dev/null", "--wrap=srun sleep 600"],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        )
        job_id = sub.stdout.strip()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if len(_stepds_in(namespace, job_id)) >= 3:  # batch step + one step per node
                break
            time.sleep(0.2)
        assert len(_stepds_in(namespace, job_id)) >= 3, "the job's steps did not start"
        assert len(_in_namespace(namespace)) >= 10  # munged, ctld, 2 slurmd, stepds, sleeps
        t0 = time.monotonic()
        down = dc("down")
        assert down.returncode == 0, down.stderr
        assert time.monotonic() - t0 < 15
        assert _in_namespace(namespace) == []
        assert _processes_mentioning(str(base)) == []
        assert dc("status").returncode == 3
    finally:
        dc("down")
        shutil.rmtree(base, ignore_errors=True)


def _pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _children(pid: int) -> list[int]:
    out = []
    for child in _pids():
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(child)
    return out


def _in_namespace(namespace: str) -> list[int]:
    """Host PIDs of the processes living in the PID namespace ``namespace``."""
    out = []
    for pid in _pids():
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                out.append(pid)
        except OSError:
            continue
    return out


def _stepds_in(namespace: str, job_id: str) -> list[int]:
    out = []
    for pid in _in_namespace(namespace):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("slurmstepd") and f"[{job_id}." in cmdline:
            out.append(pid)
    return out


def _processes_mentioning(text: str) -> list[str]:
    out = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if text in cmdline:
            out.append(cmdline)
    return out
