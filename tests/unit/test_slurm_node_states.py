"""The daemon's per-tick node states laid over the periodic node records (slurm/parse_states.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from malletrain.core.cluster import NodeState
from malletrain.slurm.backend import CliBackend
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot
from malletrain.slurm.parsers.parse_states import (
    MAX_ODD_LINES,
    UNRECORDED_NODE,
    merge_node_states,
    parse_node_states,
)
from malletrain.slurm.versions import NODE_STATES, PERIODIC_S, Release

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
BUSY = GOLDEN / "slurm" / "busy"  # slurm/record-golden on the 22.05 dev cluster


def busy_records():
    texts = SnapshotTexts.read_dir(BUSY, daemon=True)
    return build_snapshot(0.0, dataclasses.replace(texts, node_states="")).nodes


def test_states_as_sinfo_prints_them_one_line_per_node_and_partition():
    text = (BUSY / "node_states.txt").read_text()
    assert text.count("n6|idle+drain|") == 2  # batch and scavenger
    states = parse_node_states(text)
    assert list(states) == [f"n{i}" for i in range(1, 9)]
    assert states["n6"] == ("IDLE", frozenset({"DRAIN"}))
    assert states["n7"] == ("IDLE", frozenset({"PLANNED"}))
    assert states["n1"] == ("ALLOCATED", frozenset())


def test_odd_lines_are_warned_and_too_many_refuse_the_answer():
    warns: list[str] = []
    states = parse_node_states("n1|idle|\nno separator here\n|idle|\nn2||\nn 3|idle|\n", warns)
    assert list(states) == ["n1"] and len(warns) == 4
    with pytest.raises(SlurmParseError, match=r"NAME\|STATE\|"):
        parse_node_states("garbage\n" * (MAX_ODD_LINES + 1))
    assert parse_node_states("n1|idle*|\n")["n1"] == ("IDLE", frozenset({"NOT_RESPONDING"}))


def test_merging_this_ticks_states_changes_only_what_changed():
    records = busy_records()
    by_name = {n.name: n for n in records}
    states = parse_node_states((BUSY / "node_states.txt").read_text())
    same = merge_node_states(records, states)
    assert all(a is b for a, b in zip(same, records, strict=True))  # nothing new: the records
    # n1's job ended (idle now), n7 was taken by a job and n8 drained since the records
    now = {**states, "n1": ("IDLE", frozenset()), "n7": ("ALLOCATED", frozenset()),
           "n8": ("IDLE", frozenset({"DRAIN", "PLANNED"}))}
    merged = {n.name: n for n in merge_node_states(records, now)}
    assert merged["n1"].state is NodeState.IDLE and merged["n1"].last_busy_at is None
    assert merged["n1"].partitions == by_name["n1"].partitions  # the record's static fields
    assert merged["n7"].state is NodeState.ALLOCATED
    assert merged["n7"].last_busy_at == by_name["n7"].last_busy_at
    assert merged["n8"].state is NodeState.DRAINED
    assert merged["n2"] is by_name["n2"]


def test_a_node_without_a_record_is_never_scavenged_and_asks_for_the_records():
    records = busy_records()
    warns: list[str] = []
    states = {**parse_node_states((BUSY / "node_states.txt").read_text()),
              "n9": ("IDLE", frozenset())}
    merged = merge_node_states(records, states, warns)
    assert merged[-1].name == "n9" and merged[-1].partitions == ()
    assert any(UNRECORDED_NODE in w for w in warns)
    # a node in no partition has no state line: its record's state stays
    partial = {k: v for k, v in states.items() if k != "n5"}
    assert merge_node_states(records, partial)[4] is records[4]
    warns.clear()
    merge_node_states(records, {**states, "n2": ("TELEPORTING", frozenset())}, warns)
    assert any("unknown state 'teleporting'" in w for w in warns)


def golden_daemon_answers(node_states: str):
    by_file = {tuple(c.split(": ", 1)[1].split()): c.split(": ", 1)[0]
               for c in (BUSY / "commands.txt").read_text().splitlines() if ": " in c}

    def answer(argv: list[str]):
        if tuple(argv) == NODE_STATES:
            return 0, node_states, ""
        if argv[0] == "squeue":
            return 0, "", ""
        return 0, (BUSY / by_file[tuple(argv)]).read_text(), ""
    return answer


class Runner:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kw):
        import subprocess

        self.calls.append(list(argv))
        code, out, err = self.answer(list(argv))
        return subprocess.CompletedProcess(argv, code, out, err)


def test_the_records_are_read_again_when_a_node_has_none_and_else_at_their_period():
    now = [1000.0]
    states = [(BUSY / "node_states.txt").read_text()]
    run = Runner(lambda argv: golden_daemon_answers(states[0])(argv))
    backend = CliBackend(runner=run, daemon=True, parallel=False, clock=lambda: now[0],
                         release=Release(22, 5))
    backend.snapshot()
    assert ["sinfo", "--json"] in run.calls
    run.calls.clear()
    now[0] += 5
    backend.snapshot()
    assert ["sinfo", "--json"] not in run.calls  # kept: states only
    states[0] += "n9|idle|\n"  # a node added to the cluster
    snap = backend.snapshot()
    assert snap.node("n9") is not None and snap.node("n9").partitions == ()
    run.calls.clear()
    backend.snapshot()
    assert ["sinfo", "--json"] in run.calls  # its record, on the next tick
    run.calls.clear()
    now[0] += PERIODIC_S["nodes_json"]
    states[0] = (BUSY / "node_states.txt").read_text()
    backend.snapshot()
    assert ["sinfo", "--json"] in run.calls  # and again after its period
