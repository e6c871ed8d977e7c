"""``malletrain simulate`` end to end on small traces: summary, timelines, PNG, errors."""

import csv
import json

import pytest

from malletrain.cli import main

TRACE = "time_s,node,state\n" + "".join(f"0,n{i},idle\n" for i in range(6)) + (
    "60,n5,busy\n120,n4,busy\n180,n5,idle\n240,n4,idle\n300,n0,busy\n360,n0,idle\n"
)

JOBS = """jobs:
  - name: big
    submit_s: 0
    min_nodes: 1
    max_nodes: 4
    total_samples: 1.0e+7
    scale_up_s: 10
    scale_down_s: 5
    curve: [[1, 10.0], [2, 19.0], [4, 35.0]]
  - name: small
    submit_s: 30
    min_nodes: 1
    max_nodes: 2
    total_samples: 500
    scale_up_s: 10
    scale_down_s: 5
    curve: [[1, 2.0], [2, 3.5]]
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "idle.csv").write_text(TRACE)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    return tmp_path


def test_simulate_writes_summary_timeline_and_plot(files, capsys):
    out = files / "out"
    rc = main(
        ["simulate", "--idle-trace", str(files / "idle.csv"), "--jobs", str(files / "jobs.yaml"),
         "--policy", "equal-share", "--out", str(out), "--progress", "--bound"]
    )
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    for key in ("policy", "samples_total", "idle_node_seconds", "used_node_seconds", "rescales",
                "jobs_finished", "decision_ms_p50", "decision_ms_max", "mean_jct_s", "makespan_s"):
        assert key in s
    assert s["policy"] == "equal-share"
    # 6 nodes for 0-60, 5 for 60-120, 4 for 120-180, 5 for 180-240, 6 for 240-300, 5, 6 at 360.
    assert s["idle_node_seconds"] == pytest.approx(60 * (6 + 5 + 4 + 5 + 6 + 5))
    assert 0 < s["used_node_seconds"] <= s["idle_node_seconds"]
    assert s["samples_total"] > 0 and s["upper_bound_samples"] >= s["samples_total"]
    # the proven bound (sim.bound) is tighter than the linear one and still above the replay
    assert s["samples_total"] <= s["proven_bound_samples"] <= s["upper_bound_samples"] * 1.000001
    rows = list(csv.DictReader((out / "timeline.csv").open()))
    assert rows[0]["time_s"] == "0" and rows[-1]["time_s"] == "360"
    # (rows at the trace's events, every 60 s; the others are finishes and admissions)
    at_events = [r for r in rows if float(r["time_s"]) % 60 == 0]
    assert [int(r["idle_nodes"]) for r in at_events[:3]] == [6, 5, 4]
    changes = list(csv.DictReader((out / "job_nodes.csv").open()))
    assert {r["job"] for r in changes} == {"big", "small"}
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    got = capsys.readouterr()
    assert "%" in got.err  # the progress bar
    # --bound: the result as a fraction of the proven bound, on the one output line
    share = s["samples_total"] / s["proven_bound_samples"]
    assert f"of_bound={share:.3f}" in got.out and s["proven_bound_gap"] == 0.0


def test_bad_input_is_one_line_error_with_file_line_field(files, capsys):
    (files / "bad.csv").write_text("time_s,node,state\n0,n0,idle\n10,n9,busy\n")
    rc = main(["simulate", "--idle-trace", str(files / "bad.csv"), "--jobs",
               str(files / "jobs.yaml"), "--policy", "equal-share", "--out", str(files / "o")])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert err.count("\n") == 0 and "bad.csv:3" in err and "'node'" in err
    assert "Traceback" not in err


def test_unknown_policy_and_missing_swf_nodes(files, capsys):
    base = ["--jobs", str(files / "jobs.yaml"), "--out", str(files / "o")]
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--idle-trace", str(files / "idle.csv"), "--policy", "nope", *base])
    assert exc.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    assert main(["simulate", "--swf", str(files / "x.swf"), "--policy", "equal-share", *base])
    assert "--swf-nodes" in capsys.readouterr().err


@pytest.mark.parametrize(
    "policy", ["malletrain", "malletrain-known-curves", "freetrain", "equal-share", "no-loss-bound"]
)
def test_shipped_example_runs_under_every_policy(tmp_path, policy):
    """examples/sim stays valid input, and every registered policy replays it."""
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "sim"
    out = tmp_path / policy
    rc = main(["simulate", "--idle-trace", str(ex / "idle-trace.csv"), "--jobs",
               str(ex / "jobs.yaml"), "--policy", policy, "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == policy and s["events"] > 10
    assert 0 < s["used_node_seconds"] <= s["idle_node_seconds"] + 1e-6
    assert s["samples_total"] <= s["upper_bound_samples"]


SAME_JOBS = "jobs:\n" + "".join(
    f"""  - name: twin-{i}
    submit_s: 0
    min_nodes: 1
    max_nodes: 4
    total_samples: 1.0e+9
    scale_up_s: 18
    scale_down_s: 12
    curve: [[1, 10.0], [2, 19.0], [4, 30.0]]
"""
    for i in range(3)
)


def test_no_loss_bound_with_free_rescales_bounds_every_policy(tmp_path):
    """The evaluation's loss-free reference: identical jobs that never finish (so every
    policy runs the same admitted jobs), every size change free; no policy, charged its
    rescales, makes more samples than it."""
    (tmp_path / "idle.csv").write_text(TRACE)
    (tmp_path / "jobs.yaml").write_text(SAME_JOBS)
    samples = {}
    for policy in ("no-loss-bound", "malletrain", "malletrain-known-curves", "freetrain",
                   "equal-share"):
        out = tmp_path / policy
        extra = ["--no-rescale-cost"] if policy == "no-loss-bound" else []
        rc = main(["simulate", "--idle-trace", str(tmp_path / "idle.csv"), "--jobs",
                   str(tmp_path / "jobs.yaml"), "--policy", policy, "--out", str(out), *extra])
        assert rc == 0
        s = json.loads((out / "summary.json").read_text())
        samples[policy] = s["samples_total"]
        if policy == "no-loss-bound":
            assert s["rescales"] > 0 and s["preemptions"] > 0  # changes happened, for free
            assert s["samples_lost_rescale"] == 0 and s["samples_lost_preemption"] == 0
    bound = samples.pop("no-loss-bound")
    # 6 nodes on 3 concave jobs: 2 each (19/s per job) is the best split at any time
    assert all(v <= bound * (1 + 1e-9) for v in samples.values()), samples
    assert min(samples.values()) < bound


TYPED_JOBS = """jobs:
  - name: fast-on-v100
    submit_s: 0
    min_nodes: 1
    max_nodes: 3
    total_samples: 1.0e+9
    scale_up_s: 10
    scale_down_s: 5
    curves: {p100: [[1, 1.0], [3, 3.0]], v100: [[1, 3.0], [3, 9.0]]}
"""


def test_a_mixed_cluster_from_a_real_node_list(files, capsys):
    """--node-list: the trace's nodes typed in the list's GPU shares; the job runs on one
    type (the faster one, where it fits), and the summary gives node-seconds and cost."""
    from pathlib import Path
    node_list = (Path(__file__).resolve().parents[2] / "data" / "traces"
                 / "alibaba-gpu-v2023-openb_node_list_gpu_node.csv")
    (files / "typed.yaml").write_text(TYPED_JOBS)
    argv = ["simulate", "--idle-trace", str(files / "idle.csv"), "--jobs",
            str(files / "typed.yaml"), "--policy", "malletrain-known-curves", "--no-progress",
            "--node-list", str(node_list), "--gpu-models", "P100=p100,V100M16=v100,V100M32=v100",
            "--prices", "p100=1,v100=2"]
    assert main([*argv, "--out", str(files / "typed")]) == 0
    summary = json.loads((files / "typed" / "summary.json").read_text())
    used = summary["type_node_seconds"]
    assert set(used) <= {"p100", "v100"} and used.get("v100", 0) > 0
    assert summary["cost"] == pytest.approx(used.get("p100", 0) + 2 * used.get("v100", 0))
    assert summary["objective"] == "throughput" and not summary["node_types_hidden"]
    capsys.readouterr()
    assert main([*argv[:-2], "--prices", "v100=cheap", "--out", str(files / "bad")]) != 0
    assert "--prices: prices are numbers" in capsys.readouterr().err
    assert main(["simulate", "--idle-trace", str(files / "idle.csv"), "--jobs",
                 str(files / "jobs.yaml"), "--policy", "malletrain", "--hide-types",
                 "--out", str(files / "x")]) != 0
    assert "need --node-list" in capsys.readouterr().err
