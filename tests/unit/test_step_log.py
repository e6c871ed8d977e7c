"""The benchmarks' count of redone steps (``benchmarks/step_log.py``), on logs as the
example writes them: a step in flight that failed, and steps committed again after a
snapshot restore."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

STEP_LOG = Path(__file__).resolve().parents[2] / "benchmarks" / "step_log.py"


def _module():
    spec = importlib.util.spec_from_file_location("step_log_bench", STEP_LOG)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _redone_steps(path: Path) -> int:
    return int(_module().redone_steps(path))


def _write(path: Path, records: list[dict[str, object]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_failed_steps_count_once_and_steps_committed_again_count_per_extra_epoch(tmp_path):
    log = _write(tmp_path / "f0.log", [
        *({"event": "step", "step": s, "epoch": 1, "rank": r} for s in range(5) for r in (0, 1)),
        {"event": "failed_step", "step": 5, "epoch": 1, "rank": 0},
        {"event": "failed_step", "step": 5, "epoch": 1, "rank": 1},  # the same step
        *({"event": "step", "step": s, "epoch": 2, "rank": 0} for s in range(5, 8)),
        # the only node lost at step 8; the job went back to its guard snapshot of step 6
        *({"event": "step", "step": s, "epoch": 3, "rank": 0} for s in range(6, 10)),
    ], tail='{"event": "st')  # a line cut short by the SIGKILL
    assert _redone_steps(log) == 1 + 2  # step 5 in flight; steps 6 and 7 again


def test_no_log_no_redone_steps(tmp_path):
    assert _redone_steps(tmp_path / "absent.log") == 0


def test_a_restart_after_every_replica_was_lost_is_the_first_step_of_a_newer_epoch(tmp_path):
    log = _write(tmp_path / "f0.log", [
        {"event": "epoch", "epoch": 1, "step": 0, "t": 100.0},
        *({"event": "step", "step": s, "epoch": 1, "rank": 0, "t": 101.0 + s} for s in range(5)),
    ])
    m = _module()
    assert m.newest_epoch(log) == 1
    assert m.first_step_after_epoch(log, 1) is None  # the lost worker's steps do not count
    _write(log, [
        *({"event": "step", "step": s, "epoch": 1, "rank": 0, "t": 101.0 + s} for s in range(5)),
        {"event": "epoch", "epoch": 2, "step": 1, "t": 120.0},
        {"event": "step", "step": 1, "epoch": 2, "rank": 0, "t": 120.5},
        {"event": "step", "step": 2, "epoch": 2, "rank": 0, "t": 121.0},
    ])
    assert m.first_step_after_epoch(log, 1) == 120.5 and m.newest_epoch(log) == 2
