"""#SBATCH directives read like sbatch, flags win, unsafe options refused, all input validated."""

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.daemon.jobs.directives import (
    ScriptErrors,
    build_spec,
    merge,
    parse_option_tokens,
    read_directives,
    script_mode,
    spec_warnings,
)
from malletrain.daemon.jobs.spec import JobSpec, SpecError, parse_export, parse_nodes, parse_time_s

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
    ("#SBATCH --nodelist=n1", "--nodelist cannot be used for a malleable job"),
    ("#SBATCH --dependency=aftercorr:1", "array task to array task dependencies are not"),
    ("#SBATCH --dependency=afterok:1?singleton,afterany:2", "cannot be mixed"),
    ("#SBATCH -w n1", "-w cannot be used"),
    ("#SBATCH --uid=0", "--uid cannot be used for a malleable job"),
    ("#SBATCH --array=1-4000", "Slurm's default MaxArraySize allows 0-1000"),
    ("#SBATCH --begin=now+1hour", "--begin cannot be used for a malleable job"),
    ("#SBATCH -G 8 -N 2-4", "cannot be split over a changing number of nodes"),
    ("#SBATCH --mem='64G; rm'", "not a plain value"),
    ("#SBATCH --frobnicate=1", "unknown option --frobnicate"),
    ("#SBATCH --time=soon", "is not a time"),
    ("#SBATCH -N 4-2", "min <= max"),
    ("#SBATCH --export=MALLETRAIN_JOB_ID=x", "set by malletrain"),
    ("#SBATCH --exclude=/home/u/bad-nodes", "a file of node names is not read"),
    ("#SBATCH -x n[1-", "hostlist"),
    ("#SBATCH --rate-target=fast", "is not a rate in samples/s"),
    ("#SBATCH --rate-target=0", "is not a rate in samples/s"),
    ("#SBATCH --rate-target=inf", "is not a rate in samples/s"),
    ("#SBATCH --rate-target=nan", "is not a rate in samples/s"),
])
def test_refused_and_invalid_directives_name_file_line_and_option(line, needle):
    text = f"#!/bin/bash\n{line}\necho hi\n"
    with pytest.raises(SpecError) as err:
        spec_from(text)
    assert needle in str(err.value)
    if any(w in needle for w in ("unknown", "cannot be", "not a time", "not a rate")):
        assert "/home/u/train.py:2" in str(err.value)


def test_time_formats_match_sbatch():
    assert parse_time_s("30") == 1800
    assert parse_time_s("5:30") == 360  # Slurm keeps whole minutes, rounded up
    assert parse_time_s("00:19:59") == 1200
    assert parse_time_s("1:00:00") == 3600
    assert parse_time_s("2-0") == 172800
    assert parse_time_s("1-2:3") == 93780
    assert parse_time_s("1-2:3:4") == 93840
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
    excluding, _ = spec_from(SCRIPT + "#SBATCH -x n9\n", ["--exclude=n[1-3],n7"])
    assert excluding.exclude == ("n1", "n2", "n3", "n7")  # the flag wins over the script
    assert JobSpec.from_dict(excluding.to_dict()) == excluding
    with_dir, _ = spec_from("#!/bin/bash\n#SBATCH -x gpu[01-02]\necho hi\n")
    assert with_dir.exclude == ("gpu01", "gpu02")
    targeted, _ = spec_from(SCRIPT, ["--rate-target=1250.5"])
    assert targeted.rate_target == 1250.5
    assert JobSpec.from_dict(targeted.to_dict()) == targeted
    for bad in ({}, [], {"script": "relative.py"}, {"script": "/x.py", "max_nodes": "4"},
                {"script": "/x.py", "min_nodes": 3, "max_nodes": 2},
                {"script": "/x.py", "python": "python3"}, {"script": "/x.py", "evil": 1},
                {"script": "/x.py", "environment": {"MALLETRAIN_JOB_ID": "j"}},
                {"script": "/x.py", "args": ["a\0b"]}, {"script": "/x.py", "min_nodes": True},
                {"script": "/x.py", "rate_target": True}, {"script": "/x.py", "rate_target": "9"},
                {"script": "/x.py", "rate_target": -1.0}, {"script": "/x.py", "exclude": "n1"},
                {"script": "/x.py", "exclude": ["n1;rm"]},
                {"script": "/x.py", "exclude": [f"n{i}" for i in range(5000)]},
                {"script": "/x.py", "rate_target": 1e300}):
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


def test_every_problem_is_reported_at_once_like_a_compiler():
    text = ("#!/bin/bash\n#SBATCH --begin=now+1hour\n#SBATCH -N 2\n#SBATCH --frobnicate\n"
            "#SBATCH --time=soon\n#SBATCH --mail-type=END\n#SBATCH --nodelist n1\nsrun x\n")
    with pytest.raises(ScriptErrors) as err:
        spec_from(text, ["--gpus-per-node=lots"])
    lines = err.value.problems
    assert [ln.split(": ", 1)[0] for ln in lines] == [
        "/home/u/train.py:2", "/home/u/train.py:4", "/home/u/train.py:5",
        "/home/u/train.py:7", "command line"]
    assert str(err.value).count("\n") == len(lines) - 1  # one problem per line


def test_gpus_in_each_of_sbatchs_forms():
    def gpus(*lines, flags=()):
        text = "#!/bin/bash\n" + "".join(f"#SBATCH {ln}\n" for ln in lines) + "srun x\n"
        spec, _ = spec_from(text, flags)
        return spec.gpus_per_node, spec.gpu_type, spec.nproc_per_node, spec.slot_options

    assert gpus("--gres=gpu:a100:4", "-N 1-8") == (4, "a100", 4, ("--gres=gpu:a100:4",))
    assert gpus("--gres=gpu:2") == (2, None, 2, ("--gres=gpu:2",))
    assert gpus("--gpus-per-node=v100:8", "--ntasks-per-node=1") == (8, "v100", 1, ())
    assert gpus("-G 8", "-N 2") == (4, None, 4, ())
    assert gpus("--gpus-per-task=1", "--ntasks-per-node=4") == (4, None, 4, ())
    assert gpus("-n 8", "-N 2") == (0, None, 4, ())
    assert gpus("-N4", "-t30", "-c 8", "--mem=64G", "-C a100&ib") == (
        0, None, 1, ("--cpus-per-task=8", "--mem=64G", "--constraint=a100&ib"))


def test_gpus_and_per_node_options_reach_every_node_slot():
    from malletrain.daemon.jobs.slots import render_slot

    text = "#!/bin/bash\n#SBATCH --gpus-per-node=a100:4\n#SBATCH --mem=64G -C ib\nsrun x\n"
    spec, _ = spec_from(text)
    argv = render_slot(spec, "m1", 0, coordinator="c:1", secret="ab" * 32, state_dir="/s",
                       partition="scavenger").render()
    assert "--gpus-per-node=a100:4" in argv and "--mem=64G" in argv
    assert "--constraint=ib" in argv
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_sbatch_time_and_warning_forms():
    text = "#!/bin/bash\n#SBATCH --time=UNLIMITED\n#SBATCH --signal=B:USR1@60\n" \
           "#SBATCH --requeue\n#SBATCH --qos=high\nsrun x\n"
    spec, opts = spec_from(text)
    assert spec.time_limit_s is None and spec.qos == "high"  # --qos is held (issue 47)
    warnings = opts.warnings + spec_warnings(opts, spec)  # native: --signal means nothing
    assert [w.split(": ", 2)[1] for w in warnings] == ["--requeue ignored", "--signal ignored"]


def test_nice_is_read_and_a_negative_one_refused_as_sbatch_does():
    spec, _ = spec_from("#!/bin/bash\n#SBATCH --nice=150\nsrun x\n")
    assert spec.nice == 150 and JobSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ScriptErrors, match="only Slurm's operators may give a negative"):
        spec_from("#!/bin/bash\n#SBATCH --nice=-5\nsrun x\n")


@pytest.mark.parametrize(("signal_opt", "expect"), [
    ("B:USR1@60", ("USR1", 60)), ("SIGUSR2@300", ("USR2", 300)), ("10@5", ("USR1", 5)),
    ("R:TERM", ("TERM", 60)), (None, ("TERM", 0)),
])
def test_restart_mode_reads_the_stop_signal(signal_opt, expect):
    head = "#!/bin/bash\n#SBATCH -N 1-4\n"
    if signal_opt:
        head += f"#SBATCH --signal={signal_opt}\n"
    text = head + "srun torchrun --nproc_per_node 2 train.py\n"
    plan, problems = script_mode(text, "/h/job.sh")
    assert problems == () and plan is not None
    opts = read_directives(text, "/h/job.sh")
    spec = build_spec(opts, script="/h/job.sh", args=[], cwd="/h", python="/usr/bin/python3",
                      default_name="job.sh", plan=plan)
    assert (spec.mode, spec.nproc_per_node) == ("restart", 2)
    assert (spec.stop_signal, spec.stop_grace_s) == expect
    assert spec_warnings(opts, spec) == ()


def test_restart_mode_refuses_a_signal_it_cannot_send():
    text = "#!/bin/bash\n#SBATCH --signal=KILL@10\ntorchrun t.py\n"
    plan, _ = script_mode(text, "/h/j.sh")
    with pytest.raises(ScriptErrors, match=r"/h/j.sh:2: --signal: 'KILL' is not a signal"):
        build_spec(read_directives(text, "/h/j.sh"), script="/h/j.sh", args=[], cwd="/h",
                   python="/usr/bin/python3", default_name="j", plan=plan)


# -- sbatch's own grammar (each case checked against real sbatch 22.05 by hand, and by
#    tests/slurm/test_sbatch_oracle.py on the dev cluster)

GRAMMAR = """#!/usr/bin/env -S bash -e
#SBATCH --nodes=2-4\t# tab, then a comment
#SBATCH --tasks-per-node 4
#SBATCH --err=/tmp/e-%j.txt
#SBATCH -J "MNMG PyTorch"
#SBATCH --no-requeue
#SBATCH --image=docker:nersc/pytorch:24.06
#SBATCH --container-remap-root
srun torchrun --nproc_per_node 4 train.py
"""


def test_sbatch_grammar_aliases_prefixes_comments_spank_and_names():
    spec, opts = spec_from(GRAMMAR, path="/home/u/job.sh")
    assert (spec.min_nodes, spec.max_nodes, spec.nproc_per_node) == (2, 4, 4)
    assert spec.error == "/tmp/e-%j.txt"  # --err: the unique prefix of --error
    assert spec.name == "MNMG PyTorch"
    assert spec.slot_options == ("--image=docker:nersc/pytorch:24.06", "--container-remap-root")
    assert any("--no-requeue ignored" in w for w in opts.warnings)
    assert sum("SPANK" in w for w in opts.warnings) == 2
    assert script_mode(GRAMMAR, "job.sh")[1] == ()  # `env -S bash -e`: a shell script


@pytest.mark.parametrize(("line", "needle"), [
    ("#SBATCH --mem-per=4G", "option --mem-per is ambiguous (possibilities: --mem-per-cpu "
     "--mem-per-gpu)"),
    ("#SBATCH --nod=2", "option --nod is ambiguous"),
    ("#SBATCH hetjob", "hetjob: heterogeneous jobs"),
    ("#SBATCH --bogus-opt=1", "unknown option --bogus-opt"),
])
def test_what_sbatch_refuses_is_refused_with_its_line(line, needle):
    with pytest.raises(ScriptErrors) as err:
        spec_from(f"#!/bin/bash\n{line}\nsrun torchrun x.py\n", path="/j.sh")
    assert any(needle in p and p.startswith("/j.sh:2:") for p in err.value.problems), \
        err.value.problems


def test_gpus_asked_only_on_srun_lines_are_said_at_submit():
    text = ("#!/bin/bash\n#SBATCH -N 2\nN=8\nsrun -n$((N*2)) --gpus-per-task=1 python t.py\n"
            "srun hostname\n")
    plan, problems = script_mode(text, "/j.sh")
    assert problems == () and plan is not None and plan.srun_gpu_lines == (4,)
    spec, opts = spec_from(text, path="/j.sh")
    warnings = spec_warnings(opts, spec, plan)
    assert any(w.startswith("/j.sh:4: srun asks for GPUs") for w in warnings), warnings
    with_gpus = text.replace("-N 2\n", "-N 2\n#SBATCH --gpus-per-node=8\n")
    spec, opts = spec_from(with_gpus, path="/j.sh")
    assert not any("srun asks" in w for w in spec_warnings(opts, spec, script_mode(
        with_gpus, "/j.sh")[0]))


@pytest.mark.parametrize(("line", "ok"), [
    ("#SBATCH --exclusive=user", True), ("#SBATCH --exclusive=MCS", True),
    ("#SBATCH --exclusive", True), ("#SBATCH --no-kill=off", True),
    ("#SBATCH --kill-on-invalid-dep=yes", True),
    ("#SBATCH --exclusive=everyone", False), ("#SBATCH --kill-on-invalid-dep", False),
])
def test_optional_values_are_read_as_getopt_gives_them_to_sbatch(line, ok):
    """sbatch's ``--exclusive[=user|mcs|topo]``, ``--no-kill[=off]`` and ``--nice[=N]`` take
    a value only as ``--opt=value`` (getopt_long's optional argument); the next word is
    never theirs. A value sbatch does not know is refused as sbatch refuses it."""
    text = f"#!/bin/bash\n#SBATCH -N 2\n{line}\nsrun torchrun x.py\n"
    if ok:
        spec, _ = spec_from(text, path="/j.sh")
        assert spec.min_nodes == 2
    else:
        with pytest.raises(ScriptErrors) as err:
            spec_from(text, path="/j.sh")
        assert all(p.startswith("/j.sh:3:") for p in err.value.problems)


def test_nice_alone_is_sbatchs_100_and_never_takes_the_next_word():
    spec, _ = spec_from("#!/bin/bash\n#SBATCH --nice --nodes=3\nsrun x\n", path="/j.sh")
    assert (spec.nice, spec.min_nodes) == (100, 3)
    with pytest.raises(ScriptErrors) as err:  # getopt: 50 is not --nice's value
        spec_from("#!/bin/bash\n#SBATCH --nice 50\nsrun x\n", path="/j.sh")
    assert any("'50' is not an option" in p for p in err.value.problems)


def test_directives_are_found_where_sbatch_finds_them():
    """sbatch's ``_opt_batch_script``: a directive starts in the first column (an indented
    one is a comment), its options may follow ``#SBATCH`` without a space, ``#SLURM`` is
    read too (with a warning), and a backslash makes the next character plain."""
    text = ("#!/bin/bash\n#SBATCH -N 2\n  #SBATCH -N 3\n\t#SBATCH --time=10\n"
            "#SBATCH--time=5\n#SLURM --ntasks-per-node=4\n#SBATCH -J a\\ b\\#c # note\n"
            "srun x\n")
    spec, opts = spec_from(text, path="/j.sh")
    assert (spec.min_nodes, spec.time_limit_s, spec.name) == (2, 300, "a b#c")
    assert opts.values["ntasks-per-node"] == "4"
    assert any(w.startswith("/j.sh:6: #SLURM") for w in opts.warnings)
    with pytest.raises(ScriptErrors) as err:  # sbatch: Invalid directive found: X
        spec_from("#!/bin/bash\n#SBATCHX -N 2\nsrun x\n", path="/j.sh")
    assert any(p.startswith("/j.sh:2: 'X' is not an option") for p in err.value.problems)


@pytest.mark.parametrize(("text", "needle"), [
    ("#!/bin/bash\r\n#SBATCH -N 2\r\nsrun x\r\n", "/j.sh:1: DOS line breaks"),
    ("#!/bin/bash\n#SBATCH -N 2\nsrun x\0\n", "/j.sh:3: a NUL character"),
    (" #!/bin/bash\n#SBATCH -N 2\nsrun x\n", "/j.sh:1: the first line must start with #!"),
])
def test_a_script_sbatch_cannot_read_is_refused_as_sbatch_refuses_it(text, needle):
    plan, problems = script_mode(text, "/j.sh")
    assert plan is None and any(p.startswith(needle) for p in problems), problems


def test_options_sbatch_has_and_has_not_are_read_as_sbatch_reads_them():
    """``--bb``, ``--gpus-per-socket``, ``--ntasks-per-tres`` and ``--cluster`` are
    sbatch's (22.05); ``--share`` and ``--burst-buffer`` are not."""
    spec, opts = spec_from("#!/bin/bash\n#SBATCH -N 2 --bb=capacity=1G --ntasks-per-tres=1\n"
                           "#SBATCH --gpus-per-socket=2\nsrun x\n", path="/j.sh")
    assert spec.slot_options == ("--gpus-per-socket=2",)
    assert sum("ignored" in w for w in opts.warnings) == 2
    for line, needle in (("--cluster=c2", "--cluster cannot be used"),
                         ("--share", "unknown option --share"),
                         ("--burst-buffer=x", "unknown option --burst-buffer")):
        with pytest.raises(ScriptErrors) as err:
            spec_from(f"#!/bin/bash\n#SBATCH {line}\nsrun x\n", path="/j.sh")
        assert any(needle in p for p in err.value.problems), err.value.problems


def test_sbatchs_input_environment_wins_over_the_script_and_flags_over_it():
    """sbatch reads ``SBATCH_*`` after the ``#SBATCH`` lines and before the command line."""
    from malletrain.daemon.jobs.sbatch_options import environment_options
    text = "#!/bin/bash\n#SBATCH -N 2 -t 10 -J script --account=a\nsrun x\n"
    env = environment_options({"SBATCH_TIMELIMIT": "45", "SBATCH_JOB_NAME": "env",
                               "SBATCH_ACCOUNT": "b", "SBATCH_EXCLUSIVE": "", "HOME": "/h"})
    d = read_directives(text, "/j.sh")
    opts = merge(merge(d, env), parse_option_tokens(["--account=c"], "command line"))
    spec = build_spec(opts, script="/j.sh", args=[], cwd="/", python="/p",
                      default_name="j.sh")
    assert (spec.time_limit_s, spec.name, spec.account) == (2700, "env", "c")
    assert any(w.startswith("$SBATCH_EXCLUSIVE: --exclusive ignored") for w in opts.warnings)
    bad = environment_options({"SBATCH_TIMELIMIT": "soon", "SBATCH_WAIT": "1"})
    with pytest.raises(ScriptErrors) as err:
        build_spec(merge(d, bad), script="/j.sh", args=[], cwd="/", python="/p",
                   default_name="j.sh")
    assert sorted(p.split(":")[0] for p in err.value.problems) == ["$SBATCH_TIMELIMIT",
                                                                    "$SBATCH_WAIT"]


def test_the_launch_line_is_read_with_what_slurm_sets_in_the_batch_shell():
    """``${SLURM_GPUS_PER_NODE:-1}`` is the job's --gpus-per-node where it is given, and its
    default where only --gres asks for GPUs (Slurm sets the variable from --gpus-per-node
    alone); ``$SLURM_GPUS_ON_NODE`` is the GPUs per node however asked for."""
    from malletrain.daemon.jobs.directives import batch_environment
    line = "srun torchrun --nproc_per_node=${SLURM_GPUS_PER_NODE:-1} t.py\n"
    for head, workers in (("#SBATCH -N 2 --gpus-per-node=8\n", 8),
                          ("#SBATCH -N 2 --gres=gpu:8\n", 1)):
        text = "#!/bin/bash\n" + head + line
        opts = read_directives(text, "/j.sh")
        env = batch_environment(opts)
        plan, _ = script_mode(text, "/j.sh", env)
        spec = build_spec(opts, script="/j.sh", args=[], cwd="/", python="/p",
                          default_name="j.sh", plan=plan)
        assert spec.nproc_per_node == workers, (head, env)
    opts = read_directives("#!/bin/bash\n#SBATCH -N 2 --gres=gpu:a100:4 -c 8 "
                           "--ntasks-per-node=1\nsrun x\n", "/j.sh")
    assert batch_environment(opts) == {"SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "8",
                                       "SLURM_NTASKS_PER_NODE": "1"}


def test_short_options_are_split_as_getopt_splits_them():
    """``-N2``: the rest of the word is the value, as written (``-J=abc`` names the job
    ``=abc``, ``-t=10`` is no time: sbatch refuses it); flags share a dash (``-Qv``)."""
    spec, opts = spec_from("#!/bin/bash\n#SBATCH -N2 -t5 -J=abc -Qv\nsrun x\n", path="/j.sh")
    assert (spec.min_nodes, spec.time_limit_s, spec.name) == (2, 300, "=abc")
    assert sum("ignored: not needed" in w for w in opts.warnings) == 2
    for line in ("-N=2", "-t=10"):
        with pytest.raises(ScriptErrors):
            spec_from(f"#!/bin/bash\n#SBATCH {line}\nsrun x\n", path="/j.sh")


def test_node_counts_read_as_slurm_reads_them():
    assert parse_nodes("2k") == (2048, 2048) and parse_nodes("1-2K") == (1, 2048)
    assert parse_nodes("-4") == (1, 4)  # no minimum: Slurm's is 1
    for bad in ("2x", "k", "2-", "4-2"):
        with pytest.raises(SpecError):
            parse_nodes(bad)


def test_zero_counts_and_times_and_the_gpu_options_order_as_slurm_reads_them():
    """``-t 0`` is no limit, ``--gpus-per-node=0`` and ``--gres=gpu:0`` no GPUs, and
    ``--gpus-per-node`` wins over ``--gres=gpu`` whichever comes first (Slurm 22.05); a
    time with spaces around it is not one."""
    spec, _ = spec_from("#!/bin/bash\n#SBATCH -N 2 -t 0 --gpus-per-node=0\nsrun x\n")
    assert (spec.time_limit_s, spec.gpus_per_node) == (None, 0)
    assert spec_from("#!/bin/bash\n#SBATCH -t 0-00:00\nsrun x\n")[0].time_limit_s is None
    for line in ("--gres=gpu:4 --gpus-per-node=a100:2", "--gpus-per-node=a100:2 --gres=gpu:4"):
        spec, _ = spec_from(f"#!/bin/bash\n#SBATCH -N 2 {line}\nsrun x\n")
        assert (spec.gpus_per_node, spec.gpu_type) == (2, "a100")
    with pytest.raises(ScriptErrors):
        spec_from('#!/bin/bash\n#SBATCH -N 2 -t " 30 "\nsrun x\n')


def test_task_counts_slurm_derives_from_the_gpus():
    """``--ntasks-per-gpu`` tasks for each GPU; one task per ``--gpus-per-task`` GPUs of the
    node's; ``--gpus-per-task`` with no task count at all is refused, as sbatch refuses it."""
    spec, _ = spec_from("#!/bin/bash\n#SBATCH -N 64 --gpus=512 --ntasks-per-gpu=1\nsrun x\n",
                        path="/j.sh")
    assert (spec.gpus_per_node, spec.nproc_per_node) == (8, 8)
    spec, _ = spec_from("#!/bin/bash\n#SBATCH -N 2 --gpus-per-node=8 --gpus-per-task=4\n"
                        "srun x\n", path="/j.sh")
    assert spec.nproc_per_node == 2
    with pytest.raises(ScriptErrors) as err:
        spec_from("#!/bin/bash\n#SBATCH --gpus-per-task=1\nsrun x\n", path="/j.sh")
    assert any("--gpus-per-task: used without a task count" in p for p in err.value.problems)
    spec, opts = spec_from("#!/bin/bash\n#SBATCH -N 2 --get-user-env=10L\nsrun x\n")
    assert any("--get-user-env ignored" in w for w in opts.warnings)


@pytest.mark.parametrize(("lines", "warned"), [
    ("#SBATCH --gpus-per-task=1 --ntasks-per-node=2\n", True),  # (real sbatch 24.11, 26.05)
    ("#SBATCH --gpus-per-task=1 --ntasks=4 -N 2\n", False),
    ("#SBATCH --gpus-per-task=1 --gpus=8 -N 2\n", False),
])
def test_gpus_per_task_without_gpus_or_ntasks_is_said_to_fail_on_newer_releases(lines, warned):
    spec, opts = spec_from("#!/bin/bash\n" + lines + "srun python train.py\n")
    said = [w for w in spec_warnings(opts, spec) if "24.11 and later refuse" in w]
    assert bool(said) == warned, said
