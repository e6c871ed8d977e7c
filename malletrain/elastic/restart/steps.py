"""``srun`` inside a restart-mode batch shell: a step's options read as srun reads them and
its tasks laid out over the generation's nodes. Pure; golden-tested.

The batch shell runs on the generation's first node, inside that node's slot; each node is
a single-node Slurm job of the user. A step is therefore launched as one real ``srun`` per
node it covers, into that node's slot (``srun --jobid=<slot> --overlap --nodes=1
--ntasks=K``): Slurm's own launcher does the I/O forwarding, signals and exit codes, and
the task wrapper (:mod:`.task`) gives each task the job-wide view (``SLURM_PROCID`` among
the step's tasks, ``SLURM_NODEID``, the nodelists). Options that place the step (``-N``,
``-n``, ``--ntasks-per-node``, ``-w``, ``-x``, ``-r``, ``-m``) are read here; options that
shape each node's share (``-c``, ``--gpus-per-task``, ``--gpu-bind``, ``--cpu-bind``,
``--mem``, ``--export``, ``-D``, ``-o``, ...) go to every node's real srun unchanged; the
ones that cannot be honoured fail the step at once with a clear message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.elastic.restart.generation import GenerationView, GenNode
from malletrain.errors import PermanentError


class StepError(PermanentError):
    """A step that cannot run here: its message goes to the job's output."""


#: srun's long options -> (0: no value, 1: a value, 2: an optional ``=value``), and the
#: role each plays: ``place`` (read here), ``pass`` (to every node's srun), ``drop``
#: (meaningless for a step inside a node slot), ``refuse``.
_LONG: dict[str, tuple[int, str]] = {
    "nodes": (1, "place"), "ntasks": (1, "place"), "ntasks-per-node": (1, "place"),
    "nodelist": (1, "place"), "exclude": (1, "place"), "relative": (1, "place"),
    "distribution": (1, "place"), "label": (0, "place"), "kill-on-bad-exit": (2, "place"),
    "jobid": (1, "drop"), "mpi": (1, "drop"), "exclusive": (2, "drop"), "overlap": (0, "drop"),
    "exact": (0, "drop"), "whole": (0, "drop"), "partition": (1, "drop"),
    "account": (1, "drop"), "qos": (1, "drop"), "constraint": (1, "drop"),
    "reservation": (1, "drop"), "nice": (2, "drop"), "priority": (1, "drop"),
    "wckey": (1, "drop"), "contiguous": (0, "drop"), "use-min-nodes": (0, "drop"),
    "spread-job": (0, "drop"), "immediate": (2, "drop"), "hold": (0, "drop"),
    "cpus-per-task": (1, "pass"), "cpu-bind": (1, "pass"), "gpus-per-task": (1, "pass"),
    "gpus-per-node": (1, "pass"), "gpus": (1, "pass"), "gpu-bind": (1, "pass"),
    "gres": (1, "pass"), "gres-flags": (1, "pass"), "mem": (1, "pass"),
    "mem-per-cpu": (1, "pass"), "mem-per-gpu": (1, "pass"), "cpus-per-gpu": (1, "pass"),
    "mem-bind": (1, "pass"), "export": (1, "pass"), "chdir": (1, "pass"),
    "output": (1, "pass"), "error": (1, "pass"), "input": (1, "pass"), "time": (1, "pass"),
    "signal": (1, "pass"), "hint": (1, "pass"), "cpu-freq": (1, "pass"),
    "threads-per-core": (1, "pass"), "ntasks-per-core": (1, "pass"),
    "ntasks-per-socket": (1, "pass"), "ntasks-per-gpu": (1, "pass"),
    "sockets-per-node": (1, "pass"), "cores-per-socket": (1, "pass"),
    "extra-node-info": (1, "pass"), "open-mode": (1, "pass"), "network": (1, "pass"),
    "accel-bind": (1, "pass"), "tres-per-task": (1, "pass"), "wait": (1, "pass"),
    "job-name": (1, "pass"), "comment": (1, "pass"), "time-min": (1, "pass"),
    "unbuffered": (0, "pass"), "verbose": (0, "pass"), "quiet": (0, "pass"),
    "overcommit": (0, "pass"), "oversubscribe": (0, "pass"), "preserve-env": (0, "pass"),
    "disable-status": (0, "pass"), "no-kill": (2, "pass"), "propagate": (2, "pass"),
    "slurmd-debug": (1, "pass"), "task-prolog": (1, "pass"), "task-epilog": (1, "pass"),
    "epilog": (1, "pass"), "prolog": (1, "pass"),
    "multi-prog": (0, "refuse"), "pty": (0, "refuse"), "het-group": (1, "refuse"),
    "no-allocate": (0, "refuse"), "bcast": (2, "refuse"), "test-only": (0, "refuse"),
}
#: srun's short options -> the long option they stand for
_SHORT = {"N": "nodes", "n": "ntasks", "w": "nodelist", "x": "exclude", "r": "relative",
          "m": "distribution", "l": "label", "K": "kill-on-bad-exit", "c": "cpus-per-task",
          "G": "gpus", "D": "chdir", "o": "output", "e": "error", "i": "input", "t": "time",
          "J": "job-name", "W": "wait", "u": "unbuffered", "v": "verbose", "Q": "quiet",
          "O": "overcommit", "s": "oversubscribe", "E": "preserve-env", "X": "disable-status",
          "k": "no-kill", "p": "partition", "A": "account", "C": "constraint",
          "B": "extra-node-info", "q": "qos", "Z": "no-allocate", "I": "immediate",
          "H": "hold"}
#: long options that SPANK plugins add at real sites (pyxis, shifter): passed on as given
_SPANK_PREFIXES = ("container", "image", "module", "no-container")
#: those of them that take no value
_SPANK_FLAGS = ("no-container", "container-remap-root", "container-writable",
                "container-readonly", "container-mount-home")

_REFUSED_WHY = {
    "multi-prog": "runs different programs per task from a file",
    "pty": "asks for a terminal",
    "het-group": "names a component of a heterogeneous job",
    "no-allocate": "runs outside any allocation",
    "bcast": "copies a file to the nodes through Slurm's sbcast",
    "test-only": "asks for a scheduling estimate",
}


@dataclass(frozen=True)
class StepRequest:
    """A step's options as srun read them; ``None``: not given on the command line."""

    command: tuple[str, ...]
    nodes: tuple[int, int] | None = None
    ntasks: int | None = None
    per_node: int | None = None
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    relative: int = 0
    cyclic: bool = False
    label: bool = False
    kill_on_bad_exit: bool = False
    passthrough: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeShare:
    """One node's part of a step: its global task ids (``SLURM_PROCID`` per local task)."""

    node: GenNode
    node_index: int  # SLURM_NODEID within the step
    task_ids: tuple[int, ...]


@dataclass(frozen=True)
class StepLayout:
    request: StepRequest
    shares: tuple[NodeShare, ...]
    ntasks: int
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def nodelist(self) -> str:
        return ",".join(s.node.name for s in self.shares)


def _resolve_long(name: str) -> str:
    """getopt_long's rule: an exact name, or a prefix of exactly one."""
    if name in _LONG:
        return name
    hits = [n for n in _LONG if n.startswith(name)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise StepError(f"option '--{name}' is ambiguous; possibilities: "
                        + " ".join(f"'--{h}'" for h in sorted(hits)))
    raise StepError(f"unrecognized option '--{name}'")


def _split_options(argv: Sequence[str]) -> tuple[list[tuple[str, str | None, str]], list[str]]:
    """srun's argument list -> ([(long name, value, as written)], command)."""
    out: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return out, list(argv[i + 1:])
        if not tok.startswith("-") or tok == "-":
            break
        if tok.startswith("--"):
            raw, eq, value = tok[2:].partition("=")
            if raw.startswith(_SPANK_PREFIXES) and raw not in _LONG:
                if not eq and not raw.startswith(_SPANK_FLAGS) and i + 1 < len(argv):
                    tok, i = f"{tok}={argv[i + 1]}", i + 1
                out.append(("spank", None, tok))
                i += 1
                continue
            name = _resolve_long(raw)
            has_arg = _LONG[name][0]
            if has_arg == 1 and not eq:
                if i + 1 >= len(argv):
                    raise StepError(f"option '--{name}' requires an argument")
                value, i = argv[i + 1], i + 1
            out.append((name, value if (eq or has_arg == 1) else None, tok))
            i += 1
            continue
        j = 1  # a cluster of short options: -lu, -N2, -n 4
        while j < len(tok):
            letter = tok[j]
            if letter not in _SHORT:
                raise StepError(f"invalid option -- '{letter}'")
            name = _SHORT[letter]
            has_arg = _LONG[name][0]
            if has_arg == 0 or (has_arg == 2 and j + 1 == len(tok)):
                out.append((name, None, f"-{letter}"))
                j += 1
                continue
            value = tok[j + 1:]
            if not value and has_arg == 1:
                if i + 1 >= len(argv):
                    raise StepError(f"option requires an argument -- '{letter}'")
                value, i = argv[i + 1], i + 1
            out.append((name, value, f"-{letter}"))
            break
        i += 1
    return out, list(argv[i:])


def _int(value: str | None, what: str, lo: int = 1) -> int:
    text = (value or "").strip()
    if not text.isdigit() or int(text) < lo:
        raise StepError(f"{what}: {value!r} is not a whole number >= {lo}")
    return int(text)


def _names(value: str | None, what: str) -> tuple[str, ...]:
    """A step's -w/-x: a comma list of node names or a simple ``n[1-3,5]`` range."""
    text = (value or "").strip()
    if not text or "/" in text:
        raise StepError(f"{what}: {value!r}: give node names (a file of names is not read)")
    out: list[str] = []
    depth, word = 0, ""
    for ch in text + ",":
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.extend(_expand(word))
            word = ""
        else:
            word += ch
    return tuple(x for x in out if x)


def _expand(word: str) -> list[str]:
    if "[" not in word:
        return [word]
    head, _, rest = word.partition("[")
    body, _, tail = rest.partition("]")
    names = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if dash and lo.isdigit() and hi.isdigit():
            names += [f"{head}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi) + 1)]
        else:
            names.append(f"{head}{part}{tail}")
    return names


def parse(argv: Sequence[str]) -> StepRequest:
    """``srun``'s arguments (without ``srun``) -> a request, or :class:`StepError`."""
    opts, command = _split_options(argv)
    if not command:
        raise StepError("no command to run")
    if ":" in command:
        raise StepError("heterogeneous steps (':' between components) cannot run in a "
                        "malleable job")
    got: dict[str, object] = {}
    passthrough: list[str] = []
    warnings: list[str] = []
    for name, value, written in opts:
        role = "pass" if name == "spank" else _LONG[name][1]
        if role == "refuse":
            raise StepError(f"--{name} cannot run in a malleable job: it "
                            f"{_REFUSED_WHY[name]}")
        if role == "pass":
            passthrough.append(written if name == "spank" else
                               f"--{name}" if value is None else f"--{name}={value}")
            continue
        if role == "drop":
            if name not in ("jobid", "overlap", "exact", "whole", "exclusive", "mpi"):
                warnings.append(f"srun --{name} ignored: a step runs in the job's own nodes")
            continue
        got[name] = value
    return _request(tuple(command), got, tuple(passthrough), tuple(warnings))


def _request(command: tuple[str, ...], got: Mapping[str, object],
             passthrough: tuple[str, ...], warnings: tuple[str, ...]) -> StepRequest:
    nodes = None
    if "nodes" in got:
        lo, _, hi = str(got["nodes"]).partition("-")
        nodes = (_int(lo, "--nodes"), _int(hi or lo, "--nodes"))
    dist = str(got.get("distribution", "block"))
    kill = got.get("kill-on-bad-exit", "1") if "kill-on-bad-exit" in got else "0"
    return StepRequest(
        command=command, nodes=nodes,
        ntasks=_int(str(got["ntasks"]), "--ntasks") if "ntasks" in got else None,
        per_node=(_int(str(got["ntasks-per-node"]), "--ntasks-per-node")
                  if "ntasks-per-node" in got else None),
        nodelist=_names(str(got["nodelist"]), "--nodelist") if "nodelist" in got else (),
        exclude=_names(str(got["exclude"]), "--exclude") if "exclude" in got else (),
        relative=_int(str(got["relative"]), "--relative", 0) if "relative" in got else 0,
        cyclic=dist.split(":")[0].split(",")[0] == "cyclic", label="label" in got,
        kill_on_bad_exit=str(kill or "1") != "0", passthrough=passthrough, warnings=warnings)


def layout(req: StepRequest, view: GenerationView, env: Mapping[str, str]) -> StepLayout:
    """Which nodes run how many of the step's tasks, as srun places them in an allocation
    of the generation's nodes. ``env``: the shell's, for srun's input variables
    (``SLURM_NTASKS``, ``SLURM_NTASKS_PER_NODE``) when the command line gives no count."""
    avail = [n for n in view.nodes if n.name not in req.exclude]
    unknown = [x for x in req.nodelist if view.node(x) is None]
    if unknown:
        raise StepError(f"--nodelist {','.join(unknown)}: not a node of this job now "
                        f"(its nodes: {view.nodelist})")
    avail = avail[req.relative:]
    unplaced = [n.name for n in avail if n.slot_job <= 0]
    if unplaced:
        raise StepError(f"node(s) {','.join(unplaced)} of this job have no Slurm slot to run "
                        "a step in (their node agents registered none)")
    if req.nodelist:
        chosen = [n for n in avail if n.name in req.nodelist]
        rest = [n for n in avail if n.name not in req.nodelist]
        avail = chosen + rest
    env_per = env.get("SLURM_NTASKS_PER_NODE", "")
    default_per = (req.per_node or (int(env_per) if env_per.isdigit() and int(env_per) > 0
                                    else view.tasks_per_node or 1))
    if req.nodes is not None:
        want = max(req.nodes[0], len(req.nodelist))
        if want > len(avail):
            raise StepError(f"asks for {want} node(s); the job has {len(avail)} now "
                            f"({view.nodelist})")
        # a range without a task count takes as many nodes as it may; with one, the fewest
        count = want if req.ntasks is not None else max(want, min(req.nodes[1], len(avail)))
    elif req.nodelist:
        count = len(req.nodelist)
    elif req.ntasks is not None:
        count = min(len(avail), math.ceil(req.ntasks / default_per))
    else:
        count = len(avail)
    ntasks = _ntasks(req, count, default_per, env)
    count = min(count, ntasks)  # srun: "can't run 1 processes on 2 nodes"
    shares = _spread(avail[:count], ntasks, req)
    return StepLayout(req, shares, ntasks)


def _ntasks(req: StepRequest, count: int, default_per: int, env: Mapping[str, str]) -> int:
    if req.ntasks is not None:
        return req.ntasks
    if req.per_node is not None or req.nodes is not None or req.nodelist:
        return count * default_per
    total = env.get("SLURM_NTASKS", "")
    return int(total) if total.isdigit() and int(total) > 0 else count * default_per


def _spread(nodes: list[GenNode], ntasks: int, req: StepRequest) -> tuple[NodeShare, ...]:
    n = len(nodes)
    if req.per_node is not None:
        counts = [0] * n
        left = ntasks
        for i in range(n):
            counts[i] = min(req.per_node, left)
            left -= counts[i]
        if left:
            raise StepError(f"{ntasks} tasks at {req.per_node} per node need "
                            f"{math.ceil(ntasks / req.per_node)} nodes; the step has {n}")
    else:
        counts = [ntasks // n + (1 if i < ntasks % n else 0) for i in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    if req.cyclic:
        t, i = 0, 0
        while t < ntasks:
            if len(ids[i % n]) < counts[i % n]:
                ids[i % n].append(t)
                t += 1
            i += 1
    else:
        t = 0
        for i in range(n):
            ids[i] = list(range(t, t + counts[i]))
            t += counts[i]
    return tuple(NodeShare(node, i, tuple(ids[i])) for i, node in enumerate(nodes)
                 if ids[i])


#: a step's share that Slurm cannot start in its node slot within this time fails with
#: Slurm's own reason (``srun: error: Unable to create step for job N: ...``) in the job's
#: output, instead of waiting without a word ("step creation temporarily disabled")
STEP_START_S = 30


def node_argv(lay: StepLayout, share: NodeShare, view: GenerationView,
              task_spec: str) -> list[str]:
    """The real ``srun`` a node's share runs: into the node's slot, next to its agent."""
    req = lay.request
    return [view.real_srun, f"--jobid={share.node.slot_job}", "--overlap",
            f"--immediate={STEP_START_S}", "--nodes=1",
            f"--ntasks={len(share.task_ids)}",
            *(["--kill-on-bad-exit=1"] if req.kill_on_bad_exit else []), *req.passthrough,
            view.python, "-m", "malletrain.elastic.restart.task", task_spec, "--",
            *req.command]
