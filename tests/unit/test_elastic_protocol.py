"""Store records of the elastic protocol and the pure decisions built on them."""

import pytest

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol import records as rec
from malletrain.errors import PermanentError


def _ev(seq, kind, member, **data):
    return p.Event(seq=seq, kind=kind, member_id=member, time_s=float(seq), data=data)


def test_membership_round_trip_and_rank_offsets():
    m = p.build_membership(3, ["a", "b", "c"], {"a": 2, "b": 1, "c": 4}, "publish", 10.0)
    back = rec.decode_membership(rec.encode_membership(m))
    assert back == m
    assert m.world_size == 7
    assert [m.rank_offset(x) for x in "abc"] == [0, 2, 3]
    assert m.local_world_size("c") == 4


def test_build_membership_validates():
    with pytest.raises(PermanentError, match="never registered"):
        p.build_membership(1, ["a", "x"], {"a": 1}, "publish", 0.0)
    with pytest.raises(PermanentError, match="twice"):
        p.build_membership(1, ["a", "a"], {"a": 1}, "publish", 0.0)
    with pytest.raises(PermanentError, match="invalid member id"):
        p.build_membership(1, ["a/b"], {"a/b": 1}, "publish", 0.0)


def test_ids_cannot_escape_the_key_namespace():
    for bad in ["", "a/b", "../x", "a b", "-x", "x" * 129]:
        with pytest.raises(PermanentError):
            p.Keys(bad)
    assert p.Keys("job-1.a_b").cfg(4) == "mt/job-1.a_b/cfg/4"


def test_waiting_members_and_departures_from_the_event_log():
    events = [
        _ev(0, "register", "a", node="n0", pid=1, local_world_size=2),
        _ev(1, "register", "b", node="n1", pid=2, local_world_size=1),
        _ev(2, "register", "c", node="n2", pid=3, local_world_size=1),
        _ev(3, "depart", "c", reason="sigterm", epoch=1, step=5),
        _ev(4, "depart", "b", reason="failed", epoch=2, step=9),
        _ev(5, "register", "b", node="n1", pid=4, local_world_size=1),  # came back
    ]
    current = p.build_membership(2, ["a"], {"a": 2}, "heal", 0.0)
    waiting = p.waiting_members(events, current)
    assert set(waiting) == {"b"}
    assert waiting["b"].pid == 4
    assert set(p.live_registrations(events)) == {"a", "b"}
    deps = p.departures(events)
    assert [(d.member_id, d.reason, d.step) for d in deps] == [("c", "sigterm", 5),
                                                                ("b", "failed", 9)]


def test_progress_and_finish_round_trip():
    r = p.ProgressReport(epoch=2, step=10, samples_total=320, samples_per_s=99.5,
                         world_size=3, step_time_s=0.1, time_s=5.0, members=("a", "b"))
    assert rec.decode_progress(rec.encode_progress(r)) == r
    f = p.FinishRecord(step=10, samples_total=320, time_s=6.0)
    assert rec.decode_finish(rec.encode_finish(f)) == f


@pytest.mark.parametrize(
    "table, expected",
    [
        # freshest live replica by step, not rank 0
        ([[0, 0, -1], [1, 40, -1], [1, 41, -1]], (2, 41, False)),
        # ties: the lowest rank
        ([[1, 7, -1], [1, 7, -1]], (0, 7, False)),
        # a snapshot newer than every live replica wins
        ([[0, 0, 90], [1, 50, -1]], (0, 90, True)),
        # a stale snapshot (older than a live replica) is never used
        ([[0, 0, 30], [1, 50, -1]], (1, 50, False)),
        ([[1, 30, 30]], (0, 30, False)),
        # new job, no state anywhere: rank 0's initialization
        ([[0, 0, -1], [0, 0, -1]], (0, -1, False)),
    ],
)
def test_choose_source(table, expected):
    assert p.choose_source(table) == expected


def test_the_last_group_and_the_holders_look_back_a_bounded_way():
    sizes = {m: 1 for m in ("a", "b", "c", "d")}
    history = {1: ["a", "b"], 2: ["a"], 3: [], 4: ["c", "d"], 5: ["d"]}
    ms = {e: p.build_membership(e, mem, sizes, "publish", 0.0) for e, mem in history.items()}
    assert p.previous_members(ms.get, ms[5]) == ("c", "d")
    assert p.last_holders(ms.get, ms[5]) == ["c", "a", "b"]
    assert p.last_holders(ms.get, ms[4]) == ["a", "b"]  # the eviction (epoch 3) is skipped
    assert p.previous_members(ms.get, ms[1]) == ()
    far = p.build_membership(6 + p.HOLDER_LOOKBACK_EPOCHS, ["c"], sizes, "publish", 0.0)
    assert p.previous_members(ms.get, far) == ()  # nothing in the window: no wait
    assert p.last_holders(ms.get, far) == []


def test_a_generation_record_says_whether_an_older_one_still_runs():
    from malletrain.elastic.restart.handover import running_before
    assert running_before(b"4:run", 5) and not running_before(b"5:run", 5)
    assert not running_before(b"4:stop", 5) and not running_before(None, 5)
    assert not running_before(b"x:run", 5) and not running_before(b"\xff", 5)
