"""Metrics: snapshot collector, event API, naming conventions, the real HTTP endpoint."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from malletrain.ops.metrics import JobStatus, Metrics, MetricsSnapshot, serve


def snapshot(idle: int = 3, scavenged: int = 4, jobs: tuple[JobStatus, ...] = ()):
    return MetricsSnapshot(
        time_s=1_800_000_000.0, total_nodes=8, idle_nodes=idle, scavenged_nodes=scavenged,
        predicted_idle_node_seconds=1234.5, jobs=jobs,
    )


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def served():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server = serve("127.0.0.1:0", registry)
    yield metrics, server
    server.stop()


def test_gauges_come_from_the_latest_snapshot(served):
    metrics, server = served
    before = scrape(server.url)
    assert ("malletrain_idle_nodes", ()) not in before  # nothing observed yet: no value, not 0

    alice = JobStatus("m1", "alice", "running", nodes=4, samples_per_s=812.5,
                      samples_total=10_000, rescales_up=2, rescales_down=1)
    bob = JobStatus("m2", "bob", "queued", nodes=0)
    metrics.publish(snapshot(jobs=(alice, bob)))
    got = scrape(server.url)
    assert got[("malletrain_idle_nodes", ())] == 3
    assert got[("malletrain_scavenged_nodes", ())] == 4
    assert got[("malletrain_cluster_nodes", ())] == 8
    assert got[("malletrain_predicted_idle_node_seconds", ())] == 1234.5
    assert got[("malletrain_slurm_up", ())] == 1
    assert got[("malletrain_last_tick_timestamp_seconds", ())] == 1_800_000_000.0
    a = (("job_id", "m1"), ("user", "alice"))
    assert got[("malletrain_job_nodes", a)] == 4
    assert got[("malletrain_job_samples_per_second", a)] == 812.5
    assert got[("malletrain_job_samples_total", a)] == 10_000
    assert got[("malletrain_job_rescales_total", (("direction", "up"), *a))] == 2
    assert got[("malletrain_job_rescales_total", (("direction", "down"), *a))] == 1
    assert got[("malletrain_jobs", (("state", "queued"),))] == 1
    assert got[("malletrain_jobs", (("state", "running"),))] == 1

    # a job that left is gone from the next scrape: no stale series
    metrics.publish(snapshot(idle=5, scavenged=0, jobs=(bob,)))
    got = scrape(server.url)
    assert got[("malletrain_idle_nodes", ())] == 5
    assert not [k for k in got if ("job_id", "m1") in k[1]]


def test_event_api_counts_and_histograms(served):
    metrics, server = served
    for s in (0.002, 0.003, 0.2):
        metrics.observe_decision(s)
    metrics.observe_tick(0.04)
    laps = metrics.tick_phases()
    laps.lap("slurm")
    time.sleep(0.02)
    laps.lap("decide")
    metrics.observe_yield(0.3)
    metrics.observe_yield(7.0)
    metrics.count_preemption()
    metrics.count_preemption(2)
    metrics.observe_slurm_call("squeue", 0.01)
    metrics.observe_slurm_call("squeue", 10.0, ok=False)
    metrics.observe_slurm_call("sbatch", 0.05, ok=False)
    metrics.count_reload(ok=False)
    metrics.observe_request("attach", 0.03)
    metrics.observe_request("steal", 0.001)  # not a request kind: no series of its own
    metrics.observe_request(7, 0.001)
    got = scrape(server.url)
    assert got[("malletrain_decision_duration_seconds_count", ())] == 3
    assert got[("malletrain_decision_duration_seconds_bucket", (("le", "0.005"),))] == 2
    assert got[("malletrain_decision_duration_seconds_sum", ())] == pytest.approx(0.205)
    assert got[("malletrain_tick_duration_seconds_count", ())] == 1
    assert got[("malletrain_tick_phase_seconds_count", (("phase", "slurm"),))] == 1
    assert got[("malletrain_tick_phase_seconds_sum", (("phase", "decide"),))] >= 0.02
    assert got[("malletrain_yield_latency_seconds_bucket", (("le", "0.5"),))] == 1
    assert got[("malletrain_yield_latency_seconds_bucket", (("le", "10.0"),))] == 2
    assert got[("malletrain_preemptions_total", ())] == 3
    assert got[("malletrain_slurm_calls_total", (("call", "squeue"),))] == 2
    assert got[("malletrain_slurm_call_errors_total", (("call", "squeue"),))] == 1
    assert got[("malletrain_slurm_call_errors_total", (("call", "sbatch"),))] == 1
    assert got[("malletrain_config_reloads_total", (("result", "rejected"),))] == 1
    assert got[("malletrain_config_reloads_total", (("result", "ok"),))] == 0
    attach_le_50ms = (("le", "0.05"), ("op", "attach"))
    assert got[("malletrain_request_duration_seconds_bucket", attach_le_50ms)] == 1
    assert got[("malletrain_request_duration_seconds_count", (("op", "other"),))] == 2
    assert not any(k[1] == (("op", "steal"),) for k in got)


def test_names_follow_prometheus_conventions():
    names = Metrics(CollectorRegistry()).sample_names()
    assert names and all(n.startswith("malletrain_") for n in names)
    for n in names:
        assert "job_id" not in n
        if n.endswith(("_bucket", "_sum", "_count")):
            assert "_seconds_" in n, n  # every histogram measures time, in base units
    assert "malletrain_preemptions_total" in names
    assert "malletrain_yield_latency_seconds_bucket" in names


def test_registry_is_never_the_global_default():
    Metrics(CollectorRegistry())
    Metrics(CollectorRegistry())  # two instances do not clash
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("malletrain_")]


def test_scrape_never_mixes_two_snapshots(served):
    """idle + scavenged is constant in every snapshot; a scrape must see one of them whole."""
    metrics, server = served
    stop = threading.Event()

    def publisher():
        i = 0
        while not stop.is_set():
            metrics.publish(snapshot(idle=i % 9, scavenged=8 - i % 9))
            i += 1

    metrics.publish(snapshot(idle=0, scavenged=8))
    t = threading.Thread(target=publisher)
    t.start()
    try:
        for _ in range(10):
            got = scrape(server.url)
            total = got[("malletrain_idle_nodes", ())] + got[("malletrain_scavenged_nodes", ())]
            assert total == 8
    finally:
        stop.set()
        t.join()


def test_stop_frees_the_port():
    registry = CollectorRegistry()
    Metrics(registry)
    server = serve("127.0.0.1:0", registry)
    port = server.port
    scrape(server.url)
    server.stop()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # would raise EADDRINUSE if still served
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)


def test_serve_rejects_a_bad_address_and_a_taken_port():
    registry = CollectorRegistry()
    with pytest.raises(ValueError):
        serve("no-port", registry)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError):
            serve(f"127.0.0.1:{s.getsockname()[1]}", registry)


def test_serves_on_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.fail("this machine has no IPv6 support")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.publish(snapshot())
    server = serve("[::1]:0", registry)
    try:
        assert server.url.startswith("http://[::1]:")
        assert scrape(server.url)[("malletrain_idle_nodes", ())] == 3
    finally:
        server.stop()


job_ids = st.text(min_size=1, max_size=12)
jobs_strategy = st.lists(
    st.builds(
        JobStatus,
        job_id=job_ids,
        user=st.text(max_size=8),
        state=st.sampled_from(["queued", "running", "evicted", "stalled"]),
        nodes=st.integers(0, 5000),
        samples_per_s=st.floats(0, 1e9, allow_nan=False),
        samples_total=st.integers(0, 2**53),
        rescales_up=st.integers(0, 10**6),
        rescales_down=st.integers(0, 10**6),
    ),
    max_size=6,
    unique_by=lambda j: j.job_id,
)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_strategy, idle=st.integers(0, 10**6))
def test_any_snapshot_renders_parseable_exposition(jobs, idle):
    """Odd label values (quotes, newlines, unicode) are escaped; every value comes back."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.publish(snapshot(idle=idle, jobs=tuple(jobs)))
    text = generate_latest(registry).decode()
    got = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert got[("malletrain_idle_nodes", ())] == idle
    for j in jobs:
        key = (("job_id", j.job_id), ("user", j.user))
        assert got[("malletrain_job_nodes", key)] == j.nodes
        assert got[("malletrain_job_samples_total", key)] == float(j.samples_total)
        assert got[("malletrain_job_samples_per_second", key)] == pytest.approx(j.samples_per_s)
    assert sum(v for (n, _), v in got.items() if n == "malletrain_jobs") == len(jobs)


def test_slurm_call_context_manager_times_and_counts_errors():
    metrics = Metrics(CollectorRegistry())
    with metrics.slurm_call("observe"):
        pass
    with pytest.raises(RuntimeError), metrics.slurm_call("observe"):
        raise RuntimeError("slurmctld down")
    assert metrics.slurm_calls.labels(call="observe")._value.get() == 2
    assert metrics.slurm_call_errors.labels(call="observe")._value.get() == 1


def _get(url: str, password: str | None = None) -> tuple[int, str]:
    import base64
    import urllib.error

    req = urllib.request.Request(url)
    if password is not None:
        token = base64.b64encode(f"prometheus:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_per_job_series_only_where_jobs_are_public_or_to_the_operators_password():
    """Issue 49: with PrivateData=jobs every local user read other users' job ids here."""
    registry, jobs = CollectorRegistry(), CollectorRegistry()
    metrics = Metrics(registry, jobs)
    metrics.publish(snapshot(jobs=(JobStatus("m1", "", "running", 2),)))
    public = [False]
    server = serve("127.0.0.1:0", registry, jobs=jobs, jobs_public=lambda: public[0],
                   password=b"s3cret")
    try:
        status, text = _get(server.url)
        assert status == 200 and "malletrain_idle_nodes 3.0" in text
        assert "job_id" not in text and 'malletrain_jobs{state="running"} 1.0' in text
        assert _get(server.url, "guess")[0] == 401
        status, text = _get(server.url, "s3cret")
        assert status == 200 and 'malletrain_job_nodes{job_id="m1",user=""} 2.0' in text
        public[0] = True  # Slurm shows every job to every user: so do we
        assert 'job_id="m1"' in _get(server.url)[1]
    finally:
        server.stop()


def test_the_password_file_must_be_private_and_one_line(tmp_path):
    from malletrain.ops.metrics_http import read_password

    f = tmp_path / "pw"
    f.write_text("  s3cret \n")
    f.chmod(0o640)
    assert read_password(f) == b"s3cret"
    for mode, text in ((0o644, "s3cret\n"), (0o600, "\n"), (0o600, "two\nlines\n")):
        f.write_text(text)
        f.chmod(mode)
        with pytest.raises(ValueError):
            read_password(f)
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(OSError):
        read_password(tmp_path / "link")
