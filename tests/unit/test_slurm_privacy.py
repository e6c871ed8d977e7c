"""Reading who may see whose jobs from Slurm (PrivateData, SlurmUser, admin levels)."""

import pytest

from malletrain.slurm.privacy import (
    ADMIN_LEVELS_COMMAND,
    CONFIG_COMMAND,
    Privacy,
    parse_admin_levels,
    parse_config,
    read_privacy,
)

# lines as `scontrol show config` of Slurm 22.05 prints them (the dev cluster's, and a site's)
CONFIG_OPEN = """Configuration data as of 2026-11-25T11:37:00
AccountingStorageType   = accounting_storage/slurmdbd
PrivateData             = none
SlurmUser               = root(0)
"""
CONFIG_PRIVATE = """PrivateData             = accounts,jobs,usage
SlurmUser               = slurm(64030)
"""


def test_parse_config():
    assert parse_config(CONFIG_OPEN) == (frozenset(), "root")
    assert parse_config(CONFIG_PRIVATE) == (frozenset({"accounts", "jobs", "usage"}), "slurm")
    assert parse_config("garbage\n=\n") == (frozenset(), None)


def test_parse_admin_levels():
    text = "root|Administrator\nalice|None\nops|Operator\nbad line\n|\n"
    assert parse_admin_levels(text) == frozenset({"root", "ops"})


def test_who_sees_all():
    open_ = Privacy()
    private = Privacy(private_jobs=True, operators=frozenset({"root", "slurm", "ops"}))
    assert open_.sees_all("alice", 1001)
    assert not private.sees_all("alice", 1001)
    assert private.sees_all("ops", 1005) and private.sees_all("anyone", 0)


def test_read_privacy_falls_back_to_root_and_the_slurm_user_without_accounting():
    def run(argv):
        if argv == CONFIG_COMMAND:
            return CONFIG_PRIVATE
        assert argv == ADMIN_LEVELS_COMMAND
        raise RuntimeError("sacctmgr: no slurmdbd")

    p = read_privacy(run)
    assert p == Privacy(private_jobs=True, operators=frozenset({"root", "slurm"}))


def test_read_privacy_needs_the_config():
    def run(argv):
        raise RuntimeError("slurmctld down")

    with pytest.raises(RuntimeError):
        read_privacy(run)


def test_the_cache_rereads_after_its_ttl_and_keeps_the_last_good_answer():
    from malletrain.slurm.privacy import PrivacyCache

    now = [0.0]
    answers: list = [RuntimeError("slurmctld down"), Privacy(), RuntimeError("down again")]

    def read():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    cache = PrivacyCache(read, ttl_s=60, clock=lambda: now[0])
    assert cache.get().private_jobs  # no answer yet: private, the safe side
    now[0] = 30
    assert cache.get().private_jobs and len(answers) == 2  # within the TTL: not re-read
    now[0] = 61
    assert cache.get().private_jobs  # read again on its own thread: the last answer now
    cache.settle(5)
    assert not cache.get().private_jobs and len(answers) == 1  # read: open
    now[0] = 200
    assert not cache.get().private_jobs
    cache.settle(5)
    assert not cache.get().private_jobs and answers == []  # failed read: the last good one


def test_a_slow_read_after_the_first_never_holds_the_caller():
    import threading

    from malletrain.slurm.privacy import PrivacyCache

    now = [0.0]
    release = threading.Event()
    reads = []

    def read():
        reads.append(now[0])
        if len(reads) > 1:
            assert release.wait(10)  # slurmctld answering slowly
        return Privacy(private_jobs=len(reads) > 1)

    cache = PrivacyCache(read, ttl_s=60, clock=lambda: now[0])
    assert not cache.get().private_jobs  # the first read is the caller's own
    now[0] = 61
    assert not cache.get().private_jobs  # a read runs; the last answer at once
    now[0] = 130
    assert not cache.get().private_jobs and reads == [0.0, 61]  # never two reads at once
    release.set()
    cache.settle(5)
    assert cache.get().private_jobs
