"""Concurrent job lookups answered by one Slurm query (slurm/coalesce.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from malletrain.core.cluster import Job, JobState
from malletrain.errors import RetryableError
from malletrain.slurm.coalesce import CoalescedJobs


def job(i: int) -> Job:
    return Job(job_id=i, name=f"j{i}", user="alice", state=JobState.PENDING,
               partition="scavenger", node_count=1)


class Slurm:
    """Knows jobs 1..999; the first query blocks until ``release`` (to gather a batch)."""

    def __init__(self) -> None:
        self.queries: list[list[int]] = []
        self.release = threading.Event()
        self.first_in = threading.Event()

    def jobs(self, ids: Sequence[int]) -> list[Job]:
        self.queries.append(list(ids))
        if len(self.queries) == 1:
            self.first_in.set()
            assert self.release.wait(10)
        if any(i >= 1000 for i in ids):
            raise RetryableError(f"squeue: invalid job id in {list(ids)}")
        return [job(i) for i in ids]


class Lookups:
    """Each list of ids looked up on a thread of its own; ``results`` once joined."""

    def __init__(self, c: CoalescedJobs, asks: list[list[int]]) -> None:
        self.results: list[object] = [None] * len(asks)
        self.threads = [threading.Thread(target=self._one, args=(c, k, ids))
                        for k, ids in enumerate(asks)]
        for t in self.threads:
            t.start()

    def _one(self, c: CoalescedJobs, k: int, ids: list[int]) -> None:
        try:
            self.results[k] = [j.job_id for j in c.jobs(ids)]
        except RetryableError as exc:
            self.results[k] = exc

    def join(self) -> list[object]:
        for t in self.threads:
            t.join(10)
        return self.results


def wait_for_callers(c: CoalescedJobs, n: int) -> None:
    """Until ``n`` lookups wait in the open batch (the query before it still runs)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with c._cond:
            if c._open is not None and c._open.callers == n:
                return
        time.sleep(0.01)
    raise AssertionError(f"{n} callers never gathered")


def test_a_lone_lookup_runs_at_once() -> None:
    s = Slurm()
    s.release.set()
    c = CoalescedJobs(s.jobs)
    assert [j.job_id for j in c.jobs([5, 3])] == [5, 3]
    assert s.queries == [[3, 5]]


def test_lookups_arriving_during_a_query_share_the_next_one() -> None:
    s = Slurm()
    c = CoalescedJobs(s.jobs)
    first = Lookups(c, [[1]])
    assert s.first_in.wait(5)
    rest = Lookups(c, [[10 + k, 100 + k] for k in range(20)])
    wait_for_callers(c, 20)
    s.release.set()
    assert first.join() == [[1]]
    assert rest.join() == [[10 + k, 100 + k] for k in range(20)]  # each gets only its own
    assert len(s.queries) == 2  # 21 lookups, 2 queries
    assert sorted(s.queries[1]) == list(range(10, 30)) + list(range(100, 120))


def test_one_callers_bad_id_fails_its_own_lookup_not_its_neighbours() -> None:
    s = Slurm()
    c = CoalescedJobs(s.jobs)
    first = Lookups(c, [[1]])
    assert s.first_in.wait(5)
    rest = Lookups(c, [[20], [5000], [30]])
    wait_for_callers(c, 3)
    s.release.set()
    first.join()
    good_a, bad, good_b = rest.join()
    assert good_a == [20] and good_b == [30]
    assert isinstance(bad, RetryableError)


def test_a_lone_callers_error_is_raised_as_it_was() -> None:
    s = Slurm()
    s.release.set()
    c = CoalescedJobs(s.jobs)
    with pytest.raises(RetryableError, match="invalid job id"):
        c.jobs([7000])
    assert c.jobs([7]) and len(s.queries) == 2  # and the next lookup is served
