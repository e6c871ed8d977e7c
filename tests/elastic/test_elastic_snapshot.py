"""The evicted-to-zero snapshot files: atomic, tagged, never picked from another job."""

from __future__ import annotations

import os
import pwd
import stat

import pytest
import torch

from malletrain.elastic.worker import snapshot

pytestmark = pytest.mark.torch
KEY = b"s" * 32


def _payload(x: float) -> dict:
    return {"model": {"w": torch.full((3,), x)}, "position": {"step": 0, "samples_total": 0}}


def test_save_is_atomic_tagged_and_replaces_older(tmp_path):
    p1 = snapshot.save(tmp_path, "job", 10, _payload(1.0), KEY)
    p2 = snapshot.save(tmp_path, "job", 25, _payload(2.0), KEY)
    assert not p1.exists() and p2.name == "job.step000000000025.mtsnap"
    assert not list(tmp_path.glob(".*tmp"))  # no temporary left behind
    ref = snapshot.find_latest(tmp_path, "job")
    assert ref is not None and ref.step == 25
    loaded = snapshot.load(ref, "job", KEY)
    assert loaded is not None and loaded["step"] == 25 and loaded["job_id"] == "job"
    assert torch.equal(loaded["model"]["w"], torch.full((3,), 2.0))


def test_other_jobs_and_prefixes_are_never_matched(tmp_path):
    snapshot.save(tmp_path, "job10", 99, _payload(1.0), KEY)
    snapshot.save(tmp_path, "other", 500, _payload(1.0), KEY)
    (tmp_path / "job1.step000000000777.mtsnap.tmp").write_bytes(b"partial")
    assert snapshot.find_latest(tmp_path, "job1") is None
    assert snapshot.find_latest(tmp_path / "missing", "job1") is None
    assert snapshot.find_latest(None, "job1") is None


def test_mismatched_or_corrupt_files_are_rejected_and_set_aside(tmp_path):
    good = snapshot.save(tmp_path, "job", 5, _payload(1.0), KEY)
    forged = tmp_path / "job.step000000000050.mtsnap"
    forged.write_bytes(good.read_bytes())  # inner tag says step 5
    forged.chmod(0o600)  # private, like a real one: the tags give it away
    ref = snapshot.find_latest(tmp_path, "job")
    assert ref is not None and ref.step == 50
    assert snapshot.load(ref, "job", KEY) is None
    assert (tmp_path / (forged.name + ".rejected")).exists()
    corrupt = tmp_path / "job.step000000000060.mtsnap"
    corrupt.write_bytes(b"\x00not a torch file")
    corrupt.chmod(0o600)
    assert snapshot.load(snapshot.find_latest(tmp_path, "job"), "job", KEY) is None
    # what remains is the genuine one
    ref = snapshot.find_latest(tmp_path, "job")
    assert ref is not None and ref.step == 5 and snapshot.load(ref, "job", KEY) is not None


def test_a_later_save_of_an_older_step_keeps_the_newer_file(tmp_path):
    """Two members may save at once (SIGTERM while re-forming): the slower, staler one
    must not delete the newer snapshot the faster one put in place."""
    snapshot.save(tmp_path, "job", 25, _payload(2.0), KEY)
    snapshot.save(tmp_path, "job", 24, _payload(1.0), KEY)
    ref = snapshot.find_latest(tmp_path, "job")
    assert ref is not None and ref.step == 25
    assert sorted(p.name for p in tmp_path.glob("job.*")) == [
        "job.step000000000024.mtsnap", "job.step000000000025.mtsnap"]
    snapshot.save(tmp_path, "job", 30, _payload(3.0), KEY)  # a newer one clears both
    assert [p.name for p in tmp_path.glob("job.*")] == ["job.step000000000030.mtsnap"]


def test_remove_all_of_a_job(tmp_path):
    snapshot.save(tmp_path, "job", 5, _payload(1.0), KEY)
    snapshot.save(tmp_path, "keep", 5, _payload(1.0), KEY)
    snapshot.remove_older(tmp_path, "job", keep_step=None)
    assert snapshot.find_latest(tmp_path, "job") is None
    assert snapshot.find_latest(tmp_path, "keep") is not None


def test_snapshots_are_private_and_only_private_ones_of_this_user_are_used(tmp_path):
    """The state directory is shared by all users (issue 15): planted files are refused."""
    good = snapshot.save(tmp_path, "job", 5, _payload(1.0), KEY)
    assert stat.S_IMODE(good.stat().st_mode) == 0o600
    planted = tmp_path / "job.step000000000900.mtsnap"  # another user's, newer-named
    planted.write_bytes(good.read_bytes())
    planted.chmod(0o600)
    os.chown(planted, pwd.getpwnam("nobody").pw_uid, -1)
    readable = tmp_path / "job.step000000000800.mtsnap"  # a copy others could read or swap
    readable.write_bytes(good.read_bytes())
    readable.chmod(0o644)
    link = tmp_path / "job.step000000000700.mtsnap"  # a symlink to a file of its choosing
    link.symlink_to(good)
    ref = snapshot.find_latest(tmp_path, "job")
    assert ref is not None and ref.path == good and snapshot.load(ref, "job", KEY) is not None
    snapshot.remove_older(tmp_path, "job", keep_step=None)  # removes only its own files
    assert not good.exists() and planted.exists()


def test_a_snapshot_must_carry_this_jobs_mac(tmp_path):
    """Swapped, truncated, or written with another secret (e.g. the same user's other job
    renamed into place): refused before torch.load, and the genuine one is still used."""
    good = snapshot.save(tmp_path, "job", 5, _payload(1.0), KEY)
    data = good.read_bytes()
    for step, body in ((50, data[:-10]),  # truncated
                       (60, data[:-1] + bytes([data[-1] ^ 1])),  # one bit flipped
                       (70, data[:8] + b"0" * 32 + data[40:])):  # MAC replaced
        bad = tmp_path / f"job.step{step:012d}.mtsnap"
        bad.write_bytes(body)
        bad.chmod(0o600)
        assert snapshot.load(snapshot.find_latest(tmp_path, "job"), "job", KEY) is None
    other = snapshot.save(tmp_path / "o", "job", 80, _payload(9.0), b"t" * 32)
    os.replace(other, tmp_path / other.name)  # a valid file, another secret
    assert snapshot.load(snapshot.find_latest(tmp_path, "job"), "job", KEY) is None
    ref = snapshot.find_latest(tmp_path, "job")
    assert ref is not None and ref.path == good
    loaded = snapshot.load(ref, "job", KEY)
    assert loaded is not None and torch.equal(loaded["model"]["w"], torch.full((3,), 1.0))


def test_a_jobs_directory_is_its_own_private_and_unguessable(tmp_path):
    """Issue 49: in the shared directory another user took a snapshot's name first."""
    old = os.umask(0o777)  # even a umask that takes the owner's own bits
    try:
        own = snapshot.private_dir(tmp_path, "job", KEY, create=True)
    finally:
        os.umask(old)
    assert own is not None and own.parent == tmp_path and own.name.startswith("job.")
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    assert own == snapshot.job_dir(tmp_path, "job", KEY) != snapshot.job_dir(tmp_path, "job",
                                                                             b"t" * 32)
    assert snapshot.private_dir(tmp_path, "job", KEY, create=False) == own
    assert snapshot.private_dir(tmp_path, "new", KEY, create=False) is None  # not made
    theirs = snapshot.job_dir(tmp_path, "other", KEY)  # taken by another user (or opened)
    theirs.mkdir(mode=0o700)
    os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(OSError, match="not by this user"):
        snapshot.private_dir(tmp_path, "other", KEY, create=True)
    assert snapshot.private_dir(tmp_path, "other", KEY, create=False) is None
    os.chown(theirs, os.geteuid(), -1)
    theirs.chmod(0o755)
    with pytest.raises(OSError, match="lets others in"):
        snapshot.private_dir(tmp_path, "other", KEY, create=True)


def test_a_snapshot_saved_before_the_per_job_directories_is_still_found(tmp_path):
    """A job evicted to zero by the code before issue 49 saved in the shared directory
    itself; after the upgrade it must resume from that file, not start over, and only if
    it is this user's private file with the job's MAC (another user's copy is refused)."""
    old = snapshot.save(tmp_path, "job", 40, _payload(4.0), KEY)  # the old layout
    own = snapshot.private_dir(tmp_path, "job", KEY, create=True)
    assert snapshot.find_newest(tmp_path, own, "job").path == old
    newer = snapshot.save(own, "job", 50, _payload(5.0), KEY)
    assert snapshot.find_newest(tmp_path, own, "job").path == newer
    assert snapshot.find_newest(tmp_path, None, "job").step == 40
    os.chown(old, pwd.getpwnam("nobody").pw_uid, -1)  # planted: not this user's
    assert snapshot.find_newest(tmp_path, None, "job") is None
    assert snapshot.find_newest(None, None, "job") is None
