"""The attacks of issue 15, each run as a second real Unix user of the dev cluster."""

import sys
from pathlib import Path

# the elastic harness (a coordinator process, real workers) is shared with tests/elastic
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "elastic"))
