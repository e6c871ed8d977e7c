"""Value shapes of Slurm releases: both known forms read alike, any other refused loudly.

The recorded outputs of each release are in tests/unit/test_slurm_parse.py; these are the
edges: the shapes the parsers must refuse (never a silent misread), and the choice of
commands per release.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from malletrain.core.cluster import JobState, NodeState
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.parsers.parse_json import job_state_of, parse_nodes_json, parse_squeue_json
from malletrain.slurm.parsers.shapes import INFINITE_32, Source, number, source_of, states
from malletrain.slurm.versions import (
    PERIODIC,
    PERIODIC_S,
    TESTED,
    Release,
    every_tick,
    periodic,
    snapshot_commands,
    support_note,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
META_24_11 = {"plugin": {"data_parser": "data_parser/v0.0.42"},
              "slurm": {"version": {"major": "24", "minor": "11", "micro": "5"},
                        "release": "24.11.5"}}
SRC = Source("squeue --json", "24.11.5", "data_parser/v0.0.42")


def _squeue(jobs, meta=META_24_11) -> str:
    return json.dumps({"meta": meta, "errors": [], "warnings": [], "jobs": jobs})


def _nodes(nodes, meta=META_24_11) -> str:
    return json.dumps({"meta": meta, "errors": [], "nodes": nodes})


def test_numbers_of_both_shapes():
    rec = {"a": 7, "b": {"set": True, "infinite": False, "number": 9},
           "c": {"set": False, "infinite": False, "number": 0},
           "d": {"set": True, "infinite": True, "number": 0}}
    assert [number(rec, k, SRC, "x") for k in "abcd"] == [7, 9, 0, INFINITE_32]
    assert number(rec, "missing", SRC, "x") == 0


@pytest.mark.parametrize("value", ["12", 1.5, True, {"number": 3}, [3],
                                   {"set": True, "infinite": False, "number": "3"}])
def test_a_number_of_another_shape_is_refused_naming_release_and_field(value):
    with pytest.raises(SlurmParseError) as exc:
        number({"time_limit": value}, "time_limit", SRC, "squeue --json: job 4")
    text = str(exc.value)
    assert "Slurm 24.11.5" in text and "data_parser/v0.0.42" in text
    assert "job 4" in text and "'time_limit'" in text and "does not know" in text


def test_states_of_both_shapes_and_refusals():
    assert states({"s": "idle"}, "s", SRC, "x") == ("IDLE",)
    assert states({"s": ["IDLE", "PLANNED"]}, "s", SRC, "x") == ("IDLE", "PLANNED")
    assert states({}, "s", SRC, "x") == ("UNKNOWN",)
    for bad in ([], [1], {"state": "IDLE"}, 3, ""):
        with pytest.raises(SlurmParseError, match="'s'"):
            states({"s": bad}, "s", SRC, "x")


def test_source_is_read_from_the_meta_of_each_release():
    assert str(source_of({"meta": META_24_11}, "squeue --json")) == (
        "squeue --json (Slurm 24.11.5, data_parser/v0.0.42)")
    old = json.loads((GOLDEN / "slurm" / "idle" / "squeue.json").read_text())
    assert str(source_of(old, "squeue --json")) == (
        "squeue --json (Slurm 22.05.8, Slurm OpenAPI v0.0.38)")
    assert source_of({}, "x").release == "unknown release"


def test_job_state_list_reads_as_22_05_reads_the_same_job():
    """22.05 names the first flag of a fixed order instead of the base state."""
    assert job_state_of(("RUNNING",)) == (JobState.RUNNING, "RUNNING")
    assert job_state_of(("PENDING", "REQUEUE_HOLD"))[0] is JobState.PENDING
    assert job_state_of(("COMPLETED", "COMPLETING"))[0] is JobState.COMPLETING
    assert job_state_of(("RUNNING", "CONFIGURING"))[0] is JobState.CONFIGURING
    assert job_state_of(("PENDING", "REQUEUED"))[0] is JobState.REQUEUED
    assert job_state_of(("RUNNING", "SOME_NEW_FLAG")) == (JobState.RUNNING, "RUNNING")
    assert job_state_of(("TELEPORTING",))[0] is None


def test_the_issue_case_a_24_11_running_job_is_read_whole():
    """Issue 21: the 22.05 parser read this job as UNKNOWN, 0 nodes, no limit, no start."""
    (job,) = parse_squeue_json(_squeue([{
        "job_id": 2, "job_state": ["RUNNING"], "nodes": "n[1-4]", "name": "long",
        "node_count": {"set": True, "infinite": False, "number": 4},
        "time_limit": {"set": True, "infinite": False, "number": 30},
        "start_time": {"set": True, "infinite": False, "number": 1795626405},
        "end_time": {"set": True, "infinite": False, "number": 1795628205}}]))
    assert job.state is JobState.RUNNING and job.nodes == ("n1", "n2", "n3", "n4")
    assert job.node_count == 4 and job.time_limit_s == 1800
    assert job.start_time == 1795626405 and job.end_time - job.start_time == 1800


def test_an_unlimited_job_in_the_new_shape_has_no_time_limit():
    (job,) = parse_squeue_json(_squeue([{
        "job_id": 5, "job_state": ["PENDING"], "nodes": "",
        "time_limit": {"set": False, "infinite": True, "number": 0},
        "start_time": {"set": True, "infinite": False, "number": 0}}]))
    assert job.time_limit_s is None and job.start_time is None


@pytest.mark.parametrize("field,value", [
    ("job_state", {"current": ["RUNNING"]}),
    ("nodes", {"allocated": ["n1"]}),
    ("node_count", "4"),
    ("time_limit", [30]),
    ("start_time", "2026-11-25T17:00:00"),
    ("end_time", {"when": 5}),
])
def test_an_unknown_job_shape_refuses_the_answer(field, value):
    rec = {"job_id": 3, "job_state": ["RUNNING"], "nodes": "n1", field: value}
    with pytest.raises(SlurmParseError) as exc:
        parse_squeue_json(_squeue([rec]))
    assert "Slurm 24.11.5" in str(exc.value) and repr(field) in str(exc.value)


def test_nodes_of_the_new_shape_and_an_unknown_state_is_never_idle():
    warns: list[str] = []
    nodes = parse_nodes_json(_nodes([
        {"name": "a1", "state": ["IDLE", "PLANNED"], "partitions": ["batch"],
         "active_features": ["a100", "ib"], "cpus": 64,
         "last_busy": {"set": True, "infinite": False, "number": 1795626402}},
        {"name": "a2", "state": ["IDLE", "DRAIN"]},
        {"name": "a3", "state": ["HIBERNATING"]},
    ]), warns)
    a1, a2, a3 = nodes
    assert a1.state is NodeState.IDLE and a1.flags == {"PLANNED"}
    assert a1.features == ("a100", "ib") and a1.partitions == ("batch",)
    assert a1.last_busy_at == 1795626402 and a1.cpus == 64
    assert a2.state is NodeState.DRAINED
    assert a3.state is NodeState.UNKNOWN and "unknown state 'hibernating'" in warns[0]


@pytest.mark.parametrize("field,value", [("state", {"base": "IDLE"}), ("state_flags", "DRAIN"),
                                         ("state", ["IDLE", 3]), ("last_busy", "yesterday"),
                                         ("partitions", {"batch": True})])
def test_an_unknown_node_shape_refuses_the_answer(field, value):
    rec = {"name": "a1", "state": ["IDLE"], field: value}
    if field == "state_flags":
        rec["state_flags"] = 17  # neither a string nor a list
    with pytest.raises(SlurmParseError, match="node a1"):
        parse_nodes_json(_nodes([rec]))


def test_sinfo_json_of_23_02_and_later_is_refused_with_the_command_to_use():
    text = json.dumps({"meta": META_24_11, "errors": [], "sinfo": [{"nodes": {"nodes": []}}]})
    with pytest.raises(SlurmParseError, match="scontrol show nodes --json"):
        parse_nodes_json(text)


def test_commands_per_release():
    old, new = snapshot_commands(Release(22, 5)), snapshot_commands(Release(24, 11))
    assert old["nodes_json"] == ("sinfo", "--json")
    assert new["nodes_json"] == ("scontrol", "show", "nodes", "--json")
    assert old["squeue_json"] == new["squeue_json"] == (
        "squeue", "--all", "--states=all", "--json")
    assert set(old) - set(PERIODIC) == {"nodes_json", "squeue_json", "planned"}
    assert set(new) - set(PERIODIC) == {"nodes_json", "squeue_json"}
    for release in TESTED:  # the daemon: the nodes' states and the job list, two calls
        daemon = every_tick(release, daemon=True)
        assert list(daemon) == ["node_states", "jobs_plain"]
        assert daemon["node_states"] == (
            "sinfo", "--noheader", "--Node", "--Format=NodeList:0|,StateComplete:0|")
        kept = periodic(release, daemon=True)  # the nodes' records, with the periodic ones
        assert kept["nodes_json"] == (old if release < Release(23, 2) else new)["nodes_json"]
        assert set(kept) - set(PERIODIC) == {"nodes_json"} and PERIODIC_S["nodes_json"] > 0
        assert "nodes_json" not in periodic(release)
    with pytest.raises(SlurmParseError, match="older than"):
        snapshot_commands(Release(21, 8))
    assert Release.parse("slurm-wlm 24.11.5\n") == Release(24, 11)
    assert support_note(Release(26, 5)) is None
    assert "25.05 is not among the tested" in (support_note(Release(25, 5)) or "")


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_down_controller_on_new_releases_is_retryable(release):
    """23.02+ exit 1 with a message on stderr (22.05 exit 0 with ``errors``)."""
    from malletrain.slurm.commands import classify_failure
    from malletrain.slurm.errors import SlurmUnavailableError

    down = GOLDEN / f"slurm-{release}" / "down"
    assert (down / "nodes.json.rc").read_text().strip() == "1"
    err = classify_failure(["scontrol", "show", "nodes", "--json"], 1,
                           (down / "nodes.json.stderr").read_text())
    assert isinstance(err, SlurmUnavailableError) and "is slurmctld running?" in str(err)


def test_the_job_list_keeps_a_job_of_an_unknown_state_with_its_plan():
    from malletrain.slurm.parsers.parse_plain_jobs import parse_jobs_plain

    t = "t" * 24
    text = (f"{t}7|TELEPORTING|2|10:00|2026-11-25T18:00:00|N/A|2026-11-25T17:00:00|bob|batch"
            f"||n[1-2]|Resources|physics|normal{t}x{t}(null)\n")
    warns: list[str] = []
    (job,) = parse_jobs_plain(text, t, warns)
    assert job.state is JobState.UNKNOWN and job.planned_nodes == ("n1", "n2")
    assert "unknown state 'TELEPORTING'" in warns[0]


@pytest.mark.parametrize("text", ["7|RUNNING|...\n", "tttttttttttttttttttttttt7|x\n"])
def test_a_job_list_without_this_calls_token_is_refused(text):
    from malletrain.slurm.parsers.parse_plain_jobs import parse_jobs_plain

    with pytest.raises(SlurmParseError, match=r"token|multiple of 3"):
        parse_jobs_plain(text, "u" * 24)


def test_records_seen_on_the_last_list_are_not_parsed_again():
    """The tick's memo (RecordMemo): the same jobs as a parse without it, unchanged records
    as the very objects of the last list, warned records parsed (and warned) every time,
    and only the last list kept."""
    from malletrain.slurm.parsers.parse_plain_jobs import RecordMemo, parse_jobs_plain

    busy = GOLDEN / "slurm" / "busy"  # recorded on the dev cluster
    token = (busy / "jobs.token").read_text().strip()
    text = (busy / "jobs.txt").read_text()
    memo = RecordMemo()
    first = parse_jobs_plain(text, token, [], memo)
    assert first == parse_jobs_plain(text, token, [])
    again = parse_jobs_plain(text, token, [], memo)
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    t = "t" * 24
    odd = (f"{t}7|TELEPORTING|2|10:00|2026-11-25T18:00:00|N/A|2026-11-25T17:00:00|bob|batch"
           f"||n[1-2]|Resources|physics|normal{t}x{t}(null)\n")
    for _ in range(2):
        warns: list[str] = []
        (job,) = parse_jobs_plain(odd, t, warns, memo)
        assert job.state is JobState.UNKNOWN and len(warns) == 1
    assert memo._last == {}  # the busy list is forgotten once another list was read
    changed = odd.replace("TELEPORTING", "RUNNING")
    (job,) = parse_jobs_plain(changed, t, [], memo)
    assert job.state is JobState.RUNNING
