"""A shell batch script in restart mode: its launch line found, the node's copy rendered.

Pure. The same :func:`analyse` runs at ``malletrain submit`` (so a script without a
runnable launch line is refused there, as ``FILE:LINE:`` messages) and in the node agent,
on the text the slot carries, so both agree on the line.

The rendered copy differs from the user's script in one place only: the launch line's
command is prefixed with ``"$MALLETRAIN_PYTHON" -m malletrain.elastic.restart.launch``.
The shell still expands the line's variables, quotes and ``$(...)`` as written, and the
launcher receives the evaluated argument list (no shell string is ever built); line numbers
in the shell's error messages stay the user's.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from malletrain.elastic.restart.launchers import launcher_kind, program_name, split_srun

#: the environment variable a slot carries the user's script text in (the agent reads it,
#: then removes it from what the user's processes see)
SCRIPT_ENV = "MALLETRAIN_SCRIPT_TEXT"
LAUNCH_PREFIX = '"$MALLETRAIN_PYTHON" -m malletrain.elastic.restart.launch '
#: where the command of a line starts: after indentation, ``VAR=value`` words and ``exec``
_COMMAND_START = re.compile(
    r"""^(\s*(?:[A-Za-z_][A-Za-z0-9_]*=(?:"[^"]*"|'[^']*'|[^\s"'])*\s+)*)(exec\s+)?""")
_SHELLS = ("bash", "sh", "zsh", "ksh", "dash")
_MPI = ("mpirun", "mpiexec", "orterun")


@dataclass(frozen=True)
class LaunchLine:
    lineno: int  # the line it starts on (1-based)
    kind: str  # torchrun, srun-python, accelerate, deepspeed
    words: tuple[str, ...]  # as written, unexpanded (for --test-only)


@dataclass(frozen=True)
class ScriptPlan:
    interpreter: tuple[str, ...]  # from the #! line
    launch: LaunchLine


def is_shell_script(text: str) -> bool:
    first = text.split("\n", 1)[0].strip()
    if not first.startswith("#!"):
        return False
    words = first[2:].split()
    names = [program_name(w) for w in words[:2]]
    return any(n in _SHELLS for n in names)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each command line: backslash continuations joined,
    here-document bodies skipped (they are data, not commands)."""
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
        while buf.endswith("\\") and i + 1 < len(lines):
            i += 1
            buf = buf[:-1] + " " + lines[i]
        m = re.search(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)", buf)
        if m:
            heredoc = m.group(1)
        out.append((start, buf))
        i += 1
    return out


def _words(line: str) -> list[str] | None:
    """The line's first simple command as words (None: not a line shlex can read)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    words: list[str] = []
    try:
        for tok in lex:
            if tok and all(c in "();<>|&" for c in tok):
                break
            words.append(tok)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    if words and words[0] == "exec":
        words.pop(0)
    return words


def find_launch(text: str, path: str) -> tuple[LaunchLine | None, list[str]]:
    """The one launch line of a script, and every problem found."""
    found: list[LaunchLine] = []
    problems: list[str] = []
    for lineno, line in logical_lines(text):
        if lineno == 1 or line.lstrip().startswith("#"):
            continue
        words = _words(line)
        if not words:
            continue
        _, cmd = split_srun(words)
        if cmd and program_name(cmd[0]) in _MPI:
            problems.append(f"{path}:{lineno}: {program_name(cmd[0])}: MPI launches cannot change "
                            "size; use torchrun or srun python")
            continue
        kind = launcher_kind(cmd, under_srun=program_name(words[0]) == "srun")
        if kind is not None:
            found.append(LaunchLine(lineno, kind, tuple(words)))
    if not found and not problems:
        problems.append(f"{path}:1: no launch line: restart mode runs the one line that starts "
                        "training (srun torchrun ..., torchrun ..., srun python ..., "
                        "accelerate launch ..., deepspeed ..., python -m "
                        "torch.distributed.run ...)")
    for extra in found[1:]:
        problems.append(f"{path}:{extra.lineno}: a second launch line (the first is line "
                        f"{found[0].lineno}): restart mode restarts one launch per node")
    return (found[0] if found else None), problems


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


def analyse(text: str, path: str) -> tuple[ScriptPlan | None, list[str]]:
    """A shell batch script -> its plan, or the ``FILE:LINE:`` problems that refuse it."""
    first = text.split("\n", 1)[0].strip()
    interpreter = tuple(first[2:].split()) if first.startswith("#!") else ()
    launch, problems = find_launch(text, path)
    if not interpreter:
        problems.insert(0, f"{path}:1: no #! line: a batch script starts with its "
                           "interpreter, e.g. #!/bin/bash")
    if launch is None or problems:
        return None, problems
    return ScriptPlan(interpreter, launch), []


def render(text: str, plan: ScriptPlan) -> str:
    """The script a node runs: the user's, with the launch line's command prefixed."""
    lines = text.split("\n")
    i = plan.launch.lineno - 1
    m = _COMMAND_START.match(lines[i])
    assert m is not None  # the pattern matches every string
    lines[i] = m.group(1) + LAUNCH_PREFIX + lines[i][m.end():]
    return "\n".join(lines)
