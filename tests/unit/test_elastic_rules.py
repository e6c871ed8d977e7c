"""Batch size and learning rate versus world size."""

import math

import pytest

from malletrain.elastic.training.rules import FixedGlobalBatch, LinearScaling, SqrtScaling


def test_linear_scaling():
    r = LinearScaling(per_rank_batch=32, base_lr=0.1)
    assert [r.global_batch(w) for w in (1, 2, 3)] == [32, 64, 96]
    assert r.learning_rate(4) == pytest.approx(0.4)
    r8 = LinearScaling(per_rank_batch=32, base_lr=0.8, base_world_size=8)
    assert r8.learning_rate(2) == pytest.approx(0.2)


def test_sqrt_scaling():
    r = SqrtScaling(per_rank_batch=16, base_lr=0.1)
    assert r.global_batch(4) == 64
    assert r.learning_rate(4) == pytest.approx(0.2)
    assert r.learning_rate(2) == pytest.approx(0.1 * math.sqrt(2))


def test_fixed_global_batch():
    r = FixedGlobalBatch(global_batch_size=96, lr=0.05)
    assert {r.global_batch(w) for w in (1, 2, 3, 5)} == {96}
    assert r.learning_rate(7) == 0.05


@pytest.mark.parametrize(
    "make",
    [
        lambda: LinearScaling(per_rank_batch=0, base_lr=0.1),
        lambda: LinearScaling(per_rank_batch=4, base_lr=0.0),
        lambda: SqrtScaling(per_rank_batch=4, base_lr=0.1, base_world_size=0),
        lambda: FixedGlobalBatch(global_batch_size=0, lr=0.1),
    ],
)
def test_invalid_rules_are_rejected(make):
    with pytest.raises(ValueError):
        make()
