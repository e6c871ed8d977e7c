"""What each policy is told about the jobs' curves: learned ones never come from the file."""

import ast
import inspect

import pytest

from malletrain.sim import curves
from malletrain.sim.curves import LearnedCurves, NoCurves, TrueCurves, job_kind
from malletrain.sim.jobs import SimJob


def job(name="imagenet-003", curve=((1, 100.0), (8, 700.0))):
    return SimJob(name, 0.0, 1, 8, 1e9, 18.0, 12.0, curve)


def test_true_and_no_curves():
    j = job()
    assert TrueCurves().model(j) == (j.true_model, 18.0, 12.0)
    assert NoCurves().model(j)[0].rate(4) == 0.0


def test_learned_model_ignores_the_file_and_follows_progress():
    a, b = LearnedCurves(), LearnedCurves()
    ja, jb = job(curve=((1, 100.0),)), job(curve=((1, 9999.0), (2, 20000.0)))
    assert a.model(ja)[0] == b.model(jb)[0]  # same (prior) belief whatever the file says
    # Feed 50 samples/s (whole job) on 2 nodes, as the replay would, well past the warm-up.
    for prov, jj in ((a, ja), (b, jb)):
        prov.rescaled(jj, 0.0, 0, 2)
        for t in range(0, 600, 60):
            prov.observe(jj, float(t), 2, 50.0 * t)
    ma, mb = a.model(ja)[0], b.model(jb)[0]
    assert ma == mb
    assert ma.rate(2) == pytest.approx(50.0)


def test_learned_provider_source_never_touches_curves():
    src = inspect.getsource(curves.LearnedCurves)
    names = {n.attr for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)}
    assert not names & {"curve", "true_model", "best_per_node_rate", "scale_up_s", "scale_down_s"}


def test_job_kind():
    assert job_kind("sia-imagenet-aws-007") == "sia-imagenet-aws"
    assert job_kind("solo") == "solo"
