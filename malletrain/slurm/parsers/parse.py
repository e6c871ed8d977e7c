"""Pure parsers: raw Slurm output text (22.05 to 26.05) -> the domain model of
:mod:`malletrain.core.cluster`.

No process is run here; :mod:`malletrain.slurm.cli_backend` collects the texts and the
golden-file tests (``tests/golden/slurm/``, recorded from the real dev cluster) feed these
functions directly (one set per tested release: ``tests/golden/slurm`` is 22.05,
``tests/golden/slurm-24.11`` and ``-26.05`` the others).  The policy, after submitit:

* The shape we rely on is missing (not JSON, no ``nodes`` list, no ``PartitionName``):
  :class:`SlurmParseError` naming the command and the field.  Waiting will not fix it.
* Slurm answered but reported an error in the JSON (``errors`` non-empty: 22.05's
  ``sinfo --json`` and ``squeue --json`` exit 0 with an empty list and an error entry when
  slurmctld is down): :class:`SlurmUnavailableError`, retryable.
* A field the schedule depends on (states, a job's nodes, counts, times) in a shape no
  tested release writes: :class:`SlurmParseError` naming the release, data_parser and field
  (:mod:`malletrain.slurm.parsers.shapes`); never a guess that could misplace work.
* One odd record otherwise (an unknown state name, a cosmetic field of the wrong type, a
  job without an id): a warning string in the snapshot and ``UNKNOWN``/a default/skip,
  never a crash, so one strange node does not blind the daemon; an unknown node state
  is never idle.

Facts these parsers encode (see docs/slurm-backend.md; release differences in
:mod:`malletrain.slurm.versions`):
``--json`` ignores every filter (filter here); ``sinfo --json`` has no partitions
(``scontrol show partition -o``) and ``squeue --json`` has no planned nodes of pending jobs
(``squeue -h -t PENDING -o "%A %S %Y"``); leaf switches come from ``scontrol show topology``;
time limits are minutes, times epoch seconds, 0 means unset; ``scontrol`` prints local time
``YYYY-MM-DDTHH:MM:SS``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from malletrain.core.cluster import ClusterSnapshot, Job, Node
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.parsers import shapes
from malletrain.slurm.parsers.parse_json import parse_nodes_json, parse_squeue_json
from malletrain.slurm.parsers.parse_plain_jobs import RecordMemo, parse_jobs_plain
from malletrain.slurm.parsers.parse_states import merge_node_states, parse_node_states
from malletrain.slurm.parsers.parse_text import (
    parse_job_gpus,
    parse_partitions,
    parse_planned,
    parse_reservations,
    parse_topology,
)
from malletrain.slurm.versions import Release

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotTexts:
    """The raw outputs of one tick's batched calls (what the golden files hold)."""

    #: 22.05: ``sinfo --json``; 23.02+: ``scontrol show nodes --json`` (:mod:`.versions`).
    nodes_json: str
    partitions: str
    reservations: str
    #: Whole JSON job records (``malletrain nodes``; the daemon reads ``jobs_plain``).
    squeue_json: str = ""
    #: 22.05's backfill plan beside ``squeue_json`` (``squeue -t PENDING -o "%A %S %Y"``).
    planned: str = ""
    #: ``scontrol show topology`` (empty without a topology plugin).
    topology: str = ""
    #: The daemon's job list and the token of its call (:mod:`.parse_plain_jobs`).
    jobs_plain: str = ""
    jobs_token: str = ""
    #: The daemon's node states of this tick, laid over ``nodes_json`` (:mod:`.parse_states`).
    node_states: str = ""
    #: The jobs' GPUs (:data:`~malletrain.slurm.versions.JOB_GPUS`), where they are read.
    job_gpus: str = ""

    @classmethod
    def read_dir(cls, directory: Path, daemon: bool = False) -> SnapshotTexts:
        """The texts of one recorded tick (slurm/record-golden's :data:`GOLDEN_FILES`):
        the daemon's form (the job list) or ``malletrain nodes``' (JSON job records)."""
        jobs = ("jobs_plain", "jobs_token") if daemon else ("squeue_json", "planned")
        files = {k: v for k, v in GOLDEN_FILES.items()
                 if k not in ("jobs_plain", "jobs_token", "squeue_json", "planned") or k in jobs}
        return cls(**{field: (directory / name).read_text()
                      for field, name in files.items() if (directory / name).exists()})


#: The file slurm/record-golden writes for each field of :class:`SnapshotTexts`.
GOLDEN_FILES = {
    "nodes_json": "nodes.json", "squeue_json": "squeue.json",
    "partitions": "partitions.txt", "reservations": "reservations.txt",
    "planned": "planned.txt", "topology": "topology.txt", "jobs_plain": "jobs.txt",
    "jobs_token": "jobs.token", "node_states": "node_states.txt",
}
#: The job list's token in the golden files (the backend draws a new one for every call).
GOLDEN_TOKEN = "golden0token0golden0token"


# ----------------------------------------------------------------------------- JSON helpers


def slurm_version(text: str) -> str | None:
    """``"22.05"`` from the ``meta`` of a JSON answer of any tested release, or ``None``."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        return str(Release.parse(shapes.source_of(data, "").release))
    except SlurmParseError:  # "unknown release": no meta
        return None


# ----------------------------------------------------------------------------- snapshot

T = TypeVar("T")
#: the last two parses of each periodic answer (partitions, reservations, topology, the
#: nodes' records): the same text comes back every tick until its period ends, and
#: re-parsing the topology of 5,000 nodes each tick cost the daemon ~25 ms
#: (``benchmarks/load.py``). Two: a new answer parsed off the tick (slurm/refresh.py) and
#: the one the ticks use until they take it.
_LAST_PARSE: dict[Callable[..., Any], list[tuple[tuple[str, ...], Any, tuple[str, ...]]]] = {}


def _periodic(parse: Callable[..., T], warns: list[str], *texts: str) -> T:
    """``parse(*texts, warns)``, answered from an earlier call when the texts are the same
    (the same objects, mostly: the backend hands its kept answer back every tick)."""
    entries = _LAST_PARSE.get(parse, [])
    for seen, result, seen_warns in entries:
        if seen == texts:
            warns.extend(seen_warns)
            return cast(T, result)
    mine: list[str] = []
    parsed = parse(*texts, mine)
    _LAST_PARSE[parse] = [(texts, parsed, tuple(mine)), *entries[:1]]
    warns.extend(mine)
    return parsed


def check_periodic(texts: Mapping[str, str]) -> None:
    """Parse the daemon's periodic answers (by key) as its tick will, raising on an odd one;
    run where they are read off the tick, it leaves the tick a memo hit."""
    warns: list[str] = []
    if "nodes_json" in texts and "topology" in texts:  # the records: read at the tick when
        _periodic(_node_records, warns, texts["nodes_json"], texts["topology"])  # missing
    for key, parse in (("partitions", parse_partitions), ("reservations", parse_reservations)):
        if key in texts:
            _periodic(parse, warns, texts[key])


def _node_records(nodes_json: str, topology: str, warns: list[str]) -> tuple[Node, ...]:
    """The JSON node list with each node's switch (the topology's warnings aside)."""
    return parse_nodes_json(nodes_json, warns, switches=parse_topology(topology, []))


def with_gpus(jobs: tuple[Job, ...], gpus: Mapping[int, int]) -> tuple[Job, ...]:
    """The jobs with the GPUs read for them (a job the GPU list misses, one that started
    between the two calls, counts none this tick)."""
    return tuple(replace(j, gpus=gpus[j.job_id]) if j.job_id in gpus else j for j in jobs)


def build_snapshot(taken_at: float, texts: SnapshotTexts,
                   memo: RecordMemo | None = None) -> ClusterSnapshot:
    """One :class:`ClusterSnapshot` from one tick's outputs (pure; golden-file tested);
    ``memo`` keeps the job list's records between ticks (:class:`RecordMemo`)."""
    warns: list[str] = []
    if texts.node_states:  # the daemon: records read periodically, states every tick
        records = _periodic(_node_records, warns, texts.nodes_json, texts.topology)
        nodes = merge_node_states(records, parse_node_states(texts.node_states, warns), warns)
    else:
        switches = _periodic(parse_topology, warns, texts.topology)
        nodes = parse_nodes_json(texts.nodes_json, warns, switches=switches)
    if texts.squeue_json:
        jobs = parse_squeue_json(texts.squeue_json, parse_planned(texts.planned, warns), warns)
    else:
        jobs = parse_jobs_plain(texts.jobs_plain, texts.jobs_token, warns, memo)
    if texts.job_gpus:
        jobs = with_gpus(jobs, parse_job_gpus(texts.job_gpus, warns))
    partitions = _periodic(parse_partitions, warns, texts.partitions)
    reservations = _periodic(parse_reservations, warns, texts.reservations)
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
