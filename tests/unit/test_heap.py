"""The daemon's collector between ticks (malletrain/ops/heap.py), on the real CPython gc."""

import gc
import weakref

import pytest

from malletrain.ops.heap import YOUNG_THRESHOLD, BetweenTicks


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def heap():
    now = [0.0]
    h = BetweenTicks(full_every_s=600.0, clock=lambda: now[0])
    yield h, now
    h.close()
    gc.collect()


def test_what_a_tick_leaves_is_out_of_the_collectors_sight_until_the_full_collection(heap):
    h, now = heap
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    h.after_tick()  # frozen with everything else alive now
    del cycle
    gc.collect()  # an automatic pass of the next tick: the frozen cycle is not scanned
    assert alive() is not None
    assert gc.get_freeze_count() > 0

    now[0] = 599.0
    h.after_tick()
    gc.collect()
    assert alive() is not None and h.full_collections == 0

    now[0] = 600.0
    h.after_tick()  # due: everything unfrozen and collected once, then frozen again
    assert alive() is None
    assert h.full_collections == 1 and h.last_freed >= 1
    assert gc.get_freeze_count() > 0


def test_garbage_made_within_a_tick_is_still_collected_at_once(heap):
    h, _ = heap
    h.after_tick()
    cycle = _Cycle()  # made after the freeze: young, scanned by the next pass
    alive = weakref.ref(cycle)
    del cycle
    gc.collect()
    assert alive() is None


def test_close_gives_every_frozen_object_back(heap):
    h, _ = heap
    h.after_tick()
    assert gc.get_freeze_count() > 0
    h.close()
    assert gc.get_freeze_count() == 0


def test_young_passes_are_rarer_while_it_runs_and_as_before_after():
    before = gc.get_threshold()
    h = BetweenTicks()
    try:
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
    finally:
        h.close()
    assert gc.get_threshold() == before


def test_the_loop_gives_the_collector_its_turn_after_a_failed_tick_too():
    from malletrain.daemon.loop import _tick

    class SlurmDown:
        def tick(self):
            raise RuntimeError("slurmctld is not answering")

    h = BetweenTicks()
    try:
        gc.unfreeze()
        assert _tick(SlurmDown(), h) is None  # logged; the next tick starts afresh
        assert gc.get_freeze_count() > 0
    finally:
        h.close()
