"""``malletrain submit``'s sbatch options: the ones it documents, and every other option of
sbatch (and of the SPANK plugins sites add) too, so that a user overrides a script's
``#SBATCH`` lines on the command line as with sbatch (``-p``, ``--gpus-per-task``,
``--mem-per-gpu``...). All of them are handed on as ``--opt=value`` tokens to the same
table as the ``#SBATCH`` lines (:func:`~malletrain.daemon.jobs.sbatch_options.parse_option_tokens`),
which reads, warns about, passes to the slots or refuses each one.
"""

from __future__ import annotations

import argparse

from malletrain.daemon.jobs.sbatch_options import RULE_TABLE, SPANK_FLAGS, SPANK_OPTIONS


def add_job_options(sub: argparse.ArgumentParser) -> None:
    """The sbatch-like options of ``submit`` (each also read from ``#SBATCH`` lines)."""
    sub.add_argument("-J", "--job-name")
    sub.add_argument("-N", "--nodes", help="node count range MIN[-MAX]")
    sub.add_argument("--min-nodes", type=str)
    sub.add_argument("--max-nodes", type=str)
    sub.add_argument("-t", "--time", help="total wall time (Slurm formats)")
    sub.add_argument("--gpus-per-node", help="[TYPE:]N GPUs on every node")
    sub.add_argument("--gres", help="generic resources per node, e.g. gpu:a100:4")
    sub.add_argument("-G", "--gpus", help="[TYPE:]N GPUs in all (fixed node counts only)")
    sub.add_argument("-n", "--ntasks", help="tasks in all (fixed node counts only)")
    sub.add_argument("-c", "--cpus-per-task", help="passed to every node slot")
    sub.add_argument("--mem", help="memory per node, passed to every node slot")
    sub.add_argument("-C", "--constraint", help="node features, passed to every node slot")
    sub.add_argument("--ntasks-per-node", "--nproc-per-node", dest="ntasks_per_node",
                     help="worker processes per node (torchrun --nproc-per-node)")
    sub.add_argument("-o", "--output")
    sub.add_argument("-e", "--error")
    sub.add_argument("-D", "--chdir")
    sub.add_argument("--export")
    sub.add_argument("-A", "--account")
    sub.add_argument("--kind", help="profile key: jobs of one kind share a learned profile")
    sub.add_argument("-x", "--exclude", metavar="HOSTLIST",
                     help="nodes the job never runs on, e.g. n[1-4],gpu7")
    sub.add_argument("--rate-target", metavar="SAMPLES_PER_S",
                     help="throughput beyond which more nodes are worth nothing to the job "
                          "(with node prices: met on the cheapest nodes)")
    sub.add_argument("-a", "--array", metavar="INDEXES",
                     help="a job array: one malleable job per task, e.g. 0-15%%4")
    sub.add_argument("-d", "--dependency", metavar="LIST",
                     help="start after other malleable jobs, e.g. afterok:m12")
    sub.add_argument("--launcher", choices=("torchrun", "srun"),
                     help="start the K workers of a node with srun (default) or torchrun")
    _add_other_sbatch_options(sub)


#: sbatch options `submit` defines itself, with another meaning or none here
_OWN = frozenset({"--help", "--test-only", "--parsable", "--version"})


def _other_sbatch_options(taken: set[str]) -> list[tuple[str, str | None, bool]]:
    """(long, short, takes a value) of every sbatch option and SPANK option not defined
    above: on the command line as in an ``#SBATCH`` line, so that a user overrides a
    script's ``--partition``, ``--gpus-per-task`` or ``--mem-per-gpu`` as with sbatch."""
    out = []
    for rule in RULE_TABLE:
        if rule.long in taken or rule.long in _OWN:
            continue
        short = rule.short if rule.short and rule.short not in taken else None
        out.append((rule.long, short, rule.value))
    out += [(o, None, o not in SPANK_FLAGS) for o in sorted(SPANK_OPTIONS) if o not in taken]
    return out


def _dest(long: str) -> str:
    return "sbatch_" + long.removeprefix("--").replace("-", "_")


def _add_other_sbatch_options(sub: argparse.ArgumentParser) -> None:
    """Each is collected in order as ``--opt=value`` tokens and read with sbatch's table
    (:func:`parse_option_tokens`), which warns, passes to the slots, or refuses it. An
    option with getopt's optional argument (``--exclusive[=user]``) is a flag, and its
    ``--opt=value`` form a second, hidden option of the same list (:class:`SubmitParser`)."""
    taken = {s for a in sub._actions for s in a.option_strings}
    for long, short, value in _other_sbatch_options(taken):
        names = [long] + ([short] if short else [])
        if value and long not in _OPTIONAL_VALUE:
            sub.add_argument(*names, dest=_dest(long), action="append", metavar="VALUE",
                             help=argparse.SUPPRESS)
            continue
        sub.add_argument(*names, dest=_dest(long), action="append_const", const=None,
                         help=argparse.SUPPRESS)
        if long in _OPTIONAL_VALUE:
            sub.add_argument(long + _WITH_VALUE, dest=_dest(long), action="append",
                             help=argparse.SUPPRESS)


#: sbatch's options whose value is optional: given only as ``--opt=value``, never the next
#: word (``--exclusive job.sh`` is the flag, then the script)
_OPTIONAL_VALUE = frozenset(rule.long for rule in RULE_TABLE if rule.optional is not None)
_WITH_VALUE = ":value"


class SubmitParser(argparse.ArgumentParser):
    """``submit``'s parser: argparse has no getopt-style optional argument (a value only
    after ``=``), so before parsing, ``--exclusive=user`` among the options (not the
    script's arguments) becomes the hidden ``--exclusive:value=user``."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        if args is not None:
            args = self._with_values(list(args))
        return super().parse_known_args(args, namespace)

    def _with_values(self, args: list[str]) -> list[str]:
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
            name, eq, value = args[i].partition("=")
            if eq and name in _OPTIONAL_VALUE:
                args[i] = f"{name}{_WITH_VALUE}={value}"
            action = self._option_string_actions.get(name)
            if not eq and action is not None and action.nargs is None and (
                    name.startswith("--") or len(args[i]) == 2):
                i += 1  # its value is the next word
            i += 1
        return args


_FLAG_OPTS = (
    ("job_name", "--job-name"), ("nodes", "--nodes"), ("min_nodes", "--min-nodes"),
    ("max_nodes", "--max-nodes"), ("time", "--time"), ("gpus_per_node", "--gpus-per-node"),
    ("ntasks_per_node", "--ntasks-per-node"), ("output", "--output"), ("error", "--error"),
    ("chdir", "--chdir"), ("export", "--export"), ("account", "--account"), ("kind", "--kind"),
    ("launcher", "--launcher"), ("gres", "--gres"), ("gpus", "--gpus"), ("ntasks", "--ntasks"),
    ("cpus_per_task", "--cpus-per-task"), ("mem", "--mem"), ("constraint", "--constraint"),
    ("rate_target", "--rate-target"), ("exclude", "--exclude"), ("array", "--array"),
    ("dependency", "--dependency"),
)


def command_line_tokens(args: argparse.Namespace) -> list[str]:
    """The options given on the command line, as ``--opt=value`` tokens."""
    tokens: list[str] = []
    for attr, opt in _FLAG_OPTS:
        value = getattr(args, attr)
        if value is not None:
            tokens.append(f"{opt}={value}")
    for long, _short, _value in _other_sbatch_options(set()):
        for value in getattr(args, _dest(long), None) or ():
            tokens.append(long if value is None else f"{long}={value}")
    return tokens
