"""``malletrain config check [FILE]`` and ``malletrain config show [FILE]``.

``check`` is what an operator runs before ``systemctl reload malletrain``: it validates the
file exactly as the daemon will and prints every problem (file:line: field: what), exit
status 78 (EX_CONFIG) if there is one. ``show`` prints the effective settings, defaults
filled in, as YAML (or JSON), so nobody has to guess what an omitted field means.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from malletrain.ops.config_file import load_settings
from malletrain.ops.settings import DEFAULT_CONFIG_PATH, Settings

log = logging.getLogger(__name__)

#: Environment variable naming the config file when FILE is not given.
CONFIG_ENV = "MALLETRAIN_CONFIG"


def default_config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "config", help="check or show the daemon's configuration",
        description="Validate or display a malletrain configuration file.",
    )
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    help_file = f"config file (default: ${CONFIG_ENV} or {DEFAULT_CONFIG_PATH})"
    check = sub.add_parser("check", help="validate a config file; exit 78 if it is invalid")
    check.add_argument("file", nargs="?", type=Path, help=help_file)
    check.set_defaults(func=_check)
    show = sub.add_parser("show", help="print the effective settings, defaults filled in")
    show.add_argument("file", nargs="?", type=Path, help=help_file)
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    show.add_argument("--defaults", action="store_true", help="ignore FILE; show the defaults")
    show.set_defaults(func=_show)


def _check(args: argparse.Namespace) -> int:
    path = args.file or default_config_path()
    settings = load_settings(path)  # SettingsError -> one clear message, exit 78
    print(f"{path}: ok (policy {settings.allocator.policy}, tick every "
          f"{settings.allocator.tick_interval_s:g} s, metrics "
          f"{settings.metrics.address if settings.metrics.enabled else 'off'})")
    return 0


def _show(args: argparse.Namespace) -> int:
    settings = load_settings(None if args.defaults else (args.file or default_config_path()))
    data = settings_to_dict(settings)
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    return 0


def field_docs() -> dict[str, str]:
    """Every leaf setting as ``"section.field" -> documentation``, in declaration order."""
    out: dict[str, str] = {}
    for sec in dataclasses.fields(Settings):
        cls = typing.get_type_hints(Settings)[sec.name]
        for f in dataclasses.fields(cls):
            out[f"{sec.name}.{f.name}"] = f.metadata["doc"]
    return out


def settings_to_dict(settings: Settings) -> dict[str, Any]:
    """Plain YAML-able data (paths as strings, tuples as lists), e.g. for ``config show``."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    result = plain(settings)
    assert isinstance(result, dict)
    return result
