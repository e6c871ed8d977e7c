"""The actuator applies each job's actions in order and different jobs' side by side.

Real SQLite store; the Slurm backend is a recorder (the order and overlap of calls is the
logic under test; the real calls are the e2e tests').
"""

from __future__ import annotations

import threading

from malletrain.daemon.act.actuator import Actuator
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.tick.actions import Park, Place


class Recorder:
    """Records calls; ``update`` of a job in ``wait_for`` blocks until that other job's
    update has begun (a serial actuator would wait out the timeout and fail)."""

    def __init__(self, wait_for: dict[int, int] | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.wait_for = wait_for or {}
        self.began = {sid: threading.Event() for sid in range(1, 10)}
        self.lock = threading.Lock()

    def _note(self, what: str, sid: int) -> None:
        with self.lock:
            self.calls.append((what, sid))

    def update(self, sid: int, **fields) -> None:
        self._note("update", sid)
        self.began[sid].set()
        other = self.wait_for.get(sid)
        if other is not None and not self.began[other].wait(5.0):
            raise AssertionError(f"update {sid} waited for {other}, which never began")

    def release(self, sid: int) -> None:
        self._note("release", sid)

    def requeue_hold(self, sid: int) -> None:
        self._note("requeuehold", sid)


def _store(tmp_path, jobs: dict[str, list[int]]) -> Store:
    store = Store(tmp_path / "state.db")
    for name, slots in jobs.items():
        rec = store.create_job(1000, "alice", JobSpec(script="/x.py", name=name, max_nodes=2))
        assert rec.job_id == name
        store.add_slots(name, slots)
    return store


def test_different_jobs_actions_run_side_by_side_each_in_order(tmp_path):
    store = _store(tmp_path, {"m1": [1, 2], "m2": [3, 4]})
    backend = Recorder(wait_for={1: 3})  # m1's first placement needs m2's to be under way
    act = Actuator(backend, store, coordinator=None)  # type: ignore[arg-type]
    out = act.apply([Place("m1", 0, 1, "n1", 5), Place("m1", 1, 2, "n2", 5),
                     Place("m2", 0, 3, "n3", 5)])
    assert out.placed == 3 and out.failed == 0
    m1 = [c for c in backend.calls if c[1] in (1, 2)]
    assert m1 == [("update", 1), ("release", 1), ("update", 2), ("release", 2)]
    assert {a["kind"] for a in store.open_actions()} == set()  # every action recorded as done
    store.close()


def test_jobs_giving_nodes_back_go_first(tmp_path):
    store = _store(tmp_path, {"m1": [1, 2], "m2": [3, 4]})
    backend = Recorder()
    act = Actuator(backend, store, coordinator=None, workers=1)  # type: ignore[arg-type]
    act.apply([Place("m1", 0, 1, "n1", 5), Park("m2", 0, 3, "given back to job 7")])
    assert backend.calls == [("requeuehold", 3), ("update", 1), ("release", 1)]
    store.close()


def test_reserve_marks_the_nodes_of_queued_placements_before_they_run(tmp_path):
    store = _store(tmp_path, {"m1": [1, 2]})
    backend = Recorder()
    act = Actuator(backend, store, coordinator=None, clock=lambda: 42.0)  # type: ignore[arg-type]
    act.reserve([Place("m1", 1, 2, "n7", 5), Park("m1", 0, 1, "given back")])
    slots = {s.slot: s for s in store.slots("m1")}
    assert (slots[1].placed_node, slots[1].placed_at_s) == ("n7", 42.0)
    assert slots[0].placed_node is None  # a park marks nothing ahead
    assert backend.calls == []  # nothing ran: the next tick sees n7 as taken all the same
    store.close()
