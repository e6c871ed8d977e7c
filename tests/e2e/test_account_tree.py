"""Slurm's nested account tree through the real daemon on the dev cluster (issue 47): accounts
made with ``sacctmgr`` (root -> mtphys -> {mtphys-a, mtphys-b}; root -> mtchem), mt-alice in
both physics sub-accounts with a job in each, mt-bob in mtchem with one. With
``accounting.account_weights`` the daemon reads each account's parent with the limits and
divides the 8 nodes level by level: physics 4 (2 + 2 for alice), chemistry 4 for bob. One
level (the accounts side by side) would give the three leaf accounts 3, 3 and 2: alice 5-6,
bob 2-3. ``malletrain jobs --json`` shows the entitlements. About 30 s."""

from __future__ import annotations

import json

import pytest

from .harness import Daemon, check_python_reachable, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

SAMPLES = 10_000_000  # no job finishes: all are cancelled at the end
TREE = (("mtphys", "root"), ("mtphys-a", "mtphys"), ("mtphys-b", "mtphys"),
        ("mtchem", "root"))
MEMBERS = (("mt-alice", "mtphys-a"), ("mt-alice", "mtphys-b"), ("mt-bob", "mtchem"))


@pytest.fixture
def account_tree(clean_cluster):
    """The accounts and the users' associations; removed afterwards (the session's cluster
    is shared by every test)."""
    c = clean_cluster
    try:
        for account, parent in TREE:
            c.run("sacctmgr", "-i", "add", "account", account, f"parent={parent}",
                  "Description=account tree test", "Organization=tests")
        for user, account in MEMBERS:
            c.run("sacctmgr", "-i", "add", "user", user, f"account={account}")
        yield c
    finally:
        for user, account in MEMBERS:
            c.run("sacctmgr", "-i", "delete", "user", user, f"account={account}", check=False)
        for account, _ in reversed(TREE):
            c.run("sacctmgr", "-i", "delete", "account", account, check=False)


def test_the_daemon_divides_down_slurms_account_tree(account_tree, workdir):
    c = account_tree
    check_python_reachable("mt-alice", c.env)
    d = Daemon(workdir, c.conf_path, c.env).with_accounting(account_weights={"mtchem": 1.0})
    d.start()
    try:
        a = d.submit_example("mt-alice", "a", "1-8", SAMPLES, options=["-A", "mtphys-a"])
        b = d.submit_example("mt-alice", "b", "1-8", SAMPLES, options=["-A", "mtphys-b"])
        bob = d.submit_example("mt-bob", "c", "1-8", SAMPLES, options=["-A", "mtchem"])

        def divided() -> bool:
            rows = d.jobs()
            return ([len(rows[j]["nodes"]) for j in (a, b, bob)] == [2, 2, 4]
                    and rows[bob]["user_entitled"] == 4 and rows[a]["user_entitled"] == 4)

        wait_until(divided, 90, period_s=1,
                   what="alice 2 + 2 nodes in the two physics accounts, bob 4 in chemistry",
                   on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
        for user, job in (("mt-alice", a), ("mt-alice", b), ("mt-bob", bob)):
            d.cli(user, "cancel", "--socket", str(d.socket), job)
        assert "Traceback" not in d.log()
    finally:
        d.stop()
        d.stop_coordinator()
        c.scancel_all()
