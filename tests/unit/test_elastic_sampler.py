"""Data position math of the elastic runtime: no sample skipped or seen twice."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.elastic.training.sampler import DataStream, Slice, split_step, step_count


def test_split_is_contiguous_even_and_in_rank_order():
    assert split_step(100, 10, 3) == [Slice(100, 4), Slice(104, 3), Slice(107, 3)]
    assert split_step(0, 2, 4) == [Slice(0, 1), Slice(1, 1), Slice(2, 0), Slice(2, 0)]
    assert split_step(5, 12, 1) == [Slice(5, 12)]


def test_split_rejects_bad_input():
    with pytest.raises(ValueError):
        split_step(0, 4, 0)
    with pytest.raises(ValueError):
        split_step(-1, 4, 2)


def test_step_count_cuts_exactly_at_the_target():
    assert step_count(32, 0, None) == 32
    assert step_count(32, 90, 100) == 10
    assert step_count(32, 100, 100) == 0
    with pytest.raises(ValueError):
        step_count(0, 0, None)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 50),
    seed=st.integers(0, 3),
    sizes=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 7)), min_size=1, max_size=30),
)
def test_any_rescale_sequence_covers_each_epoch_exactly_once(n, seed, sizes):
    """Whatever the world sizes and batches step by step, the concatenation of all ranks'
    indices is the stream: each data epoch is a permutation of the dataset."""
    ds = DataStream(n, seed=seed)
    pos = 0
    seen: list[int] = []
    for world, per_rank in sizes:
        for piece in split_step(pos, world * per_rank, world):
            seen.extend(ds.indices(piece).tolist())
        pos += world * per_rank
    assert len(seen) == pos
    for start in range(0, pos, n):
        block = seen[start : start + n]
        assert len(set(block)) == len(block)  # nothing twice within an epoch
        if len(block) == n:
            assert sorted(block) == list(range(n))  # nothing skipped


def test_permutation_is_deterministic_and_differs_per_epoch():
    a, b = DataStream(100, seed=7), DataStream(100, seed=7)
    assert np.array_equal(a.permutation(3), b.permutation(3))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert np.array_equal(DataStream(5, shuffle=False).indices(Slice(3, 4)), [3, 4, 0, 1])


def test_a_step_may_straddle_two_epochs():
    ds = DataStream(4, seed=1)
    idx = ds.indices(Slice(2, 4)).tolist()
    assert idx[:2] == ds.permutation(0)[2:].tolist()
    assert idx[2:] == ds.permutation(1)[:2].tolist()
