"""A shell batch script in restart mode, read before it runs: its launch lines. Pure.

The script runs as written (one batch shell per generation, :mod:`.agent`); nothing here
changes it. ``malletrain submit`` reads it to say what it will start (``--test-only``: the
launcher, the workers per node a line states) and to refuse what cannot run at a changing
size (an MPI launch). A script with no launcher malletrain recognises runs too, with a
warning: its steps still reach the generation's nodes through ``srun``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from malletrain.elastic.restart import shellwords as sh
from malletrain.elastic.restart.launchers import (
    launcher_kind,
    program_name,
    split_srun,
)

#: the environment variable a slot carries the user's script text in (the agent reads it,
#: then removes it from what the user's processes see)
SCRIPT_ENV = "MALLETRAIN_SCRIPT_TEXT"
_MPI = ("mpirun", "mpiexec", "orterun")


@dataclass(frozen=True)
class LaunchLine:
    lineno: int  # the line it starts on (1-based)
    kind: str  # torchrun, srun-python, accelerate, deepspeed
    #: the command as the static reading sees it: the script's variables expanded, a
    #: ``bash -c`` string read as the command it runs (for --test-only and the worker count)
    words: tuple[str, ...]
    offset: int = 0  # where the command starts in its line (after ``clear;`` and the like)


@dataclass(frozen=True)
class ScriptPlan:
    interpreter: tuple[str, ...]  # from the #! line
    launch: LaunchLine | None  # the first launch line, if the script has one
    #: the script's other launch lines
    alternatives: tuple[LaunchLine, ...] = ()
    warnings: tuple[str, ...] = ()
    #: lines whose ``srun`` asks for GPUs (the node slots must hold them)
    srun_gpu_lines: tuple[int, ...] = ()


def interpreter_name(first_line: str) -> str:
    """The program a ``#!`` line runs: ``#!/usr/bin/env -S bash -e`` -> ``bash``."""
    words = first_line.strip()[2:].split() if first_line.strip().startswith("#!") else []
    if words and program_name(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return program_name(words[0]) if words else ""


def is_shell_script(text: str) -> bool:
    return interpreter_name(text.split("\n", 1)[0]) in sh.SHELLS


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each command line: backslash continuations, quoted
    strings and bash arrays over several lines joined, here-document bodies skipped (data,
    not commands)."""
    out: list[tuple[int, str]] = []
    lines = text.split("\n")
    i = 0
    heredoc: str | None = None
    while i < len(lines):
        start, buf = i + 1, lines[i]
        if heredoc is not None:
            if buf.strip() == heredoc:
                heredoc = None
            i += 1
            continue
        # a comment's backslash continues nothing (``# srun ... \`` is one line)
        while i + 1 < len(lines) and (sh.without_comment(buf).endswith("\\")
                                       or sh.open_quote(buf) or sh.open_array(buf)):
            i += 1
            buf = buf[:-1] + " " + lines[i] if buf.endswith("\\") else buf + "\n" + lines[i]
        # a here-document (not a here-string ``<<<``, not in a comment)
        m = re.search(r"(?<!<)<<-?(?!<)\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)", buf)
        if m and not buf.lstrip().startswith("#"):
            heredoc = m.group(1)
        if i + 1 == len(lines) and buf.endswith("\\") and not buf.endswith("\\\\"):
            buf = buf[:-1]  # a continuation at the end of the file continues nothing
        out.append((start, buf))
        i += 1
    return out


def commands(text: str, environment: Mapping[str, str] | None = None
             ) -> Iterator[tuple[int, int, list[str]]]:
    """(line, offset, words) of each simple command of a script, its words read with the
    variables the script set before it (:mod:`.shellwords`), on top of ``environment`` (what
    Slurm sets in the batch shell: ``SLURM_GPUS_PER_NODE``...): ``srun bash -c "$LAUNCHER
    ... $CMD"`` is seen as the launcher it runs. Comments and the ``#!`` line are skipped."""
    variables = dict(environment or {})  # as they stand before the line read (one pass)
    for lineno, line in logical_lines(text):
        if lineno == 1 or line.lstrip().startswith("#"):
            continue
        for offset, command in sh.segments(line):
            command = _after_keyword(command)
            for words in sh.resolved_commands(command, variables) if command.strip() else ():
                yield lineno, offset, words
        sh.assign(line, variables)


def find_launch(text: str, path: str, environment: Mapping[str, str] | None = None
                ) -> tuple[list[LaunchLine], list[str]]:
    """The launch lines of a script, and every problem found."""
    found: list[LaunchLine] = []
    problems: list[str] = []
    for lineno, offset, words in commands(text, environment):
        launch, problem = _launch_in(words, path, lineno, offset)
        if problem:
            problems.append(problem)
        elif launch is not None:
            found.append(launch)
    return found, problems


def mpi_lines(text: str) -> list[tuple[int, str]]:
    """(line, launcher) of each MPI launch (``mpirun``, ``mpiexec``, ``srun mpirun``)."""
    out = []
    for lineno, _, words in commands(text):
        _, cmd = split_srun(words)
        if cmd and program_name(cmd[0]) in _MPI:
            out.append((lineno, program_name(cmd[0])))
    return out


def srun_gpu_lines(text: str) -> tuple[int, ...]:
    """Lines whose ``srun`` asks for GPUs (``--gpus-per-task=1``, ``--gres=gpu:4``, ``-G
    8``): Slurm gives them only where the node slots hold GPUs."""
    return tuple(sorted({lineno for lineno, _, words in commands(text)
                         if _srun_asks_gpus(words)}))


def _srun_asks_gpus(words: list[str]) -> bool:
    """``srun --gpus-per-task=1 ...``, ``srun --gres=gpu:4``, ``srun -G 8``: GPUs asked for
    on the step, which Slurm can only give where the node slots hold them."""
    srun, _ = split_srun(words)
    return any(k in ("--gpus-per-task", "--gpus-per-node", "--gpus", "-G") or
               (k == "--gres" and "gpu" in v) for k, v in srun.items())


def _after_keyword(command: str) -> str:
    """The command after a compound command's keyword (``then torchrun ...``, ``else ...``,
    ``do ...``); "" for ``if``/``elif`` conditions and ``fi``, else the command itself."""
    word, _, rest = command.strip().partition(" ")
    if word in ("if", "elif", "fi"):
        return ""
    return rest if word in ("then", "else", "do") else command


def _launch_in(words: list[str], path: str, lineno: int, offset: int
               ) -> tuple[LaunchLine | None, str | None]:
    _, cmd = split_srun(words)
    kind = launcher_kind(cmd, under_srun=program_name(words[0]) == "srun")
    if kind is None:
        return None, None
    return LaunchLine(lineno, kind, tuple(words), offset), None


def declared_workers(launch: LaunchLine) -> int | None:
    """Worker processes per node the launch line states as a literal number, if it does
    (``--nproc_per_node 4``, ``srun --ntasks-per-node=4 python``, ``--num_gpus 4``)."""
    srun, cmd = split_srun(launch.words)
    names = {"torchrun": ("--nproc-per-node",), "deepspeed": ("--num-gpus",),
             "srun-python": ()}.get(launch.kind, ())
    value = srun.get("--ntasks-per-node") if launch.kind == "srun-python" else None
    for i, word in enumerate(cmd):
        name, eq, text = word.partition("=")
        if name.replace("_", "-") in names:
            value = text if eq else (cmd[i + 1] if i + 1 < len(cmd) else None)
            break
    return int(value) if value and value.isdigit() and 0 < int(value) <= 256 else None


def analyse(text: str, path: str, environment: Mapping[str, str] | None = None
            ) -> tuple[ScriptPlan | None, list[str]]:
    """A shell batch script -> its plan, or the ``FILE:LINE:`` problems that refuse it.
    ``environment``: what Slurm sets in the batch shell, as the job's options say."""
    first = text.split("\n", 1)[0].strip()
    interpreter = tuple(first[2:].split()) if first.startswith("#!") else ()
    launches, problems = find_launch(text, path, environment)
    if not interpreter:
        problems.insert(0, f"{path}:1: no #! line: a batch script starts with its "
                           "interpreter, e.g. #!/bin/bash")
    if problems:
        return None, problems
    warnings = [f"{path}:{ln}: {name}: an MPI launcher starts its remote processes through "
                "srun, which reaches the job's current nodes; not tested with malletrain"
                for ln, name in mpi_lines(text)]
    if not launches:
        warnings.append(
            f"{path}:1: no launcher malletrain recognises (srun torchrun, torchrun, srun "
            "python, accelerate launch, deepspeed, python -m torch.distributed.run): the "
            "script runs as written, its srun steps on the job's current nodes; workers per "
            "node counted as its GPUs per node, else its --ntasks-per-node, else 1")
    return ScriptPlan(interpreter, launches[0] if launches else None, tuple(launches[1:]),
                      tuple(warnings), srun_gpu_lines(text)), []
