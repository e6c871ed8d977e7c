"""A preempted restart-mode agent's last words (``restart.handover.Farewell``) against a
real coordinator: the departure goes out while the tasks are still being
stopped, the stop record only once they are gone, and a coordinator that does not answer
never holds the exit longer than the bound."""

from __future__ import annotations

import socket
import time

import pytest

from malletrain.elastic.coordinator.handle import Coordinator
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.jobstore import JobStore
from malletrain.elastic.protocol.keys import MemberInfo
from malletrain.elastic.restart import handover

pytestmark = pytest.mark.torch


def _opener(address: str, job: str, secret: bytes):
    host, port = address.rsplit(":", 1)

    def open_client(timeout_s: float) -> JobStore:
        return JobStore(AuthStore(host, int(port), job, secret, timeout_s=timeout_s,
                                  connect_timeout_s=timeout_s), job)
    return open_client


def test_departure_first_stop_record_only_when_the_tasks_are_gone():
    coord = Coordinator.start()
    try:
        secret = bytes.fromhex(coord.job_secret("j1"))
        open_client = _opener(coord.address, "j1", secret)
        js = open_client(5.0)
        for m in ("a", "b"):
            js.register(MemberInfo(m, f"n-{m}", 1, 1, time.time()))
        coord.publish("j1", ["a", "b"])
        handover.record(js, "b", 1, "run")
        words = handover.Farewell(open_client, "b", 1).start()
        deadline = time.monotonic() + 5.0
        while words.departed_s is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # the tasks are still being stopped: departed, but the generation still runs here
        assert [d.member_id for d in coord.departures("j1")] == ["b"]
        assert coord.departures("j1")[0].reason == "sigterm"
        time.sleep(0.1)
        assert js.get_if_set(handover.generation_key(js, "b")) == b"1:run"
        words.stopped()
        assert words.wait(5.0)
        assert js.get_if_set(handover.generation_key(js, "b")) == b"1:stop"
    finally:
        coord.close()


def test_a_coordinator_that_never_answers_does_not_hold_the_exit():
    with socket.socket() as silent:  # accepts connections (the backlog), answers nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        words = handover.Farewell(_opener(address, "j1", b"k" * 32), "b", 3).start()
        words.stopped()
        t0 = time.monotonic()
        assert not words.wait(0.3)
        assert time.monotonic() - t0 < 0.5
        assert words.departed_s is None and words.recorded_s is None


def test_no_generation_no_stop_record():
    coord = Coordinator.start()
    try:
        open_client = _opener(coord.address, "j2", bytes.fromhex(coord.job_secret("j2")))
        words = handover.Farewell(open_client, "a", None).start()
        assert words.wait(5.0)  # departed; no stop record is waited for
        assert [d.epoch for d in coord.departures("j2")] == [None]
    finally:
        coord.close()


def test_a_node_whose_script_crashed_is_not_waited_for():
    """The next generation waits for every node of the last one to record its stop, up to
    its bound (15 s and more). A node whose batch shell failed departs ``crashed`` once what
    the shell started has ended there, so it is not waited for, even if its stop record
    never came; ``failed`` (the daemon's word for a slot that vanished) neither; one still
    running (its departure is a ``sigterm`` whose stop is still on its way) is."""
    coord = Coordinator.start()
    try:
        secret = bytes.fromhex(coord.job_secret("j1"))
        js = _opener(coord.address, "j1", secret)(5.0)
        for m in ("a", "b", "c", "d"):
            js.register(MemberInfo(m, f"n-{m}", 1, 1, time.time()))
        coord.publish("j1", ["a", "b", "c", "d"])
        for m in ("b", "c", "d"):
            handover.record(js, m, 1, "run")
        js.depart("b", "crashed", 1, 0, detail="the batch script exited with code 1")
        js.depart("c", "sigterm", 1, 0)
        coord.publish("j1", ["a"])
        m2 = js.current()
        assert m2 is not None and m2.members == ("a",)
        assert handover.still_running(js, m2, "a") == ["c", "d"]
        handover.record(js, "c", 1, "stop")
        assert handover.still_running(js, m2, "a") == ["d"]
    finally:
        coord.close()
