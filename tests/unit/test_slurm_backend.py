"""The CLI backend's plumbing with a recording runner (no Slurm): argv, errors, cache, selection.

The real behaviour against Slurm is in tests/slurm/test_backend_contract.py; here only the
pure parts: what is run, how failures are typed, and the pyslurm/CLI choice.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from malletrain.core.cluster import ClusterSnapshot, NodeState
from malletrain.errors import RetryableError
from malletrain.slurm import select as select_mod
from malletrain.slurm.backend import CliBackend, SlurmBackend
from malletrain.slurm.cache import SnapshotCache
from malletrain.slurm.commands import classify_failure, render_signal, render_update
from malletrain.slurm.errors import (
    SlurmCommandError,
    SlurmCommandNotFoundError,
    SlurmParseError,
    SlurmUnavailableError,
)
from malletrain.slurm.parsers.parse import GOLDEN_FILES, SnapshotTexts, build_snapshot
from malletrain.slurm.sbatch import SbatchSpec
from malletrain.slurm.select import choose_backend_kind, select_backend
from malletrain.slurm.versions import JOB_GPUS, Release, snapshot_commands

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"


class Recorder:
    """A runner that answers from a table and records each call."""

    def __init__(self, answers):
        self.answers = answers
        self.calls: list[list[str]] = []
        self.inputs: list[str | None] = []
        self.envs: list[dict] = []

    def __call__(self, argv, *, input=None, capture_output, text, timeout, env, check,
                 errors="strict"):
        self.calls.append(argv)
        self.inputs.append(input)
        self.envs.append(env)
        answer = self.answers(argv) if callable(self.answers) else self.answers[tuple(argv)]
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return subprocess.CompletedProcess(argv, rc, out, err)


SLURM_22_05 = Release(22, 5)
SNAPSHOT_COMMANDS = snapshot_commands(SLURM_22_05)


def golden_answers(scenario: str):
    d = GOLDEN / scenario
    answers = {tuple(argv): (0, (d / GOLDEN_FILES[key]).read_text(), "")
               for key, argv in SNAPSHOT_COMMANDS.items()}
    answers[("sinfo", "--version")] = (0, "slurm-wlm 22.05.8\n", "")
    return answers


def test_cli_backend_satisfies_the_protocol():
    assert isinstance(CliBackend(), SlurmBackend)


@pytest.mark.parametrize("parallel", [True, False])
def test_snapshot_is_one_batch_of_six_calls(parallel):
    rec = Recorder(golden_answers("busy"))
    snap = CliBackend(runner=rec, clock=lambda: 123.0, env={"SLURM_CONF": "/x"},
                      parallel=parallel).snapshot()
    expected = [list(a) for a in SNAPSHOT_COMMANDS.values()]
    assert rec.calls[0] == ["sinfo", "--version"]  # the release, read once: it picks commands
    if parallel:
        assert sorted(rec.calls[1:]) == sorted(expected)  # all six, in whatever order
    else:
        assert rec.calls[1:] == expected
    assert all(e["SLURM_CONF"] == "/x" for e in rec.envs)
    assert snap.taken_at == 123.0
    assert len(snap.nodes) == 8 and len(snap.jobs) == 6
    assert snap.node("n1").switch == "s1" and snap.node("n8").switch == "s2"


def test_snapshot_fails_fast_when_sinfo_json_reports_errors():
    down = (GOLDEN / "down" / "nodes.json").read_text()
    rec = Recorder(lambda argv: (0, down, ""))
    with pytest.raises(SlurmUnavailableError, match="is slurmctld running"):
        CliBackend(runner=rec, parallel=False, release=SLURM_22_05).snapshot()
    assert len(rec.calls) == 1  # did not wait on the other five


def test_parallel_snapshot_reports_the_first_failure_in_command_order():
    down = (GOLDEN / "down" / "nodes.json").read_text()
    stderr = (GOLDEN / "down" / "partitions.stderr").read_text()

    def answer(argv):
        return (0, down, "") if argv[0] == "sinfo" else (1, "", stderr)

    with pytest.raises(SlurmUnavailableError, match="sinfo --json"):
        CliBackend(runner=Recorder(answer), release=SLURM_22_05).snapshot()


def test_timeout_is_retryable_and_missing_command_is_permanent():
    timeout = Recorder(lambda argv: subprocess.TimeoutExpired(argv, 3))
    with pytest.raises(SlurmUnavailableError, match="no answer within 3 s"):
        CliBackend(runner=timeout, timeout_s=3).snapshot()
    missing = Recorder(lambda argv: FileNotFoundError(2, "No such file", argv[0]))
    with pytest.raises(SlurmCommandNotFoundError, match="sinfo: command not found"):
        CliBackend(runner=missing).snapshot()


def test_down_scontrol_stderr_classifies_as_retryable():
    stderr = (GOLDEN / "down" / "partitions.stderr").read_text()
    err = classify_failure(["scontrol", "show", "partition"], 1, stderr)
    assert isinstance(err, SlurmUnavailableError) and isinstance(err, RetryableError)


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("scancel: error: Kill job error on job id 99: Invalid job id specified",
         SlurmCommandError),
        ("Job update not available right now, the DB index is being set, try again in a bit",
         SlurmUnavailableError),
        ("slurm_update error: Access/permission denied", SlurmCommandError),
        ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
         SlurmUnavailableError),
    ],
)
def test_classify_failure(stderr, kind):
    assert type(classify_failure(["x"], 1, stderr)) is kind


def test_missing_config_source_names_slurm_conf():
    err = classify_failure(["sinfo", "--json"], 1,
                           "sinfo: fatal: Could not establish a configuration source")
    assert isinstance(err, SlurmCommandError) and "SLURM_CONF" in str(err)


def test_submit_sends_script_on_stdin_and_env_and_parses_id():
    rec = Recorder(lambda argv: (0, "17\n", ""))
    spec = SbatchSpec(script="#!/bin/sh\ntrue\n", nodes=2, environment={"A": "1"})
    assert CliBackend(runner=rec, env={"PATH": "/usr/bin"}).submit(spec) == 17
    assert rec.calls == [spec.render()]
    assert rec.inputs == [spec.script]
    assert rec.envs[0] == {"PATH": "/usr/bin", "A": "1"}


def test_submit_garbage_output_is_a_parse_error():
    rec = Recorder(lambda argv: (0, "hello\n", ""))
    with pytest.raises(SlurmParseError, match="sbatch"):
        CliBackend(runner=rec).submit(SbatchSpec(script="#!/bin/sh\n"))


def test_cancel_is_idempotent_for_finished_jobs_unless_asked():
    msg = ("scancel: Terminating job 5\n"
           "scancel: error: Kill job error on job id 5: Job/step already completing or completed")
    rec = Recorder(lambda argv: (0, "", msg))
    CliBackend(runner=rec).cancel(5)
    assert rec.calls == [["scancel", "--verbose", "5"]]
    with pytest.raises(SlurmCommandError, match="already completing"):
        CliBackend(runner=rec).cancel(5, missing_ok=False)
    denied = Recorder(lambda argv: (0, "", "scancel: error: Kill job error on job id 5: "
                                           "Access/permission denied"))
    with pytest.raises(SlurmCommandError, match="permission denied"):
        CliBackend(runner=denied).cancel(5)


def test_actions_render_argument_lists():
    rec = Recorder(lambda argv: (0, "", ""))
    b = CliBackend(runner=rec)
    b.hold(3)
    b.release(3)
    b.requeue_hold(3)
    b.signal(3, "USR1", steps="batch")
    b.update(3, NumNodes=2, Comment="shrunk by malletrain", NodeList=("n1", "n2"))
    b.update(3, NodeList=("n1",), TimeLimit=5)
    # acts and updates without blanks are lines of an ``scontrol`` script (fact 14)
    assert list(zip(rec.calls, rec.inputs, strict=True)) == [
        (["scontrol"], "hold 3\n"),
        (["scontrol"], "release 3\n"),
        (["scontrol"], "requeuehold 3\n"),
        (["scancel", "--signal=USR1", "--batch", "3"], None),
        (["scontrol", "update", "JobId=3", "NumNodes=2", "Comment=shrunk by malletrain",
          "NodeList=n[1-2]"], None),
        (["scontrol"], "update JobId=3 NodeList=n1 TimeLimit=5\n"),
    ]


@pytest.mark.parametrize(
    "fields", [{}, {"UserId": "0"}, {"Comment": "a\nb"}, {"NumNodes": True}])
def test_update_rejects_unknown_fields_and_bad_values(fields):
    with pytest.raises(ValueError, match="update"):
        render_update(1, fields)


@pytest.mark.parametrize(("sig", "steps"), [("TERM; ls", "children"), ("USR1", "everything")])
def test_signal_validation(sig, steps):
    with pytest.raises(ValueError, match="signal"):
        render_signal(1, sig, steps)


# ----------------------------------------------------------------------------- cache


class Flaky:
    name = "flaky"

    def __init__(self, results):
        self.results = list(results)

    def snapshot(self):
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def test_cache_serves_last_good_snapshot_with_a_stale_warning():
    good = ClusterSnapshot(taken_at=100.0)
    cache = SnapshotCache(Flaky([good, SlurmUnavailableError("down"), good]),
                          clock=lambda: 130.0)
    assert cache.refresh() is good and not cache.stale
    stale = cache.refresh()
    assert cache.stale and cache.consecutive_failures == 1
    assert stale.taken_at == 100.0
    assert "stale" in stale.warnings[-1] and "30 s" in stale.warnings[-1]
    assert cache.refresh() is good and not cache.stale


def test_cache_raises_without_a_good_snapshot_or_when_too_old():
    with pytest.raises(SlurmUnavailableError):
        SnapshotCache(Flaky([SlurmUnavailableError("down")])).refresh()
    cache = SnapshotCache(Flaky([ClusterSnapshot(taken_at=0.0), SlurmParseError("bad")]),
                          max_age_s=60, clock=lambda: 1000.0)
    cache.refresh()
    with pytest.raises(SlurmParseError):
        cache.refresh()


def test_cache_does_not_swallow_programming_errors():
    cache = SnapshotCache(Flaky([ClusterSnapshot(taken_at=0.0), KeyError("bug")]))
    cache.refresh()
    with pytest.raises(KeyError):
        cache.refresh()


# ----------------------------------------------------------------------------- selection


@pytest.mark.parametrize(
    ("pyslurm_version", "slurm_version", "kind", "words"),
    [
        (None, "22.05", "cli", "not importable"),
        ("25.11.2", "22.05", "cli", "built for Slurm 25.11 but this cluster runs Slurm 22.05"),
        ("25.11.2", None, "cli", "unknown"),
        ("22.5.0", "22.05", "pyslurm", "matches"),
        ("23.2.1", "23.02", "pyslurm", "matches"),
    ],
)
def test_choose_backend_kind(pyslurm_version, slurm_version, kind, words):
    got_kind, reason = choose_backend_kind(pyslurm_version, slurm_version)
    assert got_kind == kind and words in reason


def test_select_backend_falls_back_and_logs_the_reason_once(monkeypatch, caplog):
    fake = types.ModuleType("pyslurm")
    fake.__version__ = "25.11.2"
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    monkeypatch.setattr(select_mod, "_logged_reasons", set())
    monkeypatch.setattr(CliBackend, "slurm_version", lambda self: "22.05")
    with caplog.at_level(logging.INFO, logger="malletrain.slurm.select"):
        first = select_backend()
        second = select_backend()
    assert first.name == "cli" and second.name == "cli"
    msgs = [r.getMessage() for r in caplog.records if "pyslurm" in r.getMessage()]
    assert msgs == ["pyslurm 25.11.2 is built for Slurm 25.11 but this cluster runs "
                    "Slurm 22.05; using the Slurm CLI backend"]
    assert caplog.records[0].levelno == logging.WARNING


def test_select_backend_without_pyslurm_says_why_once(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import raises ImportError
    monkeypatch.setattr(select_mod, "_logged_reasons", set())
    with caplog.at_level(logging.INFO, logger="malletrain.slurm.select"):
        assert select_backend().name == "cli"
        assert select_backend().name == "cli"
    assert len([r for r in caplog.records if "not importable" in r.getMessage()]) == 1


def test_select_backend_uses_pyslurm_when_versions_match(monkeypatch):
    fake = types.ModuleType("pyslurm")
    fake.__version__ = "22.5.0"
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    monkeypatch.setattr(select_mod, "_logged_reasons", set())
    monkeypatch.setattr(CliBackend, "slurm_version", lambda self: "22.05")
    chosen = select_backend()
    assert chosen.name == "pyslurm" and isinstance(chosen, SlurmBackend)


def test_pyslurm_adapter_maps_objects_like_the_cli_parser():
    """Only the mapping (pyslurm itself cannot be installed against Slurm 22.05)."""
    from malletrain.slurm.pyslurm_backend import PyslurmBackend

    ns = types.SimpleNamespace
    fake = types.SimpleNamespace(
        Nodes=ns(load=lambda: {"n1": ns(name="n1", state="IDLE+DRAIN", partitions=["batch"],
                                        total_cpus=2, active_features=[], reason="x"),
                               "n2": ns(name="n2", state="IDLE+PLANNED", partitions=["batch"])}),
        Jobs=ns(load=lambda: {5: ns(id=5, name="w", user_name="u", partition="batch",
                                    state="PENDING", num_nodes=2, scheduled_nodes="n[1-2]",
                                    time_limit=10, start_time=2000, end_time=2600)}),
        Partitions=ns(load=lambda: {"batch": ns(name="batch", nodes="n[1-2]", priority_tier=10,
                                                preempt_mode="CANCEL", is_default=True)}),
        Reservations=ns(load=lambda: {}),
    )
    snap = PyslurmBackend(fake, cli=CliBackend()).snapshot()
    assert [n.state for n in snap.nodes] == [NodeState.DRAINED, NodeState.IDLE]
    (job,) = snap.jobs
    assert job.planned_nodes == ("n1", "n2") and job.time_limit_s == 600
    assert snap.partitions[0].priority_tier == 10 and snap.partitions[0].default
    # where a GPU limit needs them, the GPUs come from squeue's tres-alloc (the CLI's read)
    cli = CliBackend(runner=lambda argv, **_: subprocess.CompletedProcess(
        argv, 0, "5|cpu=2,node=2,gres/gpu=4\n" if list(argv) == list(JOB_GPUS) else "", ""))
    backend = PyslurmBackend(fake, cli=cli)
    backend.count_gpus = True
    assert [j.gpus for j in backend.snapshot().jobs] == [4]


def test_periodic_calls_are_read_again_only_when_their_answer_is_old():
    """At most three calls a tick in steady state; partitions, reservations and topology
    again after 60, 15 and 300 s (their answers are reused meanwhile)."""
    now = [1000.0]
    rec = Recorder(golden_answers("busy"))
    backend = CliBackend(runner=rec, clock=lambda: now[0], release=SLURM_22_05)
    first = backend.snapshot()
    assert len(rec.calls) == 6
    for dt, extra in [(5, set()), (16, {"reservation"}), (61, {"partition", "reservation"}),
                      (301, {"partition", "reservation", "topology"})]:
        rec.calls.clear()
        now[0] = 1000.0 + dt
        snap = backend.snapshot()
        periodic = {c[2] for c in rec.calls if c[0] == "scontrol"}
        assert periodic == extra and len(rec.calls) == 3 + len(extra), (dt, rec.calls)
        assert snap.partitions == first.partitions and snap.reservations == first.reservations
        assert snap.node("n1").switch == "s1"  # the topology answer is kept in between
        backend._periodic = {k: (1000.0, v) for k, (_, v) in backend._periodic.items()}


@pytest.mark.parametrize("release", ["slurm", "slurm-24.11", "slurm-26.05"])
def test_the_daemons_backend_reads_the_job_list_with_a_fresh_token(release):
    d = GOLDEN.with_name(release) / "busy"
    golden_token = (d / "jobs.token").read_text()
    by_file = {tuple(c.split(": ", 1)[1].split()): c.split(": ", 1)[0]
               for c in (d / "commands.txt").read_text().splitlines() if ": " in c}
    version = "22.05.8" if release == "slurm" else release.split("-")[1] + ".5"
    rec = Recorder(lambda argv: (0, f"slurm-wlm {version}\n", ""))

    def answer(argv):
        if argv == ["sinfo", "--version"]:
            return 0, f"slurm-wlm {version}\n", ""
        text = (d / by_file[tuple(argv)]).read_text()
        token = rec.envs[-1].get("SQUEUE_FORMAT", "")[:24]  # sequential: the call's own env
        return 0, text.replace(golden_token, token) if token else text, ""

    rec.answers = answer
    backend = CliBackend(runner=rec, daemon=True, parallel=False)
    snap = backend.snapshot()
    jobs_calls = [e["SQUEUE_FORMAT"] for e in rec.envs if "SQUEUE_FORMAT" in e]
    assert len(jobs_calls) == 1 and len(rec.calls) == 1 + 6 and snap.warnings == ()
    # the states of this tick laid over the records: as the records alone say, recorded
    # in the same moment (n6 drained, n7 and n8 idle with a backfill plan, the rest busy)
    records = build_snapshot(0.0, SnapshotTexts(
        nodes_json=(d / "nodes.json").read_text(), partitions="", reservations="",
        topology=(d / "topology.txt").read_text()))
    assert [(n.name, n.state, n.flags) for n in snap.nodes] == [
        (n.name, n.state, n.flags) for n in records.nodes]
    assert snap.node("n6").state is NodeState.DRAINED and "PLANNED" in snap.node("n7").flags
    assert all(c[0] != "squeue" or "--json" not in c for c in rec.calls)  # no JSON records
    by_id = {j.job_id: j for j in snap.jobs}
    assert by_id[4].name == "scav" and by_id[4].user == "mt-alice"
    assert by_id[2].comment == "regular work" and by_id[2].nodes == ("n1", "n2", "n3", "n4")
    assert by_id[6].planned_nodes == ("n1", "n2", "n3", "n4", "n5", "n7", "n8")
    assert by_id[6].start_time == by_id[2].end_time
    rec.calls.clear()
    backend.snapshot()  # the next tick: the states and the job list only
    assert [c[0] for c in rec.calls] == ["sinfo", "squeue"] and "--json" not in rec.calls[0]
    second = [e["SQUEUE_FORMAT"] for e in rec.envs if "SQUEUE_FORMAT" in e][1]
    assert second != jobs_calls[0]  # a new token for every call: none to guess
    assert all("SQUEUE_FORMAT" not in " ".join(c) for c in rec.calls)  # never in argv


def test_an_odd_periodic_answer_is_asked_again_not_kept_for_its_period():
    """Found by benchmarks/faults.py (slurm-garbage): wrappers answering garbage during one
    tick made every tick fail for the next 15-300 s, because the garbage answer of a
    periodic call was kept. Now it is kept only once a snapshot built from it parsed."""
    now = [1000.0]
    good = golden_answers("busy")
    garbage = '{"jobs": [{"job_id": "x", "nodes": 7}], "meta":'
    mode = ["good"]
    rec = Recorder(lambda argv: good[tuple(argv)] if mode[0] == "good" or (argv[0] == "sinfo"
                   and argv[1] == "--version") else (0, garbage, ""))
    backend = CliBackend(runner=rec, clock=lambda: now[0], release=SLURM_22_05)
    backend.snapshot()
    now[0] += 16  # the reservations are due again
    mode[0] = "garbage"
    with pytest.raises(SlurmParseError):
        backend.snapshot()
    mode[0] = "good"
    now[0] += 1
    rec.calls.clear()
    snap = backend.snapshot()  # not the garbage: asked again, and parsed
    assert any(c[:3] == ["scontrol", "show", "reservation"] for c in rec.calls)
    assert snap.node("n1").switch == "s1"


def test_a_scontrol_line_without_any_key_is_a_parse_error_not_a_crash():
    from malletrain.slurm.parsers.parse_text import parse_key_values, parse_partitions

    assert parse_key_values('{"jobs": [{"job_id": "x"}], "meta":') == {}
    assert parse_key_values("A=1 B=two words") == {"A": "1", "B": "two words"}
    with pytest.raises(SlurmParseError, match="line without PartitionName"):
        parse_partitions('{"jobs": [{"job_id": "x", "nodes": 7}], "meta":')


def test_the_daemons_periodic_answers_are_read_off_the_tick():
    """The nodes' records (every 60 s; ~5 MB at 5,000 nodes) made the tick that read them
    the slowest (benchmarks/load.py). Once the daemon has an answer, a due one is read on a
    thread of its own while the ticks use the one they have, and kept once it parsed; an
    odd one is asked again at the next tick (slurm/refresh.py)."""
    d = GOLDEN.with_name("slurm") / "busy"
    golden_token = (d / "jobs.token").read_text()
    by_file = {tuple(c.split(": ", 1)[1].split()): c.split(": ", 1)[0]
               for c in (d / "commands.txt").read_text().splitlines() if ": " in c}
    records = [(d / "nodes.json").read_text()]
    gate = threading.Event()
    gate.set()
    calls: list[list[str]] = []

    def run(argv, *, input=None, capture_output, text, timeout, env, check, errors="strict"):
        calls.append(list(argv))
        if argv == ["sinfo", "--version"]:
            return subprocess.CompletedProcess(argv, 0, "slurm-wlm 22.05.8\n", "")
        if argv == ["sinfo", "--json"]:
            assert gate.wait(10)
            return subprocess.CompletedProcess(argv, 0, records[0], "")
        out = (d / by_file[tuple(argv)]).read_text()
        token = env.get("SQUEUE_FORMAT", "")[:24]
        return subprocess.CompletedProcess(
            argv, 0, out.replace(golden_token, token) if token else out, "")

    now = [1000.0]
    backend = CliBackend(runner=run, daemon=True, parallel=False, clock=lambda: now[0])
    assert all(n.reason != "fan failed" for n in backend.snapshot().nodes)
    # 61 s later the records are due; a tick must not wait for them
    gate.clear()
    records[0] = records[0].replace('"reason": ""', '"reason": "fan failed"', 1)
    now[0] += 61
    ticked = threading.Event()
    snaps: list[ClusterSnapshot] = []
    threading.Thread(target=lambda: (snaps.append(backend.snapshot()), ticked.set()),
                     daemon=True).start()
    assert ticked.wait(5), "the tick waited for the periodic read"
    assert all(n.reason != "fan failed" for n in snaps[0].nodes)  # the records it had
    gate.set()
    backend._refresh.wait(5)
    assert backend._refresh.last_error is None
    calls.clear()
    changed = [n.name for n in backend.snapshot().nodes if n.reason == "fan failed"]
    assert len(changed) == 1 and ["sinfo", "--json"] not in calls
    # an odd answer is not kept: the ticks go on with the last good one, and ask again
    records[0] = '{"nodes": [{"name": 7}], "meta":'
    now[0] += 61
    backend.snapshot()
    backend._refresh.wait(5)
    assert isinstance(backend._refresh.last_error, SlurmParseError)
    calls.clear()
    snap = backend.snapshot()
    backend._refresh.wait(5)
    assert [n.name for n in snap.nodes if n.reason == "fan failed"] == changed
    assert calls.count(["sinfo", "--json"]) == 1  # asked again, off the tick
