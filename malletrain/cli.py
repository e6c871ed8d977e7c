"""The ``malletrain`` command line.

Each subcommand lives in its own module that exposes ``register(subparsers)``; the
module adds its parser and sets ``func`` (``args -> exit code``) as a default.  The
modules are imported lazily by name so that ``malletrain nodes`` does not pay for
importing torch or the simulator.

Errors meant for users derive from :class:`malletrain.errors.UserError` and are
printed as one line, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from malletrain import __version__
from malletrain.errors import UserError

log = logging.getLogger(__name__)

#: (subcommand, module that registers it). Add a line here to add a subcommand.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("nodes", "malletrain.slurm.cli_nodes"),
    ("simulate", "malletrain.sim.cli_simulate"),
    ("coordinator", "malletrain.elastic.coordinator.cli"),
    ("daemon", "malletrain.daemon.service.cli_daemon"),
    ("submit", "malletrain.daemon.submit.cli_user"),
    ("jobs", "malletrain.daemon.submit.cli_user"),
    ("cancel", "malletrain.daemon.submit.cli_user"),
    ("config", "malletrain.ops.cli_config"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="malletrain",
        description="Scavenge idle Slurm nodes for malleable deep-learning training.",
    )
    parser.add_argument("--version", action="version", version=f"malletrain {__version__}")
    parser.add_argument(
        "--log-level", default="WARNING", help="log level for this command (default WARNING)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    registered: set[str] = set()
    for _name, module_name in SUBCOMMANDS:
        if module_name in registered:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # that subcommand is not built yet
        module.register(sub)
        registered.add(module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except UserError as exc:
        print(f"malletrain {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
