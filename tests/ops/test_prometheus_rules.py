"""The suggested alerts and the example scrape config, checked by Prometheus' own promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_alert_rules_are_valid():
    res = promtool("check", "rules", "malletrain-alerts.yml", cwd=ROOT / "configs")
    assert res.returncode == 0, res.stdout + res.stderr


def test_alert_rules_fire_as_documented():
    """promtool unit tests: synthetic series in, exact alerts (labels, annotations) out."""
    res = promtool("test", "rules", "malletrain-alerts.test.yml", cwd=Path(__file__).parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_example_scrape_config_is_valid():
    res = promtool("check", "config", "prometheus-malletrain.yml", cwd=ROOT / "configs")
    assert res.returncode == 0, res.stdout + res.stderr
