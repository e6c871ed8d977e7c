"""What a job asks of its nodes, on the real dev cluster: a job's ``--rate-target`` holds it
at the nodes that meet its target (issue 19) while a job without one grows onto the idle
nodes beside it, on none of the nodes it ``--exclude``s (issue 16)."""

from __future__ import annotations

import json
import time

import pytest

from .harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.torch]

SAMPLES = 10_000_000  # neither job finishes: both are cancelled at the end


def test_a_rate_target_and_an_exclusion_are_kept(daemon, clean_cluster):
    d = daemon
    # one sample/s: one node of the example trains hundreds, so one node meets it
    capped = d.submit_example("mt-alice", "jt", "1-3", SAMPLES, options=("--rate-target=1",))
    free = d.submit_example("mt-alice", "jf", "1-3", SAMPLES, options=("-x", "n[1-5]"))
    allowed = {"n6", "n7", "n8"}

    def settled():
        rows = d.jobs()
        return (len(rows[free]["nodes"]) == 3 and rows[capped]["state"] == "running"
                and rows[capped]["samples_total"] > 0 and len(rows[capped]["nodes"]) == 1)

    wait_until(settled, 150, what="the untargeted job on 3 nodes, the targeted one on 1",
               on_timeout=lambda: json.dumps(d.jobs(), indent=1) + d.log()[-3000:])
    rows = d.jobs()
    assert rows[capped]["rate_target"] == 1.0 and rows[free]["rate_target"] is None
    held = []
    for _ in range(10):  # idle nodes stay on offer all along: 8 nodes, 3 + 1 held
        rows = d.jobs()
        held.append(len(rows[capped]["nodes"]))
        assert set(rows[free]["nodes"]) <= allowed, rows[free]["nodes"]
        time.sleep(2)
    assert held == [1] * 10, held
    assert d.jobs()[capped]["samples_per_s"] > 1.0  # the target is met on that one node
    d.cli("mt-alice", "cancel", "--socket", str(d.socket), capped, free)
    wait_until(lambda: all(d.jobs()[j]["state"] == "cancelled" for j in (capped, free)), 60,
               what="both jobs cancelled")
    assert "Traceback" not in d.log()
