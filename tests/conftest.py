"""Shared pytest fixtures: ONE real Slurm dev cluster per test run.

Usage in a test module::

    pytestmark = pytest.mark.slurm

    def test_something(clean_cluster):          # or dev_cluster, if jobs may stay
        job_id = clean_cluster.sbatch("-N", "2", wrap="srun sleep 30")
        clean_cluster.wait_until(lambda: clean_cluster.job_state(job_id) == "RUNNING")

``dev_cluster`` (session scope) starts ``slurm/dev-cluster up --nodes 8 --accounting`` in its
own directory under /tmp with a free port range, exports ``SLURM_CONF`` (and
``MALLETRAIN_DEVCLUSTER_DIR``/``_PORT``) in ``os.environ`` so subprocesses and the backend find
it, and runs ``down`` at the end (no process left).  Accounting (slurmdbd + MariaDB) is on
because without it Slurm 22.05 refuses every update of a job after its first shrink.

``shared_tmp`` is a world-writable directory for the output of jobs of the test users.

``clean_cluster`` (function scope) is the same object, after every job was cancelled, every
reservation deleted, nodes resumed and slurmctld made sure to run: tests do not see each
other's jobs.  Finished jobs stay visible in ``squeue --json`` for ``MinJobAge`` (300 s), so
filter by state or job id.

Environment knobs: ``MALLETRAIN_TEST_DEVCLUSTER_PORT`` (port base; default: a free one),
``MALLETRAIN_TEST_KEEP_DEVCLUSTER=1`` (keep the directory with its logs after the run) and
``MALLETRAIN_TEST_SLURM_VERSION`` (22.05, this machine's, by default; 24.11 or 26.05 run
from a Debian root, slurm/slurm_roots.py: ``make test-slurm-versions``).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from malletrain.slurm.parsers.parse_text import parse_key_values

REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
TEST_NODES = 8
TEST_USERS = ("mt-alice", "mt-bob")
#: The Slurm release of the test cluster (``make test-slurm-versions`` sets it).
SLURM_VERSION = os.environ.get("MALLETRAIN_TEST_SLURM_VERSION", "22.05")


def _ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _pick_port_base(nodes: int) -> int:
    """A port base whose whole range (ctld, dbd, db, nodes) is free right now."""
    forced = os.environ.get("MALLETRAIN_TEST_DEVCLUSTER_PORT")
    if forced:
        return int(forced)
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(20000, 40000, 100)
        if _ports_free(base, nodes + 12):
            return base
    raise RuntimeError("no free port range for the dev cluster")


@dataclass
class DevCluster:
    """A running dev cluster and helpers to drive it from tests (argument lists only)."""

    dir: Path
    conf_path: Path
    port: int
    nodes: tuple[str, ...]
    env: dict[str, str]
    users: tuple[str, ...] = TEST_USERS
    accounting: bool = True
    _submitted: list[int] = field(default_factory=list)

    # -- running commands ------------------------------------------------------------
    def run(
        self,
        *argv: str,
        user: str | None = None,
        check: bool = True,
        timeout_s: float = 30,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command with this cluster's environment, optionally as a test user."""
        cmd = list(argv)
        if user is not None:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *cmd]
        res = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout_s,
            input=input, check=False,
        )
        if check and res.returncode != 0:
            raise AssertionError(
                f"{cmd} failed with {res.returncode}:\n{res.stdout}\n{res.stderr}"
            )
        return res

    def dev_cluster(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(str(DEV_CLUSTER), *args, timeout_s=timeout_s)

    def sbatch(
        self,
        *args: str,
        wrap: str | None = None,
        script: str | None = None,
        user: str | None = None,
        output: str = "/dev/null",
    ) -> int:
        """Submit a job (``wrap`` command or ``script`` text on stdin); return its id."""
        if (wrap is None) == (script is None):
            raise ValueError("give exactly one of wrap= or script=")
        argv = ["sbatch", "--parsable", f"--output={output}", *args]
        if wrap is not None:
            argv.append(f"--wrap={wrap}")
        res = self.run(*argv, user=user, input=script)
        job_id = int(res.stdout.strip().split(";")[0])
        self._submitted.append(job_id)
        return job_id

    def scontrol_job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o`` as a dict ({} when the job is unknown)."""
        res = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if res.returncode != 0:
            return {}
        return parse_key_values(res.stdout.strip())

    def job_state(self, job_id: int) -> str:
        return self.scontrol_job(job_id).get("JobState", "")

    def active_job_ids(self) -> list[int]:
        res = self.run("squeue", "-h", "-o", "%A", "-t", "PD,R,CG,S,CF,RQ,RS,SO")
        return [int(x) for x in res.stdout.split()]

    def node_states(self) -> dict[str, str]:
        res = self.run("sinfo", "-h", "-N", "-p", "batch", "-o", "%N %T")
        return dict(line.split(None, 1) for line in res.stdout.splitlines() if line.strip())

    @staticmethod
    def wait_until(
        predicate: Callable[[], object], timeout_s: float = 30, period_s: float = 0.2,
        what: str = "condition",
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if predicate():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(period_s)

    # -- cleaning ----------------------------------------------------------------------
    def ctld_up(self) -> bool:
        res = self.run("scontrol", "ping", check=False, timeout_s=15)
        return res.returncode == 0 and "UP" in res.stdout

    def wait_step_running(self, job_id: int, step: int = 0, timeout_s: float = 20) -> None:
        """Wait until step ``job_id.step`` is launched (listed by ``squeue -s``), plus 1 s.

        Cancelling a job while its srun step is being launched leaves that step's node
        COMPLETING for ~65 s in Slurm 22.05 (measured); wait for this before cancelling a
        job that just started.
        """
        def launched() -> bool:
            res = self.run("squeue", "-h", "-s", "-j", str(job_id), "-o", "%i", check=False)
            return f"{job_id}.{step}" in res.stdout.split()

        self.wait_until(launched, timeout_s=timeout_s, what=f"step {job_id}.{step}")
        time.sleep(1.0)

    def scancel_all(self, wait: bool = True, timeout_s: float = 90) -> None:
        """Cancel every job, delete reservations, resume nodes; wait until all nodes idle.

        The 90 s allow for Slurm 22.05's ~65 s COMPLETING when a job was cancelled during
        its step launch (see :meth:`wait_step_running`).
        """
        if not self.ctld_up():
            self.dev_cluster("start-controller")
        self.run("scancel", "--full", "--quiet", "-u", "root", check=False)
        for user in self.users:
            self.run("scancel", "--full", "--quiet", "-u", user, check=False)
        ids = self.active_job_ids()
        if ids:
            self.run("scancel", "--full", "--quiet", *map(str, ids), check=False)
        res = self.run("scontrol", "show", "reservation", "-o", check=False)
        for line in res.stdout.splitlines():
            if line.startswith("ReservationName="):
                name = line.split()[0].split("=", 1)[1]
                self.run("scontrol", "delete", f"ReservationName={name}", check=False)
        if not wait:
            return

        def settled() -> bool:
            if self.active_job_ids():
                return False
            states = self.node_states()
            bad = [n for n, s in states.items() if s.rstrip("*~#!%$@^-") not in ("idle",)]
            stuck = [n for n in bad if any(k in states[n] for k in ("drain", "down", "fail"))]
            if stuck:
                self.run("scontrol", "update", f"NodeName={','.join(stuck)}", "State=RESUME",
                         check=False)
            return not bad

        self.wait_until(settled, timeout_s=timeout_s, what="an empty, idle cluster")


TEST_DIR_PREFIX = "malletrain-devcluster-test-"


def _stop_orphaned_test_clusters() -> None:
    """Stop clusters of earlier test runs that were killed before their teardown.

    Each test cluster's directory holds ``owner.pid`` (the pytest process); if that process
    is gone, nobody will ever run ``down`` for it, so we do.
    """
    for owner in Path("/tmp").glob(f"{TEST_DIR_PREFIX}*/owner.pid"):
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue  # still running: another live test session's cluster
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(owner.parent))
        _down(env)
        shutil.rmtree(owner.parent, ignore_errors=True)


def _down(env: dict[str, str]) -> None:
    """``dev-cluster down`` for the cluster ``env`` names (no process of it left)."""
    subprocess.run([str(DEV_CLUSTER), "down"], env=env, capture_output=True, timeout=60,
                   check=False)


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    """One real 8-node Slurm cluster (with accounting) for the whole test run."""
    if os.geteuid() != 0:
        pytest.fail("the Slurm dev cluster needs root (run the tests as root, as CI does)")
    _stop_orphaned_test_clusters()
    port = _pick_port_base(TEST_NODES)
    base = Path(tempfile.mkdtemp(prefix=TEST_DIR_PREFIX, dir="/tmp"))
    base.chmod(0o755)  # the test users must read slurm.conf and reach the munge socket
    (base / "owner.pid").write_text(f"{os.getpid()}\n")
    env = dict(os.environ)
    env.update(
        MALLETRAIN_DEVCLUSTER_DIR=str(base),
        MALLETRAIN_DEVCLUSTER_PORT=str(port),
        SLURM_CONF=str(base / "etc" / "slurm.conf"),
    )
    # every `dev-cluster` call of the tests keeps this release (an `up` without it would
    # restart the cluster as 22.05: seen in the first 26.05 run)
    env["MALLETRAIN_DEVCLUSTER_SLURM_VERSION"] = SLURM_VERSION
    if SLURM_VERSION != "22.05":  # that release's clients first (slurm/slurm_roots.py)
        env["PATH"] = f"{base / 'bin'}:{env.get('PATH', os.defpath)}"
    cluster = DevCluster(
        dir=base,
        conf_path=base / "etc" / "slurm.conf",
        port=port,
        nodes=tuple(f"n{i}" for i in range(1, TEST_NODES + 1)),
        env=env,
    )
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "MALLETRAIN_DEVCLUSTER_DIR",
                                            "MALLETRAIN_DEVCLUSTER_PORT", "PATH",
                                            "MALLETRAIN_DEVCLUSTER_SLURM_VERSION")}
    try:
        cluster.dev_cluster(
            "up", "--nodes", str(TEST_NODES), "--accounting", "--users", ",".join(TEST_USERS),
            "--slurm-version", SLURM_VERSION, timeout_s=600,
        )
        for key in saved:
            os.environ[key] = env[key]
        yield cluster
    finally:
        _down(env)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not os.environ.get("MALLETRAIN_TEST_KEEP_DEVCLUSTER"):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-writable (sticky) directory under /tmp for job output of the test users.

    pytest's ``tmp_path`` lives under a root-only directory, which jobs running as
    mt-alice/mt-bob cannot write into (the job then fails with ``JobLaunchFailure``).
    """
    d = Path(tempfile.mkdtemp(prefix="malletrain-test-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def free_port_base() -> Callable[[int], int]:
    """``free_port_base(nodes)`` -> a port base for an extra, short-lived dev cluster."""
    return _pick_port_base


@pytest.fixture
def extra_cluster() -> Iterator[Callable[[str, int], DevCluster]]:
    """``extra_cluster(name, nodes)`` -> a second, short-lived cluster's directory, port and
    environment (not started: the test runs ``up`` with the options it needs through
    ``.dev_cluster``); each is taken down and removed afterwards."""
    made: list[DevCluster] = []

    def make(name: str, nodes: int) -> DevCluster:
        base = Path(tempfile.mkdtemp(prefix=f"malletrain-devcluster-{name}-", dir="/tmp"))
        port = _pick_port_base(nodes)
        env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(base),
                   MALLETRAIN_DEVCLUSTER_PORT=str(port),
                   SLURM_CONF=str(base / "etc" / "slurm.conf"))
        made.append(DevCluster(dir=base, conf_path=base / "etc" / "slurm.conf", port=port,
                               nodes=tuple(f"n{i}" for i in range(1, nodes + 1)), env=env))
        return made[-1]

    yield make
    for c in made:
        _down(c.env)
        shutil.rmtree(c.dir, ignore_errors=True)


@pytest.fixture
def clean_cluster(dev_cluster: DevCluster) -> Iterator[DevCluster]:
    """The session cluster with no jobs or reservations, before and after the test."""
    dev_cluster.scancel_all()
    yield dev_cluster
    dev_cluster.scancel_all()
