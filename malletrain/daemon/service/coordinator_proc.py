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
from pathlib import Path
from typing import Any

from malletrain.daemon.jobs.store_files import write_private
from malletrain.errors import PermanentError, RetryableError
from malletrain.ops.settings import Settings

log = logging.getLogger(__name__)


def coordinator_files(settings: Settings) -> tuple[Path, Path, Path]:
    base = settings.state.database_path.parent
    return base / "coordinator.addr", base / "coordinator.pid", base / "coordinator.log"


def key_file(settings: Settings) -> Path:
    return settings.state.database_path.parent / "coordinator.key"


def ensure_coordinator(settings: Settings, realm: str, timeout_s: float = 60.0) -> Any:
    """Attach to the running coordinator, or start one detached and attach to it.

    A coordinator this daemon started that has another key (the key file was replaced) is
    stopped and started again; one started otherwise (systemd) is reported.
    """
    from malletrain.elastic.coordinator.handle import Coordinator, CoordinatorKeyMismatch
    from malletrain.elastic.coordinator.keyfile import ensure_key

    addr_file, pid_file, log_file = coordinator_files(settings)
    addr_file.parent.mkdir(parents=True, exist_ok=True)
    master = ensure_key(key_file(settings))
    candidates = []
    if addr_file.exists():
        candidates.append(addr_file.read_text().strip())
    if settings.coordinator.port:
        candidates.append(f"{settings.coordinator.host}:{settings.coordinator.port}")
    for address in candidates:
        try:
            coord = Coordinator.attach(address, master, timeout_s=2.0, realm=realm)
            log.info("attached to the running coordinator at %s", address)
            return coord
        except CoordinatorKeyMismatch as exc:
            if not pid_file.exists():
                raise PermanentError(f"{exc}: restart it (malletrain-coordinator.service) so "
                                     f"that it reads {key_file(settings)}") from None
            log.warning("the coordinator at %s has an old key; restarting it", address)
            stop_coordinator(settings)
            time.sleep(0.5)
        except (RetryableError, PermanentError) as exc:
            log.info("no coordinator at %s (%s)", address, exc)
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
            raise PermanentError(f"the coordinator exited at start (see {log_file})")
        if addr_file.exists() and addr_file.read_text().strip():
            address = addr_file.read_text().strip()
            log.info("started the coordinator (pid %d) at %s", proc.pid, address)
            return Coordinator.attach(address, master, timeout_s=10.0, realm=realm)
        time.sleep(0.1)
    raise RetryableError(f"the coordinator did not come up within {timeout_s:.0f} s")


def stop_coordinator(settings: Settings) -> None:
    """Stop a coordinator started by :func:`ensure_coordinator` (demo/tests; not on restart)."""
    addr_file, pid_file, _ = coordinator_files(settings)
    if pid_file.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        pid_file.unlink(missing_ok=True)
    addr_file.unlink(missing_ok=True)
