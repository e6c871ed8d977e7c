"""``malletrain nodes`` output from a recorded snapshot (no Slurm)."""

from __future__ import annotations

import json
from pathlib import Path

from malletrain.slurm.cli_nodes import format_table, rows
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"


def snapshot(scenario):
    d = GOLDEN / scenario
    return build_snapshot(float((d / "taken_at.txt").read_text()), SnapshotTexts(
        nodes_json=(d / "nodes.json").read_text(), squeue_json=(d / "squeue.json").read_text(),
        partitions=(d / "partitions.txt").read_text(),
        reservations=(d / "reservations.txt").read_text(),
        planned=(d / "planned.txt").read_text(), topology=(d / "topology.txt").read_text()))


def test_idle_rows_are_unbounded_and_json_null():
    snap = snapshot("idle")
    objs = rows(snap, snap.taken_at, None)
    assert len(objs) == 8
    assert all(o["state"] == "idle" and o["idle"] and o["idle_window_s"] is None for o in objs)
    assert json.loads(json.dumps(objs))[0]["idle_window_s"] is None
    assert "unbounded" in format_table(objs).splitlines()[1]


def test_busy_rows_and_table():
    snap = snapshot("busy")
    objs = {o["name"]: o for o in rows(snap, snap.taken_at, ["scavenger"])}
    long_end = next(j.end_time for j in snap.jobs if j.name == "long")
    assert objs["n7"]["idle_window_s"] == round(long_end - snap.taken_at)
    assert objs["n7"]["claimed_by"] == "job 6" and objs["n7"]["flags"] == ["PLANNED"]
    assert objs["n1"] | {"claimed_by": None, "claim_start_at": None} == {
        "name": "n1", "state": "allocated", "flags": [], "partitions": ["batch", "scavenger"],
        "idle": False, "idle_window_s": 0, "claimed_by": None, "claim_start_at": None,
        "reason": "", "switch": "s1", "type": ""}
    assert objs["n6"]["state"] == "drained" and objs["n6"]["reason"] == "disk check"
    table = format_table(list(objs.values())).splitlines()
    assert table[0].split() == [
        "NODE", "STATE", "FLAGS", "PARTITIONS", "SWITCH", "TYPE", "IDLE_WINDOW", "UNTIL"]
    n7 = next(line for line in table if line.startswith("n7")).split()
    assert n7[1:3] == ["idle", "PLANNED"] and n7[4] == "s2"
    assert n7[-2:] == ["job", "6"] and n7[-3] == "s"
    n1 = next(line for line in table if line.startswith("n1")).split()
    assert n1[-2:] == ["-", "-"]


def test_partition_filter_drops_nodes_outside():
    snap = snapshot("idle")
    assert rows(snap, snap.taken_at, ["nosuch"]) == []
