"""A real Prometheus server (Debian's /usr/bin/prometheus) for the ops tests.

``prometheus_factory(targets, rule_files=())`` starts one on loopback with a temporary config
and data directory, a 1 s scrape and evaluation interval, waits until it is ready and returns a
handle with ``query(promql)`` (the HTTP API, /api/v1/query) and ``wait_for(...)``. Every server
is terminated (then killed, if it lingers) when the test ends.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; a list of {"metric": labels, "value": float}."""
        data = self.api("/api/v1/query", query=promql)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def value(self, promql: str) -> float | None:
        """The single value of a query, None when it returns nothing."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return result[0]["value"] if result else None

    def wait_for(
        self, promql: str, predicate: Callable[[float | None], bool], timeout_s: float = 30,
    ) -> float | None:
        deadline = time.monotonic() + timeout_s
        last: float | None = None
        while time.monotonic() < deadline:
            last = self.value(promql)
            if predicate(last):
                return last
            time.sleep(0.25)
        raise AssertionError(f"{promql}: last value {last} after {timeout_s} s\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    started: list[Prometheus] = []

    def start(targets: Sequence[str], rule_files: Sequence[Path] = (),
              basic_auth: dict[str, str] | None = None) -> Prometheus:
        n = len(started)
        scrape: dict[str, object] = {"job_name": "malletrain",
                                     "static_configs": [{"targets": list(targets)}]}
        if basic_auth is not None:  # {username, password_file}: the operator's scrape
            scrape["basic_auth"] = dict(basic_auth)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [scrape],
        }
        config_path = tmp_path / f"prometheus-{n}.yml"
        config_path.write_text(yaml.safe_dump(config))
        port = free_port()
        log_path = tmp_path / f"prometheus-{n}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config_path}",
                 f"--storage.tsdb.path={tmp_path / f'prometheus-data-{n}'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        server = Prometheus(f"http://127.0.0.1:{port}", proc, log_path)
        started.append(server)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {proc.returncode}:\n"
                                     f"{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return server
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready after 30 s:\n{server.log_tail()}")
            time.sleep(0.1)

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.terminate()
            try:
                server.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=15)
