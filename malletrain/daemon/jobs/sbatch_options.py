"""sbatch's options, as a table: what malletrain does with each one.

Every option sbatch documents (Slurm 22.05) that a batch script may carry is listed once, with
its short form and whether it takes a value, and one of four fates:

* **use**: malletrain reads it (nodes, time, GPUs, workers per node, output, ...);
* **slot**: passed unchanged to every node slot's ``sbatch`` (memory, CPUs, constraints,
  licences: Slurm honours them per node exactly as for the original job);
* **ignore**: accepted with a warning that says why it does not matter to a malleable job
  (mail, partition, priority hints, ...);
* **refuse**: it cannot be honoured (a fixed node list, a begin time, ...); the
  message says why and what to do instead.

An option not in the table is refused as unknown, like sbatch does. Problems are collected,
never raised one at a time: a user sees every line to fix in one run, as ``FILE:LINE:
message`` (:func:`parse_option_tokens`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_USE, _SLOT, _IGNORE, _REFUSE = "use", "slot", "ignore", "refuse"


@dataclass(frozen=True)
class Rule:
    long: str
    fate: str
    short: str | None = None
    value: bool = True
    why: str = ""
    #: getopt's optional argument (``--exclusive[=user]``, ``--nice[=N]``): a value only as
    #: ``--opt=value``, never the next word; this one when none is given
    optional: str | None = None
    #: the values sbatch accepts, when it names them (compared without case, as sbatch does)
    choices: tuple[str, ...] = ()


_TABLE: tuple[Rule, ...] = (
    # -- read by malletrain
    Rule("--job-name", _USE, "-J"), Rule("--nodes", _USE, "-N"),
    Rule("--min-nodes", _USE), Rule("--max-nodes", _USE), Rule("--time", _USE, "-t"),
    Rule("--gpus-per-node", _USE), Rule("--gres", _USE), Rule("--gpus", _USE, "-G"),
    Rule("--gpus-per-task", _USE), Rule("--ntasks-per-node", _USE),
    Rule("--tasks-per-node", _USE),  # sbatch's alias of --ntasks-per-node
    Rule("--nproc-per-node", _USE), Rule("--ntasks", _USE, "-n"),
    Rule("--output", _USE, "-o"), Rule("--error", _USE, "-e"), Rule("--chdir", _USE, "-D"),
    Rule("--export", _USE), Rule("--account", _USE, "-A"), Rule("--kind", _USE),
    Rule("--launcher", _USE), Rule("--signal", _USE), Rule("--rate-target", _USE),
    Rule("--exclude", _USE, "-x"), Rule("--array", _USE, "-a"),
    Rule("--dependency", _USE, "-d"), Rule("--qos", _USE, "-q"), Rule("--ntasks-per-gpu", _USE),
    Rule("--nice", _USE, optional="100"),  # sbatch's --nice alone: 100
    # -- honoured by Slurm on every node slot
    *(Rule(o, _SLOT, s) for o, s in (
        ("--cpus-per-task", "-c"), ("--mem", None), ("--mem-per-cpu", None),
        ("--mem-per-gpu", None), ("--cpus-per-gpu", None), ("--constraint", "-C"),
        ("--tmp", None), ("--licenses", "-L"), ("--mincpus", None),
        ("--threads-per-core", None), ("--cores-per-socket", None),
        ("--sockets-per-node", None), ("--gres-flags", None), ("--hint", None),
        ("--core-spec", "-S"), ("--thread-spec", None), ("--extra-node-info", "-B"),
        ("--network", None), ("--prefer", None), ("--gpus-per-socket", None))),
    # -- accepted, with a warning
    Rule("--partition", _IGNORE, "-p",
         why="malleable jobs run their node slots in the scavenger partition"),
    Rule("--exclusive", _IGNORE, value=False, why="node slots always hold a whole node",
         optional="",
         choices=("", "exclusive", "allocation", "oversubscribe", "user", "mcs", "topo")),
    Rule("--no-kill", _IGNORE, "-k", value=False, why="a lost node is handled by the daemon",
         optional="", choices=("", "set", "off", "no")),
    Rule("--kill-on-invalid-dep", _IGNORE, choices=("yes", "no"),
         why="a dependency never satisfied fails the job"),
    Rule("--requeue", _IGNORE, value=False, optional="",  # --requeue[=...] since 25.05
         why="node slots are always requeued by the daemon"),
    *(Rule(o, _IGNORE, value=False, optional="", why=w) for o, w in (
        ("--oom-kill-step", "not applied to node slots"),
        ("--resv-ports", "not applied to node slots"))),
    *(Rule(o, _IGNORE, s, why=w) for o, s, w in (
        ("--mail-type", None, "malletrain sends no mail; watch `malletrain jobs`"),
        ("--mail-user", None, "malletrain sends no mail; watch `malletrain jobs`"),
        ("--open-mode", None, "node slots append to the output files"),
        ("--priority", None, "node slots only use idle nodes"),
        ("--wckey", None, "not used by node slots"),
        ("--switches", None, "the daemon chooses the nodes"),
        ("--distribution", "-m", "workers are placed per node by the launcher"),
        ("--ntasks-per-core", None, "workers are placed per node by the launcher"),
        ("--ntasks-per-socket", None, "workers are placed per node by the launcher"),
        ("--gpu-bind", None, "each worker is given its GPU by the launcher"),
        ("--cpu-freq", None, "not applied to node slots"),
        ("--gpu-freq", None, "not applied to node slots"),
        ("--acctg-freq", None, "Slurm's default is used"),
        ("--profile", None, "not applied to node slots"),
        ("--comment", None, "malletrain tags node slots with the comment"),
        ("--input", "-i", "node slots read no input"),
        ("--wait-all-nodes", None, "each node slot starts when its node is ready"),
        ("--reservation", None, "node slots run on idle nodes of the scavenger partition, "
         "outside reservations"),
        ("--mem-bind", None, "not applied to node slots"),
        ("--time-min", None, "the daemon sets each node slot's time from its idle window"),
        ("--delay-boot", None, "node slots run on nodes that are up"),
        ("--mcs-label", None, "not used by node slots"),
        ("--power", None, "not applied to node slots"),
        ("--bb", None, "burst buffers are not staged for node slots"),
        ("--bbf", None, "burst buffers are not staged for node slots"),
        ("--tres-per-task", None, "tasks are placed by the script's srun steps"),
        ("--ntasks-per-tres", None, "workers are placed per node by the launcher"),
        ("--tres-bind", None, "each worker is given its GPU by the launcher"),
        ("--context", None, "not applied to node slots"),
        ("--extra", None, "not used by node slots"),
        ("--segment", None, "the daemon chooses the nodes"))),
    *(Rule(o, _IGNORE, s, value=False, why=w) for o, s, w in (
        ("--parsable", None, "`malletrain submit --parsable` prints the job id"),
        ("--quiet", "-Q", "not needed"), ("--verbose", "-v", "not needed"),
        ("--oversubscribe", "-s", "node slots always hold a whole node"),
        ("--overcommit", "-O", "not applied to node slots"),
        ("--spread-job", None, "the daemon chooses the nodes"),
        ("--contiguous", None, "the daemon chooses the nodes"),
        ("--use-min-nodes", None, "the daemon chooses the node count"),
        ("--ignore-pbs", None, "#PBS lines are never read"),
        ("--reboot", None, "node slots run on nodes as they are"),
        ("--spread-segments", None, "the daemon chooses the nodes"),
        ("--consolidate-segments", None, "the daemon chooses the nodes"),
        ("--stepmgr", None, "node slots are single-node jobs"),
        ("--no-requeue", None, "Slurm never requeues a node slot by itself: the daemon "
         "places the job's node slots, and a preempted one's work goes on in the others"))),
    # -- cannot be honoured
    *(Rule(o, _REFUSE, s, why=w) for o, s, w in (
        ("--nodelist", "-w", "the daemon chooses the nodes among the idle ones"),
        ("--begin", "-b", "a malleable job starts when nodes are idle"),
        ("--deadline", None, "not supported for malleable jobs"),
        ("--wrap", None, "give a batch script or a Python training script"),
        ("--uid", None, "jobs always run as the submitting user"),
        ("--gid", None, "jobs always run as the submitting user"),
        ("--container", None, "not supported"),
        ("--clusters", "-M", "one cluster per daemon"),
        ("--cluster", None, "one cluster per daemon"),
        ("--container-id", None, "not supported"),
        ("--het-group", None, "heterogeneous jobs are not malleable"),
        ("--batch", None, "node features: use --constraint"),
        ("--export-file", None, "use --export"),
        ("--nodefile", "-F", "the daemon chooses the nodes among the idle ones"),
        ("--cluster-constraint", None, "one cluster per daemon"))),
    Rule("--propagate", _REFUSE, value=False, why="not supported", optional=""),
    Rule("--get-user-env", _IGNORE, value=False, optional="", why="sbatch acts on it only "
         "for root's --uid; node slots run as you, with this command's environment"),
    *(Rule(o, _REFUSE, s, value=False, why=w) for o, s, w in (
        ("--hold", "-H", "the daemon holds and releases node slots itself"),
        ("--test-only", None, "use `malletrain submit --test-only`"),
        ("--help", "-h", "not a job option"), ("--usage", None, "not a job option"),
        ("--version", "-V", "not a job option"),
        ("--wait", "-W", "a malleable job's length depends on the idle nodes"))),
)

#: every rule, in the table's order
RULE_TABLE: tuple[Rule, ...] = _TABLE

#: option (long or short form) -> its rule
RULES: Mapping[str, Rule] = {
    name: rule for rule in _TABLE for name in (rule.long, rule.short) if name
}

#: Options that SPANK plugins add at real sites (NERSC's shifter, NVIDIA's pyxis): not
#: sbatch's own, so the site's Slurm refuses them where the plugin is not installed; passed
#: to every node slot, whose sbatch then honours (or refuses) them as for the original job.
SPANK_OPTIONS = frozenset({
    "--image", "--module", "--volume", "--environment", "--container-image", "--container-mounts",
    "--container-workdir", "--container-name", "--container-save", "--container-env",
    "--container-entrypoint", "--no-container-entrypoint", "--container-mount-home",
    "--no-container-mount-home", "--container-remap-root", "--no-container-remap-root",
    "--container-writable", "--container-readonly"})
#: the SPANK options above that take no value
SPANK_FLAGS = frozenset({
    "--no-container-entrypoint", "--container-mount-home", "--no-container-mount-home",
    "--container-remap-root", "--no-container-remap-root", "--container-writable",
    "--container-readonly", "--container-entrypoint"})

#: options node slots may carry (``--gres`` with a GPU is read, and passed on whole)
SLOT_OPTIONS = frozenset({r.long for r in _TABLE if r.fate == _SLOT} | {"--gres"}
                         | SPANK_OPTIONS)
_LONG_NAMES = tuple(sorted({r.long for r in _TABLE}))
#: a value passed to node slots: one token of ordinary characters (never a shell string)
SLOT_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:|&*!()\[\]=+/%@-]{1,256}$")


@dataclass(frozen=True)
class Options:
    """Option values as read from directives or the command line (last one wins)."""

    values: Mapping[str, str]
    #: where each value came from ("script.sh:3" or "command line")
    origin: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    #: options for every node slot's sbatch, ``--opt=value``, in order
    slot: tuple[str, ...] = ()


#: sbatch's aliases: read as the option they stand for
_ALIASES = {"--tasks-per-node": "--ntasks-per-node"}


def _split(token: str) -> tuple[str, str | None]:
    """``--opt=value`` or ``-Xvalue`` -> (option, value), as getopt_long splits a word: a
    short option's value is the rest of the word as written (``-t=10`` is the time
    ``=10``, which sbatch refuses); the rest of a flag's word is more flags (``-Qv``)."""
    if token.startswith("--"):
        opt, sep, value = token.partition("=")
        return opt, (value if sep else None)
    if token.startswith("-") and len(token) > 2:
        return token[:2], token[2:]
    return token, None


def _is_flag(opt: str) -> bool:
    rule = RULES.get(opt)
    return rule is not None and not rule.value and rule.optional is None


def resolve_long(opt: str) -> str | list[str]:
    """getopt_long's reading of a long option: the exact name, else the one option it is
    a unique prefix of (``--err`` is ``--error``); a list of candidates when it is
    ambiguous (``--mem-per`` is ``--mem-per-cpu`` or ``--mem-per-gpu``), [] when none."""
    if opt in RULES or opt in SPANK_OPTIONS:
        return opt
    hits = [name for name in (*_LONG_NAMES, *SPANK_OPTIONS) if name.startswith(opt)]
    return hits[0] if len(hits) == 1 else hits


def _not_an_option(token: str, where: str) -> str | None:
    if token in ("hetjob", "packjob", ":"):
        return (f"{where}: {token}: heterogeneous jobs (components of different shapes) "
                "cannot be malleable; submit each component as a job")
    if not token.startswith("-") or token == "-":
        return f"{where}: {token!r} is not an option"
    return None


def _unresolved(opt: str, where: str) -> str | None:
    resolved = resolve_long(opt) if opt.startswith("--") else opt
    if isinstance(resolved, list) and resolved:
        return f"{where}: option {opt} is ambiguous (possibilities: {' '.join(resolved)})"
    return None


def _spank(opt: str, value: str | None, where: str, slot: list[str], warnings: list[str],
           problems: list[str]) -> None:
    if value is not None and not SLOT_VALUE_RE.match(value):
        problems.append(f"{where}: {opt}={value!r}: not a plain value")
        return
    slot.append(opt if value is None else f"{opt}={value}")
    warnings.append(f"{where}: {opt} is a SPANK plugin's option (not sbatch's): passed to "
                    "every node slot, which the site's plugin serves")


def _value_of(rule: Rule, opt: str, value: str | None, tokens: Sequence[str], i: int,
              where: str) -> tuple[str, int, str | None]:
    """An option's value as getopt_long gives it to sbatch, where the next word is read
    from, and the problem, if any. An optional argument (``--exclusive[=user]``) is only
    ever ``--opt=value``: the next word is not its value."""
    if rule.optional is not None:
        value = rule.optional if value is None else value
    elif not rule.value:
        if value is not None:
            return "", i, f"{where}: {opt} takes no value"
        value = ""
    elif value is None:
        if i >= len(tokens):
            return "", i, f"{where}: {opt} needs a value"
        value, i = tokens[i], i + 1
    if rule.choices and value.lower() not in rule.choices:
        return value, i, (f"{where}: {opt}={value}: invalid {opt} specification (sbatch "
                          f"takes {', '.join(c for c in rule.choices if c) or 'none'})")
    return value, i, None


def parse_option_tokens(tokens: Sequence[str], where: str) -> Options:
    """``["-N", "2-4", "--time=30"]`` -> Options; every problem collected, none raised."""
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    warnings: list[str] = []
    problems: list[str] = []
    slot: list[str] = []
    tokens = list(tokens)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        opt, value = _split(token)
        if value is not None and not opt.startswith("--") and _is_flag(opt):
            tokens.insert(i, "-" + value)  # ``-Qv``: -Q, then -v
            token, value = opt, None
        problem = _not_an_option(token, where) or _unresolved(opt, where)
        if problem:
            problems.append(problem)
            continue
        resolved = resolve_long(opt) if opt.startswith("--") else opt
        opt = resolved if isinstance(resolved, str) else opt
        if opt in SPANK_OPTIONS:
            if value is None and opt not in SPANK_FLAGS and i < len(tokens):
                value, i = tokens[i], i + 1
            _spank(opt, value, where, slot, warnings, problems)
            continue
        rule = RULES.get(opt)
        if rule is None:
            problems.append(f"{where}: unknown option {opt} (not an sbatch option; the "
                            "options malletrain reads are in docs/user-guide.md)")
            continue
        value, i, problem = _value_of(rule, opt, value, tokens, i, where)
        if problem:
            problems.append(problem)
            continue
        if rule.fate == _REFUSE:
            problems.append(f"{where}: {opt} cannot be used for a malleable job: {rule.why}")
        elif rule.fate == _IGNORE:
            warnings.append(f"{where}: {opt} ignored: {rule.why}")
        elif rule.fate == _SLOT:
            if not SLOT_VALUE_RE.match(value):
                problems.append(f"{where}: {opt}={value!r}: not a plain value")
            else:
                slot.append(f"{rule.long}={value}")
        else:
            key = _ALIASES.get(rule.long, rule.long).removeprefix("--")
            values[key] = value
            origin[key] = where
    return Options(values, origin, tuple(warnings), tuple(problems), tuple(slot))


#: sbatch's input environment variables (src/sbatch/opt.c: env_vars, Slurm 22.05), each the
#: option it sets: they win over the script's ``#SBATCH`` lines, command-line flags win over
#: them. A later one wins over an earlier one (``SLURM_CLUSTERS`` over ``SBATCH_CLUSTERS``).
ENVIRONMENT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("SBATCH_ACCOUNT", "--account"), ("SBATCH_ARRAY_INX", "--array"),
    ("SBATCH_ACCTG_FREQ", "--acctg-freq"), ("SBATCH_BATCH", "--batch"),
    ("SBATCH_BURST_BUFFER", "--bb"), ("SBATCH_CLUSTER_CONSTRAINT", "--cluster-constraint"),
    ("SBATCH_CLUSTERS", "--clusters"), ("SLURM_CLUSTERS", "--clusters"),
    ("SBATCH_CONTAINER", "--container"), ("SBATCH_CONSTRAINT", "--constraint"),
    ("SBATCH_CORE_SPEC", "--core-spec"), ("SBATCH_CPU_FREQ_REQ", "--cpu-freq"),
    ("SBATCH_CPUS_PER_GPU", "--cpus-per-gpu"), ("SBATCH_DEBUG", "--verbose"),
    ("SBATCH_DELAY_BOOT", "--delay-boot"), ("SBATCH_DISTRIBUTION", "--distribution"),
    ("SBATCH_EXCLUSIVE", "--exclusive"), ("SBATCH_EXPORT", "--export"),
    ("SBATCH_GET_USER_ENV", "--get-user-env"), ("SBATCH_GRES", "--gres"),
    ("SBATCH_GRES_FLAGS", "--gres-flags"), ("SBATCH_GPUS", "--gpus"),
    ("SBATCH_GPU_BIND", "--gpu-bind"), ("SBATCH_GPU_FREQ", "--gpu-freq"),
    ("SBATCH_GPUS_PER_NODE", "--gpus-per-node"), ("SBATCH_GPUS_PER_SOCKET", "--gpus-per-socket"),
    ("SBATCH_GPUS_PER_TASK", "--gpus-per-task"), ("SLURM_HINT", "--hint"),
    ("SBATCH_HINT", "--hint"), ("SBATCH_JOB_NAME", "--job-name"),
    ("SBATCH_MEM_BIND", "--mem-bind"), ("SBATCH_MEM_PER_CPU", "--mem-per-cpu"),
    ("SBATCH_MEM_PER_GPU", "--mem-per-gpu"), ("SBATCH_MEM_PER_NODE", "--mem"),
    ("SBATCH_NETWORK", "--network"), ("SBATCH_NO_KILL", "--no-kill"),
    ("SBATCH_NO_REQUEUE", "--no-requeue"), ("SBATCH_OPEN_MODE", "--open-mode"),
    ("SBATCH_OVERCOMMIT", "--overcommit"), ("SBATCH_PARTITION", "--partition"),
    ("SBATCH_POWER", "--power"), ("SBATCH_PROFILE", "--profile"), ("SBATCH_QOS", "--qos"),
    ("SBATCH_REQ_SWITCH", "--switches"), ("SBATCH_REQUEUE", "--requeue"),
    ("SBATCH_RESERVATION", "--reservation"), ("SBATCH_SIGNAL", "--signal"),
    ("SBATCH_SPREAD_JOB", "--spread-job"), ("SBATCH_THREAD_SPEC", "--thread-spec"),
    ("SBATCH_THREADS_PER_CORE", "--threads-per-core"), ("SBATCH_TIMELIMIT", "--time"),
    ("SBATCH_USE_MIN_NODES", "--use-min-nodes"), ("SBATCH_WAIT", "--wait"),
    ("SBATCH_WAIT_ALL_NODES", "--wait-all-nodes"), ("SBATCH_WCKEY", "--wckey"),
)


def environment_options(environ: Mapping[str, str]) -> Options:
    """The options sbatch takes from its input environment (``SBATCH_TIMELIMIT=30``,
    ``SBATCH_ACCOUNT=proj``), read with the table like a ``#SBATCH`` line; each problem
    names its variable. A variable of an option without a value sets it, whatever it holds."""
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    warnings: list[str] = []
    problems: list[str] = []
    slot: list[str] = []
    for var, opt in ENVIRONMENT_OPTIONS:
        if var not in environ:
            continue
        rule, value = RULES[opt], environ[var]
        flag = (not rule.value and rule.optional is None) or (rule.optional is not None
                                                             and not value)
        got = parse_option_tokens([opt if flag else f"{opt}={value}"], f"${var}")
        values.update(got.values)
        origin.update(got.origin)
        warnings += got.warnings
        problems += got.problems
        slot += got.slot
    return Options(values, origin, tuple(warnings), tuple(problems), tuple(slot))
