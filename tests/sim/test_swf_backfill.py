"""FCFS + EASY backfill replay of a small, hand-checked SWF log, and its plan."""

import pytest

from malletrain.sim.swf import EasyBackfillReplay, read_swf, swf_trace
from malletrain.sim.trace import TraceError


def swf(*jobs):
    """SWF lines from (id, submit, run, nodes, requested) tuples."""
    head = "; MaxNodes: 4\n"
    return head + "".join(
        f"{i} {s} -1 {r} {n} -1 -1 {n} {q} -1 1 -1 -1 -1 -1 -1 -1 -1\n" for i, s, r, n, q in jobs
    )


# 4 nodes. Job 2 (4 nodes) waits for job 1; job 3 fits in the hole and ends before job 2's
# reservation (t=100), so it is backfilled at t=10; job 4 would run past t=100 on a node job 2
# needs, so it waits. Nodes 2 and 3 are then idle from 60 to 100, predicted by the plan.
LOG = swf(
    (1, 1000, 100, 2, 100),
    (2, 1000, 100, 4, 100),
    (3, 1010, 50, 2, 50),
    (4, 1020, 200, 1, 200),
)


def test_read_swf_relative_times_and_sizes():
    jobs = read_swf("t.swf", 4, text=LOG)
    assert [(j.job_id, j.submit_s, j.nodes, j.requested_s) for j in jobs] == [
        (1, 0.0, 2, 100.0),
        (2, 0.0, 4, 100.0),
        (3, 10.0, 2, 50.0),
        (4, 20.0, 1, 200.0),
    ]


def test_easy_backfill_start_times():
    replay = EasyBackfillReplay(read_swf("t.swf", 4, text=LOG), 4)
    list(replay.run())
    assert dict(replay.started) == {1: 0.0, 3: 10.0, 2: 100.0, 4: 200.0}


def test_events_and_predicted_windows():
    replay = EasyBackfillReplay(read_swf("t.swf", 4, text=LOG), 4)
    evs = list(replay.run())
    got = [(e.time_s, e.became_idle, e.became_busy) for e in evs]
    assert got == [
        (0.0, (2, 3), ()),
        (10.0, (), (2, 3)),
        (60.0, (2, 3), ()),
        (100.0, (), (2, 3)),
        (200.0, (1, 2, 3), ()),
        (400.0, (0,), ()),
    ]
    at60 = evs[2].planned
    # Job 2 is planned at t=100 on the idle nodes 2 and 3: a 40 s window.
    assert at60[0].job_id == 2 and at60[0].start_s == 100.0 and at60[0].nodes == (2, 3)
    # Job 4 comes after job 2 (t=100 + 100 requested) on node 0, busy now: not listed.
    assert len(at60) == 1
    assert evs[4].planned == ()


def test_backfill_on_extra_nodes_that_the_head_does_not_need():
    # Head (job 2, 3 nodes) waits for job 1 (until 100); one extra node is free beyond its
    # needs, so job 3 (1 node, long) may run on it although it ends after the reservation.
    log = swf((1, 0, 100, 3, 100), (2, 0, 100, 3, 100), (3, 5, 1000, 1, 1000))
    replay = EasyBackfillReplay(read_swf("t.swf", 4, text=log), 4)
    list(replay.run())
    assert dict(replay.started) == {1: 0.0, 3: 5.0, 2: 100.0}


def test_a_job_past_its_request_is_planned_to_its_run_time():
    # Job 1 asked for 100 s and ran 300 (the log has it past its request: its limit was
    # longer). Planned with the request it would "end now" from t=100 to 300: job 2's
    # reservation always now, job 3 never backfilled, nodes 2-3 idle with a stale plan.
    log = swf((1, 0, 300, 2, 100), (2, 0, 100, 4, 100), (3, 10, 100, 2, 100))
    jobs = read_swf("t.swf", 4, text=log)
    assert [j.limit_s for j in jobs] == [300.0, 100.0, 100.0]
    assert jobs[0].requested_s == 100.0  # the log's request is kept as recorded
    replay = EasyBackfillReplay(jobs, 4)
    evs = list(replay.run())
    assert dict(replay.started) == {1: 0.0, 3: 10.0, 2: 300.0}
    after_job3 = next(e for e in evs if e.time_s == 110.0)
    assert after_job3.became_idle == (2, 3)
    assert after_job3.planned[0].job_id == 2 and after_job3.planned[0].start_s == 300.0


def test_the_plan_names_the_nodes_the_job_will_take():
    # Node 3 is idle throughout; job 2 waits for job 1's nodes 0-2 and, at t=100, takes the
    # lowest-numbered free nodes: 0-2 again. The plan must say so: naming node 3 (free
    # earliest) would end its window at t=100 and leave a stale claim on it after.
    log = swf((1, 0, 100, 3, 100), (2, 0, 100, 3, 100))
    replay = EasyBackfillReplay(read_swf("t.swf", 4, text=log), 4)
    evs = list(replay.run())
    assert [(e.time_s, e.became_idle, e.became_busy) for e in evs] == [
        (0.0, (3,), ()),
        (200.0, (0, 1, 2), ()),
    ]
    assert dict(replay.started) == {1: 0.0, 2: 100.0}
    assert evs[0].planned == ()  # job 2 is planned, but on no idle node


def test_swf_trace_slice(tmp_path):
    (tmp_path / "t.swf").write_text(LOG)
    tr = swf_trace(tmp_path / "t.swf", 4, start_s=70.0, until_s=250.0)
    evs = list(tr.events())
    assert [(e.time_s, e.became_idle, e.became_busy) for e in evs] == [
        (70.0, (2, 3), ()),
        (100.0, (), (2, 3)),
        (200.0, (1, 2, 3), ()),
    ]
    assert evs[0].planned[0].start_s == 100.0
    assert evs[0].idle_since_s == (60.0, 60.0)  # freed by job 3 at t=60
    assert tr.node_names == ("n0", "n1", "n2", "n3")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("1 0 -1 100 x -1 -1 2 100 -1 1 -1 -1 -1 -1 -1 -1 -1", "'allocated_procs'"),
        ("1 -5 -1 100 2 -1 -1 2 100 -1 1 -1 -1 -1 -1 -1 -1 -1", "'submit_time'"),
        ("1 0 -1 100", "'allocated_procs'"),
    ],
)
def test_swf_errors(line, field):
    with pytest.raises(TraceError) as err:
        read_swf("bad.swf", 4, text="; header\n" + line + "\n")
    assert "bad.swf:2" in str(err.value) and field in str(err.value)


def test_processors_round_up_to_nodes():
    jobs = read_swf("t.swf", 4, procs_per_node=8, text=swf((1, 0, 10, 9, 10)))
    assert jobs[0].nodes == 2


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        swf_trace(tmp_path / "nope.swf", 4)
