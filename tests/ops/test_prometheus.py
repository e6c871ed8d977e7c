"""A real Prometheus server scrapes malletrain's /metrics while the dev cluster changes.

Checked through Prometheus' HTTP API with PromQL: the target is up, malletrain_idle_nodes
equals the number of idle nodes Slurm reports (before and after a regular job takes and
releases nodes), the tick/decision histograms move, and every expression of the Grafana
dashboard and the alert rules is valid PromQL that Prometheus evaluates without error.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from malletrain.ops.metrics import Metrics, MetricsSnapshot, serve

pytestmark = [pytest.mark.prometheus, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]


def slurm_idle_nodes(cluster) -> int:
    return sum(1 for s in cluster.node_states().values() if s.rstrip("*~#!%$@^-") == "idle")


@pytest.fixture
def metrics_target(clean_cluster) -> Iterator[str]:
    """HOST:PORT of a /metrics endpoint fed from the live cluster once a second."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server = serve("127.0.0.1:0", registry)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            states = clean_cluster.node_states()
            idle = sum(1 for s in states.values() if s.rstrip("*~#!%$@^-") == "idle")
            metrics.observe_slurm_call("sinfo", time.monotonic() - t0)
            metrics.observe_decision(0.001)
            metrics.publish(MetricsSnapshot(
                time_s=time.time(), total_nodes=len(states), idle_nodes=idle,
                scavenged_nodes=0, predicted_idle_node_seconds=idle * 3600.0,
            ))
            metrics.observe_tick(time.monotonic() - t0)
            stop.wait(0.5)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.port}"
    stop.set()
    thread.join(10)
    server.stop()


def dashboard_and_alert_exprs() -> list[str]:
    dash = json.loads((ROOT / "configs" / "grafana-malletrain.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((ROOT / "configs" / "malletrain-alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return [e.replace("$instance", ".*").replace("$__rate_interval", "30s") for e in exprs]


def test_prometheus_scrapes_the_live_values(clean_cluster, metrics_target, prometheus_factory):
    started = time.monotonic()
    cluster = clean_cluster
    job = cluster.sbatch("-p", "batch", "-N", "3", "-t", "10", wrap="sleep 600")
    cluster.wait_until(lambda: cluster.job_state(job) == "RUNNING", what="the batch job to run")
    assert slurm_idle_nodes(cluster) == len(cluster.nodes) - 3

    prom = prometheus_factory(
        [metrics_target], rule_files=[ROOT / "configs" / "malletrain-alerts.yml"]
    )
    prom.wait_for('up{job="malletrain"}', lambda v: v == 1)
    prom.wait_for("malletrain_idle_nodes", lambda v: v == len(cluster.nodes) - 3)
    assert prom.value("malletrain_cluster_nodes") == len(cluster.nodes)

    # the regular job ends: the nodes are idle again, and Prometheus sees it
    cluster.run("scancel", str(job))
    cluster.wait_until(lambda: slurm_idle_nodes(cluster) == len(cluster.nodes),
                       what="all nodes idle")
    prom.wait_for("malletrain_idle_nodes", lambda v: v == len(cluster.nodes))

    # histograms and counters accumulate between scrapes
    prom.wait_for("increase(malletrain_tick_duration_seconds_count[1m])", lambda v: (v or 0) > 0)
    prom.wait_for("rate(malletrain_slurm_calls_total{call=\"sinfo\"}[1m])", lambda v: (v or 0) > 0)
    prom.wait_for("time() - malletrain_last_tick_timestamp_seconds",
                  lambda v: v is not None and v < 30)

    # every dashboard panel and alert rule is PromQL this Prometheus accepts
    for expr in dashboard_and_alert_exprs():
        prom.query(expr)  # raises on a parse or evaluation error
    # the alert rules loaded and evaluate cleanly against the real series
    groups = prom.api("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 7 and all(r["health"] != "err" for r in rules), rules
    firing = [r["name"] for r in rules if r["state"] == "firing"]
    assert not firing, firing

    assert time.monotonic() - started < 120
