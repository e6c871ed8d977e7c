"""The coordinator's records: what workers write decodes back exactly; anything else, from
a buggy or hostile writer, is a RecordError and nothing else (fuzzed)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.elastic.protocol import records as r
from malletrain.elastic.protocol.keys import FinishRecord, Membership, ProgressReport

PROGRESS = ProgressReport(epoch=3, step=120, samples_total=7680, samples_per_s=512.5,
                          world_size=4, step_time_s=0.25, time_s=1.7e9, members=("s0-r0", "s1-r2"))
MEMBERSHIP = Membership(epoch=2, members=("s0-r0", "s1-r0"), local_world_sizes=(2, 2),
                        source="publish", published_at_s=1.7e9, dropped=("s2-r0",))


def test_records_round_trip():
    assert r.decode_progress(r.encode_progress(PROGRESS)) == PROGRESS
    assert r.decode_membership(r.encode_membership(MEMBERSHIP)) == MEMBERSHIP
    fin = FinishRecord(step=9, samples_total=640, time_s=1.7e9)
    assert r.decode_finish(r.encode_finish(fin)) == fin
    ev = r.decode_event(4, r.encode_event("register", "s0-r0", 1.7e9,
                                          {"node": "n1", "pid": 42, "local_world_size": 2}))
    assert (ev.seq, ev.kind, ev.member_id, ev.data["node"]) == (4, "register", "s0-r0", "n1")
    dep = r.decode_event(5, r.encode_event("depart", "s0-r0", 1.7e9,
                                           {"reason": "sigterm", "epoch": None, "step": 3}))
    assert dep.data["reason"] == "sigterm"


@pytest.mark.parametrize("change, why", [
    ({"samples_total": "7680"}, "samples_total"),
    ({"samples_total": -1}, "samples_total"),
    ({"samples_total": True}, "samples_total"),
    ({"samples_per_s": float("nan")}, "samples_per_s"),  # Python's json reads NaN
    ({"samples_per_s": 1e300}, "samples_per_s"),
    ({"members": ["ok", "../../etc"]}, "member id"),
    ({"members": "s0-r0"}, "members"),
    ({"extra": 1}, "unexpected"),
])
def test_a_bad_progress_field_is_a_record_error_naming_it(change, why):
    d = json.loads(r.encode_progress(PROGRESS)) | change
    with pytest.raises(r.RecordError, match=why):
        r.decode_progress(json.dumps(d))


def test_memberships_events_and_sizes_are_checked():
    d = json.loads(r.encode_membership(MEMBERSHIP))
    for bad in ({"local_world_sizes": [2]}, {"members": ["a", "a"], "local_world_sizes": [1, 1]},
                {"source": "attacker"}, {"epoch": 0}):
        with pytest.raises(r.RecordError):
            r.decode_membership(json.dumps(d | bad))
    with pytest.raises(r.RecordError, match="kind"):
        r.decode_event(0, json.dumps({"kind": "evict", "member_id": "a", "time_s": 1.0,
                                      "data": {}}))
    with pytest.raises(r.RecordError, match="host name"):
        r.decode_event(0, json.dumps({"kind": "register", "member_id": "a", "time_s": 1.0,
                                      "data": {"node": "n1\nFAKE LOG LINE"}}))
    with pytest.raises(r.RecordError, match="bytes"):
        r.decode_finish(b"{" + b" " * r.MAX_RECORD_BYTES + b"}")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=20,
)
field_names = st.sampled_from(["epoch", "step", "samples_total", "samples_per_s", "world_size",
                               "step_time_s", "time_s", "members", "local_world_sizes",
                               "source", "published_at_s", "dropped", "kind", "member_id",
                               "data", "node", "pid", "reason"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(field_names, json_values, max_size=9) | json_values)
def test_any_json_is_decoded_or_refused_with_a_record_error(obj):
    raw = json.dumps(obj)
    for decode in (r.decode_progress, r.decode_membership, r.decode_finish,
                   lambda x: r.decode_event(0, x)):
        with contextlib.suppress(r.RecordError):
            decode(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_are_decoded_or_refused_with_a_record_error(raw):
    for decode in (r.decode_progress, r.decode_membership, r.decode_finish):
        with contextlib.suppress(r.RecordError):
            decode(raw)


@pytest.mark.parametrize("raw", ["[" * 5000, '{"a":' * 5000, "[" * 100_000])
def test_nesting_past_the_stack_is_a_record_error_not_a_recursion_error(raw):
    """The combined load test's find (issue 49): a job's progress of 5,000 "[" raised
    RecursionError out of the daemon's batched read of EVERY job's records, and another
    user's job sat in `starting` for 4 minutes."""
    for decode in (r.decode_progress, r.decode_membership, r.decode_finish,
                   lambda x: r.decode_event(0, x)):
        with pytest.raises(r.RecordError, match="not JSON"):
            decode(raw)
def test_a_departure_says_what_failed_in_one_printable_line():
    """Restart mode's node agent departs "crashed" with the failed step's line; the daemon
    shows it in `malletrain jobs`, so it is one printable line of bounded length."""
    from malletrain.elastic.protocol.keys import departures

    raw = r.encode_event("depart", "s0-r0", 1.0, {"reason": "crashed", "epoch": 2, "step": 0,
                                                   "detail": "srun: error: --pty: not here"})
    (d,) = departures([r.decode_event(0, raw)])
    assert (d.reason, d.detail) == ("crashed", "srun: error: --pty: not here")
    for bad in ("x" * (r.MAX_DETAIL + 1), "two\nlines", "\x1b[31mred", 7):
        raw = r.encode_event("depart", "s0-r0", 1.0, {"reason": "crashed", "detail": bad})
        with pytest.raises(r.RecordError, match="detail"):
            r.decode_event(0, raw)
    # an old departure without one reads as before
    (d,) = departures([r.decode_event(0, r.encode_event("depart", "s0-r0", 1.0,
                                                        {"reason": "sigterm"}))])
    assert d.detail == ""
