"""The workers' step log (``examples/elastic_train.py --jsonl``), read by the benchmarks.

Each worker appends one JSON line per step event; a ``failed_step`` record is a step that was
started and not committed (the step in flight when a peer died or the group re-formed), which
the job then ran again. Several ranks log the same failed step: it counts once.
"""

from __future__ import annotations

import json
from pathlib import Path


def redone_steps(path: Path) -> int:
    """Distinct (epoch, step) pairs logged as ``failed_step`` in ``path`` (0 if absent)."""
    if not path.exists():
        return 0
    failed = set()
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a SIGKILL
        if isinstance(rec, dict) and rec.get("event") == "failed_step":
            failed.add((rec.get("epoch"), rec.get("step")))
    return len(failed)
