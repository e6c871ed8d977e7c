"""The golden corpus: 34 real public multi-node training batch scripts, unchanged, through
``malletrain submit --test-only --json`` (offline: no daemon, no Slurm).

Each script's expected nodes, time, GPUs, workers per node and launcher were read from its
``#SBATCH`` lines and launch line (``tests/data/sbatch/README.md`` names the sources and
licences). The issue's bar: at least 90 % accepted, and every refusal a ``FILE:LINE:``
message.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from malletrain import cli

CORPUS = Path(__file__).resolve().parents[1] / "data" / "sbatch"
ROWS = json.loads((CORPUS / "corpus.json").read_text())


def _test_only(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    rc = cli.main(["submit", "--test-only", "--json", str(path)])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


@pytest.mark.parametrize("row", ROWS, ids=[r["file"] for r in ROWS])
def test_each_real_script_reads_as_expected(row, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MALLETRAIN_SOCKET", str(tmp_path / "no-daemon.sock"))
    path = CORPUS / row["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == row["sha256"], "changed"
    rc, got, err = _test_only(path, capsys)
    expected = row["expected"]
    if expected["accepted"]:
        assert rc == 0, got
        assert {k: got[k] for k in expected} == expected
        assert got["per_node_command"], got
    else:
        assert rc == 1 and got["accepted"] is False
        assert any(expected["refused_because"] in e for e in got["errors"]), got["errors"]
        for line in err.strip().splitlines():  # compiler-style, one per problem
            file, lineno, message = line.split(":", 2)
            assert file == str(path) and lineno.isdigit() and message.strip(), line


def test_nine_in_ten_are_accepted():
    accepted = sum(r["expected"]["accepted"] for r in ROWS)
    assert len(ROWS) >= 30 and accepted / len(ROWS) >= 0.9, (accepted, len(ROWS))
