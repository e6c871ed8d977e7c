"""Just enough of the shell's grammar to find a launch line in a real batch script. Pure.

Real scripts seldom write the launcher on the launch line itself. They build it in
variables and run it through ``bash -c`` so that ``\\$SLURM_PROCID`` is expanded on each node
(BigScience's, ml-engineering's, Hugging Face's recipes)::

    export LAUNCHER="python -u -m torch.distributed.run --nproc_per_node $GPUS_PER_NODE ..."
    srun $SRUN_ARGS --jobid $SLURM_JOB_ID bash -c "$LAUNCHER --node_rank \\$SLURM_PROCID $CMD"

To see which launcher such a line runs, and how many workers it starts per node, this module
splits a line into its simple commands and expands variables from the script's own plain
assignments (``NAME=value``, ``export NAME=value``; ``${NAME:-default}``). That is a static
reading, used only to recognise the line and show it in ``--test-only``: on the node the
shell itself expands the line as written, and ``bash -c`` strings are run by bash.
"""

from __future__ import annotations

import re
import shlex

_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
#: ``NAME=( ... )``, ``NAME+=( ... )``, ``declare -a NAME=( ... )``: a bash array
_ARRAY = re.compile(
    r"^\s*(?:(?:declare|local|typeset)\s+-[aA-Za-z]*\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)\)\s*$",
    re.DOTALL)
_ARRAY_START = re.compile(
    r"^\s*(?:(?:declare|local|typeset)\s+-[aA-Za-z]*\s+)?[A-Za-z_][A-Za-z0-9_]*\+?=\(")
#: ``"${NAME[@]}"`` (quoted or not; ``[*]`` too): every element of an array
_ARRAY_USE = re.compile(
    r'"\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}"|\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}')
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_SEPARATORS = (";", "&&", "||", "|", "&")
#: where a command starts: after indentation, ``VAR=value`` words and ``exec``
_COMMAND_START = re.compile(
    r"""^(\s*(?:[A-Za-z_][A-Za-z0-9_]*=(?:"[^"]*"|'[^']*'|[^\s"'])*\s+)*)(exec\s+)?""")
#: a value that is a command substitution: only the shell can know it (``$((`` is arithmetic)
_SUBSTITUTION = re.compile(r"^\s*[\"']?(\$\((?!\()|`)")
SHELLS = ("bash", "sh", "zsh", "ksh", "dash")


def open_quote(line: str) -> bool:
    """Whether ``line`` ends inside a quoted string (it goes on on the next line)."""
    return _scan(line)[1]


def open_array(line: str) -> bool:
    """Whether ``line`` starts a bash array its own line does not close (``ARGS=(`` alone)."""
    if not _ARRAY_START.match(line):
        return False
    code = "\n".join(without_comment(part) for part in line.split("\n"))
    unquoted = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", "", code)
    return unquoted.count("(") > unquoted.count(")")


def without_comment(line: str) -> str:
    """``line`` up to an unquoted ``#`` that starts a word (a comment runs to the line's end)."""
    return line[:_scan(line)[2]]


def segments(line: str) -> list[tuple[int, str]]:
    """(offset, text) of each simple command of a line: split at ``;``, ``&&``, ``||``,
    ``|`` and ``&`` outside quotes (``2>&1`` and ``>&2`` are redirections, not separators)."""
    return _scan(line)[0]


def _scan(line: str) -> tuple[list[tuple[int, str]], bool, int]:
    """The simple commands of ``line``, whether it ends inside quotes, and where its code
    ends (at a comment, or at the line's end)."""
    out: list[tuple[int, str]] = []
    start, i, quote, depth = 0, 0, "", 0  # depth: inside $( ... ), whose | is its own
    while i < len(line):
        c = line[i]
        if not quote and line.startswith("$(", i):
            depth += 1
            i += 2
            continue
        if depth and not quote and c in "()":
            depth += 1 if c == "(" else -1
        elif quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            break  # a comment runs to the end of the line
        elif not depth:
            sep = next((s for s in _SEPARATORS if line.startswith(s, i)), None)
            redirect = c == "&" and (line[i - 1:i] in (">", "<") or line[i + 1:i + 2] == ">")
            if sep and not redirect:
                out.append((start, line[start:i]))
                i += len(sep)
                start = i
                continue
        i += 1
    out.append((start, line[start:i]))
    return [(off, text) for off, text in out if text.strip()], bool(quote), i


def _split(text: str) -> list[str] | None:
    """Words as the shell splits them; a ``$( ... )`` or ``$(( ... ))`` stays one word."""
    lex = shlex.shlex(_glue_substitutions(text), posix=True)
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        return [word.replace(_GLUE, " ") for word in lex]
    except ValueError:
        return None


_GLUE = "\x00"  # stands for a space inside $( ... ) while shlex splits the words


def _glue_substitutions(text: str) -> str:
    """``text`` with the whitespace inside each unquoted ``$( ... )`` replaced by
    :data:`_GLUE`, so that ``--gpus $(( N * 4 ))`` is two words, not six."""
    out, depth, quote, i = [], 0, "", 0
    while i < len(text):
        c = text[i]
        if not depth and quote:
            quote = "" if c == quote else quote
        elif not depth and c in "'\"":
            quote = c
        elif not quote and text.startswith("$(", i):
            depth += 1
            out.append("$(")
            i += 2
            continue
        elif depth and c in "()":
            depth += 1 if c == "(" else -1
        out.append(_GLUE if depth and c in " \t\n" else c)
        i += 1
    return "".join(out)


def words(command: str) -> list[str] | None:
    """A simple command as words, leading ``VAR=value``, ``exec``, ``time [-p]``, ``nohup``
    and ``command`` dropped (None: not a command shlex can read, e.g. an unterminated
    quote)."""
    out = _split(command)
    if out is None:
        return None
    while out and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", out[0]):
        out.pop(0)
    while out and out[0] in ("exec", "time", "nohup", "command", "-p"):
        out.pop(0)
    return out


def expand(text: str, variables: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced from ``variables``; ``\\$``
    is kept as ``$``. A name the script does not set is left as written (``${NAME:-x}``: its
    default): it is set at run time (``$SLURM_PROCID``, ``$MASTER_ADDR=$(...)``)."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        return m.group(2) if m.group(2) is not None else m.group(0)

    def elements(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return variables.get(f"{name}[@]", m.group(0))

    parts = _ARRAY_USE.sub(elements, text).split("\\$")
    return "$".join(_VAR.sub(one, p) for p in parts)


def assign(line: str, variables: dict[str, str]) -> None:
    """Apply ``line`` to ``variables`` if it is a plain assignment (``NAME=value``,
    ``export NAME=value``): its value unquoted and expanded with the variables before it, as
    the shell does. A value that is a command substitution (``$(hostname)``) is not known
    statically: the name is left out. One inside a longer value is kept as written."""
    line = "\n".join(without_comment(part) for part in line.split("\n"))
    array = _ARRAY.match(line)
    if array:
        _assign_array(array, variables)
        return
    m = _ASSIGN.match(line)
    if not m or _SUBSTITUTION.search(m.group(2)):
        return
    value = _split(m.group(2))
    if value is not None and len(value) <= 1:
        variables[m.group(1)] = expand(value[0] if value else "", variables)


def _assign_array(m: re.Match[str], variables: dict[str, str]) -> None:
    """A bash array's elements, kept as one shell-quoted string under ``NAME[@]`` so that
    ``"${NAME[@]}"`` expands to them word for word (``NAME+=(...)`` appends). Comments inside
    the parentheses are dropped, as bash drops them."""
    body = "\n".join(without_comment(line) for line in m.group(3).split("\n"))
    elements = _split(expand(body, variables))
    if elements is None:
        return
    key = f"{m.group(1)}[@]"
    before = variables.get(key, "") if m.group(2) else ""
    variables[key] = " ".join(filter(None, [before, shlex.join(elements)]))


def resolved_commands(command: str, variables: dict[str, str]) -> list[list[str]]:
    """The words of each command a simple command runs, as the static reading sees them:
    variables expanded; the string of ``bash -c STRING`` (after ``srun`` options) or of
    ``eval STRING`` read as the commands it runs, each with the words before the string
    (``srun ... bash -c "source env.sh; torchrun ..."`` gives ``srun ... source env.sh``
    and ``srun ... torchrun ...``)."""
    first = words(expand(command, variables))
    if first is None:
        return []
    if first and first[0] == "eval":
        return _inner_commands(" ".join(first[1:]), [], variables)
    for i in range(len(first)):
        at = shell_string(first[i:])
        if at is not None:
            return _inner_commands(first[i + at], first[:i], variables)
    return [first] if first else []


def _inner_commands(text: str, before: list[str], variables: dict[str, str]
                    ) -> list[list[str]]:
    """The commands of a shell string, one per line and separator, each after ``before``;
    the string's own assignments apply to the commands after them."""
    scope = dict(variables)
    out = []
    for line in text.replace("\\\n", " ").split("\n"):
        for _, segment in segments(line):
            inner = words(expand(segment, scope))
            if inner:
                out.append(before + inner)
            assign(segment, scope)
    return out


def prefix_command(command: str, prefix: str) -> str:
    """``command`` with ``prefix`` put before its program (after ``VAR=value`` and ``exec``),
    so that the shell still applies those assignments to it."""
    m = _COMMAND_START.match(command)
    assert m is not None  # the pattern matches every string
    return m.group(1) + prefix + command[m.end():]


#: a shell's long options that take the next word as their value
_SHELL_LONG_WITH_VALUE = ("--rcfile", "--init-file")


def shell_string(cmd: list[str] | tuple[str, ...]) -> int | None:
    """Index of the STRING of ``bash -c STRING ...`` at the start of ``cmd`` (None: not one).

    Read as the shell reads its own options: ``-c`` may stand in a cluster (``bash -lc``,
    ``sh -xeuc``) or beside others (``bash -l -c``, ``bash --login -c``, ``bash -c -x``);
    ``-o``/``+o``/``-O`` take the next word (``bash -euo pipefail -c``); the command string
    is the first word that is not an option."""
    if not cmd or cmd[0].rsplit("/", 1)[-1] not in SHELLS:
        return None
    i, has_c = 1, False
    while i < len(cmd) and cmd[i][:1] in "-+" and len(cmd[i]) > 1:
        word = cmd[i]
        i += 1
        if word == "--":
            break
        if word.startswith("--"):
            i += word in _SHELL_LONG_WITH_VALUE
            continue
        has_c = has_c or (word[0] == "-" and "c" in word)
        i += sum(word.count(x) for x in "oO")  # each takes the next word
    return i if has_c and i < len(cmd) else None
