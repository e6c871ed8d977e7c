"""``malletrain daemon --config FILE``: run the scavenging daemon in the foreground.

systemd runs it as ``Type=notify`` (configs/malletrain.service); the demo and the e2e tests
run it as a plain child process. Bad configuration is one clear line, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "daemon", help="run the scavenging daemon (observe -> decide -> act on Slurm)",
        description="Run the malletrain daemon in the foreground until SIGTERM/SIGINT; "
                    "SIGHUP reloads the config between ticks.",
    )
    p.add_argument("--config", default=None,
                   help="YAML config (default: built-in defaults; see configs/malletrain.yaml)")
    p.add_argument("--place-timeout", type=float, default=None,
                   help="seconds a released slot may stay pending before it is held again")
    p.add_argument("--publish-batch", type=float, default=None,
                   help="seconds newcomers of a job wait for each other before joining")
    p.set_defaults(func=cmd_daemon)


def cmd_daemon(args: argparse.Namespace) -> int:
    from malletrain.daemon.service.loop import run_daemon
    from malletrain.ops.config_file import load_settings
    from malletrain.ops.logs import configure_logging
    from malletrain.slurm.select import select_backend

    settings = load_settings(args.config)
    configure_logging(settings.logging.level, settings.logging.format, exclusive=True)
    env = dict(os.environ)
    if settings.slurm.slurm_conf is not None:
        env["SLURM_CONF"] = str(settings.slurm.slurm_conf)
    backend = select_backend(env=env, timeout_s=settings.slurm.command_timeout_s,
                             daemon=True)
    overrides = {}
    if args.place_timeout is not None:
        overrides["place_timeout_s"] = args.place_timeout
    if args.publish_batch is not None:
        overrides["publish_batch_s"] = args.publish_batch
    return run_daemon(settings, args.config, backend, decide_overrides=overrides)
