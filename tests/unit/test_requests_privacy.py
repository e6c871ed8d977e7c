"""`malletrain jobs` follows Slurm's PrivateData: with jobs private a user sees only their own,
operators see all (the reading of PrivateData itself is tested on the dev cluster)."""

from malletrain.daemon.channel import Peer
from malletrain.daemon.requests import JobRow, RequestHandler
from malletrain.daemon.store import Store
from malletrain.ops.settings import Settings
from malletrain.slurm.privacy import Privacy


def _row(job_id: str, user: str) -> JobRow:
    return JobRow(job_id=job_id, user=user, name="train.py", state="running", nodes=[],
                  members=0, min_nodes=1, max_nodes=2, samples_total=0, samples_per_s=0.0,
                  profile_points=0, rescales_up=0, rescales_down=0, preemptions=0, message="")


def _handler(tmp_path, privacy: Privacy) -> RequestHandler:
    rows = [_row("m1", "alice"), _row("m2", "bob"), _row("m3", "alice")]
    return RequestHandler(Settings(), Store(tmp_path / "s.db"), None,  # type: ignore[arg-type]
                          coordinator=object(), state_dir=tmp_path, rows=lambda: rows,
                          wake=lambda: None, privacy=lambda: privacy)


def _ids(handler: RequestHandler, user: str, uid: int) -> list[str]:
    answer = handler.handle(Peer(uid=uid, gid=uid, pid=1, user=user), {"op": "jobs"})
    return [j["job_id"] for j in answer["jobs"]]


def test_private_jobs_show_a_user_only_their_own(tmp_path):
    h = _handler(tmp_path, Privacy(private_jobs=True, operators=frozenset({"root", "ops"})))
    assert _ids(h, "alice", 1001) == ["m1", "m3"]
    assert _ids(h, "bob", 1002) == ["m2"]
    assert _ids(h, "carol", 1003) == []
    assert _ids(h, "ops", 1004) == ["m1", "m2", "m3"]  # a Slurm operator
    assert _ids(h, "root", 0) == ["m1", "m2", "m3"]


def test_without_private_data_everybody_sees_every_job(tmp_path):
    h = _handler(tmp_path, Privacy(private_jobs=False))
    assert _ids(h, "bob", 1002) == ["m1", "m2", "m3"]


def test_an_attach_sent_again_gets_the_same_answer(tmp_path):
    """A client whose attach answer was lost sends it again (channel.call retries reads and
    attaches): the same slots are accepted again; other slots are still refused."""
    from types import SimpleNamespace

    import pytest

    from malletrain.core.cluster import JobState
    from malletrain.daemon.slots import slot_tag
    from malletrain.errors import PermanentError

    class Slots:
        def jobs(self, ids):
            return [SimpleNamespace(job_id=i, user="alice", comment=slot_tag(job, k),
                                    partition=Settings().slurm.scavenger_partition,
                                    state=JobState.PENDING, node_count=1)
                    for k, i in enumerate(ids)]

    store = Store(tmp_path / "s.db")
    coordinator = SimpleNamespace(address="127.0.0.1:1", job_secret=lambda job_id: "s")
    h = RequestHandler(Settings(), store, Slots(), coordinator=coordinator,  # type: ignore[arg-type]
                       state_dir=tmp_path, rows=lambda: [], wake=lambda: None,
                       privacy=lambda: Privacy(private_jobs=False))
    alice = Peer(uid=1001, gid=1001, pid=1, user="alice")
    job = h.handle(alice, {"op": "submit", "spec": {"script": "/x/t.py", "max_nodes": 2}})
    job = job["job_id"]
    for _ in range(2):
        assert h.handle(alice, {"op": "attach", "job_id": job, "slots": [11, 12]}) == {
            "job_id": job}
    assert [s.slurm_job_id for s in store.slots(job)] == [11, 12]
    with pytest.raises(PermanentError, match="not submitting"):
        h.handle(alice, {"op": "attach", "job_id": job, "slots": [13, 14]})
