"""Slurm releases: which ones are tested, and which commands a tick runs on each.

Slurm's JSON changes shape between releases (data_parser versions, docs/slurm-backend.md):

* 22.05 (openapi v0.0.38): ``sinfo --json`` lists nodes, one object each, with ``state``
  a string and ``state_flags`` a list; times are plain integers.
* 23.02 and later (data_parser v0.0.39 ...): ``sinfo --json`` lists *groups* of nodes
  (partition x state), with no per-node ``last_busy``; the per-node list is
  ``scontrol show nodes --json``, where ``state`` is a list (base state, then flags).
  Times and counts are ``{"set", "infinite", "number"}`` objects; ``job_state`` is a list.

The release is read once per backend (``sinfo --version``: no RPC to slurmctld) and picks
the node command; the parsers accept both shapes and refuse any other with an error that
names the release and the field (:mod:`malletrain.slurm.parsers.shapes`). The daemon reads jobs from
one text job list on every release (:data:`JOB_FIELDS`), never the JSON records: those are
~7.7 KB a job on 24.11, hundreds of MB for a centre's queue.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from malletrain.slurm.errors import SlurmParseError


@dataclass(frozen=True, order=True)
class Release:
    """A Slurm release, major.minor (``24.11``)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Release:
        """From ``sinfo --version`` (``slurm 24.11.5``, ``slurm-wlm 22.05.8``) or ``24.11``."""
        m = re.search(r"(\d+)\.(\d+)", text)
        if not m:
            raise SlurmParseError(f"no Slurm version in {text.strip()[:80]!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}"


#: Releases whose output the golden files and contract tests cover (`make test-slurm-versions`).
TESTED = (Release(22, 5), Release(24, 11), Release(26, 5))
OLDEST = TESTED[0]
#: From this release on, ``scontrol show nodes --json`` exists and ``sinfo --json`` groups.
NODES_FROM_SCONTROL = Release(23, 2)

#: The daemon's job list (every release): per job, the fields Slurm or the site writes,
#: ``|``-separated, then the two a user writes (name, comment), each behind a token drawn
#: afresh for every call. Users may put newlines and separators in a name or a comment
#: (measured: ``--comment=$'a\\n99999|RUNNING|...'`` prints as two lines), which in a plain
#: text format would let one user forge the records of others; they cannot guess the
#: token, and every record starts with it (:mod:`malletrain.slurm.parsers.parse_plain_jobs`).
JOB_FIELDS = ("%A", "%T", "%D", "%l", "%S", "%e", "%V", "%u", "%P", "%N", "%Y", "%r", "%a",
              "%q")
JOBS_PLAIN = ("squeue", "--all", "--states=all", "--noheader")
#: The arrival probe between ticks: the ids of pending jobs, one short text answer.
PENDING_IDS_COMMAND = ("squeue", "--all", "--noheader", "--states=PENDING", "--format=%A")
#: The format travels in squeue's environment, not its argv: another user on the login
#: node can read a process's command line, not its environment.
FORMAT_ENV = "SQUEUE_FORMAT"
#: The GPUs each running job holds and each pending one asks for (``tres-alloc`` prints
#: the request until the job runs; ``gres/gpu=N`` where ``AccountingStorageTRES`` has it,
#: which a ``GrpTRES=gres/gpu=N`` limit needs): only ``--Format`` has that field, so it is
#: a call of its own, each tick only where the site holds a GPU limit on running jobs
#: together (:attr:`~malletrain.core.accounting.SiteLimits.holds_gpus`). Both fields are
#: Slurm's own (no ``|`` or newline): no token is needed.
JOB_GPUS = ("squeue", "--all", "--noheader", "--states=RUNNING,PENDING",
            "--Format=JobID:0|,tres-alloc:0")


def jobs_format(token: str) -> str:
    """The ``SQUEUE_FORMAT`` of the job list for one call's ``token``."""
    return f"{token}{'|'.join(JOB_FIELDS)}{token}%j{token}%k"


#: The daemon's nodes on every tick: each node's name and complete state (base state and
#: flags, ``idle+drain``), one line per node and partition, ~30 bytes a node. The rest of a
#: node's record (partitions, features, GRES, CPUs, reason, last busy) changes when an
#: operator acts, and comes from the JSON node list every ``PERIODIC_S["nodes_json"]``:
#: at 5,000 nodes that list is ~5 MB and its parsing was most of the daemon's own time in a
#: tick (``benchmarks/load.py``). Every tested release's ``sinfo`` prints this format.
NODE_STATES = ("sinfo", "--noheader", "--Node", "--Format=NodeList:0|,StateComplete:0|")

#: What a tick needs that changes only when an operator acts: read every ``PERIODIC_S``.
PERIODIC: Mapping[str, tuple[str, ...]] = {
    "partitions": ("scontrol", "show", "partition", "-o"),
    "reservations": ("scontrol", "show", "reservation", "-o"),
    "topology": ("scontrol", "show", "topology"),
}
#: How old a periodic answer may be: partitions and the topology change with a
#: reconfiguration; a reservation made for now shows at once in the nodes' RESERVED flag,
#: so only the windows before a future one may lag this much.
PERIODIC_S: Mapping[str, float] = {"partitions": 60.0, "reservations": 15.0,
                                   "topology": 300.0, "nodes_json": 60.0}


def periodic(release: Release, daemon: bool = False) -> dict[str, tuple[str, ...]]:
    """The calls kept for their :data:`PERIODIC_S`: for the daemon, the nodes' records too
    (it reads their states each tick, :data:`NODE_STATES`)."""
    if not daemon:
        return dict(PERIODIC)
    return {"nodes_json": _nodes_command(release), **PERIODIC}


def _nodes_command(release: Release) -> tuple[str, ...]:
    return (("sinfo", "--json") if release < NODES_FROM_SCONTROL
            else ("scontrol", "show", "nodes", "--json"))


def snapshot_commands(release: Release, daemon: bool = False) -> dict[str, tuple[str, ...]]:
    """Every call of a full snapshot on ``release``, in the order results are checked.

    Each tick runs the first ones (:func:`every_tick`); :data:`PERIODIC` ones are kept
    for :data:`PERIODIC_S`.
    """
    check_readable(release)
    return {**every_tick(release, daemon), **periodic(release, daemon)}


def check_readable(release: Release) -> None:
    """Refuse a release older than any whose output malletrain reads."""
    if release < OLDEST:
        raise SlurmParseError(
            f"Slurm {release} is older than the oldest release malletrain reads ({OLDEST})"
        )


def every_tick(release: Release, daemon: bool = False) -> dict[str, tuple[str, ...]]:
    """The calls of every tick: two for the daemon, three at most otherwise.

    The daemon (``daemon=True``) reads the nodes' states (:data:`NODE_STATES`; their
    records periodically) and the job list of :data:`JOB_FIELDS`: a JSON job record is
    ~7.7 KB on 24.11, so at 50,000 queued jobs ``squeue --json`` is hundreds of MB and
    took 37-55 s here (10.5 s on 22.05, which ignores every filter with ``--json``), the
    job list 0.4 s. ``malletrain nodes`` reads whole JSON records: on 22.05 with the
    backfill plan from ``squeue -t PENDING -o "%A %S %Y"`` (start and nodes of one pass),
    on 23.02+ with the plan in the record (``scheduled_nodes``).
    """
    nodes = _nodes_command(release)
    if daemon:
        return {"node_states": NODE_STATES, "jobs_plain": JOBS_PLAIN}
    # --states=all: 23.02+ honour squeue's default filter in JSON too, which hides ended
    # jobs (an ended slot job would look gone instead of ended); 22.05 ignores it.
    squeue_json = ("squeue", "--all", "--states=all", "--json")
    if release < NODES_FROM_SCONTROL:
        return {"nodes_json": nodes, "squeue_json": squeue_json,
                "planned": ("squeue", "--all", "--noheader", "--states=PENDING",
                            "--format=%A %S %Y")}
    return {"nodes_json": nodes, "squeue_json": squeue_json}


def support_note(release: Release) -> str | None:
    """A line for the log when ``release`` is not one the tests cover, else ``None``."""
    if release in TESTED:
        return None
    tested = ", ".join(str(r) for r in TESTED)
    return (f"Slurm {release} is not among the tested releases ({tested}); output of a "
            "shape malletrain does not know is refused with an error, never guessed")
