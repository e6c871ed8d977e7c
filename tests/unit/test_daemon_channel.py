"""The submit channel: peer credentials from the kernel, every bad request answered, never fatal."""

from __future__ import annotations

import json
import os
import socket

import pytest

from malletrain.daemon.channel import MAX_REQUEST_BYTES, ChannelServer, DaemonUnavailable, call
from malletrain.errors import PermanentError, RetryableError


def handler(peer, req):
    if req["op"] == "whoami":
        return {"uid": peer.uid, "pid": peer.pid, "user": peer.user}
    if req["op"] == "boom":
        raise ZeroDivisionError("internal")
    if req["op"] == "later":
        raise RetryableError("try later")
    raise PermanentError(f"unknown request {req['op']!r}")


@pytest.fixture
def server(tmp_path):
    srv = ChannelServer(tmp_path / "s.sock", handler).start()
    yield srv
    srv.stop()


def raw(path, payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except BrokenPipeError:
            pass
        return json.loads(s.makefile().readline())


def test_the_kernel_says_who_calls(server):
    ans = call(server.path, {"op": "whoami"})
    assert ans["uid"] == os.getuid() and ans["pid"] == os.getpid()
    assert oct(server.path.stat().st_mode & 0o777) == "0o666"


def test_errors_are_typed_and_the_server_survives(server):
    with pytest.raises(PermanentError, match="unknown request"):
        call(server.path, {"op": "nope"})
    with pytest.raises(RetryableError, match="try later"):
        call(server.path, {"op": "later"})
    with pytest.raises(RetryableError, match="internal error: ZeroDivisionError"):
        call(server.path, {"op": "boom"})
    for payload in (b"not json\n", b"[1, 2]\n", b'{"op": 5}\n', b"\n", b"\xff\xfe\n"):
        ans = raw(server.path, payload)
        assert ans["ok"] is False and "bad request" in ans["error"]
    big = raw(server.path, b"{" + b" " * (MAX_REQUEST_BYTES + 10))
    assert big["ok"] is False and "larger than" in big["error"]
    assert call(server.path, {"op": "whoami"})["uid"] == os.getuid()


def test_no_daemon_is_one_clear_retryable_error(tmp_path):
    with pytest.raises(DaemonUnavailable, match="daemon is not running"):
        call(tmp_path / "missing.sock", {"op": "jobs"})


def test_a_stale_socket_file_is_replaced(tmp_path):
    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what kill -9 leaves behind
    srv = ChannelServer(path, handler).start()
    try:
        assert call(path, {"op": "whoami"})["uid"] == os.getuid()
    finally:
        srv.stop()
    assert not path.exists()
