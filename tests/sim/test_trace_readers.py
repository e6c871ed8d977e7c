"""Idle-node CSV and Philly per-minute readers: parsing and errors naming file/line/field."""

import pytest

from malletrain.sim.trace import TraceError, read_idle_csv, read_philly_minutes, slice_from

GOOD = """time_s,node,state
0,a,idle
0,b,busy
0,c,idle
5,b,idle
5,a,busy
7,a,busy
9,c,busy
"""


def test_idle_csv_events_group_by_time_and_skip_repeats():
    tr = read_idle_csv("t.csv", GOOD)
    assert tr.node_names == ("a", "b", "c")
    evs = list(tr.events())
    assert [(e.time_s, e.became_idle, e.became_busy) for e in evs] == [
        (0.0, (0, 2), ()),
        (5.0, (1,), (0,)),
        (9.0, (), (2,)),
    ]
    assert tr.end_s == 9.0
    assert all(e.planned is None for e in evs)


def test_slice_from_keeps_state_at_start():
    tr = slice_from(read_idle_csv("t.csv", GOOD), 6.0)
    evs = list(tr.events())
    assert (evs[0].time_s, evs[0].became_idle) == (6.0, (1, 2))
    assert evs[0].idle_since_s == (5.0, 0.0)
    assert [(e.time_s, e.became_busy) for e in evs[1:]] == [(9.0, (2,))]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("time_s,node,state\n0,a,idle\n5,a,busy\n3,a,idle\n", ["t.csv:4", "'time_s'", "sorted"]),
        ("time_s,node,state\n0,a,idle\n5,zz,busy\n", ["t.csv:3", "'node'", "unknown node 'zz'"]),
        ("time_s,node,state\n0,a,idle\n-1,a,busy\n", ["t.csv:3", "'time_s'", "negative"]),
        ("time_s,node,state\n0,a,sleepy\n", ["t.csv:2", "'state'", "sleepy"]),
        ("time_s,node,state\n0,a,idle\nx,a,busy\n", ["t.csv:3", "'time_s'", "not a number"]),
        ("time,node,state\n0,a,idle\n", ["t.csv:1", "'header'"]),
        ("time_s,node,state\n0,a,idle,3\n", ["t.csv:2", "'row'"]),
        ("time_s,node,state\n0,a,idle\n0,a,busy\n", ["t.csv:3", "twice"]),
        ("time_s,node,state\n4,a,idle\n", ["t.csv:2", "time 0"]),
    ],
)
def test_idle_csv_errors_name_file_line_field(text, where):
    with pytest.raises(TraceError) as err:
        read_idle_csv("t.csv", text)
    for part in where:
        assert part in str(err.value)


PHILLY = """time,active,total
2017-10-03 00:00:00,7,10
2017-10-03 00:01:00,7,10
2017-10-03 00:02:00,5,10
2017-10-03 00:03:00,9,11
"""


def test_philly_counts_become_a_stack_of_idle_nodes():
    tr = read_philly_minutes("p.csv", PHILLY)
    assert len(tr.node_names) == 5  # the most ever idle
    evs = list(tr.events())
    assert [(e.time_s, e.became_idle, e.became_busy) for e in evs] == [
        (0.0, (0, 1, 2), ()),
        (120.0, (3, 4), ()),
        (180.0, (), (2, 3, 4)),
    ]
    assert tr.end_s == 180.0


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("2017-10-03 00:04:00,12,11", "'active'"),
        ("2017-10-03 00:04:00,x,11", "'active'"),
        ("2017-10-03 00:04:00,1,-3", "'total'"),
        ("not a date,1,3", "'time'"),
        ("2017-10-02 00:00:00,1,3", "'time'"),
    ],
)
def test_philly_errors(row, field):
    with pytest.raises(TraceError) as err:
        read_philly_minutes("p.csv", PHILLY + row + "\n")
    assert "p.csv:6" in str(err.value)
    assert field in str(err.value)
