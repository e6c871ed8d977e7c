"""The attacks of issue 15, each run as a second real Unix user of the dev cluster."""

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from malletrain.devstack import LocalDaemon, check_python_reachable

# the elastic harness (a coordinator process, real workers) is shared with tests/elastic
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "elastic"))


@pytest.fixture
def daemon(clean_cluster) -> Iterator[LocalDaemon]:
    """A real daemon and coordinator on the dev cluster, in a directory mt-bob can reach;
    stopped, the cluster's jobs cancelled and the directory removed after the test
    (kept with ``MALLETRAIN_TEST_KEEP_DEVCLUSTER``)."""
    check_python_reachable("mt-bob", clean_cluster.env)
    work = Path(tempfile.mkdtemp(prefix="malletrain-sec-", dir="/tmp"))
    work.chmod(0o755)
    d = LocalDaemon(work, clean_cluster.env, str(clean_cluster.conf_path))
    d.start()
    yield d
    d.stop()
    d.stop_coordinator()
    clean_cluster.scancel_all()
    if not os.environ.get("MALLETRAIN_TEST_KEEP_DEVCLUSTER"):
        shutil.rmtree(work, ignore_errors=True)

