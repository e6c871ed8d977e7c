"""Fixtures shared by the end-to-end daemon tests."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def workdir():
    """A directory the test users can read (daemon state, job output); kept on request."""
    base = Path(tempfile.mkdtemp(prefix="malletrain-e2e-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    if not os.environ.get("MALLETRAIN_TEST_KEEP_DEVCLUSTER"):
        shutil.rmtree(base, ignore_errors=True)
