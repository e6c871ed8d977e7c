"""The ``accounting:`` section of the settings: Slurm's limits on users and accounts.

Kept apart from :mod:`malletrain.ops.settings` (which holds the tree) so that each module
stays readable; the fields follow the same metadata rules (:func:`.settings_fields.meta`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from malletrain.ops.settings_fields import meta

AccountingMode = Literal["auto", "on", "off"]
ShareWeightsFrom = Literal["config", "sshare"]
_USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
MAX_SHARE_WEIGHT = 1000.0


def check_share_weights(value: Mapping[str, float], what: str = "user") -> str | None:
    for user, weight in value.items():
        if not _USER_RE.match(user):
            return f"{user!r} is not {'an' if what == 'account' else 'a'} {what} name"
        if not 0 < weight <= MAX_SHARE_WEIGHT:
            return f"{user}: a weight is above 0 and at most {MAX_SHARE_WEIGHT:g}, got {weight:g}"
    return None


def check_account_weights(value: Mapping[str, float]) -> str | None:
    return check_share_weights(value, "account")


def check_cluster(value: str) -> str | None:
    if value and not _USER_RE.match(value):
        return f"{value!r} is not a Slurm cluster name"
    return None


@dataclass(frozen=True)
class AccountingSettings:
    """Slurm's per-user, per-account and QOS limits, held in every decision."""

    mode: AccountingMode = field(default="auto", metadata=meta(
        "Read the limits of Slurm's associations and QOS (sacctmgr show assoc / qos / "
        "user): auto = where the site runs slurmdbd (a cluster without it says so and is "
        "read no more), on = always (a failed read is logged and the last good limits "
        "kept), off = never (only user_max_nodes below)."))
    refresh_s: float = field(default=60.0, metadata=meta(
        "Seconds between two reads of the limits: they change when an administrator runs "
        "sacctmgr, not every tick.",
        min=5, max=86_400))
    cluster: str = field(default="", metadata=meta(
        "The cluster whose associations hold (Slurm's ClusterName); empty: the only one "
        "slurmdbd knows (several: an error that asks for this).",
        check=check_cluster))
    user_max_nodes: int | None = field(default=None, metadata=meta(
        "Scavenged nodes one user's malleable jobs may hold together, for sites without "
        "accounting (with accounting, held beside Slurm's limits); null = none.",
        min=1, max=1_000_000))
    share_weights: Mapping[str, float] = field(default_factory=dict, metadata=meta(
        "Weights of users' shares of the idle nodes (user: weight; a user not named: 1). "
        "A user of weight 2 is entitled to twice the nodes of a user of weight 1 while "
        "both can use them.",
        check=check_share_weights))
    share_weights_from: ShareWeightsFrom = field(default="config", metadata=meta(
        "Where users' share weights come from: config = share_weights above (equal where "
        "empty); sshare = Slurm's fair-share factor of each user (sshare, read with the "
        "limits; its past usage decays as PriorityDecayHalfLife says), never below "
        "fair_share_floor, times the user's share_weights entry (1 where not named). Needs "
        "accounting (mode auto or on) and priority/multifactor; without them, equal."))
    fair_share_floor: float = field(default=0.05, metadata=meta(
        "With share_weights_from sshare: the least weight a user gets (a factor near 0 "
        "still gets a part of the idle nodes: nobody starves); a user sshare does not "
        "list weighs this much.",
        min=0.001, max=1.0))
    fair_turn_s: float = field(default=600.0, metadata=meta(
        "When fewer idle nodes are left than users holding none, they go to those users in "
        "turns of this many seconds (each user waits a bounded number of turns, and nothing "
        "moves within one); 0 = to the users holding most, no turns.",
        min=0, max=86_400))
    fair_share_min_gain: float = field(default=0.6, metadata=meta(
        "A user's part counts each of its jobs' nodes up to where one more node adds less "
        "than this times the job's rate per node at its minimum; the other users' parts come "
        "first, and what is left once every part is met goes where a node adds the most. "
        "0 = a user's whole part is its jobs' to use, however little a node adds.",
        min=0.0, max=1.0))
    fair_share_slack_nodes: int = field(default=2, metadata=meta(
        "A user that Slurm took nodes from waits up to fair_turn_s for nodes other users "
        "hold above their parts while it is within this many nodes of its own part (parts "
        "that follow the idle pool node by node cost a shrink and a grow at each change); "
        "every other user gets its whole part at the next decision. 0 = no waiting.",
        min=0, max=1_000_000))
    account_weights: Mapping[str, float] = field(default_factory=dict, metadata=meta(
        "Weights of accounts' shares (account: weight; an account not named: 1). Where set, "
        "the idle nodes are divided among accounts first, then among each account's users "
        "(Slurm's account tree, level by level, as sacctmgr gives it); empty: among users only.",
        check=check_account_weights))

    def division(self) -> dict[str, float]:
        """The allocator's knobs of the division among users (PolicyOptions' fields)."""
        return {"fair_turn_s": self.fair_turn_s, "fair_share_min_gain": self.fair_share_min_gain,
                "fair_share_slack_nodes": self.fair_share_slack_nodes}
