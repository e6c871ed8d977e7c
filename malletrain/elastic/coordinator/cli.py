"""``malletrain coordinator``: host a standalone membership store.

Runs the elastic jobs' store in its own process, so that it survives a restart or a
``kill -9`` of the daemon (which re-attaches with ``Coordinator.attach``), and so that a user
can run an elastic script by hand without the daemon. Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from malletrain.errors import PermanentError

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "coordinator",
        help="host the membership store of elastic jobs (standalone)",
        description=(
            "Host the authenticated store that elastic workers and the daemon share. Prints "
            "host:port and serves until SIGTERM/SIGINT. With --job-secret, print a job's "
            "secret (for MALLETRAIN_JOB_SECRET) and exit."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    parser.add_argument("--port", type=int, default=29400, help="TCP port (0: pick a free one)")
    parser.add_argument(
        "--key-file", type=Path, required=True,
        help="the master key (created 0600 if missing); every job secret derives from it",
    )
    parser.add_argument("--job-secret", metavar="JOB",
                        help="print JOB's secret (hex) for a coordinator run by hand (the "
                             "daemon's jobs get theirs from the daemon) and exit; keep it "
                             "private")
    parser.add_argument(
        "--open", action="store_true",
        help="serve every job whose secret is proven, without a daemon registering jobs "
             "(a coordinator run by hand with --job-secret; never for the daemon's)")
    parser.add_argument(
        "--address-file",
        type=Path,
        help="write host:port to this file once listening (atomically; for port 0)",
    )
    parser.set_defaults(func=run)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # 0600 whatever the umask: it sits beside the daemon's database (issue 49)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port < 65536:
        raise PermanentError(f"--port {args.port}: must be between 0 and 65535")
    from malletrain.elastic.coordinator import keyfile
    from malletrain.elastic.protocol import wire

    master = keyfile.ensure_key(args.key_file)
    if args.job_secret is not None:
        try:
            print(wire.job_secret(master, args.job_secret).hex())
        except ValueError as exc:
            raise PermanentError(f"--job-secret: {exc}") from None
        return 0
    # Import here: `malletrain --help` must not pay for importing the server.
    from malletrain.elastic.coordinator.handle import serve

    try:  # no session of its own: the realm and the jobs are the daemon's to say
        server, host = serve(args.host, args.port, master, open_jobs=args.open)
    except RuntimeError as exc:
        raise PermanentError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    address = f"{host}:{server.port}"
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("coordinator: signal %d, stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if args.address_file is not None:
        _write_atomic(args.address_file, address + "\n")
    print(address, flush=True)
    while not stop.wait(1.0):
        pass
    server.close()
    sys.stdout.flush()
    return 0
