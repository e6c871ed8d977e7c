"""The dev cluster itself: the session fixture, users, idempotent up, a clean down."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from malletrain.slurm.hostlist import expand_hostlist

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
    version = dev_cluster.run("sinfo", "--version").stdout  # still the release under test
    assert f" {os.environ.get('MALLETRAIN_TEST_SLURM_VERSION', '22.05')}." in version, version


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


def test_scheduler_settings_of_a_scavenging_site(clean_cluster):
    """The settings of docs/slurm-backend.md §9 are in effect (measured there)."""
    params = _show_config(clean_cluster.env)["SchedulerParameters"].split(",")
    assert "bf_interval=1" in params and "batch_sched_delay=0" in params
    assert "defer" not in params  # it would also stop the pass an epilog triggers


def _show_config(env: dict[str, str]) -> dict[str, str]:
    res = subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True,
                         text=True, timeout=30, check=True)
    return {k.strip(): v.strip() for k, _, v in
            (line.partition("=") for line in res.stdout.splitlines())}


def test_with_an_epilog_a_preempting_job_starts_as_soon_as_its_nodes_are_freed(
        extra_cluster):
    """``up --epilog``: a freed node goes to the waiting regular job at once.

    With an ``Epilog`` every slurmd reports EPILOG_COMPLETE and slurmctld schedules on
    that message (~0.02 s here); without one the node of a preempted job that ended by
    itself comes back silently and the regular job waits for the next scheduler tick or
    backfill pass (0-1 s, uniformly: three jobs all under the bound below without the
    epilog path would happen about once in 8 runs).
    """
    c = extra_cluster("epilog", 4)
    base, env = c.dir, c.env

    def run(*argv: str, user: str | None = None) -> str:
        return c.run(*argv, user=user, timeout_s=60).stdout

    def state(job: int) -> str:
        return run("squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T").strip()

    run(str(DEV_CLUSTER), "up", "--nodes", "4", "--epilog", "--users", "mt-alice,mt-bob")
    config = _show_config(env)  # 23.02+ may list several: Epilog[0]
    assert config.get("Epilog", config.get("Epilog[0]")) == "/bin/true"
    scav = [int(run("sbatch", "--parsable", "-p", "scavenger", "-N1", "--exclusive",
                    "-t", "10", "-o", "/dev/null", "--wrap=exec srun sleep 600",
                    user="mt-alice").split(";")[0]) for _ in range(4)]
    c.wait_until(lambda: all(state(j) == "RUNNING" for j in scav), what="a scavenger job per node")
    c.wait_until(lambda: len(run("squeue", "-h", "-s", "-o", "%i").split()) >= 8,
                 what="their steps")  # batch step + step 0 of each
    time.sleep(1.0)  # a preemption during a step's launch hangs the node (§6.12)
    node_of = {j: run("squeue", "-h", "-j", str(j), "-o", "%N").strip() for j in scav}
    regular = [int(run("sbatch", "--parsable", "-p", "batch", f"-N{n}", "-t", "2",
                       "-o", "/dev/null", "--wrap=srun sleep 1",
                       user="mt-bob").split(";")[0]) for n in (2, 1, 1)]
    c.wait_until(lambda: all(state(j) == "COMPLETED" for j in regular), what="the regular jobs")
    log = base / "log" / "slurmctld.log"
    allocated = _ctld_times(log, r"sched: Allocate JobId=(\d+) ")
    allocated.update(_ctld_times(log, r"sched/backfill: _start_job: Started JobId=(\d+) "))
    ended = _ctld_times(log, r"_job_complete: JobId=(\d+) done")
    for j in regular:
        nodes = _nodes_from_log(log, j)
        taken = [s for s, n in node_of.items() if n in nodes]
        assert taken, f"job {j} on {nodes} took no scavenger node: {node_of}"
        gap_s = allocated[j] - max(ended[s] for s in taken)
        assert 0 <= gap_s < 0.6, f"job {j} started {gap_s:.2f} s after its nodes were freed"


def _nodes_from_log(log: Path, job: int) -> list[str]:
    rx = re.compile(rf"(?:sched: Allocate JobId={job} NodeList=|"
                    rf"_start_job: Started JobId={job} in \S+ on )(\S+)")
    for line in log.read_text(errors="replace").splitlines():
        m = rx.search(line)
        if m:
            return list(expand_hostlist(m.group(1)))
    return []


def _ctld_times(log: Path, pattern: str) -> dict[int, float]:
    """JobId -> time (epoch s, ms precision) of the first slurmctld.log line matching."""
    rx = re.compile(r"^\[(\S+)\] " + pattern)
    out: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = rx.match(line)
        if m:
            out.setdefault(int(m.group(2)), datetime.fromisoformat(m.group(1)).timestamp())
    return out
