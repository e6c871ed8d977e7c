"""Idle-node CSV and Philly per-minute readers: parsing and errors naming file/line/field."""

from pathlib import Path

import pytest

from malletrain.sim.counts import (
    CIRRUS_HEADER,
    read_cirrus_jobs,
    read_helios_minutes,
    read_philly_minutes,
)
from malletrain.sim.trace import TraceError, read_idle_csv, slice_from

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


# The first rows of the vendored logs, unchanged (data/README.md names their sources).
DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def _head(name: str, rows: int) -> str:
    with (DATA / name).open() as fh:
        return "".join(next(fh) for _ in range(rows + 1))


def test_helios_gpus_are_nodes_and_idle_gpus_a_stack():
    text = _head("helios-earth-vc6YE-usage-per-minute.csv", 27)
    tr = read_helios_minutes("h.csv", text)
    assert len(tr.node_names) == 208  # total_gpu_num: every GPU named, idle or not
    # idle_gpu_num: 46 at 00:00, 38 at 00:02, 54 at 00:24, 22 at 00:26 (rows 2, 4, 26, 28)
    assert [(e.time_s, len(e.became_idle), len(e.became_busy)) for e in tr.events()] == [
        (0.0, 46, 0), (120.0, 0, 8), (1440.0, 16, 0), (1560.0, 0, 32)]
    bad = text + "2020-05-01 00:27:00" + ",0" * 6 + ",208,0,0,209" + ",0" * 13 + "\n"
    with pytest.raises(TraceError, match=r"h\.csv:29.*'idle_gpu_num'.*209 idle > 208"):
        read_helios_minutes("h.csv", bad)
    with pytest.raises(TraceError, match=r"missing column.*idle_gpu_num"):
        read_helios_minutes("h.csv", "time,total_gpu_num\n2020-05-01 00:00:00,8\n")


def test_cirrus_recorded_schedule_holds_whole_nodes():
    tr = read_cirrus_jobs("c.csv", text=_head("epcc-cirrus-cpu-2024-09-jobs-rigid.csv", 3))
    # 108 cores = 3 nodes from t=3; 4 cores = 1 node each from 685990 and 689550.
    evs = [(e.time_s, len(e.became_idle), len(e.became_busy)) for e in tr.events()]
    assert evs[:4] == [(0.0, 280, 0), (3.0, 0, 3), (685990.0, 0, 1), (689550.0, 0, 1)]
    assert len(tr.node_names) == 280 and tr.end_s == 1036814.0
    bad = CIRRUS_HEAD + "9,Rigid,0,50,40,50,-10,40,completed,4\n"
    with pytest.raises(TraceError, match=r"c\.csv:2.*'End Time'.*before it starts"):
        read_cirrus_jobs("c.csv", text=bad)


CIRRUS_HEAD = ",".join(CIRRUS_HEADER) + "\n"
