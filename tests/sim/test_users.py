"""Users in the simulator (issue 47): the jobs file names them, admission is fair among them.

Admitted first-in-first-out, user A's 20 jobs kept user B's one job out of the decision for
7,684-7,941 s (issue 47). Here B's job is admitted (and so decided for) at its arrival, and
slots pass round-robin among users; a job set that names no users replays as before."""

from dataclasses import replace

import pytest

from malletrain.core.options import LIVE, REPLAY
from malletrain.core.policies import make_policy
from malletrain.errors import PermanentError
from malletrain.sim.bounds.bound import upper_bound
from malletrain.sim.bounds.bound_inputs import idle_segments
from malletrain.sim.curves import TrueCurves
from malletrain.sim.engine import Simulator
from malletrain.sim.jobs import SimJob, dump_jobs, parse_jobs
from malletrain.sim.trace import TraceError

from .test_semantics import job, run, trace

ONE = """  - name: {name}
    submit_s: 0
    min_nodes: 1
    max_nodes: 4
    total_samples: 1.0e+9
    scale_up_s: 18
    scale_down_s: 12
    curve: [[1, 100.0], [4, 350]]
"""


def _jobs(*extra: str) -> str:
    return "jobs:\n" + "".join(ONE.format(name=f"j{i}") + e for i, e in enumerate(extra))


def test_user_and_account_parse_and_round_trip():
    jobs = parse_jobs("u.yaml", _jobs("    user: alice\n    account: physics\n",
                                      "    user: 1001\n"))
    assert [(j.user, j.account) for j in jobs] == [("alice", "physics"), ("1001", "")]
    assert parse_jobs("r.yaml", dump_jobs(jobs)) == jobs
    assert [j.user for j in parse_jobs("n.yaml", _jobs("", ""))] == ["", ""]


@pytest.mark.parametrize(("extra", "parts"), [
    ("    user: 'a b'\n", ["u.yaml:10", "'user'", "expected a name"]),
    ("    user: '-rf'\n", ["'user'", "expected a name"]),
    ("    account: 'x;rm'\n", ["'account'", "expected a name"]),
    ("    user: true\n", ["'user'", "expected a name"]),
    ("    user: ''\n", ["'user'", "expected a name"]),
])
def test_bad_user_or_account_is_named(extra, parts):
    with pytest.raises(TraceError) as err:
        parse_jobs("u.yaml", _jobs(extra))
    for part in parts:
        assert part in str(err.value), str(err.value)


def test_some_jobs_without_a_user_is_an_error():
    with pytest.raises(TraceError, match=r"j1.*names no user while others do"):
        parse_jobs("u.yaml", _jobs("    user: alice\n", ""))


def _a_and_b(limit: int = 3):
    a = [replace(job(f"a{i}", total=1e9), user="a") for i in range(6)]
    b = replace(job("b0", submit=60.0, total=1e9), user="b")
    tr = trace((0, [0, 1, 2, 3], []), (100, [], []), (200, [], []))
    return a, b, tr, limit


def test_a_newcomer_user_is_admitted_on_arrival_beyond_the_limit():
    a, b, tr, limit = _a_and_b()
    res, pol = run(tr, [*a, b], {}, max_concurrent_jobs=limit)
    admitted = {r.job.name: r.admitted_s for r in res.jobs if r.admitted_s is not None}
    assert admitted == {"a0": 0.0, "a1": 0.0, "a2": 0.0, "b0": 60.0}
    at_60 = next(inp for inp in pol.seen if inp.now_s == 60.0)  # its arrival is a decision
    assert [j.job_id for j in at_60.jobs] == ["a0", "a1", "a2", "b0"]
    assert at_60.queued_jobs == 3
    assert {j.user for j in at_60.jobs} == {"a", "b"}


def test_first_in_first_out_kept_b_out_while_a_queued():
    a, b, tr, limit = _a_and_b()
    blind = [replace(j, user="") for j in [*a, b]]
    res, _ = run(tr, blind, {}, max_concurrent_jobs=limit)
    assert next(r for r in res.jobs if r.job.name == "b0").admitted_s is None


def test_free_slots_go_round_robin_to_the_user_with_fewest_admitted():
    # a: 4 jobs, b: 2, c: 1, all at t=0, limit 3: one of each first
    jobs = ([replace(job(f"a{i}"), user="a") for i in range(4)]
            + [replace(job(f"b{i}"), user="b") for i in range(2)]
            + [replace(job("c0"), user="c")])
    _, pol = run(trace((0, [0, 1, 2, 3], []), (10, [], [])), jobs, {}, max_concurrent_jobs=3)
    assert [j.job_id for j in pol.seen[0].jobs] == ["a0", "b0", "c0"]
    # c's only job finishes: the slot goes to a or b with fewest admitted (tie: a0's earlier order)
    short = replace(jobs[-1], total_samples=5.0)
    _, pol = run(trace((0, [0, 1, 2, 3], []), (10, [], [])), [*jobs[:-1], short],
                   {0: {"c0": ("a",)}}, max_concurrent_jobs=3)
    after = next(inp for inp in pol.seen if inp.now_s == 5.0)
    assert [j.job_id for j in after.jobs] == ["a0", "b0", "a1"]


def test_one_user_replays_exactly_as_before():
    jobs = [job(f"j{i}", submit=10.0 * i, total=40.0) for i in range(5)]
    named = [replace(j, user="u") for j in jobs]
    tr = trace((0, [0, 1, 2, 3], []), (30, [], [2, 3]), (60, [2, 3], []), (120, [], []))
    pol = make_policy("malletrain-known-curves", REPLAY)
    plain = Simulator(tr, jobs, pol, TrueCurves(), max_concurrent_jobs=2).run()
    pol = make_policy("malletrain-known-curves", REPLAY)
    users = Simulator(tr, named, pol, TrueCurves(), max_concurrent_jobs=2).run()
    assert [(r.admitted_s, r.finished_s, r.done) for r in plain.jobs] == \
        [(r.admitted_s, r.finished_s, r.done) for r in users.jobs]
    assert plain.summary()["one_worker_seconds_total"] == \
        users.summary()["one_worker_seconds_total"]


def test_the_bound_refuses_several_users():
    a, b, tr, _ = _a_and_b()
    with pytest.raises(PermanentError, match="several users"):
        upper_bound(idle_segments(tr), [*a, b], 3)


def test_jobs_without_users_are_one_user():
    assert SimJob("x", 0, 1, 1, 1.0, 0, 0, ((1, 1.0),)).user == ""


def test_simulate_runs_a_jobs_file_with_users_and_refuses_its_bound(tmp_path, capsys):
    from malletrain.cli import main

    from .test_cli_simulate import JOBS, TRACE

    (tmp_path / "idle.csv").write_text(TRACE)
    named = JOBS.replace("    curve: [[1, 10.0]", "    user: alice\n    curve: [[1, 10.0]")
    named = named.replace("    curve: [[1, 2.0]", "    user: bob\n    account: physics\n"
                          "    curve: [[1, 2.0]")
    (tmp_path / "jobs.yaml").write_text(named)
    argv = ["simulate", "--idle-trace", str(tmp_path / "idle.csv"), "--jobs",
            str(tmp_path / "jobs.yaml"), "--policy", "malletrain", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    assert main([*argv, "--bound"]) != 0
    assert "several users" in capsys.readouterr().err


@pytest.mark.parametrize("fair", [True, False])
def test_in_the_replay_b_gets_its_half_at_its_arrival(fair):
    """Issue 47's A/B world in the simulator, the daemon's preset LIVE and the true curves:
    A's four jobs hold all 16 nodes, B's job arrives at t=60 s; fair: B has 8 from that
    decision on; user-blind (keep margin, start cost): nothing for the whole replay."""
    curve = tuple((n, 100.0 * n * 0.97 ** (n.bit_length() - 1)) for n in (1, 2, 4, 8))
    a = [replace(job(f"a{i}", hi=8, curve=curve, up=10.0, down=5.0), user="a") for i in range(4)]
    b = replace(job("b0", submit=60.0, hi=8, curve=curve, up=10.0, down=5.0), user="b")
    names = tuple(f"n{i}" for i in range(16))
    tr = trace((0, list(range(16)), []), (600, [], []), (3600, [], []), names=names)
    pol = make_policy("malletrain-known-curves", LIVE.with_(fair_share=fair))
    res = Simulator(tr, [*a, b], pol, TrueCurves()).run()
    b_sizes = [(c.time_s, c.nodes) for c in res.job_nodes if c.job == "b0"]
    if fair:
        assert b_sizes[0] == (60.0, 8) and all(n == 8 for _, n in b_sizes)
    else:
        assert b_sizes == []
