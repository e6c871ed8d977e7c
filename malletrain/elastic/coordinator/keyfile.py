"""The coordinator's master key on disk: created private, refused unless it still is.

Every job secret derives from this key (:mod:`.wire`), so whoever reads it can join any job.
It is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` with mode 0600, and every read opens it
``O_NOFOLLOW|O_NONBLOCK`` and checks the OPENED descriptor (``fstat``: a regular file of this
process's user with no group or other bits, so nothing can be swapped in between a check and
the open), holding 64 hex digits. Anything else is a clear error, never a silent fallback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.private import stat_problem
from malletrain.errors import ConfigError


def read_key(path: Path) -> bytes:
    if not os.path.lexists(path):
        raise ConfigError(f"key file {path}: does not exist")
    try:  # O_NONBLOCK: a FIFO put in its place does not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        why = ("not a regular file (a link?)" if exc.errno == errno.ELOOP
               else f"cannot open it ({exc.strerror})")
        raise ConfigError(f"key file {path}: {why}") from None
    with os.fdopen(fd) as f:
        problem = stat_problem(os.fstat(fd))
        if problem is not None:
            raise ConfigError(f"key file {path}: {problem}")
        text = f.read(200)
    try:
        return wire.parse_secret(text)
    except ValueError as exc:
        raise ConfigError(f"key file {path}: {exc}") from None


def create_key(path: Path) -> bytes:
    """Write a new random key (fails if the file exists: never overwrite a key in use)."""
    key = os.urandom(wire.SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def ensure_key(path: Path) -> bytes:
    """The key in ``path``, created first if there is none."""
    if not os.path.lexists(path):
        try:
            return create_key(path)
        except FileExistsError:  # created by another process meanwhile
            pass
    return read_key(path)
