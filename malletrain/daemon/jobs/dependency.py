"""sbatch's ``--dependency`` between malleable jobs, parsed as Slurm parses it (pure; the
tick judges it: :mod:`malletrain.daemon.tick.waiting`).

``afterok:m12:m13,afterany:m9`` (every condition) or ``afterok:m12?afternotok:m12`` (any
one); ``after:ID[+minutes]``, ``afterany``, ``afterok``, ``afternotok`` and ``singleton``
as Slurm defines them. An id is a malleable job's: ``m12``, or ``12`` (a batch shell's
``$SLURM_JOB_ID`` is the job's number). A job whose dependency can never be satisfied
(``afterok`` on a job that failed) fails with that reason, where Slurm would leave it
pending for ever; a job no longer in the store counts as ended (as Slurm treats a purged
one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("after", "afterany", "afterok", "afternotok", "singleton")
_UNSUPPORTED = {
    "aftercorr": "array task to array task dependencies are not supported",
    "afterburstbuffer": "burst buffers are not used by malleable jobs",
    "aftershard": "not supported",
}
_ID = re.compile(r"^m?([1-9][0-9]{0,11})(?:\+([0-9]{1,6}))?$")
MAX_CONDITIONS = 64


class DependencyError(ValueError):
    """A ``--dependency`` Slurm would refuse, or one malletrain cannot keep."""


@dataclass(frozen=True)
class Condition:
    kind: str
    job_id: str | None = None  # None for singleton
    delay_s: int = 0  # ``after:ID+minutes``


@dataclass(frozen=True)
class Dependency:
    conditions: tuple[Condition, ...]
    any_of: bool = False  # ``?``-separated: one satisfied condition is enough

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(c.job_id for c in self.conditions if c.job_id is not None)


def parse_dependency(text: str) -> Dependency:
    """Slurm's grammar: ``TYPE:ID[:ID...]`` joined by ``,`` (all) or ``?`` (any)."""
    if "," in text and "?" in text:
        raise DependencyError(f"--dependency={text}: ',' (all) and '?' (any) cannot be mixed")
    any_of = "?" in text
    conditions: list[Condition] = []
    for clause in text.split("?" if any_of else ","):
        kind, _, ids = clause.strip().partition(":")
        if kind in _UNSUPPORTED:
            raise DependencyError(f"--dependency={text}: {kind}: {_UNSUPPORTED[kind]}")
        if kind not in KINDS:
            raise DependencyError(f"--dependency={text}: {kind!r} is not one of "
                                  f"{', '.join(KINDS)}")
        if kind == "singleton":
            if ids:
                raise DependencyError(f"--dependency={text}: singleton takes no job id")
            conditions.append(Condition(kind))
            continue
        if not ids:
            raise DependencyError(f"--dependency={text}: {kind} needs a job id")
        for word in ids.split(":"):
            m = _ID.match(word)
            if not m or (m.group(2) is not None and kind != "after"):
                raise DependencyError(f"--dependency={text}: {word!r} is not a malleable "
                                      "job id (m12 or 12; +minutes only after 'after')")
            conditions.append(Condition(kind, f"m{m.group(1)}", int(m.group(2) or 0) * 60))
    if len(conditions) > MAX_CONDITIONS:
        raise DependencyError(f"--dependency={text}: more than {MAX_CONDITIONS} conditions")
    return Dependency(tuple(conditions), any_of)
