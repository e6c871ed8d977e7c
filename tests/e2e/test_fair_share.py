"""Fair shares among users through the real daemon on the dev cluster (issue 47): mt-alice's
8 jobs (her limit) hold every node; mt-bob submits one job of the same kind; bob's job
trains on its user's half while alice's jobs shrink to hers. User-blind, bob's job got 1
node of 8 after 18 s and kept 1 for the next 3 minutes.

The parts count every node a job may hold (``fair_share_min_gain: 0``): the dev cluster's
8 nodes share one 2-core machine, so a job's measured curve adds about half a node per node,
near the useful-size rule's threshold (0.5 then, 0.6 now), and a part for useful sizes would
follow that noise (once in three runs, with the rule, bob's REASON was not ``UserShare`` for
30 s after he reached his half; that run printed no jobs table, so its plan is not known).
The rule is tested on its own (``tests/unit/test_fair_share_useful.py``, the replays)."""

from __future__ import annotations

import json

import pytest

from .harness import Daemon, serve, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

SAMPLES = 10_000_000  # no job finishes: all are cancelled at the end
#: Steps paced at 0.5 s (the examples' default is 0.25 s). At 0.25 s, in one CI rehearsal,
#: bob fell back from 4 nodes to 1 (REASON Resources) while alice's 1-node jobs took the
#: rest: the plan valued his growth below their starts, most likely because nine jobs'
#: workers on 2 cores left his 4-node rate measured barely above his 1-node rate.
STEP_SLEEP_S = 0.5


@pytest.fixture
def daemon(clean_cluster, workdir):
    """The default daemon with strict parts (the module's docstring says why)."""
    d = Daemon(workdir, clean_cluster.conf_path, clean_cluster.env)
    yield from serve(d.with_settings("accounting", fair_share_min_gain=0.0), clean_cluster)


def test_bobs_one_job_gets_bobs_half_while_alices_jobs_hold_every_node(daemon,
                                                                         clean_cluster):
    d = daemon
    alice = [d.submit_example("mt-alice", f"a{k}", "1-8", SAMPLES,
                               step_sleep_s=STEP_SLEEP_S) for k in range(8)]

    def nodes_of(rows, jobs):
        return sum(len(rows[j]["nodes"]) for j in jobs)

    wait_until(lambda: nodes_of(d.jobs(), alice) == 8, 150,
               what="alice's eight jobs on all 8 nodes",
               on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
    bob = d.submit_example("mt-bob", "b0", "1-8", SAMPLES, step_sleep_s=STEP_SLEEP_S)

    def bob_has_his_half():
        rows = d.jobs()
        return (len(rows[bob]["nodes"]) >= 4 and rows[bob]["samples_total"] > 0
                and nodes_of(rows, alice) <= 4)

    wait_until(bob_has_his_half, 150, what="bob's job training on 4 of 8 nodes",
               on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
    wait_until(lambda: d.jobs()[bob]["reason"] == "UserShare", 30,
               what="bob's job saying it is at its user's share",
               on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
    table = d.cli("mt-bob", "jobs", "--socket", str(d.socket)).stdout
    assert "REASON" in table.splitlines()[0] and "UserShare" in table
    d.cli("mt-alice", "cancel", "--socket", str(d.socket), *alice)
    d.cli("mt-bob", "cancel", "--socket", str(d.socket), bob)
    wait_until(lambda: all(d.jobs()[j]["state"] == "cancelled" for j in [*alice, bob]), 60,
               what="every job cancelled")
    assert "Traceback" not in d.log()
