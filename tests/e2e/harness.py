"""Drive a real ``malletrain daemon`` process against the dev cluster, the way an operator would.

The stack itself (daemon child process with its own config, users submitting with
``malletrain submit`` run AS mt-alice / mt-bob, ``malletrain jobs --json``) is
:mod:`malletrain.devstack`, shared with ``make demo`` and ``benchmarks/e2e.py``. Here: the
daemon on the session's dev cluster, and a polling helper. Nothing is faked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from malletrain.devstack import (
    EXAMPLE,
    LocalDaemon,
    check_python_reachable,
    run,
)

__all__ = ["EXAMPLE", "Daemon", "check_python_reachable", "grace_time_s", "serve",
           "wait_until"]


class Daemon(LocalDaemon):
    """The daemon under test: config, state and job output in ``base``."""

    def __init__(self, base: Path, slurm_conf: Path, env: dict[str, str], *,
                 tick_s: float = 1.0, extra_args: tuple[str, ...] = (),
                 policy: str = "malletrain") -> None:
        super().__init__(base, env, str(slurm_conf), policy=policy, tick_s=tick_s,
                         extra_args=extra_args)

    def with_accounting(self, **accounting: object) -> Daemon:
        """The config's ``accounting`` section set to ``accounting`` (before :meth:`start`):
        Slurm's limits read every 5 s unless the caller says otherwise."""
        config = yaml.safe_load(self.config.read_text())
        config["accounting"] = {"mode": "on", "refresh_s": 5, **accounting}
        self.config.write_text(yaml.safe_dump(config))
        return self

    def with_settings(self, section: str, **values: object) -> Daemon:
        """``values`` set in the config's ``section`` (before :meth:`start`), the rest kept."""
        config = yaml.safe_load(self.config.read_text())
        config[section] = {**(config.get(section) or {}), **values}
        self.config.write_text(yaml.safe_dump(config))
        return self


def serve(d: Daemon, cluster: Any) -> Iterator[Daemon]:
    """A daemon fixture's body: ``d`` started on the dev ``cluster`` (its test users able to
    reach this checkout), yielded, then stopped (killed with -9 if it will not stop: a test
    that kills it checks that the state survives), the cluster's jobs cancelled and the
    coordinator stopped."""
    check_python_reachable("mt-alice", cluster.env)
    d.start()
    yield d
    d.stop()
    if d.proc is not None and d.proc.poll() is None:
        d.kill9()
    cluster.scancel_all()
    d.stop_coordinator()


def wait_until(predicate: Callable[[], object], timeout_s: float, period_s: float = 0.5,
               what: str = "condition", on_timeout: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{extra}")
        time.sleep(period_s)


def grace_time_s(env: Mapping[str, str], partition: str = "scavenger") -> float:
    """The partition's ``GraceTime`` as slurmctld has it: how long a preempted slot may take
    to leave before Slurm kills it. A slot that leaves within it never makes a regular job
    wait for Slurm's kill (DESIGN.md's "node back to Slurm within GraceTime, every time");
    how far within it is a benchmark's figure (``benchmarks/e2e.py``), not a test's."""
    out = run(["scontrol", "-o", "show", "partition", partition], env).stdout
    m = re.search(r"\bGraceTime=(\d+)\b", out)
    assert m, f"no GraceTime in {out!r}"
    return float(m.group(1))
