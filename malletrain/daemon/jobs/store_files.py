"""The state database's files: the daemon's alone, whatever the umask it was started with.

The database holds every job's spec (the user's environment variables included) and its
owner; its WAL and shared-memory files hold the same pages. Created under a umask of 0022
(the packaged unit's, a shell's) they were 0644: any local user could read them where the
directory was open (a hand-made install, the dev stack; issue 49). Here the database file
is created 0600 before SQLite opens it (SQLite gives its WAL and SHM files the database's
mode), a directory made for it is 0700, and files of an older release are narrowed to 0600.
An existing directory keeps its mode: it may hold things other users must reach (the dev
stack's submit socket), and systemd's ``StateDirectoryMode`` sets it in the unit.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

#: the database's companions SQLite creates beside it
SIDE_FILES = ("-wal", "-shm", "-journal")

log = logging.getLogger(__name__)


def prepare_private(path: Path) -> None:
    """Make ``path`` (a database file) and its directory private before SQLite opens it."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(parent, 0o700)  # mkdir's mode passes through the umask
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        _narrow(fd)
    finally:
        os.close(fd)
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        try:
            fd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        try:
            _narrow(fd)
        finally:
            os.close(fd)


def _narrow(fd: int) -> None:
    """0600 for a regular file of ours with more bits (an older release's 0644)."""
    st = os.fstat(fd)
    if (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and stat.S_IMODE(st.st_mode) != 0o600):
        os.fchmod(fd, 0o600)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` created 0600 (or narrowed to it), never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        _narrow(f.fileno())
        f.write(text)


def instance_id(path: Path) -> str:
    """This installation's id, kept in ``path`` beside the database (the daemon's only)."""
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_hex(4)
    write_private(path, token + "\n")
    return token


def prepare_state_dir(state_dir: Path) -> None:
    """The shared snapshot directory, sticky and writable by the jobs' users like /tmp.
    Its mode is set on the directory itself, opened ``O_NOFOLLOW``, and only if it is the
    daemon's own: a link put in its place never makes its target world-writable."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise OSError(f"{state_dir} is not the daemon's own directory")
            os.fchmod(fd, 0o1777)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("cannot prepare %s for evicted-job state: %s", state_dir, exc)
