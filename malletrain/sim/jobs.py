"""The malleable jobs a simulation runs: a YAML job set with each job's true curve.

Format (``jobs:`` list)::

    jobs:
      - name: imagenet-0
        submit_s: 0
        min_nodes: 1
        max_nodes: 64
        total_samples: 1.0e9
        scale_up_s: 18
        scale_down_s: 12
        curve: [[1, 217.0], [2, 424.0], [4, 849.0]]   # [nodes, samples_per_s] of the whole job
        user: alice        # optional: whose job (the allocator divides nodes among users)
        account: physics   # optional: the Slurm account it would run under (carried, reported)

On a cluster of several node types (``Simulator(node_types=...)``) a job may give its
throughput per type instead, and then runs only on those types::

        curves: {p100: [[1, 98.0], [2, 190.0]], v100: [[1, 281.0], [2, 507.0]]}

(``curve`` and ``curves`` together: ``curve`` holds on every type not named). A job on
nodes of two types runs at the slower type's rate for its size: a synchronous step waits
for its slowest worker.

``submit_s`` counts from the start of the replay (``--start-s``). ``curve`` is the
job's true throughput, linear between points. Only the simulator
and the ``*-known-curves``/``freetrain`` policies see it; the ``malletrain`` policy
learns it from progress reports. Errors name the file, line and field.

Without ``user:`` a job belongs to the one unnamed user ``""``: a trace that names no users
says nothing about who owns what, and one user is exactly the user-blind problem, so every
job set written before users existed replays (and its results stand) unchanged. A job set
that names a user for some jobs must name one for all (a silent unnamed user would be a
user of its own).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from malletrain.core.model import ThroughputModel
from malletrain.sim.trace import input_error, read_text


@dataclass(frozen=True)
class SimJob:
    name: str
    submit_s: float
    min_nodes: int
    max_nodes: int
    total_samples: float
    scale_up_s: float
    scale_down_s: float
    curve: tuple[tuple[int, float], ...]
    #: (node type, curve) where the throughput differs per type (``curves:``)
    type_curves: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    #: Cost objective: the throughput beyond which more is worth nothing (``rate_target:``)
    rate_target: float | None = None
    #: Whose job (``user:``; "" the one unnamed user) and its Slurm account (``account:``)
    user: str = ""
    account: str = ""

    @cached_property
    def true_model(self) -> ThroughputModel:
        """Built once: the replay asks for a job's rate at every event."""
        return ThroughputModel(self.curve)

    @cached_property
    def _type_models(self) -> dict[str, ThroughputModel]:
        return {t: ThroughputModel(c) for t, c in self.type_curves}

    def true_models(self) -> dict[str, ThroughputModel]:
        """The true throughput per node type named in ``curves:``."""
        return dict(self._type_models)

    @property
    def allowed_types(self) -> frozenset[str] | None:
        """Only the types of ``curves:`` when there is no ``curve`` for the rest."""
        return frozenset(t for t, _ in self.type_curves) if not self.curve else None

    def rate_on(self, types: set[str], n: int) -> float:
        """True rate on ``n`` nodes of ``types``: the slowest type's (0 where it cannot run)."""
        if not self.type_curves:
            return self.true_model.rate(n)
        models = self._type_models
        rates = [models[t].rate(n) if t in models
                 else (self.true_model.rate(n) if self.curve else 0.0)
                 for t in types]
        return min(rates, default=0.0)

    def unit_rate(self) -> float:
        """The job's one-node rate, on its fastest type: the unit of one-worker-seconds."""
        return max(m.rate(1) for m in [self.true_model, *self.true_models().values()])

    def best_per_node_rate(self) -> float:
        """The most samples/s one node of this job can give (the linear upper bound)."""
        models = [self.true_model, *self.true_models().values()]
        return max(m.rate(n) / n for m in models
                   for n in range(max(1, self.min_nodes), self.max_nodes + 1))


_REQUIRED = (
    "name",
    "submit_s",
    "min_nodes",
    "max_nodes",
    "total_samples",
    "scale_up_s",
    "scale_down_s",
    "curve",
)
#: optional fields
_OPTIONAL = ("curves", "rate_target", "user", "account")
#: a user or account name as Slurm and POSIX accept them (no spaces, no shell characters)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None


def _number(path: str, node: yaml.Node, field: str, value: Any, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise input_error(path, _line(node), field, f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise input_error(path, _line(node), field, f"expected a finite number, got {value!r}")
    if integer and value != int(value):
        raise input_error(path, _line(node), field, f"expected a whole number, got {value!r}")
    return float(value)


def parse_jobs(path: str | Path, text: str | None = None) -> list[SimJob]:
    """Parse and validate a jobs YAML file (every error names file, line and field)."""
    name = str(path)
    if text is None:
        text = read_text(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise input_error(name, line, "yaml", f"malformed YAML: {problem}") from None
    if not isinstance(data, dict) or "jobs" not in data or root is None:
        raise input_error(name, _line(root), "jobs", "expected a top-level 'jobs:' list")
    assert isinstance(root, yaml.MappingNode)
    jobs_node = next(v for k, v in root.value if k.value == "jobs")
    if not isinstance(data["jobs"], list) or not isinstance(jobs_node, yaml.SequenceNode):
        raise input_error(name, _line(jobs_node), "jobs", "expected a list of jobs")
    out: list[SimJob] = []
    seen: set[str] = set()
    for item, node in zip(data["jobs"], jobs_node.value, strict=True):
        out.append(_parse_job(name, item, node, seen))
    if not out:
        raise input_error(name, _line(jobs_node), "jobs", "the job list is empty")
    unnamed = [i for i, j in enumerate(out) if not j.user]
    if unnamed and len(unnamed) < len(out):
        where = _line(jobs_node.value[unnamed[0]])
        raise input_error(name, where, "user", f"job {out[unnamed[0]].name!r} names no user "
                          "while others do: name one for every job or for none")
    return out


def _parse_job(path: str, item: Any, node: yaml.Node, seen: set[str]) -> SimJob:
    if not isinstance(item, dict) or not isinstance(node, yaml.MappingNode):
        raise input_error(path, _line(node), "jobs[]", "each job must be a mapping")
    fields = {k.value: v for k, v in node.value}
    for key in _REQUIRED:
        if key not in item and not (key == "curve" and "curves" in item):
            raise input_error(path, _line(node), key, "missing")
    unknown = sorted(set(item) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise input_error(path, _line(fields[unknown[0]]), unknown[0], "unknown field")
    jname = item["name"]
    if not isinstance(jname, str | int) or str(jname) == "":
        raise input_error(path, _line(fields["name"]), "name", "expected a non-empty name")
    jname = str(jname)
    if jname in seen:
        raise input_error(path, _line(fields["name"]), "name", f"duplicate job name {jname!r}")
    seen.add(jname)

    def num(key: str, *, integer: bool = False, positive: bool = False) -> float:
        v = _number(path, fields[key], key, item[key], integer=integer)
        if v < 0 or (positive and v == 0):
            want = "positive" if positive else "non-negative"
            raise input_error(path, _line(fields[key]), key, f"must be {want}, got {v:g}")
        return v

    submit = num("submit_s")
    lo = int(num("min_nodes", integer=True, positive=True))
    hi = int(num("max_nodes", integer=True, positive=True))
    if hi < lo:
        raise input_error(
            path, _line(fields["max_nodes"]), "max_nodes", f"{hi} is below min_nodes {lo}"
        )
    total = num("total_samples", positive=True)
    up = num("scale_up_s")
    down = num("scale_down_s")
    curve = _parse_curve(path, item["curve"], fields["curve"]) if "curve" in item else ()
    by_type = _parse_type_curves(path, item["curves"], fields["curves"]) if "curves" in item else ()
    target = num("rate_target", positive=True) if "rate_target" in item else None
    user, account = (_name(path, item, fields, key) for key in ("user", "account"))
    return SimJob(jname, submit, lo, hi, total, up, down, curve, by_type, target, user, account)


def _name(path: str, item: dict[str, Any], fields: dict[str, yaml.Node], key: str) -> str:
    """``user:``/``account:`` as written ("" where absent), or an error naming the line."""
    if key not in item:
        return ""
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, str | int) \
            or not _NAME.fullmatch(str(value)):
        raise input_error(path, _line(fields[key]), key, f"expected a name of letters, digits "
                          f"and _.- (at most 64, not starting with . or -), got {value!r}")
    return str(value)


def _parse_type_curves(path: str, value: Any, node: yaml.Node
                       ) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    if not isinstance(value, dict) or not value or not isinstance(node, yaml.MappingNode):
        raise input_error(path, _line(node), "curves", "expected {node_type: curve, ...}")
    out = []
    for key, cnode in node.value:
        name = str(key.value)
        if not name:
            raise input_error(path, _line(key), "curves", "a node type must be named")
        out.append((name, _parse_curve(path, value[key.value], cnode)))
    return tuple(sorted(out))


def _parse_curve(path: str, value: Any, node: yaml.Node) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, list) or not value or not isinstance(node, yaml.SequenceNode):
        raise input_error(path, _line(node), "curve", "expected a list of [nodes, samples_per_s]")
    points: list[tuple[int, float]] = []
    for pt, pnode in zip(value, node.value, strict=True):
        line = _line(pnode)
        if not isinstance(pt, list) or len(pt) != 2:
            raise input_error(path, line, "curve", f"expected [nodes, samples_per_s], got {pt!r}")
        n = _number(path, pnode, "curve.nodes", pt[0], integer=True)
        r = _number(path, pnode, "curve.samples_per_s", pt[1])
        if n <= 0:
            raise input_error(path, line, "curve.nodes", f"must be positive, got {n:g}")
        if r <= 0:
            raise input_error(path, line, "curve.samples_per_s", f"must be positive, got {r:g}")
        if points and n <= points[-1][0]:
            raise input_error(
                path, line, "curve.nodes", f"not increasing in nodes ({n:g} after {points[-1][0]})"
            )
        if points and r < points[-1][1]:
            raise input_error(
                path,
                line,
                "curve.samples_per_s",
                f"throughput falls with more nodes ({r:g} at {n:g} < {points[-1][1]:g} at "
                f"{points[-1][0]}); cut the curve (and max_nodes) at its peak",
            )
        points.append((int(n), float(r)))
    return tuple(points)


def dump_jobs(jobs: list[SimJob]) -> str:
    """Render a job set as YAML (the inverse of :func:`parse_jobs`)."""
    lines = ["jobs:"]
    for j in jobs:
        lines += [
            f"  - name: {j.name}",
            f"    submit_s: {j.submit_s:g}",
            f"    min_nodes: {j.min_nodes}",
            f"    max_nodes: {j.max_nodes}",
            f"    total_samples: {_yaml_float(j.total_samples)}",
            f"    scale_up_s: {j.scale_up_s:g}",
            f"    scale_down_s: {j.scale_down_s:g}",
        ]
        if j.curve:
            lines.append(f"    curve: {_yaml_curve(j.curve)}")
        if j.rate_target is not None:
            lines.append(f"    rate_target: {_yaml_float(j.rate_target)}")
        lines += [f"    {k}: {v!r}" for k, v in (("user", j.user), ("account", j.account)) if v]
        if j.type_curves:
            lines.append("    curves:")
            lines += [f"      {t}: {_yaml_curve(c)}" for t, c in j.type_curves]
    return "\n".join(lines) + "\n"


def _yaml_curve(curve: tuple[tuple[int, float], ...]) -> str:
    return "[" + ", ".join(f"[{n}, {_yaml_float(r)}]" for n, r in curve) + "]"


def _yaml_float(x: float) -> str:
    """Exact, and written so YAML 1.1 reads a float (it reads ``1e+20`` as a string)."""
    text = repr(float(x))
    if "e" in text and "." not in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text
