"""SbatchSpec -> sbatch argv, checked against reviewed golden files.

To regenerate after an intended change: MALLETRAIN_UPDATE_GOLDEN=1 pytest this file, then
review the diff of tests/golden/slurm/sbatch/ like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from malletrain.errors import PermanentError
from malletrain.slurm.sbatch import SbatchSpec, SbatchSpecError, parse_job_id

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm" / "sbatch"
SCRIPT = "#!/bin/bash\nsrun python -m train\n"

SPECS = {
    "minimal": SbatchSpec(script=SCRIPT),
    "scavenger_worker": SbatchSpec(
        script=SCRIPT,
        job_name="mt-7-resnet",
        partition="scavenger",
        nodes=2,
        time_limit_s=600,
        time_min_s=120,
        nodelist=("n3", "n4"),
        output="/tmp/mt/7/%j.out",
        comment="malletrain job 7",
        signal="B:USR1@30",
        requeue=False,
        export="ALL",
        environment={"MALLETRAIN_JOB_ID": "7", "MASTER_PORT": "29517"},
        run_as="mt-alice",
    ),
    "range_and_extras": SbatchSpec(
        script=SCRIPT,
        nodes=1,
        max_nodes=4,
        ntasks_per_node=1,
        time_limit_s=61,
        exclude=("n1",),
        chdir="/home/mt-bob",
        account="research",
        qos="low",
        hold=True,
        exclusive=True,
        dependency="afterok:12",
        extra_args=("--mem=0",),
    ),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_render_matches_golden(case):
    spec = SPECS[case]
    rendered = {"argv": spec.render(), "env": spec.render_env(), "stdin": spec.script}
    path = GOLDEN / f"{case}.json"
    if os.environ.get("MALLETRAIN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rendered, indent=1) + "\n")
    assert rendered == json.loads(path.read_text())


def test_time_is_rounded_up_to_whole_minutes():
    assert "--time=2" in SbatchSpec(script=SCRIPT, time_limit_s=61).render()
    assert "--time=1" in SbatchSpec(script=SCRIPT, time_limit_s=60).render()


def test_values_that_look_like_options_stay_values():
    argv = SbatchSpec(script=SCRIPT, comment="--uid=0 --wrap=evil").render()
    assert "--comment=--uid=0 --wrap=evil" in argv
    assert "--uid=0" not in argv


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"script": "echo no shebang"}, "script"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": True}, "nodes"),
        ({"nodes": 4, "max_nodes": 2}, "max_nodes"),
        ({"max_nodes": 2}, "max_nodes"),
        ({"time_limit_s": 60, "time_min_s": 120}, "time_min_s"),
        ({"job_name": "a b"}, "job_name"),
        ({"partition": "x;rm"}, "partition"),
        ({"nodelist": ("n1,n2",)}, "nodelist"),
        ({"comment": "two\nlines"}, "comment"),
        ({"signal": "USR1; rm -rf"}, "signal"),
        ({"dependency": "afterok:1;x"}, "dependency"),
        ({"export": "SOME"}, "export"),
        ({"environment": {"BAD KEY": "1"}}, "environment"),
        ({"run_as": "Root Admin"}, "run_as"),
        ({"extra_args": ("-N4",)}, "extra_args"),
    ],
)
def test_invalid_specs_name_the_field(kwargs, field):
    kwargs = {"script": SCRIPT, **kwargs}
    with pytest.raises(SbatchSpecError, match=f"^{field}:") as exc:
        SbatchSpec(**kwargs)
    assert isinstance(exc.value, PermanentError)


def test_parse_job_id():
    assert parse_job_id("42\n") == 42
    assert parse_job_id("42;cluster\n") == 42
    with pytest.raises(ValueError, match="no job id"):
        parse_job_id("sbatch: error: nope")
