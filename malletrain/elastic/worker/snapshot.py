"""The evicted-to-zero snapshot: the only time training state touches a file system.

File name ``<job_id>.step<step>.mtsnap`` in ``MALLETRAIN_STATE_DIR``; the payload repeats the
job id and step. A snapshot is used only if both tags match the file name and the job, and
only if its step is newer than every live replica's (the runtime compares steps at each
membership change), so neither a snapshot of another job nor an older one of this job can
overwrite fresher state. Writes go to a temporary name in the same directory, are fsync'ed
and renamed, so a reader never sees a partial file; older snapshots of the job are removed
after a newer one is in place (never a newer one: members may save at the same time).

The state directory is shared by every user's jobs (sticky, like /tmp). A job writes in a
directory of its own inside it (:func:`private_dir`): ``<job_id>.<tag>``, the tag derived
from the job's secret, created 0700 by the job's user. Another user cannot know the name
before it exists, so cannot take it first; in a shared directory with guessable names he
could (issue 49: a file of his named like the next snapshot made the evict-to-zero save
fail with EPERM, and the state was lost). A snapshot is also private and checked: it is
created ``O_CREAT|O_EXCL|O_NOFOLLOW`` with mode 0600, and a file is used only if ``lstat``
shows a regular file owned by this process's user with no group or other permissions. A
file another user planted (or a symlink, or a readable copy) is refused with a warning and
never loaded; the job's real progress is kept.

Each file carries a MAC keyed by the job's secret (``MALLETRAIN_JOB_SECRET``): ``MTSNAP1\n``,
then ``HMAC-SHA256(snapshot key, job id | step | body)``, then the ``torch.save`` body. The MAC
is checked before ``torch.load`` (itself ``weights_only=True``), so a swapped, truncated or
forged file (even one of this user's other jobs) is refused. Saving and loading hold the
body in memory once more (the state is small next to the node's memory; eviction is rare).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from malletrain.elastic.protocol.private import private_file_problem

log = logging.getLogger(__name__)

_SUFFIX = ".mtsnap"
_MAGIC = b"MTSNAP1\n"
_HEADER_BYTES = len(_MAGIC) + 32


def _mac(secret: bytes, job_id: str, step: int, body: bytes) -> bytes:
    key = hmac.new(secret, b"malletrain/snapshot/v1", hashlib.sha256).digest()
    return hmac.new(key, f"{job_id}|{step}|".encode() + body, hashlib.sha256).digest()


@dataclass(frozen=True)
class SnapshotRef:
    path: Path
    step: int


def job_dir(state_dir: Path, job_id: str, secret: bytes) -> Path:
    """The job's own directory in the shared ``state_dir``: a name only its secret gives."""
    tag = hmac.new(secret, b"malletrain/snapshot-dir/v1\0" + job_id.encode(), hashlib.sha256)
    return state_dir / f"{job_id}.{tag.hexdigest()[:32]}"


def _dir_problem(path: Path) -> str | None:
    """Why ``path`` is not a directory of this user that only this user can enter."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (a link?)"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):o} lets others in; it must be 0700"
    return None


def private_dir(state_dir: Path | None, job_id: str, secret: bytes, *, create: bool
                ) -> Path | None:
    """The job's directory (:func:`job_dir`) once it is this user's and private; None if
    there is none (``create`` false) or no ``state_dir``. With ``create`` it is made 0700
    whatever the umask; OSError if it cannot be, or if what is there is not private."""
    if state_dir is None:
        return None
    path = job_dir(state_dir, job_id, secret)
    if create:
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # a umask may have taken the owner's bits too
        except FileExistsError:
            pass
    try:
        problem = _dir_problem(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # the state directory itself is unusable (not a directory...)
        problem = str(exc)
    if problem is not None:
        if create:
            raise OSError(f"snapshot directory {path}: {problem}")
        log.warning("refusing snapshot directory %s: %s", path, problem)
        return None
    return path


def snapshot_path(state_dir: Path, job_id: str, step: int) -> Path:
    return state_dir / f"{job_id}.step{step:012d}{_SUFFIX}"


def find_latest(state_dir: Path | None, job_id: str) -> SnapshotRef | None:
    """The newest complete, private snapshot of ``job_id`` in ``state_dir`` (by step)."""
    if state_dir is None or not state_dir.is_dir():
        return None
    pattern = re.compile(rf"^{re.escape(job_id)}\.step(\d+){re.escape(_SUFFIX)}$")
    best: SnapshotRef | None = None
    for entry in os.scandir(state_dir):
        m = pattern.match(entry.name)
        if not m:
            continue
        problem = private_file_problem(entry.path)
        if problem is not None:
            log.warning("refusing snapshot %s: %s", entry.path, problem)
            continue
        ref = SnapshotRef(Path(entry.path), int(m.group(1)))
        if best is None or ref.step > best.step:
            best = ref
    return best


def find_newest(state_dir: Path | None, own_dir: Path | None, job_id: str
                ) -> SnapshotRef | None:
    """The newest snapshot of ``job_id`` in its own directory (:func:`private_dir`) or
    directly in ``state_dir``, where the code before the per-job directories saved it: a
    job evicted to zero across an upgrade resumes instead of starting over. The same checks
    hold for both (this user's private file here, the job's MAC at :func:`load`)."""
    refs = [r for r in (find_latest(own_dir, job_id), find_latest(state_dir, job_id)) if r]
    return max(refs, key=lambda r: r.step, default=None)


def save(state_dir: Path, job_id: str, step: int, payload: dict[str, Any],
         secret: bytes) -> Path:
    """Atomically write ``payload`` (tagged with job id and step, MAC'ed); returns the path."""
    state_dir.mkdir(parents=True, exist_ok=True)
    final = snapshot_path(state_dir, job_id, step)
    # an unpredictable name: in a shared directory another user may plant a guessable one
    tmp = state_dir / f".{final.name}.{secrets.token_hex(8)}.tmp"
    buf = io.BytesIO()
    torch.save(dict(payload, job_id=job_id, step=step), buf)
    body = buf.getvalue()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_MAGIC + _mac(secret, job_id, step, body))
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    remove_older(state_dir, job_id, keep_step=step)
    return final


def remove_older(state_dir: Path, job_id: str, keep_step: int | None) -> None:
    """Delete this job's snapshots older than ``keep_step`` (None: delete all).

    Only older ones: two members that both save (each may be the last holder of the state
    when SIGTERM reaches them while re-forming) must not delete each other's newer file.
    """
    pattern = re.compile(rf"^{re.escape(job_id)}\.step(\d+){re.escape(_SUFFIX)}$")
    if not state_dir.is_dir():
        return
    for entry in os.scandir(state_dir):
        m = pattern.match(entry.name)
        if (m and (keep_step is None or int(m.group(1)) < keep_step)
                and private_file_problem(entry.path) is None):  # never another user's file
            try:
                os.unlink(entry.path)
            except OSError as exc:
                log.warning("could not remove old snapshot %s: %s", entry.path, exc)


def _read_checked(ref: SnapshotRef, job_id: str, secret: bytes) -> bytes:
    """The file's torch body once its MAC holds; ValueError (the reason) otherwise."""
    problem = private_file_problem(ref.path)
    if problem is not None:  # swapped since it was found
        raise ValueError(problem)
    fd = os.open(ref.path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if len(data) < _HEADER_BYTES or not data.startswith(_MAGIC):
        raise ValueError("not a malletrain snapshot (no header)")
    mac, body = data[len(_MAGIC):_HEADER_BYTES], data[_HEADER_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, job_id, ref.step, body)):
        raise ValueError("its MAC does not match: not written by this job, or altered")
    return body


def load(ref: SnapshotRef, job_id: str, secret: bytes) -> dict[str, Any] | None:
    """Read a snapshot; None if unreadable, not MAC'ed by this job, or mis-tagged.

    A rejected file is renamed to ``*.rejected`` so that the next look-up skips it (and a
    person can inspect it).
    """
    payload = None
    try:
        body = _read_checked(ref, job_id, secret)
        payload = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except ValueError as exc:
        reason = f"refused: {exc}"
    except Exception as exc:  # truncated, corrupt, not a torch file: never use it
        reason = f"unreadable: {exc}"
    else:
        ok = isinstance(payload, dict) and (payload.get("job_id"), payload.get("step")) == (
            job_id,
            ref.step,
        )
        reason = "" if ok else "its job id/step tags do not match its name"
    if reason:
        log.warning("rejecting snapshot %s: %s", ref.path, reason)
        with contextlib.suppress(OSError):
            os.replace(ref.path, ref.path.with_name(ref.path.name + ".rejected"))
        return None
    return payload
