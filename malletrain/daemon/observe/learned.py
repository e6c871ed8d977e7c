"""What the daemon learns survives it: the advisor's profiles and the policy's state.

Each kind's profile and the policy's state are small JSON documents, saved to the store
whenever they change (compared each tick, which is cheap), so that a ``kill -9`` loses no
measurement: with a 30 s save interval a restarted daemon had forgotten the 2-node rate it
had just measured and re-learned it from a one-second, stalled stint (docs/daemon.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from malletrain.core.model import Policy
from malletrain.core.profiling.profiler import ProfilingAdvisor
from malletrain.daemon.jobs.store import Store

log = logging.getLogger(__name__)


class LearnedState:
    def __init__(self, store: Store) -> None:
        self.store = store
        #: the JSON last written per ("profile", kind) / ("policy", name): save only changes
        self._saved: dict[tuple[str, str], str] = {}

    def restore_profiles(self, advisor: ProfilingAdvisor) -> None:
        for kind, data in self.store.profiles().items():
            try:
                advisor.load_profile(kind, data)
            except ValueError as exc:
                log.warning("stored profile %r ignored: %s", kind, exc)

    def restore_policy(self, policy: Policy) -> None:
        """Give the policy what it learned before (a restart or a reload rebuilds it)."""
        load = getattr(policy, "load_state", None)
        if load is None:
            return
        data = self.store.policy_state(policy.name)
        if data is None:
            return
        try:
            load(data)
            log.info("policy %s: learned state restored from the store", policy.name)
        except ValueError as exc:
            log.warning("stored state of policy %s ignored: %s", policy.name, exc)

    def save_policy(self, policy: Policy) -> None:
        dump = getattr(policy, "state_dict", None)
        if dump is not None:
            self._save(("policy", policy.name), dump(), self.store.save_policy_state)

    def save_profiles(self, advisor: ProfilingAdvisor, kinds: Iterable[str]) -> None:
        for kind in kinds:
            data = advisor.profile_dict(kind)
            if data is not None:
                self._save(("profile", kind), data, self.store.save_profile)

    def _save(self, key: tuple[str, str], data: Any, write: Callable[[str, Any], None]
              ) -> None:
        text = json.dumps(data, sort_keys=True)
        if self._saved.get(key) != text:
            write(key[1], data)
            self._saved[key] = text
