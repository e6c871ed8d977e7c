"""The daemon's collector between ticks (malletrain/ops/heap.py), on the real CPython gc."""

import gc
import logging
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


def test_a_failed_ticks_cycles_are_freed_at_once_not_frozen_for_ten_minutes():
    """A tick that raised leaves its frames in a cycle with the exception (a frame that
    kept the error), and with them all they held (a whole snapshot): collected before the
    freeze, not kept until the next full collection."""
    from malletrain.daemon.service.loop import _tick

    held = []

    class SlurmDown:
        def tick(self):
            snapshot = _Cycle()  # a large structure the failed tick's frame holds
            held.append(weakref.ref(snapshot))
            try:
                raise ValueError("slurmctld is not answering")
            except ValueError as exc:
                error = exc  # the frame keeps the error, the error's traceback the frame
                raise RuntimeError("tick failed") from error

    # (pytest's log capture keeps each record, and with it the error: not a daemon's)
    loop_log = logging.getLogger("malletrain.daemon.service.loop")
    h = BetweenTicks()
    try:
        loop_log.disabled = True
        gc.unfreeze()
        assert _tick(SlurmDown(), h) is None  # logged; the next tick starts afresh
        assert gc.get_freeze_count() > 0  # the collector had its turn
        assert held[0]() is None
    finally:
        loop_log.disabled = False
        h.close()
