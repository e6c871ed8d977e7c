"""Slurm's limits (issue 47): sacctmgr's output parsed (golden files recorded from the dev
cluster with slurmdbd by ``slurm/record-golden-limits``), read every period with the last
good limits kept, and held in the decision beside the users' fair shares."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_fair_share import _running
from tick_scenes import node, record, slot_job, world

from malletrain.core.accounting import SiteLimits, TresLimit
from malletrain.core.allocation.fairness import solve_fair
from malletrain.core.allocation.shares import user_caps
from malletrain.core.cluster import Job, JobState, NodeState
from malletrain.core.lifecycle import JobPhase
from malletrain.core.model import ThroughputModel
from malletrain.core.options import LIVE
from malletrain.core.policies import make_policy
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store import SlotRecord
from malletrain.daemon.tick import decide
from malletrain.daemon.tick.limits import Usage, job_limits, regular_usage
from malletrain.daemon.tick.world import JobModel
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.limits import LimitsReader
from malletrain.slurm.parsers.parse_limits import COMMANDS, parse_limits, parse_tres
from malletrain.slurm.parsers.parse_plain_jobs import parse_jobs_plain

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"
#: the same scenario recorded on every tested release (slurm/record-golden-limits)
RELEASES = ("slurm", "slurm-24.11", "slurm-26.05")


def golden_texts(release: str = "slurm") -> dict[str, str]:
    d = GOLDEN.parent / release / "limits"
    return {k: (d / f"{k}.txt").read_text() for k in COMMANDS}


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_associations_qos_and_default_accounts(release):
    site = parse_limits(golden_texts(release))
    bob = site.association("mt-bob", "theory")
    assert bob is not None and bob.qos == ("normal", "scav") and bob.default_qos == ""
    assert bob.per_job == TresLimit(nodes=2)  # MaxTRES=node=2
    assert bob.total == TresLimit(nodes=3, gpus=8, jobs=3)  # GrpTRES, GrpJobs 6, MaxJobs 3
    alice = site.association("mt-alice", "physics")
    assert alice is not None and alice.per_job == TresLimit(nodes=5)  # copied from physics
    assert [a.account for a in site.account_chain("theory")] == ["theory", "physics", "root"]
    assert site.account_chain("theory")[1].total == TresLimit(nodes=6, jobs=8)
    scav = site.qos["scav"]
    assert scav.per_user == TresLimit(nodes=3, gpus=4, jobs=5)
    assert scav.per_account == TresLimit(nodes=5, jobs=7)
    assert scav.total == TresLimit(nodes=6, jobs=9) and scav.per_job == TresLimit(nodes=4)
    assert site.default_accounts == {"mt-alice": "physics", "mt-bob": "theory", "root": "root"}


def test_a_jobs_caps_under_the_recorded_limits():
    site = parse_limits(golden_texts())
    bob = dataclasses.replace(record("m1", JobPhase.QUEUED, max_nodes=8), user="mt-bob")
    lim = job_limits(bob, site)  # default account theory, QOS normal (no limits)
    assert (lim.account, lim.qos, lim.max_nodes, lim.max_reason) == (
        "theory", "normal", 2, "AccountLimit")
    assert lim.caps == {"assoc:theory/mt-bob": 3, "assoc:theory": 4, "assoc:physics": 6}
    gpus = dataclasses.replace(bob, spec=JobSpec(script="/x/t.py", max_nodes=8,
                                                 gpus_per_node=4, qos="scav"))
    lim = job_limits(gpus, site)  # gres/gpu=8 a user: 2 nodes of 4 GPUs; scav: 4 GPUs: 1
    assert lim.caps["assoc:theory/mt-bob"] == 2 and lim.caps["qos:scav/user:mt-bob"] == 1
    assert lim.caps["qos:scav/account:theory"] == 5 and lim.caps["qos:scav"] == 6
    assert site.qos_refusal("mt-bob", None, "scav") is None
    assert "not among the QOS" in (site.qos_refusal("mt-alice", None, "scav") or "")
    assert "no association" in (site.qos_refusal("mt-carol", None, "normal") or "")


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_regular_jobs_come_off_the_caps_of_their_association_and_qos(release):
    """Recorded beside the limits, with Slurm enforcing them: mt-bob's regular 1-node job
    under account theory and QOS scav, his second (2 nodes) waiting at AssocGrpGRES, and
    mt-alice's scavenger job (here one of malletrain's slots). Slurm counts bob's running
    job against his association, theory and its parents and QOS scav; the waiting one
    would start if the slots under the same limits gave way, so it counts as if it ran.
    His malleable jobs may hold that much less; the slot counts nowhere."""
    d = GOLDEN.parent / release / "limits"
    jobs = parse_jobs_plain((d / "jobs.txt").read_text(), (d / "jobs.token").read_text())
    by_name = {j.name: j for j in jobs}
    running, held, slot = by_name["regular"], by_name["held"], by_name["scav"]
    assert (running.user, running.account, running.qos, running.node_count) == (
        "mt-bob", "theory", "scav", 1)
    assert (held.state, held.state_reason, held.account, held.qos, held.node_count) == (
        JobState.PENDING, "AssocGrpGRES", "theory", "normal", 2)
    assert (slot.user, slot.account, slot.qos) == ("mt-alice", "physics", "normal")
    site = parse_limits(golden_texts(release))
    regular = [j for j in jobs if j is not slot]  # (a slot's comment carries its tag)
    used = regular_usage(regular, site)
    for key in ("assoc:theory/mt-bob", "assoc:theory", "assoc:physics", "assoc:root"):
        assert used[key] == Usage(nodes=3, jobs=2), key
    for key in ("qos:scav/user:mt-bob", "qos:scav/account:theory", "qos:scav"):
        assert used[key] == Usage(nodes=1, jobs=1), key
    bob = dataclasses.replace(record("m1", JobPhase.QUEUED, max_nodes=8), user="mt-bob")
    # GrpTRES=node=3 less 3; theory 4 - 3; physics 6 - 3 (GrpJobs 8 - 2)
    assert job_limits(bob, site, used).caps == {
        "assoc:theory/mt-bob": 0, "assoc:theory": 1, "assoc:physics": 3}
    scav = dataclasses.replace(bob, spec=JobSpec(script="/x/t.py", max_nodes=8,
                                                 gpus_per_node=4, qos="scav"))
    caps = job_limits(scav, site, used).caps  # scav: 4 GPUs a user, 5 - 1 nodes an
    assert (caps["qos:scav/user:mt-bob"], caps["qos:scav/account:theory"],  # account,
            caps["qos:scav"]) == (1, 4, 5)  # 6 - 1 in all
    waiting = dataclasses.replace(held, state_reason="Priority")  # not at a limit
    assert regular_usage([running, waiting], site)[
        "assoc:theory/mt-bob"] == Usage(nodes=1, jobs=1)
    assert regular_usage(jobs, site)["assoc:physics"] == Usage(nodes=4, jobs=3)
    assert regular_usage(jobs, None) == {}


def test_decide_gives_bob_what_his_regular_job_leaves_under_his_limit():
    """mt-bob runs a regular 2-node job elsewhere under his default account (theory:
    GrpTRES=node=3 for him): his malleable job gets the 1 node left, not the 2 its MaxTRES
    allows, and says AccountLimit; carol gets the other 15. Slurm would leave a second slot
    of bob's pending (AssocGrpNodeLimit) on a node nobody else could use. A regular job of
    his waiting at that limit takes the last node's room too: his slot gives way."""
    w = _alice_and_bob("carol")
    regular = Job(4242, "train", "mt-bob", "batch", JobState.RUNNING, node_count=2,
                  nodes=("r1", "r2"))
    w = dataclasses.replace(w, snapshot=dataclasses.replace(
        w.snapshot, jobs=(*w.snapshot.jobs, regular)))
    plan = decide(w, make_policy("malletrain", LIVE))
    assert len(plan.targets["m9"]) == 1 and len(plan.targets["m1"]) == 15
    assert plan.reasons["m9"] == "AccountLimit"
    # his next regular job waits at the limit his slot fills: the slot gives way
    waiting = Job(4243, "train", "mt-bob", "batch", JobState.PENDING, "AssocGrpNodeLimit",
                  node_count=1)
    plan = decide(dataclasses.replace(w, snapshot=dataclasses.replace(
        w.snapshot, jobs=(*w.snapshot.jobs, waiting))), make_policy("malletrain", LIVE))
    assert not plan.targets.get("m9") and len(plan.targets["m1"]) == 16
    # one that could not start even with no slot (5 nodes under his 3) waits for nothing
    # the slots hold: it takes nothing from them, however many nodes it asks for
    huge = dataclasses.replace(waiting, node_count=5)
    plan = decide(dataclasses.replace(w, snapshot=dataclasses.replace(
        w.snapshot, jobs=(*w.snapshot.jobs, huge))), make_policy("malletrain", LIVE))
    assert len(plan.targets["m9"]) == 1
    done = dataclasses.replace(regular, state=JobState.COMPLETED)
    w = dataclasses.replace(w, snapshot=dataclasses.replace(
        w.snapshot, jobs=(*w.snapshot.jobs[:-1], done)))
    assert len(decide(w, make_policy("malletrain", LIVE)).targets["m9"]) == 2


@pytest.mark.parametrize(("text", "match"), [
    ("malletrain|physics|mt-bob|||node=5||4||normal\n", "10 fields where 11"),
    ("malletrain|physics|mt-bob|||node=x||4||normal|\n", "not a whole number"),
    ("malletrain|physics|mt-bob|||node||4||normal|\n", "has no '='"),
    ("<html>502 Bad Gateway</html>\n", "1 fields where 11"),
])
def test_garbled_output_is_refused_with_the_line(text, match):
    with pytest.raises(SlurmParseError, match=match):
        parse_limits({**golden_texts(), "assoc": text})


def test_two_clusters_need_the_cluster_named():
    two = golden_texts()["assoc"] + "other|root||||||||normal|\n"
    with pytest.raises(SlurmParseError, match=r"set accounting\.cluster"):
        parse_limits({**golden_texts(), "assoc": two})
    assert len(parse_limits({**golden_texts(), "assoc": two}, "other").associations) == 1
    assert parse_tres("cpu=16,gres/gpu:a100=4,node=2") == TresLimit(nodes=2, gpus=4)


class Replay:
    """sacctmgr's recorded answers, in turn (a list per key; the last one repeats)."""

    def __init__(self, answers: dict[str, list[tuple[int, str, str]]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        key = next(k for k, c in COMMANDS.items() if list(c) == argv)
        queue = self.answers[key]
        rc, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return subprocess.CompletedProcess(argv, rc, out, err)


def _recorded(name: str, release: str = "slurm") -> dict[str, list[tuple[int, str, str]]]:
    d = GOLDEN.parent / release / name
    if name == "limits":
        return {k: [(0, t, "")] for k, t in golden_texts(release).items()}
    return {k: [(int((d / f"{k}.rc").read_text()), (d / f"{k}.stdout").read_text(),
                 (d / f"{k}.stderr").read_text())] for k in COMMANDS}


@pytest.mark.parametrize("release", RELEASES)
def test_auto_stops_asking_a_cluster_without_accounting(release):
    run = Replay(_recorded("limits-off", release))
    clock = [0.0]
    reader = LimitsReader(mode="auto", run=run, clock=lambda: clock[0])
    assert reader.current() is None and not reader.available
    clock[0] = 1000.0
    assert reader.current() is None and len(run.calls) == 1  # never asked again
    capped = LimitsReader(mode="auto", user_max_nodes=4, run=Replay(_recorded("limits-off")))
    assert capped.current() == SiteLimits(user_max_nodes=4)  # the settings' cap holds
    off = Replay(_recorded("limits"))
    assert LimitsReader(mode="off", run=off).current() is None and not off.calls


def test_garbled_or_failed_reads_keep_the_last_good_limits():
    answers = _recorded("limits")
    answers["assoc"] = [answers["assoc"][0], (0, "garbled|\n", ""),
                        (1, "", "sacctmgr: error: Problem talking to the database")]
    clock = [0.0]
    reader = LimitsReader(mode="on", refresh_s=60, run=Replay(answers), clock=lambda: clock[0])
    good = reader.current()
    assert good is not None and good.association("mt-bob", "theory") is not None
    for t in (61.0, 122.0):  # a garbled answer, then slurmdbd down
        clock[0] = t
        reader.current()
        reader._refresh.wait(5)
        assert reader.current() is good and reader.last_error is not None


def test_caps_hold_a_user_whose_nodes_would_otherwise_sit_idle_or_go_to_others():
    linear = np.arange(17, dtype=float)[None, :].repeat(2, axis=0)
    counts, _ = solve_fair(linear, ["alice", "bob"], [0, 0], 16, [(), ("bob",)], {"bob": 2})
    assert list(counts) == [14, 2]  # work-conserving: alice gets what bob may not hold
    counts, _ = solve_fair(linear, ["bob", "bob"], [0, 0], 16, [("bob",), ("bob",)],
                           {"bob": 2})
    assert counts.sum() == 2  # one user alone: held too, nodes stay idle
    counts, _ = solve_fair(linear, ["a", "b"], [0, 0], 16, [("acct",), ("acct",)],
                           {"acct": 6})
    assert list(counts) == [3, 3]  # an account's cap shared max-min by its users
    assert user_caps({"a": 16, "b": 16}, {}, 16, {"a": 3.0}) == {"a": 12, "b": 4}


def _alice_and_bob(alice: str):
    """``alice``'s one job of 1-16 nodes holds 4 of 16 nodes; mt-bob's job of 1-8 is queued."""
    names = [f"n{i}" for i in range(1, 17)]
    rec, slots, jobs, cv = _running("m1", 1, names[:4], 16, 100)
    rec = dataclasses.replace(rec, user=alice)
    jobs = [dataclasses.replace(j, user=alice) for j in jobs]
    bob = dataclasses.replace(record("m9", JobPhase.QUEUED, max_nodes=8, seq=9), uid=1001,
                              user="mt-bob",
                              spec=JobSpec(script="/x/train.py", min_nodes=1, max_nodes=8))
    for k in range(8):
        slots.append(SlotRecord("m9", k, 900 + k))
        jobs.append(dataclasses.replace(
            slot_job(900 + k, "m9", k, JobState.PENDING, "JobHeldUser"), user="mt-bob"))
    states = [node(n, NodeState.ALLOCATED if i < 4 else NodeState.IDLE)
              for i, n in enumerate(names)]
    w = world(states, jobs, slots, [rec, bob], {"m1": cv})
    model = JobModel(ThroughputModel(tuple((n, 100.0 * n) for n in (1, 2, 4, 8, 16))), 3.0,
                     1.0)
    return dataclasses.replace(w, models={"m1": model, "m9": model},
                               limits=parse_limits(golden_texts()))


def test_decide_holds_bob_at_his_limit_and_gives_the_rest_to_others():
    """mt-bob may hold 2 nodes a job (MaxTRES=node=2, as recorded); carol has no limits:
    bob gets 2, carol the other 14 (all the others: Resources, not her user's share), and
    bob's job says AccountLimit."""
    plan = decide(_alice_and_bob("carol"), make_policy("malletrain", LIVE))
    assert len(plan.targets["m9"]) == 2 and len(plan.targets["m1"]) == 14
    assert plan.reasons["m9"] == "AccountLimit" and plan.reasons["m1"] == "Resources"
    assert plan.entitled == {"carol": 14, "mt-bob": 2}  # `malletrain jobs --json`


def test_decide_holds_every_recorded_limit_even_with_nodes_idle():
    """mt-alice in physics may run 4 jobs (MaxJobs=4: each node slot is one job), and
    physics with its sub-account theory 6 nodes (GrpTRES=node=6): alice 4, bob 2, and 10
    nodes stay idle; without accounting, the settings' per-user cap (5) holds instead."""
    w = _alice_and_bob("mt-alice")
    plan = decide(w, make_policy("malletrain", LIVE))
    assert len(plan.targets["m1"]) == 4 and len(plan.targets["m9"]) == 2
    assert plan.reasons["m1"] == plan.reasons["m9"] == "AccountLimit"
    plan = decide(dataclasses.replace(w, limits=SiteLimits(user_max_nodes=5)),
                  make_policy("malletrain", LIVE))
    assert len(plan.targets["m1"]) == 5 and len(plan.targets["m9"]) == 5
    assert plan.reasons["m1"] == plan.reasons["m9"] == "AccountLimit"
    plan = decide(dataclasses.replace(w, limits=None), make_policy("malletrain", LIVE))
    assert len(plan.targets["m1"]) == 8 and len(plan.targets["m9"]) == 8  # fair halves
    assert plan.entitled == {"mt-alice": 8, "mt-bob": 8}


def test_qos_at_submit_is_checked_against_the_users_associations_as_sbatch_does(tmp_path):
    from types import SimpleNamespace

    from malletrain.daemon.jobs.spec import SpecError
    from malletrain.daemon.jobs.store import Store
    from malletrain.daemon.submit.channel import Peer
    from malletrain.daemon.submit.requests import RequestHandler
    from malletrain.ops.settings import Settings

    site = parse_limits(golden_texts())
    coordinator = SimpleNamespace(address="127.0.0.1:1", job_secret=lambda job_id, owner=-1: "s")
    h = RequestHandler(Settings(), Store(tmp_path / "s.db"), coordinator=coordinator,
                       state_dir=tmp_path, rows=lambda: [], wake=lambda: None,
                       site_limits=lambda: site)

    def submit(user: str, uid: int, qos: str) -> dict:
        spec = {"script": "/x/t.py", "max_nodes": 2, "qos": qos}
        return h.handle(Peer(uid=uid, gid=uid, pid=1, user=user), {"op": "submit", "spec": spec})

    assert submit("mt-bob", 1002, "scav")["qos"] == "scav"  # the slots run under it
    with pytest.raises(SpecError, match="'scav' is not among the QOS of user 'mt-alice'"):
        submit("mt-alice", 1001, "scav")


def test_a_nicer_job_gets_less_of_its_users_part_and_nothing_of_anothers():
    from malletrain.core.model import AllocationInput, IdleNode, MalleableJob
    from malletrain.core.options import CORE
    from malletrain.daemon.tick.allocate import nice_weight

    sqrt = ThroughputModel(tuple((n, 100.0 * n ** 0.5) for n in range(1, 9)))

    def job(job_id: str, user: str, nice: int = 0) -> MalleableJob:
        return MalleableJob(job_id, 1, 8, (), sqrt, 1.0, 1.0, user=user,
                            weight=nice_weight(nice))

    nodes = tuple(IdleNode(f"n{i}", 1e6) for i in range(8))
    policy = make_policy("malletrain", CORE)
    plain = policy.decide(AllocationInput(0.0, nodes, (job("a1", "a"), job("a2", "a"))))
    nice = policy.decide(AllocationInput(0.0, nodes, (job("a1", "a"), job("a2", "a", 300))))
    assert (plain.count("a1"), plain.count("a2")) == (4, 4)
    assert nice.count("a2") < nice.count("a1") and nice.count("a1") + nice.count("a2") == 8
    other = policy.decide(AllocationInput(0.0, nodes, (job("a1", "a", 300), job("b1", "b"))))
    assert (other.count("a1"), other.count("b1")) == (4, 4)  # users' parts come first


def test_a_cap_holds_across_node_types():
    """With several node types each type is planned in turn (core.hetero): a cap shared by
    jobs on two types holds on their sum."""
    from malletrain.core.model import AllocationInput, IdleNode, MalleableJob
    from malletrain.core.options import CORE

    linear = ThroughputModel(tuple((n, 100.0 * n) for n in range(1, 5)))
    nodes = tuple(IdleNode(f"{t}{i}", 1e6, node_type=t) for t in ("a100", "v100")
                  for i in range(4))
    jobs = tuple(MalleableJob(f"b{t}", 1, 4, (), linear, 1.0, 1.0, user="bob",
                              allowed_types=frozenset({t}), limits=("assoc:x/bob",))
                 for t in ("a100", "v100"))
    policy = make_policy("malletrain", CORE)
    free = policy.decide(AllocationInput(0.0, nodes, jobs))
    capped = policy.decide(AllocationInput(0.0, nodes, jobs, caps={"assoc:x/bob": 3}))
    assert free.count("ba100") + free.count("bv100") == 8
    assert capped.count("ba100") + capped.count("bv100") == 3


def test_a_running_job_above_a_new_limit_is_shrunk_to_it():
    """An administrator lowers a limit below what a job holds: the plan that keeps every
    running job's size (plan_check) is never taken over the cap."""
    w = dataclasses.replace(_alice_and_bob("mt-alice"), limits=SiteLimits(user_max_nodes=2))
    plan = decide(w, make_policy("malletrain", LIVE))
    assert len(plan.targets["m1"]) == 2 and plan.reasons["m1"] == "AccountLimit"


def test_a_sites_scavenger_qos_outranks_the_scripts(tmp_path):
    from types import SimpleNamespace

    from malletrain.daemon.jobs.store import Store
    from malletrain.daemon.submit.channel import Peer
    from malletrain.daemon.submit.requests import RequestHandler
    from malletrain.ops.settings import Settings, SlurmSettings

    store = Store(tmp_path / "s.db")
    coordinator = SimpleNamespace(address="127.0.0.1:1", job_secret=lambda job_id, owner=-1: "s")
    h = RequestHandler(Settings(slurm=SlurmSettings(qos="scavenger")), store,
                       coordinator=coordinator, state_dir=tmp_path, rows=lambda: [],
                       wake=lambda: None, site_limits=lambda: parse_limits(golden_texts()))
    spec = {"script": "/x/t.py", "max_nodes": 2, "qos": "high"}
    answer = h.handle(Peer(uid=1001, gid=1001, pid=1, user="mt-alice"),
                      {"op": "submit", "spec": spec})
    assert answer["qos"] == "scavenger"
    assert store.job(answer["job_id"]).spec.qos == "scavenger"  # its limits are held


def test_the_accounting_settings_are_typed_and_each_problem_named():
    from malletrain.ops.config_file import SettingsError, parse_settings

    s = parse_settings("accounting:\n  mode: off\n  user_max_nodes: 4\n"
                       "  share_weights: {mt-alice: 2.0}\n")
    assert (s.accounting.mode, s.accounting.user_max_nodes) == ("off", 4)
    assert s.accounting.share_weights == {"mt-alice": 2.0}
    with pytest.raises(SettingsError) as err:
        parse_settings("accounting:\n  mode: sometimes\n  refresh_s: 1\n"
                       "  share_weights: {'a b': 2.0, c: 0}\n")
    text = str(err.value)
    assert "accounting.mode" in text and "accounting.refresh_s" in text
    assert "accounting.share_weights" in text and "'a b' is not a user name" in text
