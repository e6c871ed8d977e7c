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
names the release and the field (:mod:`malletrain.slurm.shapes`).
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

_COMMON: Mapping[str, tuple[str, ...]] = {
    # --states=all: 23.02+ honour squeue's default filter in JSON too, which hides ended
    # jobs (an ended slot job would look gone instead of ended); 22.05 ignores it.
    "squeue_json": ("squeue", "--all", "--states=all", "--json"),
    "partitions": ("scontrol", "show", "partition", "-o"),
    "reservations": ("scontrol", "show", "reservation", "-o"),
    "planned": ("squeue", "--all", "--noheader", "--states=PENDING", "--format=%A %S %Y"),
    "topology": ("scontrol", "show", "topology"),
}


def snapshot_commands(release: Release) -> dict[str, tuple[str, ...]]:
    """The batched calls of one tick on ``release``, in the order results are checked.

    ``--json`` ignores filters in 22.05 and honours them from 23.02: only ``--states=all``
    is given (the daemon needs ended jobs), no partition or node filter.
    """
    if release < OLDEST:
        raise SlurmParseError(
            f"Slurm {release} is older than the oldest release malletrain reads ({OLDEST})"
        )
    nodes = (("scontrol", "show", "nodes", "--json") if release >= NODES_FROM_SCONTROL
             else ("sinfo", "--json"))
    return {"nodes_json": nodes, **_COMMON}


def support_note(release: Release) -> str | None:
    """A line for the log when ``release`` is not one the tests cover, else ``None``."""
    if release in TESTED:
        return None
    tested = ", ".join(str(r) for r in TESTED)
    return (f"Slurm {release} is not among the tested releases ({tested}); output of a "
            "shape malletrain does not know is refused with an error, never guessed")
