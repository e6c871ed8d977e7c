"""Hostlist expansion/compression: Slurm's node-set syntax, as pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.hostlist import compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("n1", ("n1",)),
        ("n[1-2],m7,x[10-11]", ("n1", "n2", "m7", "x10", "x11")),
        ("n[01-03]", ("n01", "n02", "n03")),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("login", ("login",)),
        ("", ()),
        ("(null)", ()),
        ("None", ()),
        (None, ()),
    ],
)
def test_expand(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[[1]]", "n[1-]"])
def test_malformed_expressions_raise_a_parse_error_naming_them(bad):
    with pytest.raises(SlurmParseError, match="hostlist"):
        expand_hostlist(bad)


def test_absurd_range_is_refused_not_allocated():
    with pytest.raises(SlurmParseError, match="too large"):
        expand_hostlist("n[1-99999999]")


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
        (["n7"], "n7"),
        (["n01", "n02"], "n[01-02]"),
        (["n2", "n1", "n1"], "n[1-2]"),
        (["login", "n1"], "login,n1"),
    ],
)
def test_compress(names, expr):
    assert compress_hostlist(names) == expr


@given(st.sets(st.integers(min_value=0, max_value=500), min_size=1, max_size=60))
def test_compress_then_expand_round_trips(numbers):
    names = [f"n{i}" for i in sorted(numbers)]
    assert expand_hostlist(compress_hostlist(names)) == tuple(names)
