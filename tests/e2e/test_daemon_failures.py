"""The daemon under failure, on the real dev cluster: bad input, Slurm down, a node vanishing
mid-step, the daemon killed in the middle of a rescale."""

from __future__ import annotations

import time

import pytest

from malletrain.devstack import PYTHON, as_user, run

from .harness import EXAMPLE, Daemon, check_python_reachable, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]


@pytest.fixture
def daemon(clean_cluster, workdir):
    d = Daemon(workdir, clean_cluster.conf_path, clean_cluster.env,
               policy="malletrain").start()
    yield d
    if not clean_cluster.ctld_up():
        clean_cluster.dev_cluster("start-controller")
    d.stop()
    if d.proc is not None and d.proc.poll() is None:
        d.kill9()
    clean_cluster.scancel_all()
    d.stop_coordinator()


def test_bad_specs_get_one_clear_line_and_nothing_is_submitted(daemon, clean_cluster):
    d = daemon
    script = d.out / "bad.py"
    script.write_text("#!/usr/bin/env python3\n#SBATCH --nodelist=n1\nprint(1)\n")
    script.chmod(0o644)
    shell = d.out / "job.sh"
    shell.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --dependency=aftercorr:7\nsrun hostname\n")
    shell.chmod(0o644)
    cases = [
        ([str(script)], "--nodelist cannot be used for a malleable job", f"{script}:2"),
        ([str(shell)], "aftercorr: array task to array task dependencies", f"{shell}:3"),
        (["-N", "3-1", str(EXAMPLE)], "min <= max", None),
        (["--time", "soon", str(EXAMPLE)], "is not a time", None),
        (["-N", "1-100000", str(EXAMPLE)], "above this site's limit", None),
        ([str(d.out / "missing.py")], "no such file", None),
        (["--export=MALLETRAIN_JOB_ID=x", str(EXAMPLE)], "set by malletrain", None),
    ]
    for args, needle, where in cases:
        res = d.submit("mt-alice", *args, check=False)
        assert res.returncode != 0, args
        assert needle in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        if where:
            assert where in res.stderr
    assert not clean_cluster.active_job_ids()  # nothing reached Slurm
    # a wrong socket is one clear line too
    # ... after trying again for $MALLETRAIN_RETRY_S (a restarting daemon), said once
    t0 = time.monotonic()
    res = run(as_user("mt-alice", ["env", "MALLETRAIN_RETRY_S=2", PYTHON, "-m", "malletrain.cli",
                                   "jobs", "--socket", "/nonexistent/sock"]),
              clean_cluster.env, check=False)
    assert res.returncode == 75 and "daemon is not running" in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 and "trying again for up to 2 s" in lines[0], res.stderr
    assert 1.5 < time.monotonic() - t0 < 10


def test_a_user_cannot_attach_or_cancel_someone_elses_jobs(daemon, clean_cluster):
    d = daemon
    # bob's held scavenger job, tagged like a slot of a job alice is submitting
    import json
    import subprocess

    from malletrain.daemon.submit.channel import call

    ask = subprocess.run(
        ["setpriv", "--reuid=mt-alice", "--regid=mt-alice", "--init-groups", "python3", "-c",
         "import json,socket,sys;s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);"
         "s.sendall((json.dumps({'op':'submit','spec':{'script':'/x/t.py'}})+'\\n').encode());"
         "print(s.makefile().readline())", str(d.socket)],
        capture_output=True, text=True, check=True, env=clean_cluster.env)
    job_id = json.loads(ask.stdout)["job_id"]
    bob_slot = clean_cluster.sbatch("--hold", "-p", "scavenger", "-N", "1",
                                    f"--comment=malletrain:{job_id}:0", wrap="srun true",
                                    user="mt-bob")
    attach = subprocess.run(
        ["setpriv", "--reuid=mt-alice", "--regid=mt-alice", "--init-groups", "python3", "-c",
         "import json,socket,sys;s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);"
         "s.sendall((json.dumps({'op':'attach','job_id':sys.argv[2],'slots':[int(sys.argv[3])]})"
         "+'\\n').encode());print(s.makefile().readline())", str(d.socket), job_id,
         str(bob_slot)], capture_output=True, text=True, check=True, env=clean_cluster.env)
    # the attach only records the ids; the tick (woken by it) checks them against Slurm
    assert json.loads(attach.stdout)["ok"], attach.stdout
    wait_until(lambda: d.jobs().get(job_id, {}).get("state") == "failed", timeout_s=30,
               what="alice's job refused at its tick", on_timeout=d.log)
    assert d.jobs()[job_id]["message"] == (
        f"refused at attach: slot job {bob_slot} belongs to mt-bob, not to mt-alice")
    time.sleep(3)  # a few ticks of winding alice's job down: bob's job is left alone
    assert clean_cluster.job_state(bob_slot) == "PENDING"
    res = d.cli("mt-bob", "cancel", "--socket", str(d.socket), job_id, check=False)
    assert res.returncode != 0 and "belongs to mt-alice" in res.stderr
    # malformed requests are answered, not fatal
    for junk in ({"op": 3}, {"op": "attach", "job_id": ["x"]}, {"op": "nope"}):
        with pytest.raises(Exception) as err:
            call(d.socket, junk)
        assert "Traceback" not in str(err.value)
    assert d.alive()


@pytest.mark.torch
def test_slurmctld_down_node_vanishing_and_kill9_mid_rescale(daemon, clean_cluster):
    """One job through three failures; it still finishes with exactly its samples."""
    check_python_reachable("mt-alice", clean_cluster.env)
    d = daemon
    samples = 20_000
    job = d.submit_example("mt-alice", "jf", "1-2", samples, launcher="torchrun")
    wait_until(lambda: d.jobs()[job]["members"] == 2, 150, what="the job on 2 nodes",
               on_timeout=lambda: d.log()[-3000:])

    # 1. slurmctld down for a while: the daemon keeps its last snapshot and keeps serving
    clean_cluster.dev_cluster("stop-controller")
    time.sleep(6)
    rows = d.jobs()
    assert d.alive() and rows[job]["state"] == "running"
    res = d.submit("mt-alice", "-N", "1", str(EXAMPLE), check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    clean_cluster.dev_cluster("start-controller")
    wait_until(clean_cluster.ctld_up, 30, what="slurmctld back")

    # 2. a node vanishes mid-step: Slurm kills the slot on it; the survivor heals, the
    #    daemon parks the dead slot and grows the job again elsewhere
    node = sorted(d.jobs()[job]["nodes"])[0]
    before = d.jobs()[job]["samples_total"]
    clean_cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN",
                      "Reason=e2e-vanish")
    wait_until(lambda: node not in d.jobs()[job]["nodes"], 60, what="the slot to leave")

    def node_back() -> bool:
        state = clean_cluster.node_states().get(node, "")
        if "down" in state or "drain" in state:
            clean_cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME",
                              check=False)
        return state.rstrip("*~#!%$@^-") in ("idle", "allocated", "mixed")

    wait_until(node_back, 60, what=f"{node} back in service")

    # 3. kill -9 while the job grows back (slots placed, members not yet published)
    wait_until(lambda: "placed slot" in d.log().split("State=DOWN")[-1]
               or len(d.jobs()[job]["nodes"]) == 2, 90, what="a re-placement")
    d.kill9()
    time.sleep(2)
    d.start()
    wait_until(lambda: d.jobs()[job]["state"] == "completed", 300, what="the job to finish",
               on_timeout=lambda: d.log()[-3000:])
    row = d.jobs()[job]
    assert row["samples_total"] == samples and row["samples_total"] > before
    assert d.result("jf")["samples_total"] == samples
