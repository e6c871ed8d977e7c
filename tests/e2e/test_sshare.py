"""Slurm's fair-share factor through the real daemon on the dev cluster (issue 47): mt-alice
and mt-bob in a fresh account (real slurmdbd, priority/multifactor); alice runs a regular
2-node job, which Slurm charges to her association at its next decay (PriorityCalcPeriod=1
minute: up to a minute), so her FairShare drops below bob's. The daemon reads ``sshare``
(``accounting.share_weights_from: sshare``) and ``malletrain jobs --json`` shows bob
entitled to more of the idle nodes than alice, in the direction of the factors read live.

About 80 s, most of it waiting for Slurm's decay period (it cannot be forced)."""

from __future__ import annotations

import json

import pytest

from malletrain.slurm.parsers.parse_sshare import COMMAND, parse_sshare

from .harness import Daemon, check_python_reachable, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

SAMPLES = 10_000_000  # no job finishes: both are cancelled at the end
ACCOUNT = "mtshare"
USERS = ("mt-alice", "mt-bob")


@pytest.fixture
def shared_account(clean_cluster):
    """Both test users in a fresh account (fresh usage); removed afterwards (the session's
    cluster is shared by every test)."""
    c = clean_cluster
    c.run("sacctmgr", "-i", "add", "account", ACCOUNT, "Description=sshare test",
          "Organization=tests")
    try:
        for user in USERS:
            c.run("sacctmgr", "-i", "add", "user", user, f"account={ACCOUNT}",
                  f"DefaultAccount={ACCOUNT}")
        yield c
    finally:
        for user in USERS:
            c.run("sacctmgr", "-i", "delete", "user", user, check=False)
        c.run("sacctmgr", "-i", "delete", "account", ACCOUNT, check=False)


def test_entitlements_follow_slurms_fair_share_factor(shared_account, workdir):
    c = shared_account
    check_python_reachable("mt-alice", c.env)
    c.sbatch("-N", "2", "-p", "batch", f"--account={ACCOUNT}", "--chdir=/tmp",
             wrap="sleep 70", user="mt-alice")
    d = Daemon(workdir, c.conf_path, c.env).with_accounting(share_weights_from="sshare")
    d.start()

    def factors() -> dict[str, float]:
        rows = parse_sshare(c.run(*COMMAND).stdout)
        return {r.user: r.factor for r in rows
                if r.account == ACCOUNT and r.user and r.factor is not None}

    try:
        alice = d.submit_example("mt-alice", "a0", "1-8", SAMPLES)
        bob = d.submit_example("mt-bob", "b0", "1-8", SAMPLES)

        def follows() -> bool:
            f, rows = factors(), d.jobs()
            return (f.get("mt-alice", 1.0) < f.get("mt-bob", 0.0)
                    and rows[bob]["user_entitled"] > rows[alice]["user_entitled"] > 0)

        wait_until(follows, 150, period_s=2,
                   what="alice's factor below bob's, and bob entitled to more nodes",
                   on_timeout=lambda: (json.dumps(factors()) + json.dumps(d.jobs(), indent=1)
                                       + d.log()[-3000:]))
        rows = d.jobs()
        assert rows[bob]["user_entitled"] + rows[alice]["user_entitled"] <= len(c.nodes)
        # alice gives back what she held beyond her new part at her next step
        wait_until(lambda: (lambda r: r[alice]["user_nodes"] <= r[alice]["user_entitled"])(
            d.jobs()), 60, what="alice at or below her weighted part",
            on_timeout=lambda: json.dumps(d.jobs(), indent=1))
        d.cli("mt-alice", "cancel", "--socket", str(d.socket), alice)
        d.cli("mt-bob", "cancel", "--socket", str(d.socket), bob)
        assert "Traceback" not in d.log()
    finally:
        d.stop()
        d.stop_coordinator()
        c.scancel_all()
