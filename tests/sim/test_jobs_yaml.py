"""Jobs YAML: round trip, and every kind of bad input named by file, line and field."""

import pytest

from malletrain.sim.jobs import SimJob, dump_jobs, parse_jobs
from malletrain.sim.trace import TraceError

GOOD = """jobs:
  - name: a
    submit_s: 0
    min_nodes: 1
    max_nodes: 4
    total_samples: 1.0e+9
    scale_up_s: 18
    scale_down_s: 12
    curve: [[1, 100.0], [2, 190], [4, 350]]
"""


def test_parse_good_job_and_interpolate():
    (job,) = parse_jobs("j.yaml", GOOD)
    assert job == SimJob("a", 0.0, 1, 4, 1e9, 18.0, 12.0, ((1, 100.0), (2, 190.0), (4, 350.0)))
    assert job.true_model.rate(3) == pytest.approx(270.0)
    assert job.best_per_node_rate() == pytest.approx(100.0)


def test_dump_round_trips():
    jobs = [SimJob("x-1", 5.0, 2, 8, 123456789.0, 1.5, 0.5, ((2, 10.5), (8, 30.25)))]
    assert parse_jobs("r.yaml", dump_jobs(jobs)) == jobs


def _bad(field_line: str, replacement: str) -> str:
    assert field_line in GOOD
    return GOOD.replace(field_line, replacement)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("jobs: [a, b\n", ["j.yaml:2", "'yaml'", "malformed YAML"]),
        ("jobs:\n  - name: a\n   bad: indent\n", ["'yaml'", "malformed"]),
        ("tasks: []\n", ["'jobs'", "top-level"]),
        ("jobs: []\n", ["'jobs'", "empty"]),
        (_bad("    curve: [[1, 100.0], [2, 190], [4, 350]]", "    curve: [[1, 100.0], [1, 190]]"),
         ["j.yaml:9", "'curve.nodes'", "not increasing in nodes"]),
        (_bad("    curve: [[1, 100.0], [2, 190], [4, 350]]",
              "    curve:\n      - [1, 100.0]\n      - [4, 90]"),
         ["j.yaml:11", "'curve.samples_per_s'", "falls"]),
        (_bad("    curve: [[1, 100.0], [2, 190], [4, 350]]", "    curve: [[0, 1.0]]"),
         ["j.yaml:9", "'curve.nodes'", "positive"]),
        (_bad("    curve: [[1, 100.0], [2, 190], [4, 350]]", "    curve: [[1, 2, 3]]"),
         ["j.yaml:9", "'curve'"]),
        (_bad("    max_nodes: 4", "    max_nodes: two"), ["j.yaml:5", "'max_nodes'", "number"]),
        (_bad("    max_nodes: 4", "    max_nodes: 2.5"), ["j.yaml:5", "'max_nodes'", "whole"]),
        (_bad("    max_nodes: 4", "    max_nodes: 0"), ["j.yaml:5", "'max_nodes'", "positive"]),
        (_bad("    submit_s: 0", "    submit_s: -5"), ["j.yaml:3", "'submit_s'", "non-negative"]),
        (_bad("    scale_up_s: 18\n", ""), ["j.yaml:2", "'scale_up_s'", "missing"]),
        (_bad("    scale_up_s: 18", "    scale_up_s: 18\n    colour: red"),
         ["j.yaml:8", "'colour'", "unknown field"]),
        (_bad("    min_nodes: 1", "    min_nodes: 9"), ["j.yaml:5", "'max_nodes'", "below min"]),
        (GOOD + GOOD.replace("jobs:\n", ""), ["j.yaml:10", "'name'", "duplicate"]),
    ],
)
def test_bad_jobs_files(text, parts):
    with pytest.raises(TraceError) as err:
        parse_jobs("j.yaml", text)
    for part in parts:
        assert part in str(err.value), str(err.value)


def test_unreadable_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        parse_jobs(tmp_path / "missing.yaml")
