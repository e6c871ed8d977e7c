"""The parsers against outputs RECORDED from the real dev cluster (slurm/record-golden), for
each tested Slurm release: the same scenarios must read the same on 22.05, 24.11 and 26.05.

tests/golden/slurm[-RELEASE]/<scenario>/scenario.txt says what was running when recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from malletrain.core.cluster import JobState, NodeState
from malletrain.errors import PermanentError, RetryableError
from malletrain.slurm.errors import SlurmParseError, SlurmUnavailableError
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot, slurm_version
from malletrain.slurm.parsers.parse_json import node_state, parse_nodes_json, parse_squeue_json
from malletrain.slurm.parsers.parse_text import (
    duration_s,
    parse_key_values,
    parse_partitions,
    parse_planned,
    parse_reservations,
    parse_topology,
    slurm_time,
)
from malletrain.slurm.versions import TESTED

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"
#: The recorded outputs of each tested release (malletrain.slurm.versions.TESTED).
RELEASES = {"22.05": GOLDEN, "24.11": GOLDEN.with_name("slurm-24.11"),
            "26.05": GOLDEN.with_name("slurm-26.05")}


@pytest.fixture(params=list(RELEASES))
def release(request) -> str:
    return request.param


def texts(release: str, scenario: str) -> SnapshotTexts:
    return SnapshotTexts.read_dir(RELEASES[release] / scenario)


def taken_at(release: str, scenario: str) -> float:
    return float((RELEASES[release] / scenario / "taken_at.txt").read_text())


def snap(release: str, scenario: str):
    return build_snapshot(taken_at(release, scenario), texts(release, scenario))


def test_every_tested_release_has_golden_files():
    assert [str(r) for r in TESTED] == list(RELEASES)
    for release in RELEASES:
        assert slurm_version(texts(release, "idle").squeue_json) == release


# ----------------------------------------------------------------------------- golden: idle


def test_idle_cluster_has_8_idle_nodes_two_partitions_no_jobs(release):
    s = snap(release, "idle")
    assert [n.name for n in s.nodes] == [f"n{i}" for i in range(1, 9)]
    assert {n.state for n in s.nodes} == {NodeState.IDLE}
    assert all(n.partitions == ("batch", "scavenger") and n.cpus == 2 for n in s.nodes)
    assert s.jobs == () and s.reservations == () and s.warnings == ()
    parts = {p.name: p for p in s.partitions}
    assert parts["batch"].default and parts["batch"].priority_tier == 10
    assert parts["scavenger"].priority_tier == 1
    assert parts["scavenger"].preempt_mode == "CANCEL"
    assert parts["scavenger"].grace_time_s == 5
    assert parts["scavenger"].max_time_s is None
    assert parts["batch"].nodes == tuple(f"n{i}" for i in range(1, 9))


def test_leaf_switches_come_from_the_topology(release):
    s = snap(release, "idle")
    assert {n.name: n.switch for n in s.nodes} == {
        **{f"n{i}": "s1" for i in range(1, 5)}, **{f"n{i}": "s2" for i in range(5, 9)}}
    assert parse_topology("") == {}  # no topology plugin: nothing on stdout
    warns: list[str] = []
    assert parse_topology("SwitchName=x Level=0 Nodes=n[1-\n", warns) == {}
    assert "switch x" in warns[0]


def test_version_is_read_from_json_meta():
    assert slurm_version(texts("22.05", "idle").nodes_json) == "22.05"
    assert slurm_version("not json") is None


# ----------------------------------------------------------------------------- golden: busy


def test_busy_nodes_states_and_flags(release):
    s = snap(release, "busy")
    states = {n.name: n.state for n in s.nodes}
    assert states["n6"] is NodeState.DRAINED
    assert s.node("n6").reason == "disk check"
    assert [n for n, st in states.items() if st is NodeState.ALLOCATED] == [
        "n1", "n2", "n3", "n4", "n5"]
    planned = [n.name for n in s.nodes if "PLANNED" in n.flags]
    assert planned == ["n7", "n8"]
    assert all(states[n] is NodeState.IDLE for n in planned)
    assert s.warnings == ()


def test_busy_jobs_running_pending_held_completed(release):
    s = snap(release, "busy")
    by_name = {j.name: j for j in s.jobs}
    long_job, wide, scav = by_name["long"], by_name["wide"], by_name["scav"]
    assert long_job.state is JobState.RUNNING
    assert long_job.nodes == ("n1", "n2", "n3", "n4")
    assert long_job.time_limit_s == 30 * 60
    assert long_job.end_time - long_job.start_time == 30 * 60
    assert long_job.comment == "regular work"
    assert long_job.planned_nodes == ()
    assert scav.user == "mt-alice" and scav.partition == "scavenger" and scav.nodes == ("n5",)
    # the backfill plan: wide starts when long ends, on every usable node
    assert wide.state is JobState.PENDING and wide.state_reason == "Resources"
    assert wide.nodes == ()
    assert wide.planned_nodes == ("n1", "n2", "n3", "n4", "n5", "n7", "n8")
    assert wide.start_time == long_job.end_time
    assert wide.time_limit_s == 600
    held = by_name["held"]
    assert held.state is JobState.PENDING and held.state_reason == "JobHeldUser"
    assert held.user == "mt-bob" and held.time_limit_s is None
    assert held.start_time is None and held.planned_nodes == ()
    rq = by_name["rq"]  # requeued and held: pending, no plan
    assert rq.state is JobState.PENDING and rq.planned_nodes == ()
    assert by_name["done"].state is JobState.COMPLETED


def test_busy_reservation_is_parsed_in_epoch_seconds(release):
    s = snap(release, "busy")
    (resv,) = s.reservations
    assert resv.name == "maint" and resv.nodes == ("n8",)
    assert resv.end_time - resv.start_time == 3600
    assert abs(resv.start_time - (taken_at(release, "busy") + 3 * 3600)) < 30


def test_planned_lines_skip_null_plans():
    """22.05's plan call (23.02+ carry plans in the job list: the test below)."""
    release = "22.05"
    plans = parse_planned((RELEASES[release] / "busy" / "planned.txt").read_text())
    assert list(plans) == [6]
    assert plans[6].nodes == ("n1", "n2", "n3", "n4", "n5", "n7", "n8")
    squeue = json.loads((RELEASES[release] / "busy" / "squeue.json").read_text())
    (wide,) = [j for j in squeue["jobs"] if j["job_id"] == 6]
    start = wide["start_time"]  # 22.05: an int; 24.11+: {"set", "infinite", "number"}
    assert plans[6].start_time == (start if isinstance(start, int) else start["number"])


def test_plan_start_and_nodes_come_from_the_same_call():
    """Seen live: the JSON read before the backfill pass (start 0), the plan read after."""
    text = _squeue([{"job_id": 4, "job_state": "PENDING", "start_time": 0, "end_time": 0,
                     "time_limit": 10}])
    plans = parse_planned("4 2026-11-22T01:00:00 n[1-2]\n")
    (job,) = parse_squeue_json(text, plans)
    assert job.planned_nodes == ("n1", "n2")
    assert job.start_time == slurm_time("2026-11-22T01:00:00")
    assert job.end_time == job.start_time + 600


def test_bad_plan_lines_warn():
    warns: list[str] = []
    assert parse_planned("7 n[1-2]\n8 soon n1\n", warns) == {}
    assert "cannot read line" in warns[0] and "job 8" in warns[1]


# ----------------------------------------------------------------------------- golden: down


def test_json_with_errors_means_slurm_unavailable_even_with_exit_0():
    down = GOLDEN / "down"
    assert (down / "nodes.json.rc").read_text().strip() == "0"  # the trap
    with pytest.raises(SlurmUnavailableError, match="slurmctld") as exc:
        parse_nodes_json((down / "nodes.json").read_text())
    assert isinstance(exc.value, RetryableError)
    with pytest.raises(SlurmUnavailableError, match="slurm_load_jobs"):
        parse_squeue_json((down / "squeue.json").read_text())


# ----------------------------------------------------------------------------- bad input


def _sinfo(nodes) -> str:
    return json.dumps({"meta": {}, "errors": [], "nodes": nodes})


def _squeue(jobs) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": jobs})


def test_not_json_is_a_permanent_parse_error_naming_the_command():
    with pytest.raises(SlurmParseError, match=r"sinfo --json: output is not JSON") as exc:
        parse_nodes_json("sinfo: error: something\n")
    assert isinstance(exc.value, PermanentError)


@pytest.mark.parametrize("payload", ['{"meta": {}, "errors": []}', '{"nodes": 3}', "[1, 2]"])
def test_missing_or_wrong_top_level_field_is_a_parse_error(payload):
    with pytest.raises(SlurmParseError, match=r"nodes|JSON object"):
        parse_nodes_json(payload)


def test_odd_node_records_become_warnings_not_crashes():
    warns: list[str] = []
    nodes = parse_nodes_json(_sinfo([
        {"name": "a1", "state": "weird_state", "state_flags": []},
        {"name": "a2", "state": "idle", "cpus": "two"},
        {"state": "idle"},
        "not an object",
        {"name": "a3", "state": "allocated", "state_flags": ["DRAIN"]},
        {"name": "a3", "state": "idle"},
    ]), warns)
    assert [(n.name, n.state) for n in nodes] == [
        ("a1", NodeState.UNKNOWN), ("a2", NodeState.IDLE), ("a3", NodeState.DRAINING)]
    assert nodes[1].cpus == 0
    text = "\n".join(warns)
    assert "unknown state 'weird_state'" in text
    assert "field 'cpus' should be int, got str" in text
    assert "nodes[2] has no 'name'" in text
    assert "nodes[3] is not an object" in text
    assert "listed twice" in text


def test_odd_job_records_become_warnings():
    warns: list[str] = []
    jobs = parse_squeue_json(_squeue([
        {"job_id": 7, "job_state": "TELEPORTING", "name": "x"},
        {"job_id": "8", "job_state": "RUNNING"},
        {"job_id": 9, "job_state": "RUNNING", "nodes": "n[1-", "time_limit": 4294967295},
        {"job_id": 10, "job_state": "REQUEUE_HOLD", "start_time": 0},
    ]), warnings=warns)
    assert [(j.job_id, j.state) for j in jobs] == [
        (7, JobState.UNKNOWN), (9, JobState.RUNNING), (10, JobState.PENDING)]
    assert jobs[1].nodes == () and jobs[1].time_limit_s is None
    assert jobs[2].start_time is None
    text = "\n".join(warns)
    assert "unknown job state 'TELEPORTING'" in text
    assert "jobs[1] has no valid 'job_id'" in text
    assert "hostlist" in text


def test_partition_line_without_name_is_a_parse_error():
    with pytest.raises(SlurmParseError, match="PartitionName"):
        parse_partitions("AllowGroups=ALL Nodes=n1\n")


def test_partition_with_bad_numbers_warns_and_defaults():
    warns: list[str] = []
    (p,) = parse_partitions(
        "PartitionName=x Nodes=n[1-2] PriorityTier=high GraceTime=5 MaxTime=1-00:00:00\n", warns)
    assert p.priority_tier == 1 and p.grace_time_s == 5 and p.max_time_s == 86400
    assert "PriorityTier 'high' is not a number" in warns[0]


def test_reservations_none_and_bad_time():
    assert parse_reservations("No reservations in the system\n") == ()
    warns: list[str] = []
    assert parse_reservations(
        "ReservationName=r StartTime=soon EndTime=2026-01-01T00:00:00 Nodes=n1\n", warns) == ()
    assert "r:" in warns[0]


def test_key_values_keep_spaces_inside_values():
    kv = parse_key_values("JobId=3 Comment=two words here Partition=batch")
    assert kv == {"JobId": "3", "Comment": "two words here", "Partition": "batch"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("UNLIMITED", None), ("30", 1800), ("05:00", 300), ("1:00:00", 3600),
     ("2-00:00:00", 172800), ("NONE", None)],
)
def test_durations(text, seconds):
    assert duration_s(text) == seconds


def test_slurm_time_unset_values():
    assert slurm_time("Unknown") is None and slurm_time("None") is None
    assert slurm_time("2026-11-22T03:12:14") > 0


@pytest.mark.parametrize(
    ("base", "flags", "state"),
    [
        ("idle", {"PLANNED"}, NodeState.IDLE),
        ("idle", {"DRAIN"}, NodeState.DRAINED),
        ("allocated", {"DRAIN"}, NodeState.DRAINING),
        ("idle", {"COMPLETING"}, NodeState.COMPLETING),
        ("idle", {"NOT_RESPONDING"}, NodeState.DOWN),
        ("idle", {"RESERVED"}, NodeState.RESERVED),
        ("down", {"DRAIN"}, NodeState.DOWN),
        ("mixed", set(), NodeState.MIXED),
        ("sparkly", set(), NodeState.UNKNOWN),
    ],
)
def test_node_state_combines_base_and_flags(base, flags, state):
    assert node_state(base, frozenset(flags)) is state


# ----------------------------------------------------------------------------- the daemon's form


@pytest.mark.parametrize("scenario", ["idle", "busy"])
def test_the_daemons_job_list_reads_every_job_as_the_json_does(release, scenario):
    """The daemon reads the queue from the job list (Slurm's fields, then name and comment
    behind a token); every field of every job must read as in the whole JSON records."""
    d = RELEASES[release] / scenario
    full = build_snapshot(taken_at(release, scenario), SnapshotTexts.read_dir(d))
    daemon = build_snapshot(taken_at(release, scenario), SnapshotTexts.read_dir(d, daemon=True))
    assert daemon.warnings == ()
    assert sorted(daemon.jobs, key=lambda j: j.job_id) == sorted(full.jobs,
                                                                 key=lambda j: j.job_id)
    assert daemon.nodes == full.nodes
