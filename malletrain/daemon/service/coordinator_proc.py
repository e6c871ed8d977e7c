"""The coordinator as a process of its own, beside the daemon (started, found, stopped).

The coordinator (the membership store the workers talk to) runs as a SEPARATE process,
started detached by the daemon when none answers at the configured address, so that a
``kill -9`` of the daemon does not touch training: the workers keep stepping, and the
restarted daemon attaches to the same coordinator and carries on.

Both read the master key from ``coordinator.key`` beside the database (0600, created by
whichever starts first). Job secrets are also derived in the database's *realm*
(:mod:`malletrain.elastic.protocol.wire`), which the daemon's session sets in the coordinator.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from malletrain.daemon.jobs.store_files import write_private
from malletrain.errors import PermanentError, RetryableError
from malletrain.ops.settings import Settings

log = logging.getLogger(__name__)
#: the daemon's live jobs: (id, the owner's uid), or bare ids
LiveJobs = Callable[[], Iterable[str | tuple[str, int]]]


def coordinator_files(settings: Settings) -> tuple[Path, Path, Path]:
    base = settings.state.database_path.parent
    return base / "coordinator.addr", base / "coordinator.pid", base / "coordinator.log"


def key_file(settings: Settings) -> Path:
    return settings.state.database_path.parent / "coordinator.key"


def ensure_coordinator(settings: Settings, realm: str, timeout_s: float = 60.0,
                       live_jobs: LiveJobs | None = None) -> Any:
    """Attach to the running coordinator, or start one detached and attach to it.

    ``live_jobs``: the daemon's live job ids, admitted again at every (re)connection (a
    restarted coordinator serves no job until then). What answers at the address is
    trusted only once it proved the key: a refusal is not proven (another user's process
    may hold the port while the coordinator is down), so it is retryable, never permanent.
    A coordinator with an old key is restarted only if the pid file names a process of
    this account running ``malletrain coordinator`` with this key file
    (:func:`our_coordinator_pid`); anything else is reported, never signalled.
    """
    from malletrain.elastic.coordinator.handle import Coordinator, CoordinatorKeyMismatch
    from malletrain.elastic.coordinator.keyfile import ensure_key

    addr_file, pid_file, _ = coordinator_files(settings)
    addr_file.parent.mkdir(parents=True, exist_ok=True)
    master = ensure_key(key_file(settings))
    candidates = []
    if addr_file.exists():
        candidates.append(addr_file.read_text().strip())
    if settings.coordinator.port:
        candidates.append(f"{settings.coordinator.host}:{settings.coordinator.port}")
    for address in candidates:
        try:
            coord = Coordinator.attach(address, master, timeout_s=2.0, realm=realm,
                                       live_jobs=live_jobs)
            log.info("attached to the running coordinator at %s", address)
            return coord
        except CoordinatorKeyMismatch as exc:
            if our_coordinator_pid(settings) is None:
                raise RetryableError(
                    f"{exc}; {pid_file} names no coordinator of this account, so it is not "
                    f"restarted: if it is malletrain-coordinator.service, restart it so that "
                    f"it reads {key_file(settings)}") from None
            log.warning("the coordinator at %s has an old key; restarting it", address)
            stop_coordinator(settings)
            time.sleep(0.5)
        except (RetryableError, PermanentError) as exc:
            log.info("no coordinator at %s (%s)", address, exc)
    return _start(settings, master, realm, timeout_s, live_jobs)


def _start(settings: Settings, master: bytes, realm: str, timeout_s: float,
           live_jobs: LiveJobs | None) -> Any:
    from malletrain.elastic.coordinator.handle import Coordinator

    addr_file, pid_file, log_file = coordinator_files(settings)
    addr_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "malletrain.cli", "coordinator",
            "--host", settings.coordinator.host, "--port", str(settings.coordinator.port),
            "--key-file", str(key_file(settings)), "--address-file", str(addr_file)]
    # beside the database: the daemon's account's only (0600), whatever the umask
    out_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(out_fd, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    write_private(pid_file, f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RetryableError(f"the coordinator exited at start (see {log_file}; is "
                                 f"another process holding its port?)")
        if addr_file.exists() and addr_file.read_text().strip():
            address = addr_file.read_text().strip()
            log.info("started the coordinator (pid %d) at %s", proc.pid, address)
            return Coordinator.attach(address, master, timeout_s=10.0, realm=realm,
                                      live_jobs=live_jobs)
        time.sleep(0.1)
    raise RetryableError(f"the coordinator did not come up within {timeout_s:.0f} s")


def our_coordinator_pid(settings: Settings) -> int | None:
    """The pid file's pid, if it names a live process of this account whose command line
    is ``... malletrain.cli coordinator ... --key-file <our key file>``; else None (a stale
    pid file, reused by another process or another user's, is never trusted)."""
    _, pid_file, _ = coordinator_files(settings)
    try:
        pid = int(pid_file.read_text().strip())
        proc = Path(f"/proc/{pid}")
        owner = os.stat(proc).st_uid
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    key = str(key_file(settings)).encode()
    if pid <= 1 or owner != os.geteuid() or b"coordinator" not in argv:
        return None
    if b"--key-file" not in argv or argv[argv.index(b"--key-file") + 1:][:1] != [key]:
        return None
    return pid


def stop_coordinator(settings: Settings) -> None:
    """Stop a coordinator started by :func:`ensure_coordinator` (demo/tests; not on restart):
    only the process :func:`our_coordinator_pid` vouches for is signalled."""
    addr_file, pid_file, _ = coordinator_files(settings)
    pid = our_coordinator_pid(settings)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    elif pid_file.exists():
        log.warning("%s names no coordinator of this account: not signalled", pid_file)
    pid_file.unlink(missing_ok=True)
    addr_file.unlink(missing_ok=True)
