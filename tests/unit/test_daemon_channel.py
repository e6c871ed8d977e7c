"""The submit channel: peer credentials from the kernel, every bad request answered, never fatal."""

from __future__ import annotations

import json
import os
import socket

import pytest

from malletrain.daemon.submit.channel import (
    MAX_REQUEST_BYTES,
    ChannelServer,
    DaemonUnavailable,
    call,
)
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
    for payload in (b"not json\n", b"[1, 2]\n", b'{"op": 5}\n', b"\n", b"\xff\xfe\n",
                    b"[" * 100_000 + b"\n"):  # nested past the stack: an answer, no traceback
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


def test_a_restarting_daemon_is_waited_for(tmp_path):
    """The socket appears 0.6 s after the first try (a daemon restarting): served, and the
    caller was told once per failed try."""
    import threading
    path = tmp_path / "s.sock"
    told: list[str] = []
    servers: list[ChannelServer] = []
    timer = threading.Timer(0.6, lambda: servers.append(ChannelServer(path, handler).start()))
    timer.start()
    try:
        ans = call(path, {"op": "whoami"}, retry_s=10, on_retry=lambda e: told.append(str(e)))
        assert ans["uid"] == os.getuid()
        assert told and all("daemon is not running" in t for t in told)
    finally:
        timer.join()
        for s in servers:
            s.stop()


class _Scripted:
    """A raw server answering each connection with the next of ``answers`` (None: read the
    request, then close without answering), counting the requests it read."""

    def __init__(self, path, answers):
        import threading
        self.answers, self.requests = list(answers), 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        for answer in self.answers:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by the test with answers left over
                return
            with conn:
                conn.makefile().readline()
                self.requests += 1
                if answer is not None:
                    conn.sendall(answer)

    def close(self):
        self.sock.close()


def test_busy_is_sent_again_and_a_lost_answer_only_for_idempotent_requests(tmp_path):
    from malletrain.daemon.submit.channel import _BUSY
    ok = b'{"ok": true, "job_id": "7"}\n'
    srv = _Scripted(tmp_path / "a.sock", [_BUSY, _BUSY, ok])
    assert call(srv.sock.getsockname(), {"op": "submit"}, retry_s=10)["job_id"] == "7"
    assert srv.requests == 3
    srv.close()
    # a submit whose answer was lost may have been done: never sent twice
    srv = _Scripted(tmp_path / "b.sock", [None, ok])
    with pytest.raises(DaemonUnavailable, match="did not answer"):
        call(srv.sock.getsockname(), {"op": "submit"}, retry_s=10)
    assert srv.requests == 1
    srv.close()
    # a read is
    srv = _Scripted(tmp_path / "c.sock", [None, ok])
    assert call(srv.sock.getsockname(), {"op": "jobs"}, retry_s=10, idempotent=True)["ok"]
    assert srv.requests == 2
    srv.close()
    # a retryable answer from the daemon itself (a quota) is the caller's to judge
    srv = _Scripted(tmp_path / "d.sock", [b'{"ok": false, "error": "quota", '
                                          b'"retryable": true}\n', ok])
    with pytest.raises(RetryableError, match="quota"):
        call(srv.sock.getsockname(), {"op": "jobs"}, retry_s=10, idempotent=True)
    assert srv.requests == 1
    srv.close()


def test_busy_sent_before_the_request_is_read_is_still_seen(tmp_path):
    """A busy daemon answers and closes without reading (channel._admit): the request can
    then fail to send (EPIPE, seen in CI under load) while the answer waits unread. It is
    read, so the caller is told "busy" and may try again, not "did not answer"."""
    import threading

    from malletrain.daemon.submit.channel import _BUSY
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "busy.sock"))
    sock.listen()

    def refuse() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.sendall(_BUSY)

    t = threading.Thread(target=refuse, daemon=True)
    t.start()
    big = {"op": "submit", "pad": "x" * (4 << 20)}  # far more than the socket buffers
    with pytest.raises(DaemonUnavailable, match="busy"):
        call(sock.getsockname(), big)
    t.join(5)
    sock.close()


def test_no_daemon_gives_up_after_the_retry_window(tmp_path):
    import time
    t0 = time.monotonic()
    with pytest.raises(DaemonUnavailable, match="daemon is not running"):
        call(tmp_path / "missing.sock", {"op": "jobs"}, retry_s=1.0)
    assert 0.5 < time.monotonic() - t0 < 3.0
