"""Nothing private on open endpoints (issue 49, finding 9), against the real daemon on the dev
cluster with ``PrivateData=jobs``, mt-alice's job running, mt-bob the other user:

* the metrics port (every local user reaches it) shows bob the cluster's series and nothing
  of alice's job; a wrong password gets 401; the operator's password shows the per-job
  series. Before: ``job_id="m1"`` to everyone.
* the daemon, started under umask 0, creates the database and every file beside it 0600
  (before: 0666 under that umask, 0644 under the unit's);
* the job's secret is nowhere in the database or its WAL.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from malletrain.devstack import LocalDaemon, check_python_reachable
from malletrain.elastic.coordinator.keyfile import ensure_key
from malletrain.elastic.protocol import wire

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

PASSWORD = "operator-only-7f3a"

#: a scrape as the calling user: status, then the body
SCRAPE = r"""
import base64, sys, urllib.error, urllib.request
req = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2:
    req.add_header("Authorization", "Basic " + base64.b64encode(
        f"prometheus:{sys.argv[2]}".encode()).decode())
try:
    with urllib.request.urlopen(req, timeout=10) as resp:
        print(resp.status)
        print(resp.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


@pytest.fixture
def private_cluster(clean_cluster):
    conf = clean_cluster.conf_path
    text = conf.read_text()
    conf.write_text(text + "PrivateData=jobs\n")
    clean_cluster.run("scontrol", "reconfigure")
    yield clean_cluster
    conf.write_text(text)
    clean_cluster.run("scontrol", "reconfigure")


@pytest.fixture
def daemon(private_cluster):
    check_python_reachable("mt-alice", private_cluster.env)
    work = Path(tempfile.mkdtemp(prefix="malletrain-sec-", dir="/tmp"))
    work.chmod(0o755)
    d = LocalDaemon(work, private_cluster.env, str(private_cluster.conf_path))
    password = work / "metrics.password"
    password.write_text(PASSWORD + "\n")
    password.chmod(0o600)
    config = yaml.safe_load(d.config.read_text())
    config["metrics"]["password_file"] = str(password)
    d.config.write_text(yaml.safe_dump(config))
    old = os.umask(0)  # the most open umask: the daemon must not rely on it
    try:
        d.start()
    finally:
        os.umask(old)
    yield d
    d.stop()
    d.stop_coordinator()
    private_cluster.scancel_all()
    shutil.rmtree(work, ignore_errors=True)


def _metrics_url(d: LocalDaemon) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"serving metrics on (http://\S+)", d.log())
        if m:
            return m.group(1)
        time.sleep(0.2)
    raise AssertionError(d.log()[-2000:])


def _scrape(cluster, url: str, user: str | None, password: str | None = None):
    args = [sys.executable, "-c", SCRAPE, url, *([password] if password else [])]
    out = cluster.run(*args, user=user).stdout
    status, _, body = out.partition("\n")
    return int(status), body


def test_metrics_hide_other_users_jobs_and_the_state_files_are_private(daemon,
                                                                       private_cluster):
    cluster = private_cluster
    url = _metrics_url(daemon)
    job = daemon.submit_example("mt-alice", "private", "1-1", 10**9)
    deadline = time.monotonic() + 60
    while f'job_id="{job}"' not in _scrape(cluster, url, None, PASSWORD)[1]:
        assert time.monotonic() < deadline, daemon.log()[-3000:]
        time.sleep(1)
    status, body = _scrape(cluster, url, "mt-bob")
    assert status == 200 and "malletrain_idle_nodes" in body
    assert "job_id=" not in body and f'"{job}"' not in body, body
    assert _scrape(cluster, url, "mt-bob", "a guess")[0] == 401

    # the state files: the daemon's alone, though it was started under umask 0
    state = daemon.state
    loose = {p.name: oct(stat.S_IMODE(p.lstat().st_mode)) for p in state.iterdir()
             if stat.S_ISREG(p.lstat().st_mode) and stat.S_IMODE(p.lstat().st_mode) & 0o077}
    assert not loose, loose
    names = {p.name for p in state.iterdir()}
    assert {"state.db", "state.db-wal", "instance", "coordinator.key"} <= names, names

    # the job's secret is derived, never stored
    master = ensure_key(state / "coordinator.key")
    import sqlite3

    db = sqlite3.connect(state / "state.db")
    realm = db.execute("SELECT value FROM meta WHERE key='realm'").fetchone()[0]
    db.close()
    secret = wire.job_secret(master, job, realm)
    for name in ("state.db", "state.db-wal"):
        data = (state / name).read_bytes()
        assert secret not in data and secret.hex().encode() not in data, name
