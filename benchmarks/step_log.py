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
