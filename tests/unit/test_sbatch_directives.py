"""#SBATCH directives read like sbatch, flags win, unsafe options refused, all input validated."""

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.daemon.directives import build_spec, merge, parse_option_tokens, read_directives
from malletrain.daemon.spec import JobSpec, SpecError, parse_export, parse_nodes, parse_time_s

SCRIPT = """#!/usr/bin/env python3
#SBATCH --job-name=resnet
#SBATCH -N 2-6          # a trailing comment
#SBATCH --time=01:30:00
#SBATCH -p batch
#SBATCH --output=/tmp/out-%j.txt

#SBATCH --ntasks-per-node=2
import torch
#SBATCH --nodes=99
"""


def spec_from(script_text, flags=(), path="/home/u/train.py"):
    d = read_directives(script_text, path)
    c = parse_option_tokens(list(flags), "command line")
    return build_spec(merge(d, c), script=path, args=["--lr", "0.1"], cwd="/home/u",
                      python="/usr/bin/python3", default_name="train.py"), merge(d, c)


def test_directives_are_read_until_the_first_command_like_sbatch():
    spec, opts = spec_from(SCRIPT)
    assert (spec.name, spec.min_nodes, spec.max_nodes) == ("resnet", 2, 6)
    assert spec.time_limit_s == 5400
    assert spec.nproc_per_node == 2
    assert spec.output == "/tmp/out-%j.txt"
    assert spec.args == ("--lr", "0.1")
    assert spec.kind == "train.py"
    # --nodes=99 comes after `import torch`: sbatch would not read it either
    assert spec.max_nodes == 6
    assert any("-p ignored" in w for w in opts.warnings)


def test_command_line_flags_win():
    spec, _ = spec_from(SCRIPT, ["--max-nodes", "3", "-J", "other", "--time=10"])
    assert (spec.name, spec.min_nodes, spec.max_nodes, spec.time_limit_s) == ("other", 2, 3, 600)


@pytest.mark.parametrize("line,needle", [
    ("#SBATCH --nodelist=n1", "--nodelist is not allowed"),
    ("#SBATCH --dependency=afterok:1", "--dependency is not allowed"),
    ("#SBATCH --signal=B:USR1@30", "--signal is not allowed"),
    ("#SBATCH --no-requeue", "--no-requeue is not allowed"),
    ("#SBATCH --uid=0", "--uid is not allowed"),
    ("#SBATCH --array=1-4", "--array is not allowed"),
    ("#SBATCH --frobnicate=1", "unknown option --frobnicate"),
    ("#SBATCH --time=soon", "is not a time"),
    ("#SBATCH -N 4-2", "min <= max"),
    ("#SBATCH --export=MALLETRAIN_JOB_ID=x", "set by malletrain"),
    ("#SBATCH --job-name='bad name'", "job name"),
])
def test_refused_and_invalid_directives_name_file_line_and_option(line, needle):
    text = f"#!/bin/bash\n{line}\necho hi\n"
    with pytest.raises(SpecError) as err:
        spec_from(text)
    assert needle in str(err.value)
    if "unknown" in needle or "not allowed" in needle or "not a time" in needle:
        assert "/home/u/train.py:2" in str(err.value)


def test_time_formats_match_sbatch():
    assert parse_time_s("30") == 1800
    assert parse_time_s("5:30") == 330
    assert parse_time_s("1:00:00") == 3600
    assert parse_time_s("2-0") == 172800
    assert parse_time_s("1-2:3") == 93780
    assert parse_time_s("1-2:3:4") == 93784
    for bad in ("", "0", "1:2:3:4", "-5", "1h", "1-"):
        with pytest.raises(SpecError):
            parse_time_s(bad)


def test_nodes_and_export():
    assert parse_nodes("3") == (3, 3)
    assert parse_nodes("1-8") == (1, 8)
    assert parse_export("NONE") == ("NONE", {})
    assert parse_export("ALL,FOO=1,BAR") == ("ALL", {"FOO": "1", "BAR": ""})


def test_spec_round_trips_and_from_dict_rejects_junk():
    spec, _ = spec_from(SCRIPT)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    for bad in ({}, [], {"script": "relative.py"}, {"script": "/x.py", "max_nodes": "4"},
                {"script": "/x.py", "min_nodes": 3, "max_nodes": 2},
                {"script": "/x.py", "python": "python3"}, {"script": "/x.py", "evil": 1},
                {"script": "/x.py", "environment": {"MALLETRAIN_JOB_ID": "j"}},
                {"script": "/x.py", "args": ["a\0b"]}, {"script": "/x.py", "min_nodes": True}):
        with pytest.raises(SpecError):
            JobSpec.from_dict(bad)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                               max_size=4),
    max_leaves=10,
)
_fields = st.sampled_from([*JobSpec.__dataclass_fields__, "junk"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_fields, _json, max_size=8))
def test_from_dict_never_raises_anything_but_spec_error(data):
    try:
        spec = JobSpec.from_dict(data)
    except SpecError:
        return
    assert spec.script.startswith("/") and 1 <= spec.min_nodes <= spec.max_nodes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=6))
def test_random_directive_lines_never_crash(lines):
    text = "#!/bin/bash\n" + "\n".join(f"#SBATCH {x}" for x in lines) + "\n"
    with contextlib.suppress(SpecError):
        spec_from(text)
