"""Issue 49, finding 7: another user takes the coordinator's port while it is down.

``mt-bob`` (a second real Unix account) binds the port the daemon's coordinator uses and
answers every handshake with an unproven "authentication failed", and the daemon's
``coordinator.pid`` names bob's process. Before, the daemon's attach raised a permanent
``CoordinatorKeyMismatch`` and its ``stop_coordinator`` SIGTERMed whatever pid the file named.
Now a refusal nobody proved is retryable, and only a process of the daemon's own account
running ``malletrain coordinator`` with its key file is ever signalled.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time

import pytest

from malletrain.daemon.service import coordinator_proc
from malletrain.elastic.coordinator.handle import Coordinator, CoordinatorKeyMismatch
from malletrain.errors import PermanentError, RetryableError
from malletrain.ops.settings import CoordinatorSettings, Settings, StateSettings

SQUATTER = r"""
import json, socket, struct, sys
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
while True:
    c, _ = srv.accept()
    try:
        c.settimeout(2)
        c.recv(1024)  # the hello
        body = json.dumps({"nonce": "00" * 16}).encode()
        c.sendall(struct.pack("!I", len(body)) + body)
        c.recv(1024)  # the proof
        body = json.dumps({"error": "authentication failed"}).encode()
        c.sendall(struct.pack("!I", len(body)) + body)
    except OSError:
        pass
    c.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bob_on_the_port():
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as mt-bob")
    try:
        pwd.getpwnam("mt-bob")
    except KeyError:
        pytest.skip("no mt-bob account")
    port = _free_port()
    proc = subprocess.Popen(["setpriv", "--reuid=mt-bob", "--regid=mt-bob", "--init-groups",
                             sys.executable, "-c", SQUATTER, str(port)],
                            stdout=subprocess.PIPE, text=True, cwd="/")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    yield port, proc
    proc.kill()
    proc.wait(10)


def test_a_squatter_cannot_make_the_daemon_give_up_or_signal_its_process(bob_on_the_port,
                                                                         tmp_path):
    port, bob = bob_on_the_port
    state = tmp_path / "state"
    state.mkdir()
    settings = Settings(state=StateSettings(database_path=state / "state.db",
                                            snapshot_dir=state / "snapshots"),
                        coordinator=CoordinatorSettings(host="127.0.0.1", port=port))
    (state / "coordinator.pid").write_text(f"{bob.pid}\n")  # bob's pid in our pid file
    master = os.urandom(32)
    with pytest.raises(CoordinatorKeyMismatch) as mismatch:
        Coordinator.attach(f"127.0.0.1:{port}", master, timeout_s=1.0)
    assert isinstance(mismatch.value, RetryableError)
    assert not isinstance(mismatch.value, PermanentError)
    with pytest.raises(RetryableError, match="names no coordinator of this account"):
        coordinator_proc.ensure_coordinator(settings, "db1", timeout_s=5)
    coordinator_proc.stop_coordinator(settings)
    time.sleep(0.3)
    assert bob.poll() is None  # bob's process was never signalled
    assert coordinator_proc.our_coordinator_pid(settings) is None


def test_only_our_own_coordinator_process_is_trusted_by_the_pid_file(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    settings = Settings(state=StateSettings(database_path=state / "state.db",
                                            snapshot_dir=state / "snapshots"),
                        coordinator=CoordinatorSettings(host="127.0.0.1", port=0))
    coord = coordinator_proc.ensure_coordinator(settings, "db1", timeout_s=60)
    try:
        pid = coordinator_proc.our_coordinator_pid(settings)
        assert pid is not None and pid == int((state / "coordinator.pid").read_text())
        (state / "coordinator.pid").write_text(f"{os.getpid()}\n")  # not a coordinator
        assert coordinator_proc.our_coordinator_pid(settings) is None
        (state / "coordinator.pid").write_text(f"{pid}\n")
    finally:
        coord.close()
        coordinator_proc.stop_coordinator(settings)
