"""The workers' step log (``examples/elastic_train.py --jsonl``), read by the benchmarks.

Each worker appends one JSON line per step event; a ``failed_step`` record is a step that was
started and not committed (the step in flight when a peer died or the group re-formed), which
the job then ran again. Several ranks log the same failed step: it counts once. A step
committed in two epochs was redone too: the job went back to a snapshot (a one-node job's
guard snapshot, after its node was lost).
"""

from __future__ import annotations

import json
from pathlib import Path


def redone_steps(path: Path) -> int:
    """Distinct (epoch, step) pairs logged as ``failed_step`` in ``path``, plus the steps
    committed in more than one epoch beyond the first (0 if absent)."""
    if not path.exists():
        return 0
    failed = set()
    committed: dict[object, set[object]] = {}  # step -> epochs it was committed in
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a SIGKILL
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "failed_step":
            failed.add((rec.get("epoch"), rec.get("step")))
        elif rec.get("event") == "step":
            committed.setdefault(rec.get("step"), set()).add(rec.get("epoch"))
    return len(failed) + sum(len(epochs) - 1 for epochs in committed.values())


def _records(path: Path) -> list[dict[str, object]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a SIGKILL
            if isinstance(rec, dict):
                out.append(rec)
    return out


def newest_epoch(path: Path) -> int:
    """The newest epoch a step was committed in (0: none yet)."""
    return max((int(r["epoch"]) for r in _records(path)  # type: ignore[call-overload]
                if r.get("event") == "step"), default=0)


def first_step_after_epoch(path: Path, epoch: int) -> float | None:
    """Wall time of the first step committed in an epoch newer than ``epoch`` (None: none
    yet): when a job that lost every replica trains again (its progress reports cannot
    tell, the dead worker's last one may arrive after its death)."""
    times = [float(r["t"]) for r in _records(path)  # type: ignore[arg-type]
             if r.get("event") == "step" and int(r["epoch"]) > epoch]  # type: ignore[call-overload]
    return min(times, default=None)
