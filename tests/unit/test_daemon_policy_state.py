"""The daemon keeps what its policy learned (hole lengths) across a restart and a reload.

Real SQLite store, real Daemon object; no tick runs, so Slurm is never called.
"""

from __future__ import annotations

from dataclasses import replace

from malletrain.core.allocation.allocator import MalleTrainPolicy
from malletrain.core.model import AllocationInput, IdleNode
from malletrain.daemon.jobs.store import Store
from malletrain.daemon.service.daemon import Daemon
from malletrain.ops.settings import AllocatorSettings, Settings, StateSettings
from malletrain.slurm.backend import CliBackend


def _settings(tmp_path, horizon_s: float = 1800.0) -> Settings:
    return Settings(
        allocator=AllocatorSettings(policy="malletrain", horizon_s=horizon_s),
        state=StateSettings(database_path=tmp_path / "state.db",
                            snapshot_dir=tmp_path / "snapshots"),
    )


def _teach(policy: MalleTrainPolicy) -> None:
    nodes = (IdleNode("n0", None, 10.0), IdleNode("n1", None, 500.0))
    policy.decide(AllocationInput(0.0, nodes, ()))
    policy.decide(AllocationInput(60.0, nodes[1:], ()))  # n0's hole ended after 70 s


def test_store_round_trips_policy_state(tmp_path):
    store = Store(tmp_path / "s.db")
    assert store.policy_state("malletrain") is None
    store.save_policy_state("malletrain", {"holes": {"events": [1.0]}})
    store.save_policy_state("malletrain", {"holes": {"events": [2.0]}})
    store.close()
    again = Store(tmp_path / "s.db")
    assert again.policy_state("malletrain") == {"holes": {"events": [2.0]}}
    again.close()


def test_learned_hole_lengths_survive_restart_and_reload(tmp_path):
    settings = _settings(tmp_path)
    d = Daemon(settings, CliBackend(), coordinator=object())
    assert isinstance(d.policy, MalleTrainPolicy)
    _teach(d.policy)
    assert d.policy.holes.model.observed == 1.0
    # a reload that rebuilds the policy (another horizon) keeps what it learned
    d.apply_settings(replace(settings, allocator=replace(settings.allocator, horizon_s=900.0)))
    assert isinstance(d.policy, MalleTrainPolicy) and d.policy.horizon_s == 900.0
    assert d.policy.holes.model.observed == 1.0
    d.close()
    # a restart (new process) restores it from the store
    d2 = Daemon(settings, CliBackend(), coordinator=object())
    assert isinstance(d2.policy, MalleTrainPolicy)
    assert d2.policy.holes.model.observed == 1.0
    d2.close()


def test_corrupt_stored_state_is_ignored_not_fatal(tmp_path):
    settings = _settings(tmp_path)
    store = Store(settings.state.database_path)
    store.save_policy_state("malletrain", {"holes": {"n_bins": "x"}})
    store.close()
    d = Daemon(settings, CliBackend(), coordinator=object())
    assert isinstance(d.policy, MalleTrainPolicy) and d.policy.holes.model.observed == 0.0
    d.close()


def test_daemon_policy_has_live_margins_and_keeps_them_across_restore(tmp_path):
    settings = _settings(tmp_path)
    d = Daemon(settings, CliBackend(), coordinator=object())
    assert isinstance(d.policy, MalleTrainPolicy)
    assert d.policy.keep_margin == 0.1 and d.policy.holes.model.prior_floor == 0.1
    _teach(d.policy)
    d.close()
    d2 = Daemon(settings, CliBackend(), coordinator=object())
    assert isinstance(d2.policy, MalleTrainPolicy)
    assert d2.policy.holes.model.prior_floor == 0.1  # a setting, not overwritten by the store
    d2.close()
