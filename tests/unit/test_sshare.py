"""Slurm's fair-share factors (``sshare``) as users' share weights, and accounts above users
(issue 47): the parser on output recorded from the dev cluster on three releases
(``slurm/record-golden-sshare``), the floor, the account tree, and the decision."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_slurm_limits import _alice_and_bob, golden_texts

from malletrain.core.accounting import SiteLimits, fair_share_weights
from malletrain.core.allocation.fairness import solve_fair
from malletrain.core.allocation.shares import FairTree, tree_caps, user_caps
from malletrain.core.model import AllocationInput, IdleNode, MalleableJob, ThroughputModel
from malletrain.core.options import LIVE
from malletrain.core.policies import make_policy
from malletrain.daemon.tick import decide
from malletrain.daemon.tick.reasons import entitlements
from malletrain.ops.config_file import SettingsError, load_settings
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.limits import LimitsReader
from malletrain.slurm.parsers.parse_limits import COMMANDS
from malletrain.slurm.parsers.parse_sshare import COMMAND, parse_sshare

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RELEASES = ("slurm", "slurm-24.11", "slurm-26.05")


def recorded(release: str = "slurm") -> str:
    return (GOLDEN / release / "sshare" / "sshare.txt").read_text()


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_tree_usage_and_factors(release):
    """mt-alice ran jobs (RawUsage > 0), mt-bob none: her factor is below his; accounts'
    own lines carry no factor; theory was given Fairshare=2."""
    rows = parse_sshare(recorded(release))
    by = {(r.account, r.user): r for r in rows}
    alice, bob = by[("physics", "mt-alice")], by[("physics", "mt-bob")]
    assert alice.raw_usage > 0 and bob.raw_usage == 0
    assert alice.factor is not None and bob.factor is not None
    assert 0 < alice.factor < bob.factor <= 1
    assert by[("theory", "")].factor is None and by[("theory", "")].raw_shares == 2
    assert by[("root", "")].raw_shares is None
    weights = fair_share_weights(rows, {"mt-alice": "physics", "mt-bob": "theory"})
    assert (weights["mt-alice"], weights["mt-bob"]) == (alice.factor,
                                                         by[("theory", "mt-bob")].factor)
    assert (GOLDEN / release / "sshare" / "commands.txt").read_text().split(": ", 1)[1] \
        == " ".join(COMMAND) + "\n"  # recorded with the command the daemon runs
    for field in COMMAND[-1].split("=", 1)[1].split(","):  # the release has each column
        assert field in (GOLDEN / release / "sshare" / "helpformat.txt").read_text()


@pytest.mark.parametrize(("text", "match"), [
    ("physics|mt-alice|1|0.5|10|0.5\n", "6 fields where 7"),
    ("physics|mt-alice|1|0.5|ten|0.5|0.2\n", "RawUsage is 'ten'"),
    ("physics|mt-alice|1|0.5|10|0.5|1.5\n", "above 1"),
    ("physics|mt-alice|1|0.5|10|0.5|nan\n", "not a finite number"),
    ("|mt-alice|1|0.5|10|0.5|0.2\n", "no account"),
])
def test_garbled_output_is_refused_with_the_line(text, match):
    with pytest.raises(SlurmParseError, match=match):
        parse_sshare(text)


def test_the_floor_and_the_default_account():
    rows = parse_sshare("  physics|a|1|0.5|900|0.9|0.0\n  physics|b|1|0.5|0|0|0.9\n"
                        "  chem|b|1|0.5|0|0|0.4\n")
    assert fair_share_weights(rows, {"b": "chem"}, floor=0.05) == {"a": 0.05, "b": 0.4}
    assert fair_share_weights(rows, {}, floor=0.05) == {"a": 0.05, "b": 0.9}  # the highest


def test_a_users_factor_moves_its_part_and_the_floor_keeps_a_node():
    """FairShare 0.9 against 0.1 of 64 idle nodes: 58 and 6 (equal: 32 each); a factor of 0
    weighs the floor (0.05): 3 of 64, and of 8 nodes still 1 (the odd node goes to a user
    holding none before the heaviest), so nobody starves while it has a job."""
    demand = {"a": 64, "b": 64}
    assert user_caps(demand, {}, 64, {"a": 0.9, "b": 0.1}) == {"a": 58, "b": 6}
    assert user_caps(demand, {}, 64) == {"a": 32, "b": 32}
    assert user_caps(demand, {}, 64, {"a": 1.0, "b": 0.05}) == {"a": 61, "b": 3}
    assert user_caps(demand, {}, 8, {"a": 1.0, "b": 0.05}) == {"a": 7, "b": 1}
    assert user_caps({"a": 64, "b": 2}, {}, 64, {"a": 0.1, "b": 0.9}) == {"a": 62, "b": 2}


def test_accounts_first_then_their_users():
    """Slurm's tree: physics (one user) and chem (three) split 12 nodes 6/6, then chem's
    users 2 each (users alone: 3 each); weighted accounts; what an account cannot use goes
    to the others (work-conserving at both levels)."""
    demand = {"physics/a": 12, "chem/b": 12, "chem/c": 12, "chem/d": 12}
    parents = {m: m.split("/")[0] for m in demand}
    assert tree_caps(demand, {}, 12, None, parents, {}) == {
        "physics/a": 6, "chem/b": 2, "chem/c": 2, "chem/d": 2}
    assert user_caps(demand, {}, 12) == dict.fromkeys(demand, 3)
    assert tree_caps(demand, {}, 12, None, parents, {"physics": 3.0})["physics/a"] == 9
    small = {**demand, "physics/a": 2}
    assert tree_caps(small, {}, 12, None, parents, {}) == {
        "physics/a": 2, "chem/b": 4, "chem/c": 3, "chem/d": 3}
    weighted = tree_caps(demand, {}, 12, {"chem/b": 4.0}, parents, {})
    assert weighted["physics/a"] == 6 and weighted["chem/b"] == 4


def test_the_account_tree_is_divided_level_by_level():
    """Slurm's tree is nested (root -> physics -> {physics-a, physics-b}; root -> chem): the
    top accounts divide the nodes, then each its child accounts and members, and so on. One
    level (no parents), the three leaf accounts split evenly instead."""
    demand = {"physics-a/alice": 64, "physics-a/bob": 64, "physics-b/carol": 64,
              "chem/dave": 64}
    parents = {m: m.split("/")[0] for m in demand}
    tree = {"physics-a": "physics", "physics-b": "physics", "physics": "root", "chem": "root",
            "root": ""}
    assert tree_caps(demand, {}, 64, None, parents, {}, account_parents=tree) == {
        "physics-a/alice": 8, "physics-a/bob": 8, "physics-b/carol": 16, "chem/dave": 32}
    flat = tree_caps(demand, {}, 64, None, parents, {})
    assert {flat["chem/dave"], flat["physics-b/carol"],
            flat["physics-a/alice"] + flat["physics-a/bob"]} <= {21, 22}
    weighted = tree_caps(demand, {}, 64, None, parents, {"chem": 3.0}, account_parents=tree)
    assert weighted["chem/dave"] == 48 and weighted["physics-b/carol"] == 8
    # what a sub-tree cannot use goes up and across: physics-b's carol wants 2
    small = tree_caps({**demand, "physics-b/carol": 2}, {}, 64, None, parents, {},
                      account_parents=tree)
    assert small == {"physics-a/alice": 15, "physics-a/bob": 15, "physics-b/carol": 2,
                     "chem/dave": 32}
    # a cycle in the parents (a garbled read) hangs from the top, and nothing loops
    looped = tree_caps(demand, {}, 64, None, parents, {},
                       account_parents={"physics-a": "physics-b", "physics-b": "physics-a"})
    assert sum(looped.values()) == 64


def test_the_policy_divides_down_the_account_tree():
    linear = ThroughputModel(((1, 1.0), (64, 64.0)))
    jobs = tuple(MalleableJob(f"j{k}", 1, 64, (), linear, 1.0, 1.0, k, user=u, account=a)
                 for k, (a, u) in enumerate([("physics-a", "alice"), ("physics-a", "bob"),
                                             ("physics-b", "carol"), ("chem", "dave")]))
    nodes = tuple(IdleNode(f"n{i}", 3600.0) for i in range(64))
    inp = AllocationInput(0.0, nodes, jobs, account_weights={"chem": 1.0},
                          account_parents={"physics-a": "physics", "physics-b": "physics"})
    plan = make_policy("malletrain", LIVE).decide(inp)
    assert [plan.count(j.job_id) for j in jobs] == [8, 8, 16, 32]


def test_the_knapsack_holds_each_member_to_its_tree_part():
    linear = np.tile(np.arange(13, dtype=float), (4, 1))
    members = ("physics/a", "chem/b", "chem/c", "chem/d")
    tree = FairTree(members, dict.fromkeys(members, 1.0),
                    {m: m.split("/")[0] for m in members}, {})
    counts, _ = solve_fair(linear, members, [0] * 4, 12, tree=tree)
    assert list(counts) == [6, 2, 2, 2]
    counts, _ = solve_fair(linear, members, [0] * 4, 12)
    assert list(counts) == [3, 3, 3, 3]


class Replay:
    """The recorded answers of the daemon's reads, by command (sacctmgr's and sshare's)."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv, **_kw):
        self.calls.append(list(argv))
        key = next(k for k, c in {**COMMANDS, "sshare": COMMAND}.items() if list(c) == argv)
        rc, out, err = self.answers[key]
        return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.mark.parametrize("release", RELEASES)
def test_the_reader_turns_factors_into_weights_and_keeps_the_last_good(release):
    answers = {k: (0, t, "") for k, t in golden_texts(release).items()}
    answers["sshare"] = (0, recorded(release), "")
    clock = [0.0]
    reader = LimitsReader(mode="on", share_weights_from="sshare", fair_share_floor=0.1,
                          share_weights={"mt-bob": 2.0}, account_weights={"physics": 3.0},
                          run=Replay(answers), clock=lambda: clock[0])
    site = reader.current()
    rows = {(r.account, r.user): r.factor for r in parse_sshare(recorded(release))}
    assert site is not None and site.account_weights == {"physics": 3.0}
    assert site.weight("mt-alice") == max(0.1, rows[("physics", "mt-alice")] or 0)
    assert site.weight("mt-bob") == pytest.approx(2.0 * (rows[("theory", "mt-bob")] or 0))
    assert site.weight("carol") == 0.1  # not in sshare: the floor
    answers["sshare"] = (0, "physics|mt-alice|garbled\n", "")
    clock[0] = 61.0
    reader.current()
    reader._refresh.wait(5)
    assert reader.current() is site and "sshare" in str(reader.last_error)
    plain = LimitsReader(mode="on", run=Replay(answers))
    assert plain.current() is not None and plain.current().weight("mt-alice") == 1.0


@pytest.mark.parametrize("release", RELEASES)
def test_without_accounting_sshare_is_not_read_and_users_weigh_alike(release):
    """Without slurmdbd (priority/basic) sshare answers nothing and exit 0, as recorded:
    no factors (every user weighs the floor: alike); sacctmgr's refusal stops the reads."""
    d = GOLDEN / release / "sshare-off"
    assert int((d / "sshare.rc").read_text()) == 0
    assert parse_sshare((d / "sshare.stdout").read_text()) == ()
    off = GOLDEN / release / "limits-off"
    answers = {k: (int((off / f"{k}.rc").read_text()), "", (off / f"{k}.stderr").read_text())
               for k in COMMANDS}
    answers["sshare"] = (int((d / "sshare.rc").read_text()), "",
                         (d / "sshare.stderr").read_text())
    run = Replay(answers)
    reader = LimitsReader(mode="auto", share_weights_from="sshare", run=run)
    assert reader.current() is None and not reader.available


def test_decide_weights_users_by_their_factor():
    """carol (FairShare 0.9) and mt-bob (0.1), 16 idle nodes: entitled 15 and 1 (equal
    weights: 8 and 8), and the targets follow; the floor keeps bob at a node."""
    w = _alice_and_bob("carol")
    policy = make_policy("malletrain", LIVE)
    for weights, want in (({"carol": 0.9, "mt-bob": 0.1}, {"carol": 15, "mt-bob": 1}),
                          ({}, {"carol": 8, "mt-bob": 8})):
        plan = decide(dataclasses.replace(w, limits=SiteLimits(share_weights=weights)),
                      policy)
        assert plan.entitled == want
        assert len(plan.targets["m9"]) == want["mt-bob"]
        assert len(plan.targets["m1"]) == want["carol"]
    floor = SiteLimits(share_weights={"carol": 1.0}, default_weight=0.05)
    plan = decide(dataclasses.replace(w, limits=floor), policy)
    assert plan.entitled == {"carol": 15, "mt-bob": 1} and len(plan.targets["m9"]) == 1


def test_sshares_six_places_do_not_round_a_part_down():
    """sshare's factors 0.333333 and 0.666667 of 6 nodes are 2 and 4 (1.999998 was a part of
    1, and the odd node went to the heavier user: 1 and 5); of 8, 2 and 6 as before."""
    weights = {"mt-alice": 0.333333, "mt-bob": 0.666667}
    demand = {"mt-alice": 8, "mt-bob": 8}
    assert user_caps(demand, {}, 6, weights) == {"mt-alice": 2, "mt-bob": 4}
    assert user_caps(demand, {}, 8, weights) == {"mt-alice": 2, "mt-bob": 6}
    many = {f"u{i}": 1.0 / 3 for i in range(3000)}  # never more than the nodes given out
    assert sum(user_caps(dict.fromkeys(many, 9), {}, 1000, many).values()) == 1000


def test_entitlements_follow_the_account_tree():
    w = _alice_and_bob("carol")
    managed = [r for r in w.jobs if r.job_id in ("m1", "m9")]
    most = {"m1": 16, "m9": 8}
    flat = entitlements(managed, {}, 16, most)
    tree = entitlements(managed, {}, 16, most, None, {"m1": "a", "m9": "b"}, {"a": 3.0})
    assert flat == {"carol": 8, "mt-bob": 8} and tree == {"carol": 12, "mt-bob": 4}


def test_the_settings_name_each_problem(tmp_path):
    path = tmp_path / "malletrain.yaml"
    path.write_text("accounting:\n  share_weights_from: sshare\n  fair_share_floor: 0.2\n"
                    "  account_weights: {physics: 2}\n")
    acct = load_settings(path).accounting
    assert (acct.share_weights_from, acct.fair_share_floor, acct.account_weights) == (
        "sshare", 0.2, {"physics": 2})
    path.write_text("accounting:\n  share_weights_from: slurm\n  fair_share_floor: 0\n"
                    "  account_weights: {'a b': 1}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    for part in ("share_weights_from", "fair_share_floor", "'a b' is not an account name"):
        assert part in str(err.value)
