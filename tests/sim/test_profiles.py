"""Converters from measured Sia/Pollux and Gavel profiles into simulator job sets."""

import json

import pytest

from malletrain.sim.jobs import parse_jobs
from malletrain.sim.profiles import (
    build_job_set,
    gavel_profiles,
    main,
    monotone_envelope,
    sia_profiles,
)
from malletrain.sim.trace import TraceError


def test_monotone_envelope_carries_the_best_and_cuts_at_peak():
    got = monotone_envelope({1: 10.0, 2: 8.0, 4: 30.0, 8: 25.0})
    assert got == ((1, 10.0), (2, 10.0), (4, 30.0))


@pytest.fixture
def sia(tmp_path):
    m = tmp_path / "sia" / "resnet"
    m.mkdir(parents=True)
    # placements: 1 GPU bsz 10 in 0.1 s = 100/s; bsz 20 in 0.1 s = 200/s (best);
    # "11" = 2 GPUs on 2 nodes: 2 x 20 / 0.2 = 200/s;
    # "2" = 2 GPUs on 1 node: 2 x 20 / 0.125 = 320/s.
    (m / "placements-aws.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,10,0.1,0\n1,20,0.1,0\n11,20,0.2,0\n2,20,0.125,0\n"
    )
    (m / "scalability-aws.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n2,8,20,0.4,0\n"
    )
    return tmp_path / "sia"


def test_sia_best_throughput_per_gpu_count(sia):
    (p,) = sia_profiles(sia, "aws")
    assert p.name == "sia-resnet-aws"
    assert p.curve == ((1, 200.0), (2, 320.0), (8, 400.0))


def test_sia_bad_row_names_file_line_field(sia):
    (sia / "resnet" / "placements-aws.csv").write_text("placement,local_bsz,step_time\n1,x,0.1\n")
    with pytest.raises(TraceError, match=r"placements-aws.csv:2: field 'local_bsz'"):
        sia_profiles(sia, "aws")


def test_gavel_steps_times_batch(tmp_path):
    f = tmp_path / "g.json"
    f.write_text(json.dumps({"v100_unconsolidated": {
        "('ResNet-50 (batch size 64)', 1)": {"null": 4.0},
        "('ResNet-50 (batch size 64)', 2)": {"null": 7.0},
        "('A3C', 1)": {"null": 3.0},
    }}))
    (p,) = gavel_profiles(f)
    assert p.name == "gavel-resnet-50-b64" and p.curve == ((1, 256.0), (2, 448.0))


def test_job_set_and_cli_round_trip(sia, tmp_path):
    jobs = build_job_set(sia_profiles(sia), 3, hours_at_max=2, scale_up_s=18, scale_down_s=12)
    assert [j.max_nodes for j in jobs] == [8, 8, 8]
    assert jobs[0].total_samples == pytest.approx(400.0 * 7200)
    out = tmp_path / "jobs.yaml"
    assert main(["--sia", str(sia), "--jobs", "3", "--hours-at-max", "2", "--out", str(out)]) == 0
    assert parse_jobs(out) == jobs
