"""``malletrain nodes``: every node with its state, partitions and predicted idle window.

Like ``sinfo -N``, plus what malletrain adds: for an idle node, how many seconds it is
predicted to stay idle (until the earliest planned start of a pending job planned onto it,
or the start of a reservation covering it), or ``unbounded`` when nothing is planned.

``--json`` prints a list of objects: ``name``, ``state``, ``flags``, ``partitions``, ``idle``
(usable now), ``idle_window_s`` (seconds; ``null`` = unbounded; ``0`` for a node that is not
idle), ``claimed_by`` (``"job 42"``/``"reservation maint"``/``null``), ``claim_start_at``
(epoch s or ``null``), ``reason``, ``switch`` (leaf switch or ``null``) and ``type`` (the GPU
model of its GRES, ``""`` without GPUs: ``core.scavenger.node_type``).  Errors (Slurm
down, a client missing, output that does not parse) print one line and exit non-zero (75 =
try again later).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from malletrain.core.cluster import ClusterSnapshot
from malletrain.core.scavenging.scavenger import NodeWindow, node_windows
from malletrain.slurm.backend import DEFAULT_TIMEOUT_S
from malletrain.slurm.select import select_backend

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "nodes",
        help="list nodes with their predicted idle window",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument(
        "--partition", "-p", action="append", default=None, metavar="NAME",
        help="only nodes in this partition (repeatable; default: all nodes)",
    )
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=f"give up on Slurm after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    p.set_defaults(func=run)


def rows(
    snapshot: ClusterSnapshot, now: float, partitions: list[str] | None
) -> list[dict[str, Any]]:
    """The JSON objects, one per node (pure, for tests and the daemon's API)."""
    reasons = {n.name: n.reason for n in snapshot.nodes}
    return [_row(w, reasons.get(w.name, "")) for w in node_windows(
        snapshot, now, partitions=partitions)]


def _row(w: NodeWindow, reason: str) -> dict[str, Any]:
    return {
        "name": w.name,
        "state": w.state.value,
        "flags": sorted(w.flags),
        "partitions": list(w.partitions),
        "idle": w.idle,
        "idle_window_s": None if w.window_s is None else round(w.window_s),
        "claimed_by": w.claim.by if w.claim else None,
        "claim_start_at": w.claim.start_at if w.claim else None,
        "reason": reason,
        "switch": w.switch,
        "type": w.node_type,
    }


def format_table(objs: list[dict[str, Any]]) -> str:
    header = ("NODE", "STATE", "FLAGS", "PARTITIONS", "SWITCH", "TYPE", "IDLE_WINDOW", "UNTIL")
    lines = [header]
    for o in objs:
        if not o["idle"]:
            window = "-"
        elif o["idle_window_s"] is None:
            window = "unbounded"
        else:
            window = f"{o['idle_window_s']} s"
        lines.append((
            o["name"], o["state"], ",".join(o["flags"]) or "-", ",".join(o["partitions"]) or "-",
            o["switch"] or "-", o["type"] or "-", window,
            (o["claimed_by"] or "-") if o["idle"] else "-",
        ))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in lines
    )


def run(args: argparse.Namespace) -> int:
    backend = select_backend(timeout_s=args.timeout)
    snapshot = backend.snapshot()
    for warning in snapshot.warnings:
        print(f"malletrain nodes: warning: {warning}", file=sys.stderr)
    objs = rows(snapshot, snapshot.taken_at, args.partition)
    if args.json:
        print(json.dumps(objs, indent=1))
    else:
        print(format_table(objs))
    return 0
