"""The CLI backend against the REAL dev cluster: observe and every action.

These are the contract tests any SlurmBackend must pass; ``backend`` is what
``select_backend()`` picks here (the CLI one on Slurm 22.05).
"""

from __future__ import annotations

import threading
import time

import pytest

from malletrain.core.cluster import JobState, NodeState
from malletrain.core.scavenging.scavenger import idle_nodes
from malletrain.daemon.jobs.slots import is_held
from malletrain.slurm.backend import SlurmBackend
from malletrain.slurm.errors import SlurmCommandError
from malletrain.slurm.sbatch import SbatchSpec
from malletrain.slurm.select import select_backend

pytestmark = pytest.mark.slurm

SLEEP = "#!/bin/bash\nsrun sleep 300\n"


def sleeper(**kw) -> SbatchSpec:
    """A job that sleeps under srun (so it has a step), output discarded."""
    return SbatchSpec(script=SLEEP, output="/dev/null", **kw)


@pytest.fixture
def backend(clean_cluster) -> SlurmBackend:
    return select_backend(timeout_s=20)


def wait_job(backend, job_id, pred, timeout_s=20, what="job state"):
    deadline = time.monotonic() + timeout_s
    while True:
        job = backend.snapshot().job(job_id)
        if job is not None and pred(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} of job {job_id}: {job}")
        time.sleep(0.3)


def test_snapshot_of_the_clean_cluster(backend):
    snap = backend.snapshot()
    assert backend.name == "cli"
    assert [n.name for n in snap.nodes] == [f"n{i}" for i in range(1, 9)]
    assert {n.state for n in snap.nodes} == {NodeState.IDLE}
    assert not [j for j in snap.jobs if j.state.is_active]
    parts = {p.name: p for p in snap.partitions}
    assert parts["scavenger"].preempt_mode == "CANCEL" and parts["scavenger"].grace_time_s == 5
    assert parts["batch"].priority_tier > parts["scavenger"].priority_tier
    assert snap.warnings == ()
    assert abs(snap.taken_at - time.time()) < 5
    assert [n.switch for n in snap.nodes] == ["s1"] * 4 + ["s2"] * 4  # topology.conf


def test_backfill_honours_the_computed_idle_window(backend, clean_cluster):
    """The window malletrain computes is the one Slurm enforces: a scavenger job whose time
    limit fits it starts on the idle nodes at once; one that does not fit stays pending.

    Runs early in this module: it once failed when an earlier test had cancelled a job
    during its step launch, which keeps a node COMPLETING ~65 s (docs/slurm-backend.md,
    trap 12); the earlier tests now wait for their steps, and the order is kept as a margin.
    """
    running = backend.submit(sleeper(nodes=4, time_limit_s=1800))
    wait_job(backend, running, lambda j: j.state is JobState.RUNNING)
    wide = backend.submit(sleeper(nodes=8, time_limit_s=600))
    wait_job(backend, wide, lambda j: bool(j.planned_nodes), timeout_s=15,
             what="a backfill plan")
    snap = backend.snapshot()
    idle = idle_nodes(snap, snap.taken_at, partitions=["scavenger"])
    assert len(idle) == 4 and all(n.window_s is not None for n in idle)
    window_s = min(n.window_s for n in idle if n.window_s is not None)
    assert 25 * 60 < window_s <= 30 * 60
    too_long = backend.submit(sleeper(partition="scavenger", nodes=4,
                                      time_limit_s=int(window_s) + 600, run_as="mt-bob"))
    fits = backend.submit(sleeper(partition="scavenger", nodes=4,
                                  time_limit_s=int(window_s) - 120, run_as="mt-alice"))
    try:
        job = wait_job(backend, fits, lambda j: j.state is JobState.RUNNING, timeout_s=45,
                       what="backfill to start the fitting job")
    except AssertionError as exc:
        jobs = clean_cluster.run("scontrol", "show", "job", "-o", check=False).stdout
        nodes = clean_cluster.run("sinfo", "-N", "-p", "batch", check=False).stdout
        raise AssertionError(f"{exc}\nwindow_s={window_s}\n{jobs}\n{nodes}") from None
    assert set(job.nodes) == {n.name for n in idle}
    assert backend.snapshot().job(too_long).state is JobState.PENDING


def test_submit_as_a_user_runs_with_env_comment_and_limit(backend, shared_tmp):
    out = shared_tmp / "env.out"
    spec = SbatchSpec(
        script="#!/bin/bash\necho \"$(id -un) $MT_TOKEN $SLURM_JOB_NUM_NODES\"\nsrun sleep 300\n",
        job_name="contract-env", nodes=2, time_limit_s=300, comment="malletrain contract",
        output=str(out), environment={"MT_TOKEN": "tok-123"}, run_as="mt-alice",
    )
    job_id = backend.submit(spec)
    job = wait_job(backend, job_id, lambda j: j.state is JobState.RUNNING)
    assert job.user == "mt-alice" and job.name == "contract-env"
    assert len(job.nodes) == 2 and job.node_count == 2
    assert job.time_limit_s == 300 and job.comment == "malletrain contract"
    assert job.end_time - job.start_time == 300
    deadline = time.monotonic() + 10
    while not out.exists() or not out.read_text().strip():
        assert time.monotonic() < deadline, "no job output"
        time.sleep(0.2)
    assert out.read_text().split() == ["mt-alice", "tok-123", "2"]


def test_cancel_is_idempotent(backend, clean_cluster):
    job_id = backend.submit(sleeper(nodes=1))
    wait_job(backend, job_id, lambda j: j.state is JobState.RUNNING)
    clean_cluster.wait_step_running(job_id)
    backend.cancel(job_id)
    wait_job(backend, job_id, lambda j: j.state is JobState.CANCELLED)
    backend.cancel(job_id)  # already done: fine
    with pytest.raises(SlurmCommandError):
        backend.cancel(job_id, missing_ok=False)
    with pytest.raises(SlurmCommandError):
        backend.cancel(999999, missing_ok=False)


def test_hold_release_and_planned_start_of_a_pending_job(backend, clean_cluster):
    running = backend.submit(sleeper(nodes=4, time_limit_s=1800))
    wait_job(backend, running, lambda j: j.state is JobState.RUNNING)
    wide = backend.submit(sleeper(nodes=8, time_limit_s=600))
    job = wait_job(backend, wide, lambda j: bool(j.planned_nodes), timeout_s=15,
                   what="a backfill plan")
    run_job = backend.snapshot().job(running)
    assert job.state is JobState.PENDING
    assert job.planned_nodes == tuple(f"n{i}" for i in range(1, 9))
    assert job.start_time == run_job.end_time
    # the arrival probe's query: pending ids only (not the running job)
    assert backend.pending_job_ids() == {wide}
    backend.hold(wide)
    held = wait_job(backend, wide, lambda j: j.state_reason.startswith("JobHeld"))
    assert held.state is JobState.PENDING
    backend.release(wide)
    wait_job(backend, wide, lambda j: not j.state_reason.startswith("JobHeld"))


def test_jobs_reads_only_the_named_jobs_as_a_snapshot_shows_them(backend, clean_cluster):
    held = backend.submit(sleeper(nodes=1, hold=True, comment="malletrain:m1:0",
                                  partition="scavenger"))
    other = backend.submit(sleeper(nodes=1, hold=True))
    wait_job(backend, held, lambda j: j.state is JobState.PENDING)
    found = backend.jobs([held, 999999])  # an unknown id beside a known one
    assert [j.job_id for j in found] == [held]
    assert found[0] == backend.snapshot().job(held)
    assert found[0].comment == "malletrain:m1:0" and is_held(found[0])
    assert backend.jobs([999998, 999999]) == ()  # none known: no error, nothing
    assert backend.jobs([]) == ()
    assert other not in {j.job_id for j in found}


def test_requeue_hold_puts_a_running_job_back_held(backend, clean_cluster):
    job_id = backend.submit(sleeper(nodes=2))
    wait_job(backend, job_id, lambda j: j.state is JobState.RUNNING)
    clean_cluster.wait_step_running(job_id)
    backend.requeue_hold(job_id)
    job = wait_job(backend, job_id, lambda j: j.state is JobState.PENDING)
    assert is_held(job), job.state_reason  # Slurm says "job requeued in held state"
    assert job.nodes == ()


def _at_once(fn, job_ids):
    """``fn(job_id)`` for each id on a thread of its own, started together; the errors."""
    errors: dict[int, Exception | None] = {}
    go = threading.Barrier(len(job_ids))

    def one(job_id: int) -> None:
        go.wait(10)
        try:
            fn(job_id)
            errors[job_id] = None
        except Exception as exc:  # the test looks at each one
            errors[job_id] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in job_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


def test_concurrent_releases_and_parks_share_calls_and_fail_only_their_own_job(
        backend, clean_cluster, monkeypatch):
    """The action workers' releases and requeueholds, made as ``scontrol VERB 1,2,3``
    (slurm/coalesce.py): each job is acted on, and an unknown id fails only its caller."""
    calls: list[list[str]] = []
    run = backend._runner

    def counting(argv, **kw):
        calls.append(list(argv))
        return run(argv, **kw)

    monkeypatch.setattr(backend, "_runner", counting)
    jobs = [backend.submit(sleeper(nodes=1, hold=True, partition="scavenger"))
            for _ in range(5)]
    for k, job_id in enumerate(jobs):
        backend.update(job_id, NodeList=f"n{k + 1}", StartTime="now")
    gone = 999_999
    calls.clear()
    errors = _at_once(backend.release, [*jobs, gone])
    assert [errors[j] for j in jobs] == [None] * 5
    assert isinstance(errors[gone], SlurmCommandError)
    assert "invalid job id" in str(errors[gone]).lower() and str(gone) in str(errors[gone])
    assert len(calls) < 6, calls  # at least two of the six shared a call
    for job_id in jobs:
        wait_job(backend, job_id, lambda j: j.state is JobState.RUNNING)
        clean_cluster.wait_step_running(job_id)
    calls.clear()
    errors = _at_once(backend.requeue_hold, jobs)
    assert list(errors.values()) == [None] * 5
    assert len(calls) < 5, calls
    for job_id in jobs:
        job = wait_job(backend, job_id, lambda j: j.state is JobState.PENDING)
        assert is_held(job), job.state_reason
    # parked again: Slurm names each job it cannot act on, and only those fail
    errors = _at_once(backend.requeue_hold, jobs[:2])
    assert all(isinstance(e, SlurmCommandError) and "pending" in str(e).lower()
               for e in errors.values()), errors


def test_concurrent_updates_share_one_scontrol_script_and_fail_only_their_own_job(
        backend, clean_cluster, monkeypatch):
    """The placements' updates from the action workers, made as one ``scontrol`` reading
    them from stdin (slurm/coalesce.py CoalescedUpdates): each job gets its own node and
    time limit, and an unknown id fails only its caller."""
    calls: list[list[str]] = []
    run = backend._runner

    def counting(argv, **kw):
        calls.append(list(argv))
        return run(argv, **kw)

    jobs = [backend.submit(sleeper(nodes=1, hold=True, partition="scavenger"))
            for _ in range(5)]
    monkeypatch.setattr(backend, "_runner", counting)
    gone = 999_999
    node = {j: f"n{k + 1}" for k, j in enumerate([*jobs, gone])}
    errors = _at_once(lambda j: backend.update(j, NodeList=node[j], TimeLimit=3 + j % 5),
                      [*jobs, gone])
    assert [errors[j] for j in jobs] == [None] * 5
    assert isinstance(errors[gone], SlurmCommandError)
    assert "invalid job id" in str(errors[gone]).lower() and str(gone) in str(errors[gone])
    assert len(calls) < 6 and all(c == ["scontrol"] for c in calls), calls
    monkeypatch.undo()
    for job_id in jobs:
        record = backend._check(["scontrol", "show", "job", "--oneliner", str(job_id)])
        assert f" ReqNodeList={node[job_id]} " in record, record
        assert f" TimeLimit=00:0{3 + job_id % 5}:00 " in record, record
        assert "JobState=PENDING" in record and "Reason=JobHeldUser" in record, record


def test_concurrent_acts_of_every_verb_share_one_scontrol_script(
        backend, clean_cluster, monkeypatch):
    """A tick's actions of different kinds (park, placement, release) arriving together run
    as one ``scontrol`` script (slurm/coalesce.py CoalescedScontrol): each job gets what
    its own line asked, and only the unknown id fails."""
    calls: list[list[str]] = []
    run = backend._runner

    def counting(argv, **kw):
        calls.append(list(argv))
        return run(argv, **kw)

    placed, released = (backend.submit(sleeper(nodes=1, hold=True, partition="scavenger"))
                        for _ in range(2))
    # pending, not held: waiting for the held one
    held = [backend.submit(sleeper(nodes=1, partition="scavenger",
                                   dependency=f"afterany:{placed}")) for _ in range(2)]
    gone = 999_999
    monkeypatch.setattr(backend, "_runner", counting)
    acts = {placed: lambda: backend.update(placed, NodeList="n3", TimeLimit=7),
            released: lambda: backend.release(released),
            held[0]: lambda: backend.hold(held[0]), held[1]: lambda: backend.hold(held[1]),
            gone: lambda: backend.release(gone)}
    errors = _at_once(lambda j: acts[j](), list(acts))
    assert [errors[j] for j in (placed, released, *held)] == [None] * 4, errors
    assert isinstance(errors[gone], SlurmCommandError) and "release 999999" in str(
        errors[gone])
    assert len(calls) < 5 and all(c == ["scontrol"] for c in calls), calls
    monkeypatch.undo()
    record = backend._check(["scontrol", "show", "job", "--oneliner", str(placed)])
    assert " ReqNodeList=n3 " in record and " TimeLimit=00:07:00 " in record, record
    assert "Reason=JobHeldUser" in record, record
    for job_id in held:
        assert is_held(wait_job(backend, job_id, lambda j: j.state is JobState.PENDING))
    assert not is_held(wait_job(backend, released, lambda j: j.state in (
        JobState.PENDING, JobState.RUNNING)))


def test_the_daemons_node_states_say_what_the_node_records_say(clean_cluster):
    """The daemon reads the nodes' states each tick (``sinfo --Node --Format=...``) and their
    records periodically (slurm/parse_states.py): every state and flag it ends up with is
    the records' own, for allocated, drained, draining, planned, idle and down nodes."""
    from malletrain.slurm.backend import CliBackend
    from malletrain.slurm.versions import NODE_STATES

    c = clean_cluster
    plain = select_backend(timeout_s=20)
    long_job = plain.submit(sleeper(nodes=3, time_limit_s=1800))  # n1-n3
    wait_job(plain, long_job, lambda j: j.state is JobState.RUNNING)
    c.wait_step_running(long_job)
    c.run("scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=contract draining")
    c.run("scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=contract drained")
    c.run("scontrol", "update", "NodeName=n5", "State=DOWN", "Reason=contract down")
    plain.submit(sleeper(nodes=4, time_limit_s=600))  # planned on n2, n3 and two of n6-n8

    def planned() -> list[str]:
        return [n.name for n in plain.snapshot().nodes if "PLANNED" in n.flags]

    # Which two of the idle n6-n8 the plan names is Slurm's choice (n7, n8 mostly; not always).
    c.wait_until(lambda: planned(), timeout_s=30, what="a backfill plan naming idle nodes")
    states_text = c.run(*NODE_STATES).stdout
    assert "n1|allocated+drain|" in states_text and "n5|down" in states_text
    daemon = CliBackend(daemon=True)
    for _ in range(5):  # the two reads are a moment apart: Slurm may move in between
        mine = [(n.name, n.state, n.flags) for n in daemon.snapshot().nodes]
        theirs = [(n.name, n.state, n.flags) for n in plain.snapshot().nodes]
        if mine == theirs:
            break
        time.sleep(0.5)
    assert mine == theirs
    by = {n: (s, f) for n, s, f in mine}
    assert by["n1"][0] is NodeState.DRAINING and by["n4"][0] is NodeState.DRAINED
    assert by["n5"][0] is NodeState.DOWN and by["n6"][0] is NodeState.IDLE
    assert by["n2"][0] is NodeState.ALLOCATED
    named = [n for n, (_, flags) in by.items() if "PLANNED" in flags]
    assert named and set(named) <= {"n6", "n7", "n8"}, named


def test_update_shrinks_twice_then_changes_limit_and_comment(backend, clean_cluster):
    """With accounting on (the fixture's default) repeated shrinks work in 22.05."""
    job_id = backend.submit(sleeper(nodes=4, time_limit_s=600))
    job = wait_job(backend, job_id, lambda j: j.state is JobState.RUNNING)
    backend.update(job_id, NodeList=job.nodes[:3])
    wait_job(backend, job_id, lambda j: len(j.nodes) == 3)
    backend.update(job_id, NumNodes=2)
    job = wait_job(backend, job_id, lambda j: len(j.nodes) == 2)
    assert job.state is JobState.RUNNING
    backend.update(job_id, TimeLimit=20, Comment="shrunk twice")
    job = wait_job(backend, job_id, lambda j: j.comment == "shrunk twice")
    assert job.time_limit_s == 20 * 60
    idle = [n.name for n in backend.snapshot().nodes if n.state is NodeState.IDLE]
    assert len(idle) == 6


def test_update_of_an_unknown_job_is_a_permanent_error(backend):
    with pytest.raises(SlurmCommandError, match="scontrol update"):
        backend.update(999999, Comment="x")


def test_signal_reaches_the_steps_not_the_batch_shell(backend, shared_tmp):
    out = shared_tmp / "sig.out"
    script = (
        "#!/bin/bash\n"
        "trap 'echo batch-USR1' USR1\n"
        "srun bash -c \"trap 'echo step-USR1' USR1; echo ready; "
        "while true; do sleep 0.2; done\" &\n"
        "while true; do sleep 0.2; done\n"
    )
    job_id = backend.submit(SbatchSpec(script=script, nodes=1, output=str(out),
                                       run_as="mt-bob"))
    wait_job(backend, job_id, lambda j: j.state is JobState.RUNNING)
    deadline = time.monotonic() + 15
    while "ready" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, "step did not start"
        time.sleep(0.2)
    backend.signal(job_id, "USR1")
    deadline = time.monotonic() + 10
    while "step-USR1" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    assert "batch-USR1" not in out.read_text()
    backend.signal(job_id, "USR1", steps="batch")
    deadline = time.monotonic() + 10
    while "batch-USR1" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)


def test_batch_job_preempts_a_scavenger_job(backend, clean_cluster):
    """The dev cluster's partitions do what the design relies on (partition_prio, CANCEL).

    The scavenger job's steps get SIGTERM; ``srun sleep`` dies of it, so the job ends by
    itself within the grace time (FAILED, by its exit status) rather than by the kill.
    """
    scav = backend.submit(sleeper(partition="scavenger", nodes=8, time_limit_s=300,
                                  run_as="mt-alice"))
    wait_job(backend, scav, lambda j: j.state is JobState.RUNNING)
    # a preemption during the step's launch hangs the nodes ~65 s (docs/slurm-backend.md
    # §6.12); with batch_sched_delay=0 the preemption comes within ~1 s of the submission
    clean_cluster.wait_step_running(scav)
    t0 = time.monotonic()
    regular = backend.submit(sleeper(partition="batch", nodes=8, time_limit_s=300))
    wait_job(backend, regular, lambda j: j.state is JobState.RUNNING, timeout_s=45,
             what="the batch job to start")
    delay_s = time.monotonic() - t0
    assert not backend.snapshot().job(scav).state.is_active
    assert delay_s < 45, f"the batch job waited {delay_s:.1f} s for the scavenger job"
    clean_cluster.wait_step_running(regular)  # so the clean-up does not race the launch


def _wait_privacy(backend, private: bool) -> None:
    deadline = time.monotonic() + 30
    while backend.privacy().private_jobs != private:
        if time.monotonic() > deadline:
            raise AssertionError(f"PrivateData did not become {'jobs' if private else 'none'}")
        time.sleep(0.5)


def test_privacy_follows_the_clusters_private_data(backend, clean_cluster):
    """malletrain reads PrivateData as Slurm applies it (set live with `scontrol reconfigure`)."""
    p = backend.privacy()
    assert not p.private_jobs and "root" in p.operators  # SlurmUser=root, Administrator
    assert p.sees_all("mt-bob", 1234)
    conf = clean_cluster.conf_path
    text = conf.read_text()
    try:
        conf.write_text(text + "PrivateData=jobs\n")
        clean_cluster.run("scontrol", "reconfigure")
        _wait_privacy(backend, True)
        p = backend.privacy()
        assert not p.sees_all("mt-bob", 1234) and p.sees_all("root", 0)
        # what malletrain follows is what Slurm does: bob no longer sees alice's job
        jid = clean_cluster.sbatch("--hold", wrap="sleep 60", user="mt-alice")
        seen = clean_cluster.run("squeue", "-h", "-o", "%i", user="mt-bob").stdout.split()
        assert str(jid) not in seen
        assert str(jid) in clean_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    finally:
        conf.write_text(text)
        clean_cluster.run("scontrol", "reconfigure")
        _wait_privacy(backend, False)


def test_a_user_cannot_forge_job_lines_with_newlines_in_names_or_comments(clean_cluster):
    """The attack on a text job list: Slurm takes newlines in ``--job-name``/``--comment``
    and squeue prints them raw (measured on 24.11), so a line such as the one below would
    read as a job of mt-alice running on every node. The daemon's job list puts a fresh
    random token before every record and before the name and the comment, so mt-bob's job
    reads as what it is, whole, and no other job appears."""
    forged = "424242|RUNNING|8|UNLIMITED|2026-01-01T00:00:00|NONE|2026-01-01T00:00:00|" \
             "mt-alice|scavenger|n[1-8]|(null)"
    bob = clean_cluster.sbatch("--hold", "-t", "5", f"--job-name=x\n{forged}",
                               f"--comment=y\n{forged}\n424243 RUNNING 8 n[1-8]",
                               wrap="true", user="mt-bob")
    daemon_backend = select_backend(timeout_s=20, daemon=True)
    snap = daemon_backend.snapshot()
    assert snap.job(424242) is None and snap.job(424243) is None
    job = snap.job(bob)
    assert job is not None and job.user == "mt-bob" and job.state is JobState.PENDING
    assert job.nodes == () and job.planned_nodes == ()
    assert job.name == f"x\n{forged}" and job.comment == f"y\n{forged}\n424243 RUNNING 8 n[1-8]"
    assert snap.warnings == ()
    full = select_backend(timeout_s=20).snapshot().job(bob)  # `malletrain nodes`: JSON
    assert full == job
