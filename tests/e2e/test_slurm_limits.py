"""Slurm's limits through the real daemon on the dev cluster (issue 47): an administrator
gives mt-bob at most 2 nodes a job (``sacctmgr -i modify user mt-bob set MaxTRES=node=2``,
real slurmdbd); the daemon reads it with ``sacctmgr`` and holds bob's job at 2 nodes, saying
``AccountLimit``, while alice's job uses the 6 others (her fair half would be 4). Then
bob's association gets ``GrpTRES=node=3`` and bob starts a regular 2-node job: Slurm counts
it against the same limit, so his malleable job goes down to the 1 node left (not the 2 its
MaxTRES allows), alice's to the 5 left beside it. About 60 s."""

from __future__ import annotations

import json

import pytest

from .harness import Daemon, check_python_reachable, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

SAMPLES = 10_000_000  # no job finishes: both are cancelled at the end
ACCOUNT = "mtlimits"


@pytest.fixture
def bob_limited(clean_cluster):
    """mt-bob's association in a fresh account, with MaxTRES=node=2; removed afterwards
    (the session's cluster is shared by every test)."""
    c = clean_cluster
    c.run("sacctmgr", "-i", "add", "account", ACCOUNT, "Description=limits test",
          "Organization=tests")
    try:
        c.run("sacctmgr", "-i", "add", "user", "mt-bob", f"account={ACCOUNT}",
              f"DefaultAccount={ACCOUNT}")
        c.run("sacctmgr", "-i", "modify", "user", "mt-bob", "set", "MaxTRES=node=2")
        yield c
    finally:
        c.run("sacctmgr", "-i", "delete", "user", "mt-bob", check=False)
        c.run("sacctmgr", "-i", "delete", "account", ACCOUNT, check=False)


def test_bob_is_held_at_his_account_limit_while_alice_uses_the_rest(bob_limited, workdir):
    c = bob_limited
    check_python_reachable("mt-alice", c.env)
    d = Daemon(workdir, c.conf_path, c.env).with_accounting()
    d.start()
    try:
        alice = d.submit_example("mt-alice", "a0", "1-8", SAMPLES)
        bob = d.submit_example("mt-bob", "b0", "1-8", SAMPLES)

        def held():  # (the reason is the last tick's: it may lag the nodes by a tick)
            rows = d.jobs()
            return (len(rows[bob]["nodes"]) == 2 and rows[bob]["samples_total"] > 0
                    and len(rows[alice]["nodes"]) == 6 and rows[bob]["reason"] == "AccountLimit")

        wait_until(held, 75, what="bob training on 2 nodes (AccountLimit), alice on the 6 others",
                   on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
        rows = d.jobs()
        assert rows[bob]["reason"] == "AccountLimit", rows[bob]
        assert (rows[bob]["user_nodes"], rows[bob]["user_entitled"]) == (2, 2), rows[bob]
        assert rows[alice]["user_entitled"] == 6, rows[alice]
        table = d.cli("mt-bob", "jobs", "--socket", str(d.socket)).stdout
        assert "AccountLimit" in table

        c.run("sacctmgr", "-i", "modify", "user", "mt-bob", "set", "GrpTRES=node=3")
        regular = c.sbatch("-p", "batch", "-N", "2", "-t", "2", wrap="sleep 60", user="mt-bob")

        def beside_regular():  # (as held(): the reason may lag the nodes by a tick)
            rows = d.jobs()
            return (c.job_state(regular) == "RUNNING" and len(rows[bob]["nodes"]) == 1
                    and len(rows[alice]["nodes"]) == 5 and rows[bob]["reason"] == "AccountLimit")

        wait_until(beside_regular, 60,
                   what="bob's regular job running, his malleable job on 1 node (AccountLimit)",
                   on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
        assert d.jobs()[bob]["reason"] == "AccountLimit"
        d.cli("mt-alice", "cancel", "--socket", str(d.socket), alice)
        d.cli("mt-bob", "cancel", "--socket", str(d.socket), bob)
        assert "Traceback" not in d.log()
    finally:
        d.stop()
        d.stop_coordinator()
        c.scancel_all()
