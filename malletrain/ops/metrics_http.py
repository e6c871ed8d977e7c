"""The /metrics endpoint, and who is shown the per-job series.

Every local user can reach the endpoint (it listens on the login node), and the per-job
series name jobs (``job_id="m1"``), their sizes and rates. Where Slurm keeps jobs private
(``PrivateData=jobs``) that is more than ``squeue`` tells a user of another's jobs (issue
49), so the endpoint answers in two tiers:

* the cluster's series (idle and scavenged nodes, ticks, Slurm calls, jobs counted by
  state: nothing about any one job) to every scrape;
* the per-job series too where jobs are public in Slurm, or to a scrape that presents the
  operator's password with HTTP basic auth (``metrics.password_file``; Prometheus's
  ``basic_auth: {username: ..., password_file: ...}``; the user name is not checked). A
  wrong password gets 401 (a misconfigured Prometheus notices); no password at all gets
  the first tier only.

Basic auth over plain HTTP: the password crosses the network in clear where the address is
not loopback; bind ``metrics.address`` to loopback or a monitoring network (docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import (
    ThreadingWSGIServer,
    _get_best_family,
    _SilentHandler,
    make_wsgi_app,
)
from prometheus_client.registry import Collector, Metric

log = logging.getLogger(__name__)

#: the operator's password file: longer is refused (it is one line, not a document)
MAX_PASSWORD_BYTES = 1024


class MetricsServer:
    """A running /metrics endpoint; :meth:`stop` shuts it down and frees the port."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)


def read_password(path: Path) -> bytes:
    """The operator's metrics password: the file's one line. ValueError if it is a link,
    not a regular file, readable or writable by others (o bits), empty or too long."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if st.st_mode & 0o007:
            raise ValueError(f"{path}: mode {stat.S_IMODE(st.st_mode):o} lets every user "
                             "read or change it (chmod o-rwx)")
        data = f.read(MAX_PASSWORD_BYTES + 1)
    password = data.strip()
    if not password or len(data) > MAX_PASSWORD_BYTES or b"\n" in password:
        raise ValueError(f"{path}: expected one line of 1 to {MAX_PASSWORD_BYTES} bytes")
    return password


def _presented(environ: dict[str, Any]) -> bytes | None:
    """The password of a basic-auth header (None: none; b"": malformed)."""
    header = environ.get("HTTP_AUTHORIZATION")
    if not header:
        return None
    scheme, _, token = str(header).partition(" ")
    if scheme.lower() != "basic":
        return b""
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return b""
    return decoded.partition(b":")[2]


class _Both(Collector):
    """The cluster's series, then the per-job ones: what the operator is shown."""

    def __init__(self, *parts: CollectorRegistry) -> None:
        self._parts = parts

    def collect(self) -> Iterable[Metric]:
        def each() -> Iterator[Metric]:
            for part in self._parts:
                yield from part.collect()
        return list(each())


def _app(registry: CollectorRegistry, jobs: CollectorRegistry | None,
         jobs_public: Callable[[], bool], password: bytes | None) -> Callable[..., Any]:
    public = make_wsgi_app(registry)
    if jobs is None:
        return public
    both = CollectorRegistry()
    both.register(_Both(registry, jobs))
    full = make_wsgi_app(both)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        given = _presented(environ)
        if given is not None and (password is None or not hmac.compare_digest(given, password)):
            start_response("401 Unauthorized",
                           [("WWW-Authenticate", 'Basic realm="malletrain"'),
                            ("Content-Type", "text/plain")])
            return [b"wrong password\n"]
        return (full if given is not None or jobs_public() else public)(environ, start_response)
    return app


def serve(address: str, registry: CollectorRegistry, *, jobs: CollectorRegistry | None = None,
          jobs_public: Callable[[], bool] = lambda: False, password: bytes | None = None
          ) -> MetricsServer:
    """Serve ``registry`` on ``address`` ("HOST:PORT", "[v6]:PORT") in a daemon thread; and
    ``jobs`` (the per-job series) only while ``jobs_public()`` or to a scrape with
    ``password`` (module doc). Without ``jobs`` everything in ``registry`` is served.

    Raises OSError if the address cannot be bound (the daemon reports it and exits).
    """
    from malletrain.ops.settings_fields import parse_address

    host, port = parse_address(address)

    class Server(ThreadingWSGIServer):
        """Its own class: the address family is set on it per address (IPv4/IPv6)."""

    Server.address_family, host = _get_best_family(host, port)
    httpd = make_server(host, port, _app(registry, jobs, jobs_public, password), Server,
                        handler_class=_SilentHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    ms = MetricsServer(httpd, thread)
    log.info("serving metrics on %s", ms.url)
    return ms
