"""The coordinator's wire: a mutual HMAC handshake, then MAC-checked frames of plain fields.

Why not ``TCPStore``: it has no authentication, so anyone who can reach its port can read and
write every job's membership and join its process group (docs/security.md). Why not
``multiprocessing.connection``: it pickles (code execution across a privilege boundary) and
has one key per listener, where each job needs its own.

Keys. The coordinator holds one *master key* (the daemon's, 32 random bytes in a 0600 file).
Job ``J``'s secret is ``HMAC(master, "malletrain/job/v1\\0" + realm + "\\0" + J)``: the daemon
hands it to J's processes only (inside the job's private batch script), and the coordinator
derives it again from the job id a client names, so nothing per job is registered or kept in
sync. The *realm* names the daemon's database (set by the daemon's session, :data:`Op.REALM`):
job ids restart at ``m1`` with a new database, and the new ``m1`` must not get the secret an
old ``m1``'s user knows. The daemon itself authenticates with ``HMAC(master,
"malletrain/admin/v1")``.

Handshake (every connection, before anything else)::

    C -> S  {"v": 1, "job": J | null, "nonce": nc}      (null: the daemon's admin session)
    S -> C  {"nonce": ns}
    C -> S  {"proof": HMAC(K, "c" + T)}                 T = the four values above, joined
    S -> C  {"proof": HMAC(K, "s" + T)} | {"error": ...[, "retry": true | "proof": ...]}

Both ends prove the key (a client also refuses a fake coordinator on the port); the session
key ``HMAC(K, "session" + T)`` then MACs every frame with its direction and sequence number, so
a frame cannot be forged, replayed or reordered. Frames are authenticated, not encrypted: the
data is membership and progress (the model travels over the process group's own links).

A refusal is trusted only as far as it is proven, since anyone may answer on the port while
the coordinator is down: ``{"error", "retry": true}`` (a coordinator that has not yet been
told its realm and jobs by the daemon: try again) and an unproven ``{"error"}`` (a wrong key,
or not the coordinator at all) are :class:`Unproven`; only an error carrying
``HMAC(K, "e" + T + error)`` (the client's key was right, and the job has ended) is a
permanent :class:`AuthRefused`.

A frame is ``u32 length | mac(32) | payload``; a payload is ``u8 code | (u32 len | bytes)*``.
Sizes are bounded before anything is read into memory; every read has a deadline (the whole
handshake, the whole frame once its first byte came).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from enum import IntEnum

from malletrain.elastic.protocol.keys import ID_RE

#: the largest value a client may store (gloo/NCCL rendezvous blobs are far smaller)
MAX_VALUE_BYTES = 1 << 20
#: the largest frame: one value plus its key and framing
MAX_FRAME_BYTES = MAX_VALUE_BYTES + (64 << 10)
#: the largest handshake message
MAX_HELLO_BYTES = 1024
SECRET_BYTES = 32
_LEN = struct.Struct("!I")
_SEQ = struct.Struct("!Q")


class Op(IntEnum):
    """Requests; the fields each takes are listed in :mod:`.kvserver`."""

    SET = 1
    GET = 2
    ADD = 3
    CHECK = 4
    WAIT = 5
    NUM_KEYS = 6
    DELETE = 7
    COMPARE_SET = 8
    FORGET_JOB = 9  # admin only
    JOBS = 10  # admin only: the job namespaces held, with their sizes
    REALM = 11  # admin only: the realm job secrets are derived in (see above)
    READ_MANY = 12  # admin only: many keys of any jobs in one round trip (the daemon's tick)
    ADMIT = 13  # admin only: jobs whose secrets are served (coordinator/registry.py)


class Status(IntEnum):
    OK = 0
    TIMEOUT = 1
    REFUSED = 2  # not allowed or over a quota; the session goes on


class WireError(Exception):
    """The peer broke the protocol (bad MAC, size, encoding) or failed authentication."""


class AuthRefused(WireError):
    """The coordinator refused, and proved it is the coordinator: the job has ended."""


class FrameRefused(WireError):
    """A frame the reader would not buffer (over its sender's quota): it was read and
    discarded in small pieces, unchecked; the session goes on with a refusal."""


class Unproven(WireError):
    """A refusal nobody proved (a wrong key, another process on the port) or a coordinator
    not ready yet (``retry``): never a reason to give up at once."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


# ---------------------------------------------------------------------- keys


def job_secret(master: bytes, job_id: str, realm: str = "") -> bytes:
    """Job ``job_id``'s secret: what its processes prove, derived from the master key."""
    if not ID_RE.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}")
    if realm and not ID_RE.match(realm):
        raise ValueError(f"invalid realm {realm!r}")
    label = f"malletrain/job/v1\0{realm}\0{job_id}".encode()
    return hmac.new(master, label, hashlib.sha256).digest()


def admin_secret(master: bytes) -> bytes:
    return hmac.new(master, b"malletrain/admin/v1", hashlib.sha256).digest()


def parse_secret(text: str) -> bytes:
    """A secret as written in the environment or a key file: 64 hex digits."""
    text = text.strip()
    if len(text) != 2 * SECRET_BYTES:
        raise ValueError(f"a secret is {2 * SECRET_BYTES} hex digits, got {len(text)} characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError("a secret is hex digits only") from None


# ---------------------------------------------------------------------- raw framing


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (``time.monotonic()``) all of them by then, however
    slowly the peer trickles them (``TimeoutError`` otherwise)."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(buf)} of {n} bytes before the deadline")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by the peer")
        buf += chunk
    return bytes(buf)


def _send_plain(sock: socket.socket, obj: dict[str, object]) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(body)) + body)


def _recv_plain(sock: socket.socket, deadline: float | None = None) -> dict[str, object]:
    (n,) = _LEN.unpack(recv_exact(sock, 4, deadline))
    if n > MAX_HELLO_BYTES:
        raise WireError(f"handshake message of {n} bytes")
    try:
        obj = json.loads(recv_exact(sock, n, deadline))
    except (ValueError, RecursionError) as exc:  # 1 KiB of "[" nests past the stack
        raise WireError(f"handshake message is not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise WireError("handshake message is not an object")
    return obj


def _hex_field(obj: dict[str, object], name: str, n_bytes: int) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or len(value) != 2 * n_bytes:
        raise WireError(f"handshake: bad {name!r}")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise WireError(f"handshake: bad {name!r}") from None
    return value


def _transcript(job: str | None, nc: str, ns: str) -> bytes:
    return f"malletrain/v1|{job or ''}|{nc}|{ns}".encode()


def _mac(key: bytes, label: bytes, data: bytes) -> str:
    return hmac.new(key, label + data, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------------- handshake


def client_handshake(sock: socket.socket, job: str | None, key: bytes) -> Session:
    """Prove ``key`` for ``job`` (None: admin) and check the server's proof."""
    nc = os.urandom(16).hex()
    _send_plain(sock, {"v": 1, "job": job, "nonce": nc})
    ns = _hex_field(_recv_plain(sock), "nonce", 16)
    t = _transcript(job, nc, ns)
    _send_plain(sock, {"proof": _mac(key, b"c", t)})
    answer = _recv_plain(sock)
    if "error" in answer:
        error = str(answer["error"])[:200]
        proof = answer.get("proof")
        if isinstance(proof, str) and hmac.compare_digest(
                proof, _mac(key, b"e", t + error.encode())):
            raise AuthRefused(f"the coordinator refused: {error}")
        raise Unproven(f"the coordinator refused (unproven): {error}",
                       retry=answer.get("retry") is True)
    proof = _hex_field(answer, "proof", 32)
    if not hmac.compare_digest(proof, _mac(key, b"s", t)):
        raise WireError("the coordinator did not prove the key: not the real coordinator")
    return Session(sock, hmac.new(key, b"session" + t, hashlib.sha256).digest(), client=True)


def server_handshake(sock: socket.socket, master: bytes,
                     admission: Callable[[str], tuple[str | None, bool]],
                     timeout_s: float = 5.0) -> tuple[str | None, Session]:
    """Check a client's proof; returns (its job, or None for admin; the session).

    ``admission(job)``: (the realm job secrets are derived in, None while the daemon has not
    registered its jobs since this coordinator started: "retry"; whether the job is
    registered: if not, a client that proved the right key is told, with proof, that the
    job has ended). The whole handshake has ``timeout_s``, not each read.
    """
    deadline = time.monotonic() + timeout_s
    hello = _recv_plain(sock, deadline)
    if hello.get("v") != 1:
        raise WireError("handshake: unsupported version")
    job = hello.get("job")
    if job is not None and (not isinstance(job, str) or not ID_RE.match(job)):
        raise WireError("handshake: bad job id")
    nc = _hex_field(hello, "nonce", 16)
    ns = os.urandom(16).hex()
    _send_plain(sock, {"nonce": ns})
    t = _transcript(job, nc, ns)
    proof = _hex_field(_recv_plain(sock, deadline), "proof", 32)
    realm, admitted = ("", True) if job is None else admission(job)
    if realm is None:
        _send_plain(sock, {"error": "the coordinator is starting: retry", "retry": True})
        raise WireError(f"not ready yet (job {job})")
    key = admin_secret(master) if job is None else job_secret(master, job, realm)
    if not hmac.compare_digest(proof, _mac(key, b"c", t)):
        _send_plain(sock, {"error": "authentication failed"})
        raise WireError(f"authentication failed (job {job or '<admin>'})")
    if not admitted:
        error = "the job has ended or is not registered"
        _send_plain(sock, {"error": error, "proof": _mac(key, b"e", t + error.encode())})
        raise WireError(f"job {job}: {error}")
    _send_plain(sock, {"proof": _mac(key, b"s", t)})
    return job, Session(sock, hmac.new(key, b"session" + t, hashlib.sha256).digest(),
                        client=False)


# ---------------------------------------------------------------------- sessions


class Session:
    """MAC-checked frames over one authenticated socket (not thread-safe: callers lock)."""

    def __init__(self, sock: socket.socket, key: bytes, *, client: bool) -> None:
        self.sock = sock
        self._key = key
        self._out_dir, self._in_dir = (b"C", b"S") if client else (b"S", b"C")
        self._out_seq = 0
        self._in_seq = 0
        #: the server's bound on reading one frame once it started (None: no bound)
        self.frame_timeout_s: float | None = None

    def _tag(self, direction: bytes, seq: int, payload: bytes) -> bytes:
        return hmac.new(self._key, direction + _SEQ.pack(seq) + payload, hashlib.sha256).digest()

    def send(self, code: int, fields: Sequence[bytes]) -> None:
        payload = encode_fields(code, fields)
        if len(payload) + 32 > MAX_FRAME_BYTES:
            raise WireError(f"frame of {len(payload)} bytes is over the limit")
        tag = self._tag(self._out_dir, self._out_seq, payload)
        self._out_seq += 1
        self.sock.sendall(_LEN.pack(len(payload) + 32) + tag + payload)

    def recv(self, reserve: Callable[[int], bool] | None = None) -> tuple[int, list[bytes]]:
        """The next frame. Waits for its first byte as long as the peer stays quiet; once it
        came, the whole frame must arrive within :attr:`frame_timeout_s` (when set).
        ``reserve(n)`` is called with the frame's size before its body is buffered (it
        counts the bytes); if it says no, the body is discarded unbuffered and
        :class:`FrameRefused` raised."""
        self.sock.settimeout(None)
        first = recv_exact(self.sock, 1)
        deadline = (None if self.frame_timeout_s is None
                    else time.monotonic() + self.frame_timeout_s)
        (n,) = _LEN.unpack(first + recv_exact(self.sock, 3, deadline))
        if not 33 <= n <= MAX_FRAME_BYTES:
            raise WireError(f"frame of {n} bytes")
        if reserve is not None and not reserve(n):
            while n > 0:  # 8 KiB at a time: nothing of it is kept
                n -= len(recv_exact(self.sock, min(n, 1 << 13), deadline))
            self._in_seq += 1
            raise FrameRefused("the frame is over the quota of its job")
        body = recv_exact(self.sock, n, deadline)
        if self.frame_timeout_s is not None:
            self.sock.settimeout(self.frame_timeout_s)  # the answer's send, likewise bounded
        tag, payload = body[:32], body[32:]
        if not hmac.compare_digest(tag, self._tag(self._in_dir, self._in_seq, payload)):
            raise WireError("frame MAC does not match: forged, replayed or reordered")
        self._in_seq += 1
        return decode_fields(payload)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def encode_fields(code: int, fields: Sequence[bytes]) -> bytes:
    parts = [bytes([code])]
    for f in fields:
        parts += [_LEN.pack(len(f)), f]
    return b"".join(parts)


def decode_fields(payload: bytes) -> tuple[int, list[bytes]]:
    if not payload:
        raise WireError("empty frame")
    code, pos, fields = payload[0], 1, []
    while pos < len(payload):
        if pos + 4 > len(payload):
            raise WireError("truncated field length")
        (n,) = _LEN.unpack_from(payload, pos)
        pos += 4
        if pos + n > len(payload):
            raise WireError("truncated field")
        fields.append(payload[pos:pos + n])
        pos += n
    return code, fields
