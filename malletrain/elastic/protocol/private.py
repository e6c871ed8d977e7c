"""The one check a private file must pass before it is used (the master key, snapshots).

A file is private when ``lstat`` (never following a link) shows a regular file owned by this
process's user with no group or other permission bits: nobody else can have written, swapped
or read it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def private_file_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a private file of this user, or None if it is one."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot stat it ({exc.strerror})"
    return stat_problem(st)


def stat_problem(st: os.stat_result) -> str | None:
    """Why what ``st`` describes is not a private file of this user (use it on ``fstat``
    of the descriptor that is then read, so that nothing is swapped in between)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a link?)"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return (f"mode {stat.S_IMODE(st.st_mode):o} lets others read or write it; "
                "it must be 0600")
    return None
