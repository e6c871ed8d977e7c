"""Fixtures shared by the end-to-end daemon tests."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from .harness import Daemon, serve


@pytest.fixture
def workdir():
    """A directory the test users can read (daemon state, job output); kept on request."""
    base = Path(tempfile.mkdtemp(prefix="malletrain-e2e-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    if not os.environ.get("MALLETRAIN_TEST_KEEP_DEVCLUSTER"):
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon(clean_cluster, workdir):
    """The daemon with its default policy, the learned `malletrain` (curves, costs and hole
    lengths learned online): a test that kills it with -9 checks that this survives."""
    yield from serve(Daemon(workdir, clean_cluster.conf_path, clean_cluster.env), clean_cluster)
