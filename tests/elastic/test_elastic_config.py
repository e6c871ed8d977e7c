"""The worker's environment contract: clear one-line errors, parsed knobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from elastic_harness import EXAMPLE, REPO

from malletrain.elastic.protocol.config import ElasticConfig
from malletrain.elastic.worker.faults import is_peer_failure
from malletrain.errors import ConfigError, PermanentError

pytestmark = pytest.mark.torch

BASE = {"MALLETRAIN_COORDINATOR": "h:1", "MALLETRAIN_JOB_ID": "j", "MALLETRAIN_MEMBER_ID": "m",
        "MALLETRAIN_JOB_SECRET": "0f" * 32}


def test_from_env_reads_the_contract():
    cfg = ElasticConfig.from_env({**BASE, "MALLETRAIN_STATE_DIR": "/s", "LOCAL_RANK": "1",
                                  "LOCAL_WORLD_SIZE": "4", "MALLETRAIN_STEP_TIMEOUT_S": "2.5",
                                  "MALLETRAIN_BACKEND": "gloo"})
    assert (cfg.coordinator, cfg.job_id, cfg.member_id) == ("h:1", "j", "m")
    assert cfg.state_dir == Path("/s") and (cfg.local_rank, cfg.local_world_size) == (1, 4)
    assert cfg.step_timeout_s == 2.5 and cfg.backend == "gloo"
    assert ElasticConfig.from_env(BASE).state_dir is None
    assert cfg.secret == bytes.fromhex("0f" * 32) and "0f0f" not in repr(cfg)  # never printed


@pytest.mark.parametrize(
    "env, match",
    [
        ({"MALLETRAIN_JOB_ID": "j"},
         "MALLETRAIN_COORDINATOR, MALLETRAIN_MEMBER_ID, MALLETRAIN_JOB_SECRET"),
        ({**BASE, "MALLETRAIN_JOB_SECRET": "abc"}, "MALLETRAIN_JOB_SECRET: a secret is 64 hex"),
        ({**BASE, "MALLETRAIN_JOB_SECRET": "zz" * 32}, "MALLETRAIN_JOB_SECRET: a secret is hex"),
        ({**BASE, "MALLETRAIN_STEP_TIMEOUT_S": "soon"}, "MALLETRAIN_STEP_TIMEOUT_S='soon'"),
        ({**BASE, "MALLETRAIN_HEAL_WAIT_S": "-1"}, "must be > 0"),
        ({**BASE, "LOCAL_RANK": "x"}, "LOCAL_RANK"),
        ({**BASE, "MALLETRAIN_COORDINATOR": "nohost"}, "invalid coordinator address"),
    ],
)
def test_from_env_errors_name_the_variable(env, match):
    with pytest.raises(PermanentError, match=match):
        ElasticConfig.from_env(env)


def test_bad_ids_are_rejected():
    with pytest.raises(PermanentError, match="member id"):
        ElasticConfig.from_env({**BASE, "MALLETRAIN_MEMBER_ID": "a/b"})


def test_peer_failures_are_told_from_user_errors():
    assert is_peer_failure(RuntimeError("[gloo] Connection reset by peer"))
    assert is_peer_failure(RuntimeError("Timed out waiting 2000ms for recv operation"))
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(ValueError("bad"))


def test_example_without_the_env_prints_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLETRAIN_")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == ConfigError.exit_code
    assert "MALLETRAIN_COORDINATOR" in out.stderr and "Traceback" not in out.stderr
