"""Where a worker process belongs and the timeouts it uses, from its environment.

The environment contract (set by the slot launcher, :mod:`malletrain.daemon.jobs.slots`) is
described in :mod:`malletrain.elastic.coordinator.handle`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from malletrain.elastic.protocol import keys as p
from malletrain.elastic.protocol import wire
from malletrain.errors import ConfigError, PermanentError


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port), with a one-line error for a bad value."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise PermanentError(f"invalid coordinator address {address!r}: expected host:port")
    return host, int(port_text)


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r}: not a number") from None
    if value <= 0:
        raise ConfigError(f"environment variable {name}={raw!r}: must be > 0")
    return value


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise ConfigError(f"environment variable {name}={raw!r}: not a non-negative integer")
    return int(raw)


@dataclass(frozen=True)
class ElasticConfig:
    """Where this process belongs and the timeouts it uses (env contract: coordinator.py)."""

    coordinator: str
    job_id: str
    member_id: str
    #: the job's secret (MALLETRAIN_JOB_SECRET): proves the job to the coordinator, keys the
    #: snapshot MAC. Never printed.
    secret: bytes = field(default=b"", repr=False)
    state_dir: Path | None = None
    local_rank: int = 0
    local_world_size: int = 1
    #: "auto": nccl for a CUDA device, gloo otherwise (MALLETRAIN_BACKEND overrides)
    backend: str = "auto"
    step_timeout_s: float = 10.0
    sync_timeout_s: float = 120.0
    join_timeout_s: float = 30.0
    heal_wait_s: float = 2.0
    report_interval_s: float = 1.0
    poll_interval_s: float = 0.05
    #: after SIGTERM, the process is forced out (os._exit) after this long, whatever it does.
    sigterm_deadline_s: float = 4.0
    #: while one node holds every replica, a snapshot at least this often (and at most 2 %
    #: of the time: :data:`~.statesync.GUARD_COST_RATIO`), so that node's loss costs the
    #: progress since then, not the job (needs ``state_dir``)
    guard_snapshot_s: float = 60.0
    #: abort the group when a step or boundary check overruns ``step_timeout_s``: needed for
    #: NCCL (no host-side timeout); gloo bounds its collectives itself (MALLETRAIN_ABORT_HUNG
    #: =1 turns it on for gloo too, which the CPU tests of the abort path use)
    abort_hung: bool | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ElasticConfig:
        env = os.environ if env is None else env
        missing = [
            k
            for k in ("MALLETRAIN_COORDINATOR", "MALLETRAIN_JOB_ID", "MALLETRAIN_MEMBER_ID",
                      "MALLETRAIN_JOB_SECRET")
            if not env.get(k)
        ]
        if missing:
            raise ConfigError(
                f"missing environment variable(s) {', '.join(missing)}: an elastic worker is "
                "started by the malletrain daemon, or by hand next to `malletrain coordinator`"
            )
        parse_address(env["MALLETRAIN_COORDINATOR"])  # host:port, or a one-line error
        p.check_id("job id", env["MALLETRAIN_JOB_ID"])
        p.check_id("member id", env["MALLETRAIN_MEMBER_ID"])
        try:
            secret = wire.parse_secret(env["MALLETRAIN_JOB_SECRET"])
        except ValueError as exc:
            raise ConfigError(f"environment variable MALLETRAIN_JOB_SECRET: {exc}") from None
        state_dir = env.get("MALLETRAIN_STATE_DIR") or None
        cfg = cls(
            coordinator=env["MALLETRAIN_COORDINATOR"],
            job_id=env["MALLETRAIN_JOB_ID"],
            member_id=env["MALLETRAIN_MEMBER_ID"],
            secret=secret,
            state_dir=Path(state_dir) if state_dir else None,
            local_rank=_env_int(env, "LOCAL_RANK", 0),
            local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", 1) or 1,
            step_timeout_s=_env_float(env, "MALLETRAIN_STEP_TIMEOUT_S", cls.step_timeout_s),
            sync_timeout_s=_env_float(env, "MALLETRAIN_SYNC_TIMEOUT_S", cls.sync_timeout_s),
            join_timeout_s=_env_float(env, "MALLETRAIN_JOIN_TIMEOUT_S", cls.join_timeout_s),
            heal_wait_s=_env_float(env, "MALLETRAIN_HEAL_WAIT_S", cls.heal_wait_s),
            backend=env.get("MALLETRAIN_BACKEND") or cls.backend,
            sigterm_deadline_s=_env_float(
                env, "MALLETRAIN_SIGTERM_DEADLINE_S", cls.sigterm_deadline_s
            ),
            guard_snapshot_s=_env_float(env, "MALLETRAIN_GUARD_SNAPSHOT_S",
                                        cls.guard_snapshot_s),
            abort_hung=(env["MALLETRAIN_ABORT_HUNG"] == "1"
                        if env.get("MALLETRAIN_ABORT_HUNG") else None),
        )
        return replace(cfg, **overrides)
