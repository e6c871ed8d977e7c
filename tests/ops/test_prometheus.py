"""The real daemon, run the way the systemd unit runs it, scraped by a real Prometheus server.

``malletrain daemon --config FILE`` runs against the dev cluster:

* as a dedicated non-root account that has Slurm's **Operator** admin level and nothing
  more (what docs/install.md prescribes), with the unit's NoNewPrivileges, an empty
  capability bounding set and MemoryDenyWriteExecute applied to the process (harden_exec.py
  installs systemd's seccomp filter for it, setpriv drops the capabilities; there is no
  systemd PID 1 here);
* with ``$NOTIFY_SOCKET``/``$WATCHDOG_USEC`` pointing at a datagram socket of the test, which
  must receive READY=1, WATCHDOG=1 and, on SIGTERM, STOPPING=1.

Debian's Prometheus scrapes it every second. Checked with PromQL through the HTTP API:
malletrain_idle_nodes equals what Slurm reports while a regular job takes and releases nodes;
a malleable job of mt-alice grows onto idle nodes (scavenged nodes, the job's nodes); a regular
job of mt-bob takes those nodes back (preemptions and yield latency counted); a SIGHUP with an
invalid file is rejected and counted while the daemon keeps running; every expression of the
Grafana dashboard and the alert rules evaluates without error.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .conftest import Prometheus, free_port

pytestmark = [pytest.mark.prometheus, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_train.py"
DAEMON_USER = "mt-malletrain"
USER = "mt-alice"
OTHER_USER = "mt-bob"

# The unit's NoNewPrivileges + MemoryDenyWriteExecute, applied the way systemd does.
HARDEN = Path(__file__).with_name("harden_exec.py")


def idle_in_slurm(cluster) -> int:
    return sum(1 for s in cluster.node_states().values() if s.rstrip("*~#!%$@^-") == "idle")


@pytest.fixture(scope="module")
def operator_account(dev_cluster) -> str:
    """A system account with Slurm AdminLevel=Operator, as docs/install.md sets up."""
    try:
        pwd.getpwnam(DAEMON_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", DAEMON_USER], check=True)
    res = dev_cluster.run("sacctmgr", "-i", "add", "user", DAEMON_USER, "account=root",
                          "adminlevel=Operator", check=False)
    if res.returncode != 0 and "Nothing new added" not in res.stdout + res.stderr:
        raise AssertionError(res.stdout + res.stderr)
    dev_cluster.run("sacctmgr", "-i", "modify", "user", "where", f"name={DAEMON_USER}",
                    "set", "adminlevel=Operator", check=False)
    shown = dev_cluster.run("sacctmgr", "-n", "-P", "show", "user", DAEMON_USER,
                            "format=user,adminlevel").stdout
    assert f"{DAEMON_USER}|Operator" in shown, shown
    return DAEMON_USER


class HardenedDaemon:
    def __init__(self, cluster, base: Path, user: str) -> None:
        self.cluster = cluster
        self.base = base
        self.user = user
        pw = pwd.getpwnam(user)
        self.state = base / "state"
        self.state.mkdir()
        os.chown(self.state, pw.pw_uid, pw.pw_gid)
        self.out = base / "out"
        self.out.mkdir()
        self.out.chmod(0o1777)
        self.socket_path = self.state / "submit.sock"
        self.metrics_port = free_port()
        self.config = base / "malletrain.yaml"
        self.log_path = base / "daemon.log"
        self.notice_path = cluster.dir / "run" / "submit-notice"  # slurm/job_submit.lua's
        # the operator's metrics password (per-job series where Slurm keeps jobs private),
        # the daemon's account's alone; Prometheus sends it with basic auth
        self.password_file = base / "metrics.password"
        self.password_file.write_text("scrape-secret-41\n")
        self.password_file.chmod(0o600)
        os.chown(self.password_file, pw.pw_uid, pw.pw_gid)
        self.write_config(level="INFO")
        # the unit's sd_notify channel: a datagram socket the daemon's user may write to
        self.notify_path = base / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify_path.chmod(0o666)
        self.notify.settimeout(0.2)
        self.messages: list[str] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read_notifications, daemon=True)
        self._reader.start()
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, level: str, extra: str = "") -> None:
        self.config.write_text(yaml.safe_dump({
            "slurm": {"scavenger_partition": "scavenger", "partitions": ["batch"],
                      "slurm_conf": str(self.cluster.conf_path), "min_slot_time_s": 60,
                      "max_slot_time_s": 900, "submit_notice": str(self.notice_path)},
            "allocator": {"tick_interval_s": 1, "policy": "malletrain"},
            "state": {"database_path": str(self.state / "state.db"),
                      "snapshot_dir": str(self.state / "snapshots")},
            "coordinator": {"host": "127.0.0.1", "port": 0},
            "submit": {"socket_path": str(self.socket_path)},
            "metrics": {"address": f"127.0.0.1:{self.metrics_port}",
                        "password_file": str(self.password_file)},
            "logging": {"level": level, "format": "json"},
        }) + extra)
        self.config.chmod(0o644)

    def start(self) -> None:
        env = dict(self.cluster.env, NOTIFY_SOCKET=str(self.notify_path),
                   WATCHDOG_USEC="4000000", PYTHONUNBUFFERED="1")
        argv = [sys.executable, str(HARDEN),
                "setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups",
                "--bounding-set=-all", "--inh-caps=-all",
                sys.executable, "-m", "malletrain.cli", "daemon", "--config", str(self.config)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True, cwd=self.out)

    def _read_notifications(self) -> None:
        """Drain the socket continuously, as systemd does."""
        while not self._closing.is_set():
            try:
                data = self.notify.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.messages.append(data.decode())

    def receive(self, wanted: str, timeout_s: float) -> None:
        """Wait until an sd_notify datagram carries ``wanted`` (e.g. READY=1)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if any(wanted in m.split("\n") for m in self.messages):
                    return
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"no {wanted} after {timeout_s} s; got {self.messages}\n"
                             f"{self.log()}")

    def cli(self, user: str, *args: str) -> str:
        res = subprocess.run(
            ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
             sys.executable, "-m", "malletrain.cli", args[0], "--socket", str(self.socket_path),
             *args[1:]],
            env=self.cluster.env, capture_output=True, text=True, timeout=60, cwd=self.out,
            check=False,
        )
        assert res.returncode == 0, f"{args}: {res.stderr}\n{self.log()}"
        return res.stdout

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def log_records(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._closing.set()
        self._reader.join(5)
        self.notify.close()
        pid_file = self.state / "coordinator.pid"  # the coordinator it started, if any
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)


@pytest.fixture
def daemon(clean_cluster, operator_account) -> Iterator[HardenedDaemon]:
    # not pytest's tmp_path: its parent is 0700, and the daemon runs as another user
    base = Path(tempfile.mkdtemp(prefix="malletrain-ops-", dir="/tmp"))
    base.chmod(0o755)
    d = HardenedDaemon(clean_cluster, base, operator_account)
    try:
        yield d
    finally:
        d.stop()
        clean_cluster.scancel_all()
        shutil.rmtree(base, ignore_errors=True)


def dashboard_and_alert_exprs() -> list[str]:
    dash = json.loads((ROOT / "configs" / "grafana-malletrain.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((ROOT / "configs" / "malletrain-alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return [e.replace("$instance", ".*").replace("$__rate_interval", "30s") for e in exprs]


def test_daemon_as_operator_scraped_by_prometheus(daemon, clean_cluster, prometheus_factory):
    started = time.monotonic()
    marks: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        marks.append((what, round(time.monotonic() - started, 1)))

    def wait_for(promql: str, predicate, timeout_s: float = 30) -> float | None:
        try:
            return prom.wait_for(promql, predicate, timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- daemon log ---\n{daemon.log()}") from None

    cluster = clean_cluster
    n = len(cluster.nodes)
    regular = cluster.sbatch("-p", "batch", "-N", "3", "-t", "10", wrap="sleep 600",
                             user=OTHER_USER)
    cluster.wait_until(lambda: cluster.job_state(regular) == "RUNNING", what="regular job")

    mark("regular job running")
    daemon.start()
    daemon.receive("READY=1", timeout_s=90)
    mark("READY=1")
    prom: Prometheus = prometheus_factory(
        [f"127.0.0.1:{daemon.metrics_port}"],
        rule_files=[ROOT / "configs" / "malletrain-alerts.yml"],
        basic_auth={"username": "prometheus", "password_file": str(daemon.password_file)},
    )
    wait_for('up{job="malletrain"}', lambda v: v == 1)
    wait_for("malletrain_idle_nodes", lambda v: v == n - 3)
    assert idle_in_slurm(cluster) == n - 3
    assert prom.value("malletrain_cluster_nodes") == n
    assert prom.value("malletrain_slurm_up") == 1
    # slurmctld wrote the notice at the regular job's submission; the daemon can read it
    wait_for(f'malletrain_submit_notice_usable{{path="{daemon.notice_path}"}}',
             lambda v: v == 1)
    daemon.receive("WATCHDOG=1", timeout_s=10)
    mark("idle nodes seen by Prometheus")

    # the regular job ends: Prometheus sees every node idle
    cluster.run("scancel", str(regular))
    cluster.wait_until(lambda: idle_in_slurm(cluster) == n, what="all nodes idle")
    wait_for("malletrain_idle_nodes", lambda v: v == n)
    wait_for("increase(malletrain_tick_duration_seconds_count[1m])", lambda v: (v or 0) > 0)
    wait_for("increase(malletrain_decision_duration_seconds_count[1m])",
                  lambda v: (v or 0) > 0)
    wait_for('malletrain_tick_phase_seconds_count{phase="publish"}', lambda v: (v or 0) > 0)
    wait_for("time() - malletrain_last_tick_timestamp_seconds",
                  lambda v: v is not None and v < 10)

    mark("all idle seen")

    # mt-alice's malleable job grows onto idle nodes through slot jobs the operator releases
    job = daemon.cli(USER, "submit", "--parsable", "-N", "1-2", "-J", "opsjob",
                     "-o", str(daemon.out / "opsjob-%j.out"), "-D", str(daemon.out),
                     str(EXAMPLE), "--total-samples", "100000000", "--step-sleep", "0.2").strip()
    wait_for("malletrain_scavenged_nodes", lambda v: v == 2, timeout_s=60)
    wait_for(f'malletrain_job_nodes{{job_id="{job}", user="{USER}"}}', lambda v: v == 2)
    wait_for('malletrain_jobs{state="running"}', lambda v: v == 1)
    wait_for("malletrain_idle_nodes", lambda v: v == n - 2)
    assert idle_in_slurm(cluster) == n - 2
    wait_for("sum(malletrain_slurm_calls_total)", lambda v: (v or 0) > 0)
    assert prom.value("sum(malletrain_slurm_call_errors_total)") in (None, 0.0)
    # the submit command's two requests, as the daemon timed them
    for op in ("submit", "attach"):
        wait_for(f'malletrain_request_duration_seconds_count{{op="{op}"}}',
                 lambda v: (v or 0) >= 1)
    mark("malleable job on 2 scavenged nodes")

    # mt-bob's regular job wants every node. Either the daemon sees it planned and parks the
    # slots itself (requeuehold), or Slurm preempts them first (then the yield is timed).
    wait_for('malletrain_slurm_calls_total{call="place"}', lambda v: v == 2)
    wide = cluster.sbatch("-p", "batch", "-N", str(n), "-t", "5", wrap="sleep 600",
                          user=OTHER_USER)
    cluster.wait_until(lambda: cluster.job_state(wide) == "RUNNING", timeout_s=60,
                       what="the wide regular job to start")
    wait_for("malletrain_scavenged_nodes", lambda v: v == 0)
    wait_for("malletrain_idle_nodes", lambda v: v == 0)
    wait_for(f'malletrain_job_nodes{{job_id="{job}"}}', lambda v: v == 0)
    wait_for('malletrain_slurm_calls_total{call="requeuehold"}', lambda v: (v or 0) >= 2)
    preempted = prom.value("malletrain_preemptions_total")
    yields = prom.value("malletrain_yield_latency_seconds_count")
    if preempted:
        parks = "\n".join(r["msg"] for r in daemon.log_records() if "slot" in r["msg"])
        assert yields is not None and yields >= 1, f"{preempted=} {yields=}\n{parks}"
        worst = prom.value("histogram_quantile(1, malletrain_yield_latency_seconds_bucket)")
        # GraceTime 5 s + Slurm's periodic check
        assert worst is not None and worst <= 20, f"{worst=}\n{parks}"
    mark(f"yielded to the regular job (preemptions {preempted}, timed yields {yields})")
    daemon.cli(USER, "cancel", job)
    cluster.run("scancel", str(wide))

    # SIGHUP with an invalid file: rejected, counted, the daemon keeps running and ticking
    good = daemon.config.read_text()
    daemon.config.write_text(good.replace("tick_interval_s: 1", "tick_interval_s: -1"))
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for('malletrain_config_reloads_total{result="rejected"}', lambda v: v == 1)
    rejected = [r for r in daemon.log_records() if "reload rejected" in r["msg"]]
    assert rejected and "allocator.tick_interval_s" in rejected[0]["msg"], daemon.log()
    # a valid change is applied
    daemon.config.write_text(good.replace("level: INFO", "level: DEBUG"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for('malletrain_config_reloads_total{result="ok"}', lambda v: v == 1)
    assert daemon.proc.poll() is None
    ticks = prom.value("malletrain_tick_duration_seconds_count")
    wait_for("malletrain_tick_duration_seconds_count", lambda v: (v or 0) > (ticks or 0))

    mark("reloads counted")

    # every dashboard panel and alert rule is PromQL this Prometheus accepts, on real series
    for expr in dashboard_and_alert_exprs():
        prom.query(expr)
    groups = prom.api("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    alerts = yaml.safe_load((ROOT / "configs" / "malletrain-alerts.yml").read_text())
    assert len(rules) == sum(len(g["rules"]) for g in alerts["groups"]) == 8
    assert all(r["health"] != "err" for r in rules), rules
    firing = {r["name"] for r in rules if r["state"] == "firing"}
    assert firing == {"MalletrainConfigReloadRejected"}, firing  # we did reject one

    # systemctl stop: SIGTERM -> STOPPING=1 and a clean exit within the stop deadline
    t0 = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    daemon.receive("STOPPING=1", timeout_s=20)
    assert daemon.proc.wait(30) == 0
    assert time.monotonic() - t0 < 20  # daemon.stop_timeout_s
    wait_for('up{job="malletrain"}', lambda v: v == 0)

    mark("stopped")
    print(marks)
    assert time.monotonic() - started < 120, marks
