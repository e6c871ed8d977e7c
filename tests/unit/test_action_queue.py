"""The action queue: a tick's actions applied off the tick, one group per job."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from malletrain.daemon.act.action_queue import ActionQueue


@dataclass
class Done:
    applied: list[str] = field(default_factory=list)

    def add(self, other: Done) -> None:
        self.applied += other.applied


class Recorder:
    """Applies actions named ``job:what``; a job in ``gates`` waits for its event first."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def gate(self, job: str) -> threading.Event:
        self.gates[job] = threading.Event()
        self.started[job] = threading.Event()
        return self.gates[job]

    def apply(self, actions: Sequence[str]) -> Done:
        job = actions[0].split(":")[0]
        if job in self.gates:
            self.started[job].set()
            assert self.gates[job].wait(10)
        if "boom" in actions[0]:
            raise RuntimeError("a bug in an action")
        with self.lock:
            self.order += actions
        return Done(list(actions))


def queue(rec: Recorder, workers: int = 2) -> ActionQueue[str, Done]:
    return ActionQueue(rec.apply, Done, workers=workers, job_of=lambda a: a.split(":")[0],
                       urgent=lambda a: a.endswith("park"))


def test_each_jobs_actions_run_in_order_and_outcomes_are_collected() -> None:
    rec = Recorder()
    q = queue(rec)
    assert q.offer(["a:place", "a:publish", "b:place", "b:publish"]) == 0
    assert q.drain(10)
    assert rec.order.index("a:place") < rec.order.index("a:publish")
    assert rec.order.index("b:place") < rec.order.index("b:publish")
    assert sorted(q.take().applied) == ["a:place", "a:publish", "b:place", "b:publish"]
    assert q.take().applied == []  # taken once
    q.close(5)


def test_a_running_jobs_newer_actions_are_dropped_and_others_do_not_wait() -> None:
    rec = Recorder()
    gate = rec.gate("a")
    q = queue(rec)
    q.offer(["a:place"])
    assert rec.started["a"].wait(5)
    assert q.busy_jobs() == {"a"}
    assert q.offer(["a:publish", "b:place"]) == 1  # a is running: its new group is dropped
    deadline = time.monotonic() + 10
    while rec.order != ["b:place"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.order == ["b:place"]  # b did not wait for a ...
    assert q.busy_jobs() == {"a"}  # ... which still runs
    gate.set()
    assert q.drain(10)
    assert "a:publish" not in rec.order and rec.order.count("a:place") == 1
    q.close(5)


def test_a_queued_jobs_newer_group_is_dropped_too() -> None:
    rec = Recorder()
    gate = rec.gate("x")
    q = queue(rec, workers=1)
    q.offer(["x:place"])  # occupies the only worker
    assert rec.started["x"].wait(5)
    q.offer(["a:place node1"])
    assert q.offer(["a:place node2"]) == 1
    gate.set()
    assert q.drain(10)
    assert rec.order == ["x:place", "a:place node1"]
    q.close(5)


def test_urgent_groups_go_first_whatever_their_order() -> None:
    rec = Recorder()
    gate = rec.gate("x")
    q = queue(rec, workers=1)
    q.offer(["x:place"])
    assert rec.started["x"].wait(5)
    q.offer(["b:place", "c:place"])
    q.offer(["d:park"])  # a node given back to a regular job
    gate.set()
    assert q.drain(10)
    assert rec.order == ["x:place", "d:park", "b:place", "c:place"]
    q.close(5)


def test_a_bug_in_one_group_does_not_stop_the_others() -> None:
    rec = Recorder()
    q = queue(rec)
    q.offer(["a:boom", "b:place"])
    assert q.drain(10)
    assert rec.order == ["b:place"]
    assert q.busy_jobs() == frozenset()
    q.offer(["a:place"])  # the job is served again
    assert q.drain(10)
    assert rec.order == ["b:place", "a:place"]
    q.close(5)


def test_close_waits_for_what_is_in_flight_then_gives_up_on_the_rest() -> None:
    rec = Recorder()
    gate = rec.gate("a")
    q = queue(rec, workers=1)
    q.offer(["a:place"])
    assert rec.started["a"].wait(5)
    q.offer(["b:place"])
    assert q.close(0.2) is False  # a still runs: b is dropped, not started
    gate.set()
    assert q.drain(10)
    assert rec.order == ["a:place"]
