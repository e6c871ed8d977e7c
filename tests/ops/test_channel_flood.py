"""A second Unix user floods the submit channel: everyone else is still served (issue 15).

Real parts: the daemon's ChannelServer on a real Unix socket (run here as root, as the
daemon runs), the attacker mt-bob and the victim mt-alice as their own processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malletrain.daemon.submit.channel import MAX_CONNECTIONS_PER_UID, ChannelServer

pytestmark = pytest.mark.slurm  # needs the dev cluster's test users

FLOOD = """
import socket, sys, time
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)  # a full backlog must not stop the flood
    try:
        s.connect(sys.argv[1])
        s.send(b'{"op": ')  # never finish the request
    except OSError:
        pass
    socks.append(s)
print("flooding", flush=True)
time.sleep(float(sys.argv[3]))
"""

ASK = """
import sys, time
from malletrain.daemon.submit.channel import call
t0 = time.monotonic()
answer = call(sys.argv[1], {"op": "jobs"}, timeout_s=30)
print(f"{time.monotonic() - t0:.2f} {answer['jobs']}", flush=True)
"""


#: a client that comes back while the server is out of file descriptors (the channel marks
#: such answers retryable): one call can fail while the flood still holds every descriptor
ASK_UNTIL_SERVED = """
import sys, time
from malletrain.daemon.submit.channel import call
t0 = time.monotonic()
while True:
    try:
        answer = call(sys.argv[1], {"op": "jobs"}, timeout_s=5)
        break
    except Exception as exc:
        if time.monotonic() - t0 > 35:
            raise
        print(f"retrying after: {exc}", file=sys.stderr, flush=True)
        time.sleep(0.5)
print(f"{time.monotonic() - t0:.2f} {answer['jobs']}", flush=True)
"""


def _as(user: str, code: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen(
        ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", sys.executable,
         "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _serve(path: Path) -> ChannelServer:
    return ChannelServer(path, lambda peer, req: {"jobs": [peer.user]}).start()


def test_300_hostile_connections_do_not_keep_others_from_being_served(dev_cluster, shared_tmp):
    path = shared_tmp / "submit.sock"
    server = _serve(path)
    flood = _as("mt-bob", FLOOD, str(path), "300", "20")
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "flooding"
        ask = _as("mt-alice", ASK, str(path))
        out, err = ask.communicate(timeout=30)
        seconds, who = out.split(" ", 1)
        assert who.strip() == "['mt-alice']", err
        assert float(seconds) < 2.0
        # bob himself is told to come back later, not left hanging
        bob = _as("mt-bob", ASK, str(path))
        _, bob_err = bob.communicate(timeout=30)
        assert "busy" in bob_err and bob.returncode != 0
        assert server._thread.is_alive()
        assert sum(server._open.values()) <= MAX_CONNECTIONS_PER_UID
    finally:
        flood.kill()
        flood.wait()
        server.stop()


def test_running_out_of_file_descriptors_does_not_end_the_channel(dev_cluster, shared_tmp):
    """The accept loop survives EMFILE; service resumes when the flood's requests time out."""
    path = shared_tmp / "tight.sock"
    code = f"""
import resource, sys
from pathlib import Path
from malletrain.daemon.submit.channel import MAX_CONNECTIONS_PER_UID, ChannelServer
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (16, hard))  # fewer than one uid may hold
server = ChannelServer(Path({str(path)!r}), lambda peer, req: {{"jobs": [peer.user]}}).start()
print("up", flush=True)
sys.stdin.readline()  # the test has been served (or gave up)
print("alive" if server._thread.is_alive() else "dead", flush=True)
"""
    server = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        flood = _as("mt-bob", FLOOD, str(path), "300", "5")
        assert flood.stdout is not None and flood.stdout.readline().strip() == "flooding"
        time.sleep(1)
        ask = _as("mt-alice", ASK_UNTIL_SERVED, str(path))
        out, err = ask.communicate(timeout=45)
        assert out.split(" ", 1)[-1].strip() == "['mt-alice']", (out, err)
        assert server.stdin is not None
        server.stdin.write("check\n")
        server.stdin.flush()
        assert server.stdout.readline().strip() == "alive"
        flood.wait(10)
    finally:
        server.kill()
        server.wait()
