"""The Grafana dashboard and the suggested alerts use only metrics the code defines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from malletrain.ops.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana-malletrain.json"
ALERTS = ROOT / "configs" / "malletrain-alerts.yml"
NAME = re.compile(r"\bmalletrain_[a-z0-9_]+")


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def alert_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_dashboard_and_alerts_reference_only_defined_metrics():
    defined = Metrics(CollectorRegistry()).sample_names()
    used: dict[str, str] = {}
    for expr in dashboard_exprs() + alert_exprs():
        for name in NAME.findall(expr):
            used.setdefault(name, expr)
    unknown = {n: e for n, e in used.items() if n not in defined}
    assert not unknown, unknown
    # and the dashboard shows what the operator guide promises
    for wanted in ("malletrain_idle_nodes", "malletrain_scavenged_nodes", "malletrain_job_nodes",
                   "malletrain_yield_latency_seconds_bucket",
                   "malletrain_decision_duration_seconds_bucket"):
        assert wanted in used, wanted


def test_dashboard_is_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "malletrain" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        xs, ys = range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])
        mine = {(x, y) for x in xs for y in ys}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
            assert p.get("description"), p["title"]
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
