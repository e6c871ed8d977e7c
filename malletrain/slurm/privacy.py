"""Who may see whose jobs, as the site's Slurm says (``PrivateData``, SlurmUser, admin levels).

A centre that sets ``PrivateData=jobs`` has decided that users do not see each other's jobs;
malletrain's ``malletrain jobs`` and metrics follow it instead of showing every job to every
user. Operators (root, the SlurmUser, accounts with Slurm's Operator or Administrator admin
level) see all, as with ``squeue``.

Read from ``scontrol show config`` and ``sacctmgr -nP show user format=user,adminlevel``; the
parsers are pure. When the admin levels cannot be read (no accounting), only root and the
SlurmUser are operators: the safe side.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

CONFIG_COMMAND = ("scontrol", "show", "config")
ADMIN_LEVELS_COMMAND = ("sacctmgr", "-nP", "show", "user", "format=user,adminlevel")


@dataclass(frozen=True)
class Privacy:
    #: ``PrivateData`` includes ``jobs``: a user sees only their own jobs
    private_jobs: bool = False
    #: user names that see every job whatever ``PrivateData`` says (root is always one)
    operators: frozenset[str] = frozenset({"root"})

    def sees_all(self, user: str, uid: int) -> bool:
        return not self.private_jobs or uid == 0 or user in self.operators


def parse_config(text: str) -> tuple[frozenset[str], str | None]:
    """``scontrol show config`` -> (the PrivateData words, the SlurmUser name)."""
    private: frozenset[str] = frozenset()
    slurm_user = None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "PrivateData":
            words = {w.strip().lower() for w in value.split(",") if w.strip()}
            private = frozenset(words - {"none", "(null)"})
        elif key == "SlurmUser":
            slurm_user = value.split("(", 1)[0].strip() or None
    return private, slurm_user


def parse_admin_levels(text: str) -> frozenset[str]:
    """``sacctmgr -nP show user format=user,adminlevel`` -> users at Operator or above."""
    out = set()
    for line in text.splitlines():
        user, sep, level = line.strip().partition("|")
        if sep and level.strip().lower() in ("operator", "administrator"):
            out.add(user.strip())
    return frozenset(out)


def read_privacy(run: Callable[[tuple[str, ...]], str]) -> Privacy:
    """Ask Slurm (``run`` returns a command's stdout or raises); the config is required."""
    private, slurm_user = parse_config(run(CONFIG_COMMAND))
    operators = {"root"} | ({slurm_user} if slurm_user else set())
    try:
        operators |= parse_admin_levels(run(ADMIN_LEVELS_COMMAND))
    except Exception as exc:  # no accounting: root and the SlurmUser only
        log.info("no Slurm admin levels (%s): operators are root and the SlurmUser", exc)
    return Privacy(private_jobs="jobs" in private, operators=frozenset(operators))


class PrivacyCache:
    """The last good :class:`Privacy`, read again at most every ``ttl_s``.

    A failed read keeps the last good answer; before the first good one, jobs are private
    (only root sees other users' jobs): an outage of slurmctld never shows more than allowed.
    Only the first read is made by the caller; later ones run on a thread of their own
    while callers get the last answer: the daemon's tick asks every tick, and two Slurm
    calls every minute on the tick's thread were its slowest ticks (``benchmarks/load.py``).
    """

    def __init__(self, read: Callable[[], Privacy], ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value = Privacy(private_jobs=True)
        self._read_at: float | None = None
        self._refreshing: threading.Thread | None = None

    def get(self) -> Privacy:
        with self._lock:
            now = self._clock()
            if self._refreshing is not None or (
                    self._read_at is not None and now - self._read_at < self._ttl_s):
                return self._value
            first = self._read_at is None
            self._read_at = now
            if not first:
                self._refreshing = threading.Thread(target=self._refresh, daemon=True,
                                                    name="privacy-read")
                self._refreshing.start()
                return self._value
        self._refresh()  # the first answer: nothing to show meanwhile but the safe side
        with self._lock:
            return self._value

    def settle(self, timeout_s: float | None = None) -> None:
        """Wait for a read in flight (tests, shutdown)."""
        thread = self._refreshing
        if thread is not None:
            thread.join(timeout_s)

    def _refresh(self) -> None:
        value: Privacy | None = None
        try:
            value = self._read()
        except Exception as exc:
            log.warning("cannot read Slurm's PrivateData (%s); keeping the last "
                        "answer (jobs private before a first one)", exc)
        with self._lock:
            if value is not None:
                self._value = value
            self._refreshing = None
