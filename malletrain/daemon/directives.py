"""``#SBATCH`` directives and `malletrain submit` flags -> a :class:`~.spec.JobSpec`.

Why it reads like sbatch: an existing batch script becomes malleable by changing one word
(``sbatch`` -> ``malletrain submit``). So the script's ``#SBATCH`` lines are read the way
sbatch reads them (after the ``#!`` line, up to the first line that is neither blank nor a
comment), and command-line flags win over them.

Why it refuses so much: slot jobs are placed, timed, signalled and requeued by the daemon,
so options that fight that (``--nodelist``, ``--dependency``, ``--signal``, ``--no-requeue``,
``--array``, ``--hold``, ``--uid`` ...) are rejected with a clear error naming the file, the
line and the option, never silently ignored. ``--partition`` and ``--exclusive`` are accepted
and ignored (slots always run exclusive in the scavenger partition), so unchanged batch
scripts still work; the caller gets a warning for each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from malletrain.daemon.spec import (
    MAX_NODES_LIMIT,
    JobSpec,
    SpecError,
    parse_export,
    parse_nodes,
    parse_time_s,
    positive_int,
)

#: option -> canonical key. Short forms are sbatch's.
_ALIASES = {
    "-J": "job-name", "--job-name": "job-name",
    "-N": "nodes", "--nodes": "nodes",
    "--min-nodes": "min-nodes", "--max-nodes": "max-nodes",
    "-t": "time", "--time": "time",
    "--gpus-per-node": "gpus-per-node",
    "--ntasks-per-node": "ntasks-per-node", "--nproc-per-node": "ntasks-per-node",
    "-o": "output", "--output": "output",
    "-e": "error", "--error": "error",
    "-D": "chdir", "--chdir": "chdir",
    "--export": "export",
    "-A": "account", "--account": "account",
    "-p": "partition", "--partition": "partition",
    "--exclusive": "exclusive",
    "--kind": "kind",
    "--launcher": "launcher",
}


#: options accepted for compatibility and ignored (with a warning saying why).
IGNORED = {
    "partition": "malleable jobs run their node slots in the scavenger partition",
    "exclusive": "node slots always hold a whole node",
}


#: options that have no value.
_FLAGS = {"exclusive"}


#: options refused, with why.
REFUSED = {
    "--nodelist": "the daemon chooses the nodes", "-w": "the daemon chooses the nodes",
    "--exclude": "not supported for malleable jobs", "-x": "not supported for malleable jobs",
    "--dependency": "not supported for malleable jobs", "-d": "not supported for malleable jobs",
    "--signal": "malletrain's workers leave on Slurm's SIGTERM",
    "--requeue": "the daemon requeues node slots itself",
    "--no-requeue": "node slots must be requeueable",
    "--array": "submit one malleable job instead", "-a": "submit one malleable job instead",
    "--hold": "the daemon holds and releases node slots", "-H": "the daemon holds and releases",
    "--uid": "jobs always run as the submitting user", "--gid": "jobs run as the user",
    "--wrap": "give a script", "--begin": "not supported", "-b": "not supported",
    "--deadline": "not supported", "--reservation": "not supported",
    "--qos": "the administrator sets the scavenger QOS", "-q": "the scavenger QOS is set",
    "--time-min": "the daemon sets each slot's time", "--ntasks": "use --ntasks-per-node",
    "-n": "use --ntasks-per-node", "--get-user-env": "not supported",
    "--comment": "malletrain tags node slots with the comment",
    "--container": "not supported", "--propagate": "not supported",
}


@dataclass(frozen=True)
class Options:
    """Raw option values (strings) as read from directives or the command line."""

    values: Mapping[str, str]
    #: where each value came from, for error messages ("script.py:3" or "command line").
    origin: Mapping[str, str]
    warnings: tuple[str, ...] = ()


def _split_option(token: str) -> tuple[str, str | None]:
    if token.startswith("--"):
        opt, sep, value = token.partition("=")
        return opt, (value if sep else None)
    if token.startswith("-") and len(token) > 2:
        return token[:2], token[2:]
    return token, None


def parse_option_tokens(tokens: Sequence[str], where: str) -> Options:
    """``["-N", "2-4", "--time=30"]`` -> Options. Refused/unknown options raise SpecError."""
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    warnings: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-"):
            raise SpecError(f"{where}: {token!r} is not an option")
        opt, value = _split_option(token)
        if opt in REFUSED:
            raise SpecError(f"{where}: {opt} is not allowed for a malleable job ({REFUSED[opt]})")
        key = _ALIASES.get(opt)
        if key is None:
            raise SpecError(f"{where}: unknown option {opt} (malletrain submit --help lists the "
                            "supported ones)")
        if key in _FLAGS:
            if value is not None:
                raise SpecError(f"{where}: {opt} takes no value")
            value = ""
        elif value is None:
            if i + 1 >= len(tokens):
                raise SpecError(f"{where}: {opt} needs a value")
            i += 1
            value = tokens[i]
        if key in IGNORED:
            warnings.append(f"{where}: {opt} ignored: {IGNORED[key]}")
        values[key] = value
        origin[key] = where
        i += 1
    return Options(values, origin, tuple(warnings))


def read_directives(script_text: str, path: str) -> Options:
    """The ``#SBATCH`` options of a script, read like sbatch does.

    sbatch stops at the first line that is not blank and not a comment; so does this.
    Later directives win over earlier ones, like later command-line options.
    """
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    warnings: list[str] = []
    for lineno, raw in enumerate(script_text.splitlines(), start=1):
        line = raw.strip()
        if lineno == 1 and line.startswith("#!"):
            continue
        if not line:
            continue
        if not line.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        rest = line[len("#SBATCH"):]
        if rest and not rest[0].isspace():
            continue  # e.g. "#SBATCHX": not a directive, like sbatch
        # sbatch allows a trailing comment after the options
        body = rest.split(" #", 1)[0].strip()
        if not body:
            continue
        tokens = _tokenize(body, f"{path}:{lineno}")
        opts = parse_option_tokens(tokens, f"{path}:{lineno}")
        values.update(opts.values)
        origin.update(opts.origin)
        warnings.extend(opts.warnings)
    return Options(values, origin, tuple(warnings))


def _tokenize(body: str, where: str) -> list[str]:
    """Split a directive like a shell would, for the simple quoting sbatch accepts."""
    tokens: list[str] = []
    cur: list[str] = []
    quote: str | None = None
    started = False
    for ch in body:
        if quote:
            if ch == quote:
                quote = None
            else:
                cur.append(ch)
        elif ch in "\"'":
            quote = ch
            started = True
        elif ch.isspace():
            if started or cur:
                tokens.append("".join(cur))
                cur = []
                started = False
        else:
            cur.append(ch)
    if quote:
        raise SpecError(f"{where}: unterminated quote")
    if started or cur:
        tokens.append("".join(cur))
    return tokens


def merge(directives: Options, command_line: Options) -> Options:
    """Command-line flags win over ``#SBATCH`` lines (sbatch's rule)."""
    values = dict(directives.values)
    origin = dict(directives.origin)
    values.update(command_line.values)
    origin.update(command_line.origin)
    return Options(values, origin, directives.warnings + command_line.warnings)


def build_spec(
    opts: Options,
    *,
    script: str,
    args: Sequence[str],
    cwd: str,
    python: str,
    default_name: str,
) -> JobSpec:
    """Turn merged options into a validated spec; errors name where the bad value came from."""
    v = opts.values

    def where(key: str) -> str:
        return opts.origin.get(key, "command line")

    min_nodes = max_nodes = 1
    if "nodes" in v:
        min_nodes, max_nodes = parse_nodes(v["nodes"], f"{where('nodes')}: --nodes")
    if "min-nodes" in v:
        min_nodes = positive_int(v["min-nodes"], f"{where('min-nodes')}: --min-nodes",
                                  MAX_NODES_LIMIT)
    if "max-nodes" in v:
        max_nodes = positive_int(v["max-nodes"], f"{where('max-nodes')}: --max-nodes",
                                  MAX_NODES_LIMIT)
    if max_nodes < min_nodes:
        raise SpecError(f"--max-nodes {max_nodes} is smaller than --min-nodes {min_nodes}")
    time_s = parse_time_s(v["time"], f"{where('time')}: --time") if "time" in v else None
    gpus = 0
    if "gpus-per-node" in v:
        text = v["gpus-per-node"].split(":")[-1]  # "a100:4" -> 4
        gpus = positive_int(text, f"{where('gpus-per-node')}: --gpus-per-node", 64)
    nproc = gpus or 1
    if "ntasks-per-node" in v:
        nproc = positive_int(v["ntasks-per-node"],
                              f"{where('ntasks-per-node')}: --ntasks-per-node", 256)
    export: str = "ALL"
    env: dict[str, str] = {}
    if "export" in v:
        export, env = parse_export(v["export"], f"{where('export')}: --export")
    chdir = v.get("chdir", cwd)
    if not chdir.startswith("/"):
        chdir = cwd.rstrip("/") + "/" + chdir
    name = v.get("job-name", default_name)
    try:
        return JobSpec(
            script=script, args=tuple(args), name=name, min_nodes=min_nodes,
            max_nodes=max_nodes, time_limit_s=time_s, gpus_per_node=gpus, nproc_per_node=nproc,
            output=v.get("output"), error=v.get("error"), chdir=chdir, export=export,
            environment=env, account=v.get("account"), kind=v.get("kind", _kind_of(script)),
            python=python, launcher=v.get("launcher", "srun"),
        )
    except SpecError as exc:
        raise SpecError(str(exc)) from None


def _kind_of(script: str) -> str:
    base = script.rsplit("/", 1)[-1]
    cleaned = re.sub(r"[^A-Za-z0-9_.+-]", "_", base)[:64]
    return cleaned or "default"
