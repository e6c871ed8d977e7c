"""What a submission counts against: ``limits.max_jobs_per_user`` per user, an array as all its
tasks (the request handler on a real SQLite store)."""

import pytest

from malletrain.daemon.jobs.spec import SpecError
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.submit.channel import Peer
from malletrain.daemon.submit.requests import RequestHandler
from malletrain.errors import RetryableError
from malletrain.ops.settings import Settings


class Coordinator:
    address = "127.0.0.1:1"

    def job_secret(self, job_id: str, owner: int) -> str:
        return "s" * 64


def _handler(tmp_path) -> RequestHandler:
    return RequestHandler(Settings(), Store(tmp_path / "s.db"), coordinator=Coordinator(),
                          state_dir=tmp_path, rows=list, wake=lambda: None)


def _submit(handler: RequestHandler, spec: dict, uid: int = 1001) -> dict:
    return handler.handle(Peer(uid=uid, gid=uid, pid=1, user="alice"),
                          {"op": "submit", "spec": spec})


def test_an_array_answers_for_all_its_tasks_at_its_first(tmp_path):
    """An array is one malleable job per task, each counted against
    ``limits.max_jobs_per_user`` (8): one of 20 tasks is refused before any task exists (it
    used to fail at the 9th, after 8 submissions and their undoing), one of 5 beside 5 live
    jobs is told to wait, and one of 3 goes in."""
    h = _handler(tmp_path)
    base = {"script": "/bin/true", "name": "sweep", "min_nodes": 1, "max_nodes": 2}
    with pytest.raises(SpecError, match="20 malleable jobs, more than one user may have"):
        _submit(h, {**base, "array": "0-19", "array_task_id": 0})
    assert h.store.count_jobs(1001) == 0
    for _ in range(5):
        _submit(h, base)
    with pytest.raises(RetryableError, match=r"5 more would pass limits\.max_jobs_per_user"):
        _submit(h, {**base, "array": "0-4", "array_task_id": 0})
    first = _submit(h, {**base, "array": "0-2", "array_task_id": 0})["job_id"]
    assert h.store.count_jobs(1001) == 6 and first
