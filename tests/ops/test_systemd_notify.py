"""sd_notify over a real Unix datagram socket (file path and abstract namespace)."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from malletrain.ops.systemd import Notifier, watchdog_interval_s


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request, tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify.sock")
        s.bind(name)
    else:
        name = "@malletrain-test-" + uuid.uuid4().hex
        s.bind(b"\0" + name[1:].encode())
    s.settimeout(2)
    yield name, s
    s.close()


def receive(s: socket.socket) -> dict[str, str]:
    data = s.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def test_ready_status_watchdog_stopping(notify_socket):
    name, s = notify_socket
    n = Notifier.from_environment({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "4000000"})
    assert n.enabled and n.watchdog_s == 4.0
    assert n.ready("scavenging 8 nodes")
    assert receive(s) == {"READY": "1", "STATUS": "scavenging 8 nodes"}
    assert n.watchdog()
    assert receive(s) == {"WATCHDOG": "1"}
    assert n.status("line1\nWATCHDOG=1")  # a newline cannot forge a second field
    assert receive(s) == {"STATUS": "line1 WATCHDOG=1"}
    assert n.reloading()
    assert receive(s) == {"RELOADING": "1"}
    assert n.stopping("stopping: releasing 4 slots")
    assert receive(s) == {"STOPPING": "1", "STATUS": "stopping: releasing 4 slots"}


def test_watchdog_timing(notify_socket):
    name, _s = notify_socket
    n = Notifier(name, watchdog_s=10.0)
    assert n.max_sleep_s(30.0) == 5.0 and n.max_sleep_s(2.0) == 2.0
    n.watchdog(now_s=100.0)
    assert not n.watchdog_due(now_s=104.9)
    assert n.watchdog_due(now_s=105.0)


def test_no_socket_means_no_op():
    n = Notifier.from_environment({})
    assert not n.enabled
    assert not n.ready() and not n.watchdog() and not n.stopping()
    assert n.max_sleep_s(60.0) == 60.0
    assert not n.watchdog_due()


def test_gone_socket_is_logged_not_raised(tmp_path, caplog):
    n = Notifier(str(tmp_path / "nobody-listens.sock"))
    assert not n.ready()
    assert not n.watchdog()  # watchdog not configured -> no send at all
    assert not n.stopping()
    assert sum("sd_notify" in r.message for r in caplog.records) == 1  # warned once


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "junk"}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ],
)
def test_watchdog_interval_from_environment(env, expected):
    assert watchdog_interval_s(env) == expected


def test_a_full_socket_never_blocks_the_loop(tmp_path):
    """A reader that lags (its queue full) must cost a dropped datagram, not a hung loop."""
    path = tmp_path / "slow.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as reader:
        reader.bind(str(path))
        n = Notifier(str(path), watchdog_s=1.0)
        t0 = time.monotonic()
        sent = [n.watchdog() for _ in range(200)]  # nobody reads
        assert time.monotonic() - t0 < 5
        assert sent[0] and not all(sent)  # some got through, the rest were dropped
        reader.settimeout(1)
        assert reader.recv(100) == b"WATCHDOG=1"
