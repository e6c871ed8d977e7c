"""The watcher thread's progress reports never land after the job's final one.

Rank 0's watcher sends progress reports on its own coordinator connection while the main
thread trains; at the finish the main thread sends the final report itself. A report the
watcher was still sending (or held) used to land after it and leave the coordinator's
progress short of the job's total (CI: 1088 of 1100 samples in
tests/elastic/test_elastic_runtime.py). ``Watcher.quiesce`` waits for the send in flight and
drops what is pending. The job and its store are stand-ins: this is the thread's ordering.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from malletrain.elastic.worker.watcher import Watcher


class SlowStore:
    """A coordinator connection whose progress writes take until ``release`` is set."""

    def __init__(self) -> None:
        self.reports: list[str] = []
        self.sending = threading.Event()
        self.release = threading.Event()

    def latest_epoch(self) -> int:
        return 1

    def set_progress(self, report: str) -> None:
        self.sending.set()
        self.release.wait(5.0)
        self.reports.append(report)


def _job(store: SlowStore) -> SimpleNamespace:
    return SimpleNamespace(
        config=SimpleNamespace(poll_interval_s=0.01, abort_hung=None, step_timeout_s=60.0),
        backend="gloo", _step_started=None,
        link=SimpleNamespace(own_client=lambda timeout_s: store))


def test_quiesce_waits_for_the_report_in_flight_and_drops_the_pending_one():
    store = SlowStore()
    watcher = Watcher(_job(store))  # type: ignore[arg-type]
    watcher.start()
    watcher.pending_report = "r1"
    assert store.sending.wait(5.0)  # the watcher is sending r1
    watcher.pending_report = "r2"  # the main thread built a newer one meanwhile
    threading.Timer(0.2, store.release.set).start()
    watcher.quiesce(join_timeout_s=5.0)
    assert store.reports == ["r1"]  # r1 landed before quiesce returned
    assert watcher.pending_report is None
    store.set_progress("final")  # what the main thread sends next is the last write
    assert store.reports == ["r1", "final"]
    assert not watcher._thread.is_alive()

