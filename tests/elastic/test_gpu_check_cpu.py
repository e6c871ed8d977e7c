"""benchmarks/gpu_check.py stays runnable: its CPU dry run (the GPU-only scenario left out)
passes here, so the script a GPU machine runs is the one CI exercises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from elastic_harness import REPO

pytestmark = pytest.mark.torch


def test_gpu_check_dry_run_on_cpu():
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--cpu", "--runs", "1",
         "--scenario", "sigterm-hang", "--scenario", "evict-restore"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
        timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == (
        "gpu_check device=cpu scenarios=2 runs=1 passed=2 failed=0")
