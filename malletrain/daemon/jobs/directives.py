"""``#SBATCH`` directives and `malletrain submit` flags -> a :class:`~.spec.JobSpec`.

Why it reads like sbatch: an existing batch script becomes malleable by changing one word
(``sbatch`` -> ``malletrain submit``). So the script's ``#SBATCH`` lines are read the way
sbatch reads them (after the ``#!`` line, up to the first line that is neither blank nor a
comment), and command-line flags win over them.

What happens to each sbatch option is one table (:mod:`.sbatch_options`): read here, passed
to every node slot, accepted with a warning, or refused with the reason. Every problem of a
script is reported at once, each as ``FILE:LINE: message`` (:class:`ScriptErrors`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from malletrain.daemon.jobs import option_values
from malletrain.daemon.jobs.sbatch_options import Options, parse_option_tokens
from malletrain.daemon.jobs.spec import (
    MAX_NODES_LIMIT,
    JobSpec,
    SpecError,
    parse_export,
    parse_nodes,
    positive_int,
)
from malletrain.elastic.restart.arrays import parse_array
from malletrain.elastic.restart.script import (
    ScriptPlan,
    analyse,
    declared_workers,
    is_shell_script,
)

T = TypeVar("T")

__all__ = ["Options", "ScriptErrors", "batch_environment", "build_spec", "merge",
           "parse_option_tokens", "read_directives", "script_mode", "spec_warnings"]

#: a restart-mode script travels in its slots' environment (one variable, under Linux's
#: 128 KiB limit for one)
MAX_RESTART_SCRIPT_BYTES = 100_000


class ScriptErrors(SpecError):
    """Every problem of a script and its command line, one ``FILE:LINE: message`` each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(sorted(problems, key=_position))  # in file order, flags last
        super().__init__("\n".join(self.problems))


def _position(problem: str) -> tuple[int, int]:
    head = problem.split(": ", 1)[0]
    _path, _, line = head.rpartition(":")
    return (0, int(line)) if line.isdigit() else (1, 0)


#: the words that start a directive, as sbatch knows them (``#SLURM``: an old spelling it
#: still reads, saying to change it)
_MAGIC = ("#SBATCH", "#SLURM")
#: C's isspace(), which sbatch uses to split a directive's words
_SPACE = " \t\n\v\f\r"


def read_directives(script_text: str, path: str) -> Options:
    """The ``#SBATCH`` options of a script, read like sbatch does (``_opt_batch_script``).

    A directive is a line that starts with ``#SBATCH`` (or ``#SLURM``) in its first column:
    an indented one is a comment, as is the ``#!`` line. What follows the word is read as
    options even without a space (``#SBATCH--nodes=2``). sbatch stops at the first line that
    is not blank and not a comment; so does this. Later directives win over earlier ones,
    like later command-line options.
    """
    parts: list[Options] = []
    for lineno, line in enumerate(script_text.split("\n"), start=1):
        magic = next((m for m in _MAGIC if line.startswith(m)), None)
        if magic is None:
            code = line.lstrip(_SPACE)
            if code and not code.startswith("#"):
                break  # the first command: sbatch reads no further
            continue
        where = f"{path}:{lineno}"
        try:
            opts = parse_option_tokens(_tokenize(line[len(magic):], where), where)
        except SpecError as exc:
            opts = Options({}, {}, problems=(str(exc),))
        if magic == "#SLURM":
            said = f"{where}: #SLURM: sbatch reads it too, and asks to change it to #SBATCH"
            opts = replace(opts, warnings=(said, *opts.warnings))
        parts.append(opts)
    merged = Options({}, {})
    for part in parts:
        merged = merge(merged, part)
    return merged


def script_mode(script_text: str, path: str, environment: Mapping[str, str] | None = None
                ) -> tuple[ScriptPlan | None, tuple[str, ...]]:
    """A shell batch script's plan (restart mode, with the problems of its launch line);
    None for a Python script (native mode); any other interpreter is refused.
    ``environment``: what Slurm sets in its batch shell (:func:`batch_environment`)."""
    first = script_text.split("\n", 1)[0].strip()
    unreadable = _what_sbatch_refuses(script_text, path)
    if unreadable:
        return None, unreadable
    if is_shell_script(script_text):
        plan, problems = analyse(script_text, path, environment)
        if len(script_text.encode()) > MAX_RESTART_SCRIPT_BYTES:
            problems.append(f"{path}:1: a batch script of more than "
                            f"{MAX_RESTART_SCRIPT_BYTES} bytes")
        return plan, tuple(problems)
    if first.startswith("#!") and "python" not in first:
        return None, (f"{path}:1: a {first[2:].strip()!r} script: malletrain runs shell "
                      "batch scripts (restart mode) and Python scripts written with "
                      "ElasticJob (native mode)",)
    return None, ()


#: sbatch's options whose value Slurm puts, as given, in the batch shell's environment
#: (src/common/env.c: only where the option is given)
_ENVIRONMENT = (("gpus-per-node", "SLURM_GPUS_PER_NODE"), ("gpus-per-task", "SLURM_GPUS_PER_TASK"),
                ("gpus", "SLURM_GPUS"), ("ntasks-per-node", "SLURM_NTASKS_PER_NODE"),
                ("job-name", "SLURM_JOB_NAME"))


def batch_environment(opts: Options) -> dict[str, str]:
    """What Slurm sets in a batch shell from the job's options, for the static reading of
    its launch lines: ``--nproc_per_node=${SLURM_GPUS_PER_NODE:-1}`` reads the job's value
    where ``--gpus-per-node`` is given, the default where it is not, as the shell would.
    ``SLURM_GPUS_ON_NODE`` (the gres plugin's) is the GPUs per node however asked for;
    ``SLURM_CPUS_PER_TASK`` comes with ``--cpus-per-task``. The node count is not set: it
    changes with a malleable job's size."""
    env = {name: opts.values[key].strip() for key, name in _ENVIRONMENT if key in opts.values}
    for option in opts.slot:
        name, _, value = option.partition("=")
        if name == "--cpus-per-task":
            env["SLURM_CPUS_PER_TASK"] = value
    c = _Collect(opts)
    tasks = c.get("ntasks-per-node", lambda t, w: positive_int(t, w, 256))
    gpus = _gpus(c, _nodes(c), tasks)[1]
    if gpus and not c.problems:
        env["SLURM_GPUS_ON_NODE"] = str(gpus)
    return env


def _what_sbatch_refuses(script_text: str, path: str) -> tuple[str, ...]:
    """What sbatch refuses in a script before it reads a directive (``_get_script_buffer``):
    no ``#!`` in its first two bytes (a Python script may leave it out here), DOS line
    breaks, a NUL character."""
    if not script_text.startswith("#!") and not path.endswith(".py"):
        return (f"{path}:1: the first line must start with #! followed by the path to an "
                "interpreter (sbatch's rule; a Python script may leave it out)",)
    if "\r\n" in script_text:
        line = script_text.count("\n", 0, script_text.index("\r\n")) + 1
        return (f"{path}:{line}: DOS line breaks (\\r\\n): sbatch refuses the script; "
                "convert it (dos2unix)",)
    if "\0" in script_text:
        line = script_text.count("\n", 0, script_text.index("\0")) + 1
        return (f"{path}:{line}: a NUL character: sbatch refuses the script",)
    return ()


def spec_warnings(opts: Options, spec: JobSpec, plan: ScriptPlan | None = None
                  ) -> tuple[str, ...]:
    """Warnings that depend on the whole spec: ``--signal`` matters only in restart mode;
    GPUs asked only on srun lines; options newer releases refuse together."""
    out: list[str] = []
    if spec.mode == "native" and "signal" in opts.values:
        out.append(f"{opts.origin['signal']}: --signal ignored: an ElasticJob script leaves "
                   "on Slurm's SIGTERM at the next step boundary, with no checkpoint to write")
    if any(o.startswith("--cpus-per-gpu=") for o in spec.slot_options) and not spec.gpus_per_node:
        out.append(f"{spec.script}: --cpus-per-gpu without GPUs: Slurm 22.05 ignores it, "
                   "24.11 and later refuse the node slots (Requested cpus_per_tres)")
    if "gpus-per-task" in opts.values and not {"gpus", "ntasks"} & opts.values.keys():
        out.append(f"{opts.origin['gpus-per-task']}: --gpus-per-task without --gpus or "
                   "--ntasks: 24.11 and later refuse the node slots (without either --gpus "
                   "or -n/--ntasks)")
    if "gres" in opts.values and "gpus-per-node" in opts.values:
        out.append(f"{opts.origin['gpus-per-node']}: --gpus-per-node beside --gres=gpu: Slurm "
                   "26.05 refuses the node slots (mutually exclusive); give one of them")
    if plan is not None:
        out.extend(plan.warnings)
        if plan.srun_gpu_lines and not spec.gpus_per_node:
            lines = ",".join(map(str, plan.srun_gpu_lines))
            out.append(f"{spec.script}:{plan.srun_gpu_lines[0]}: srun asks for GPUs (line(s) "
                       f"{lines}) but the script's #SBATCH lines ask for none: the node "
                       "slots will hold no GPUs; add --gpus-per-node (or --gres=gpu:N)")
    return tuple(out)


def _tokenize(body: str, where: str) -> list[str]:
    """Split a directive as sbatch does (``get_argument``): words split at whitespace,
    quotes that group (``-J "my job"``), a backslash that makes the next character plain
    (``a\\ b``, ``\\#``), and an unquoted ``#`` that starts a comment (``#SBATCH
    --nodes=128   # total nodes``)."""
    tokens: list[str] = []
    cur: list[str] = []
    quote: str | None = None
    started = escape = False
    for ch in body:
        if escape:
            cur.append(ch)
            escape = False
        elif ch == "\\":
            escape = started = True
        elif quote:
            if ch == quote:
                quote = None
            else:
                cur.append(ch)
        elif ch in "\"'":
            quote = ch
            started = True
        elif ch in _SPACE:
            if started or cur:
                tokens.append("".join(cur))
                cur = []
                started = False
        elif ch == "#":
            break
        else:
            cur.append(ch)
    if quote:
        raise SpecError(f"{where}: unterminated quote")
    if started or cur:
        tokens.append("".join(cur))
    return tokens


def merge(directives: Options, command_line: Options) -> Options:
    """Command-line flags win over ``#SBATCH`` lines (sbatch's rule); problems add up."""
    values = dict(directives.values)
    origin = dict(directives.origin)
    values.update(command_line.values)
    origin.update(command_line.origin)
    return Options(values, origin, directives.warnings + command_line.warnings,
                   directives.problems + command_line.problems,
                   directives.slot + command_line.slot)


class _Collect:
    """Runs the checks of :func:`build_spec`, keeping every problem instead of the first."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.problems: list[str] = list(opts.problems)

    def where(self, key: str) -> str:
        return f"{self.opts.origin.get(key, 'command line')}: --{key}"

    def get(self, key: str, parse: Callable[[str, str], T]) -> T | None:
        """``parse(value, where)`` of option ``key``; None if absent or wrong (recorded)."""
        if key not in self.opts.values:
            return None
        try:
            return parse(self.opts.values[key], self.where(key))
        except SpecError as exc:
            self.problems.append(str(exc))
            return None

    def problem(self, key: str, message: str) -> None:
        self.problems.append(f"{self.where(key)}: {message}")


def _nodes(c: _Collect) -> tuple[int, int]:
    lo, hi = c.get("nodes", parse_nodes) or _nodes_from_tasks(c)
    lo = c.get("min-nodes", lambda t, w: positive_int(t, w, MAX_NODES_LIMIT)) or lo
    hi = c.get("max-nodes", lambda t, w: positive_int(t, w, MAX_NODES_LIMIT)) or hi
    if hi < lo:
        c.problem("max-nodes", f"{hi} is smaller than the minimum of {lo} nodes")
    return lo, hi


def _nodes_from_tasks(c: _Collect) -> tuple[int, int]:
    """No node count: sbatch's ``--ntasks`` at ``--ntasks-per-node`` fills that many nodes
    (``-n 4 --ntasks-per-node=2``: 2), else one."""
    v = c.opts.values
    total, per = v.get("ntasks", ""), v.get("ntasks-per-node", "")
    if total.isdigit() and per.isdigit() and int(per) > 0:
        n = max(1, math.ceil(int(total) / int(per)))
        return n, n
    return 1, 1


def _per_node(c: _Collect, total: int, key: str, nodes: tuple[int, int], what: str) -> int:
    """A whole-job count (``--ntasks``, ``--gpus``) per node: only for a fixed node count."""
    lo, hi = nodes
    if lo != hi or total % lo:
        c.problem(key, f"{total} {what} in all cannot be split over a changing number of "
                       f"nodes ({lo}-{hi}): give {what} per node instead")
        return 0
    return total // lo


def _gpus(c: _Collect, nodes: tuple[int, int], tasks: int | None) -> tuple[str | None, int]:
    """GPUs per node and their type, from whichever of sbatch's four ways the script used."""
    # --gpus-per-node wins over --gres=gpu (Slurm 22.05; 26.05 refuses the two together)
    for key, parse in (("gpus-per-node", option_values.gpu_count),
                       ("gres", option_values.gres_gpus)):
        got = c.get(key, parse)
        if got is not None and got[1]:
            return got
    got = c.get("gpus-per-task", option_values.gpu_count)
    if got is not None:
        return got[0], got[1] * (tasks or 1)
    got = c.get("gpus", option_values.gpu_count)
    if got is not None:
        return got[0], _per_node(c, got[1], "gpus", nodes, "GPUs")
    return None, 0


def _tasks(c: _Collect, nodes: tuple[int, int]) -> int | None:
    """Tasks per node: ``--ntasks-per-node`` (malletrain's ``--nproc-per-node``), else
    ``--ntasks`` over a fixed node count."""
    tasks = c.get("ntasks-per-node", lambda t, w: positive_int(t, w, 256))
    tasks = tasks or c.get("nproc-per-node", lambda t, w: positive_int(t, w, 256))
    if tasks is None and "ntasks" in c.opts.values:
        total = c.get("ntasks", lambda t, w: positive_int(t, w, 1 << 20))
        tasks = _per_node(c, total, "ntasks", nodes, "tasks") if total else None
    return tasks


def _tasks_from_gpus(c: _Collect, gpus: int) -> int | None:
    """Slurm's task count from the GPUs where no task count is given: ``--ntasks-per-gpu``
    tasks for each GPU, or one per ``--gpus-per-task`` GPUs of the node's."""
    per_gpu = c.get("ntasks-per-gpu", lambda t, w: positive_int(t, w, 256))
    per_task = (c.get("gpus-per-task", option_values.gpu_count) or (None, 0))[1]
    if per_task and not {"ntasks", "ntasks-per-node", "gpus", "nodes"} & set(c.opts.values):
        c.problem("gpus-per-task", "used without a task count (-n, --ntasks-per-node, "
                  "--nodes) or --gpus: sbatch refuses it")
    if per_gpu and gpus:
        return per_gpu * gpus
    return gpus // per_task if per_task and gpus and gpus % per_task == 0 else None


def build_spec(opts: Options, *, script: str, args: Sequence[str], cwd: str, python: str,
               default_name: str, plan: ScriptPlan | None = None) -> JobSpec:
    """Merged options -> a validated spec, or :class:`ScriptErrors` with every problem.

    ``plan``: a shell batch script's (restart mode). Its launch line then says how many
    workers a node runs when it states a number; ``--ntasks-per-node`` counts srun tasks."""
    c = _Collect(opts)
    v = opts.values
    nodes = _nodes(c)
    time_s = c.get("time", option_values.time)
    tasks = _tasks(c, nodes)
    gpu_type, gpus = _gpus(c, nodes, tasks)
    tasks = tasks or _tasks_from_gpus(c, gpus)
    export, env = c.get("export", parse_export) or ("ALL", {})
    chdir = v.get("chdir", cwd)
    if not chdir.startswith("/"):
        chdir = cwd.rstrip("/") + "/" + chdir
    slot = tuple(opts.slot) + ((f"--gres={v['gres']}",) if "gres" in v and gpus else ())
    stop_signal, grace, shell_only = (
        (c.get("signal", option_values.stop_signal) or ("TERM", 0, False)) if plan
        else ("TERM", 0, False))
    target = c.get("rate-target", option_values.rate)
    exclude = c.get("exclude", option_values.exclude) or ()
    dependency = c.get("dependency", option_values.dependency)
    array = c.get("array", option_values.array)
    nice = c.get("nice", option_values.nice) or 0
    workers = tasks or gpus or 1
    if plan is not None:
        launch = plan.launch
        workers = (declared_workers(launch) if launch else None) or gpus or (
            tasks if (launch is None or launch.kind == "srun-python") and tasks else 1)
    spec = None
    if not c.problems:
        try:
            spec = JobSpec(
                script=script, args=tuple(args), name=v.get("job-name", default_name),
                min_nodes=nodes[0], max_nodes=nodes[1], time_limit_s=time_s,
                gpus_per_node=gpus, gpu_type=gpu_type, nproc_per_node=workers,
                output=v.get("output"), error=v.get("error"), chdir=chdir, export=export,
                environment=env, account=v.get("account"), qos=v.get("qos"), nice=nice,
                kind=v.get("kind", _kind_of(script)), python=python,
                launcher=v.get("launcher", "srun"), slot_options=slot,
                mode="restart" if plan else "native",
                stop_signal=stop_signal, stop_grace_s=grace, stop_shell_only=shell_only,
                rate_target=target, exclude=exclude,
                tasks_per_node=tasks if plan is not None else None,
                dependency=dependency, array=array,
                array_task_id=parse_array(array).task_ids[0] if array else None)
        except SpecError as exc:
            c.problems.append(str(exc))
    if spec is None:
        raise ScriptErrors(c.problems)
    return spec


def _kind_of(script: str) -> str:
    base = script.rsplit("/", 1)[-1]
    cleaned = re.sub(r"[^A-Za-z0-9_.+-]", "_", base)[:64]
    return cleaned or "default"
