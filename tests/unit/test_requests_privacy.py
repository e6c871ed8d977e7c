"""`malletrain jobs` follows Slurm's PrivateData: with jobs private a user sees only their own,
operators see all (the reading of PrivateData itself is tested on the dev cluster)."""

from malletrain.daemon.jobs.store import Store
from malletrain.daemon.submit.channel import Peer
from malletrain.daemon.submit.requests import JobRow, RequestHandler
from malletrain.ops.settings import Settings
from malletrain.slurm.privacy import Privacy


def _row(job_id: str, user: str) -> JobRow:
    return JobRow(job_id=job_id, user=user, name="train.py", state="running", nodes=[],
                  members=0, min_nodes=1, max_nodes=2, samples_total=0, samples_per_s=0.0,
                  profile_points=0, rescales_up=0, rescales_down=0, preemptions=0, message="")


def _handler(tmp_path, privacy: Privacy) -> RequestHandler:
    rows = [_row("m1", "alice"), _row("m2", "bob"), _row("m3", "alice")]
    return RequestHandler(Settings(), Store(tmp_path / "s.db"),
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
