"""Pure parsers: raw Slurm 22.05 output text -> the domain model of :mod:`malletrain.core.cluster`.

No process is run here; :mod:`malletrain.slurm.cli_backend` collects the texts and the
golden-file tests (``tests/golden/slurm/``, recorded from the real dev cluster) feed these
functions directly.  The policy, after submitit:

* The shape we rely on is missing (not JSON, no ``nodes`` list, no ``PartitionName``):
  :class:`SlurmParseError` naming the command and the field.  Waiting will not fix it.
* Slurm answered but reported an error in the JSON (``errors`` non-empty: 22.05's
  ``sinfo --json`` and ``squeue --json`` exit 0 with an empty list and an error entry when
  slurmctld is down): :class:`SlurmUnavailableError`, retryable.
* One odd record (an unknown state, a field of the wrong type, a job without an id): a
  warning string in the snapshot and ``UNKNOWN``/a default/skip, never a crash, so one
  strange node does not blind the daemon.

Facts of 22.05 these parsers encode (see docs/slurm-backend.md):
``--json`` ignores every filter (filter here); ``sinfo --json`` has no partitions
(``scontrol show partition -o``) and ``squeue --json`` has no planned nodes of pending jobs
(``squeue -h -t PENDING -o "%A %S %Y"``); leaf switches come from ``scontrol show topology``;
time limits are minutes, times epoch seconds, 0 means unset; ``scontrol`` prints local time
``YYYY-MM-DDTHH:MM:SS``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass

from malletrain.core.cluster import (
    ClusterSnapshot,
)
from malletrain.slurm.parse_json import parse_sinfo_json, parse_squeue_json
from malletrain.slurm.parse_text import (
    parse_partitions,
    parse_planned,
    parse_reservations,
    parse_topology,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotTexts:
    """The raw outputs of one tick's batched calls (what the golden files hold)."""

    sinfo_json: str
    squeue_json: str
    partitions: str
    reservations: str
    planned: str
    #: ``scontrol show topology`` (empty without a topology plugin).
    topology: str = ""


# ----------------------------------------------------------------------------- JSON helpers


def slurm_version(text: str) -> str | None:
    """``"22.05"`` from the ``meta`` of ``sinfo --json`` / ``squeue --json``, or ``None``."""
    try:
        data = json.loads(text)
        version = data["meta"]["Slurm"]["version"]
        return f"{int(version['major'])}.{int(version['minor']):02d}"
    except (ValueError, KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------- nodes


# ----------------------------------------------------------------------------- jobs


# ----------------------------------------------------------------------------- scontrol -o


# ----------------------------------------------------------------------------- snapshot


def build_snapshot(taken_at: float, texts: SnapshotTexts) -> ClusterSnapshot:
    """One :class:`ClusterSnapshot` from one tick's outputs (pure; golden-file tested)."""
    warns: list[str] = []
    nodes = parse_sinfo_json(texts.sinfo_json, warns)
    planned = parse_planned(texts.planned, warns)
    jobs = parse_squeue_json(texts.squeue_json, planned, warns)
    partitions = parse_partitions(texts.partitions, warns)
    reservations = parse_reservations(texts.reservations, warns)
    switches = parse_topology(texts.topology, warns)
    if switches:
        nodes = tuple(
            dataclasses.replace(n, switch=switches[n.name]) if n.name in switches else n
            for n in nodes
        )
    for w in warns:
        log.debug("snapshot warning: %s", w)
    return ClusterSnapshot(
        taken_at=taken_at,
        nodes=nodes,
        partitions=partitions,
        jobs=jobs,
        reservations=reservations,
        warnings=tuple(warns),
    )
