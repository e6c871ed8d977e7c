"""The values of the sbatch options whose checks are more than a number or a time: each
``(text, where) -> value`` raises :class:`~.spec.SpecError` naming ``where`` (pure)."""

from __future__ import annotations

import math
import re
import signal

from malletrain.daemon.jobs.dependency import DependencyError, parse_dependency
from malletrain.daemon.jobs.spec import (
    MAX_EXCLUDED_NODES,
    MAX_NICE,
    MAX_RATE_TARGET,
    MAX_STOP_GRACE_S,
    STOP_SIGNALS,
    SpecError,
    parse_time_s,
    positive_int,
)
from malletrain.elastic.restart.arrays import ArrayError, parse_array
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.hostlist import expand_hostlist


def rate(text: str, where: str) -> float:
    """``--rate-target=N``: samples per second, a positive finite number."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0 < rate <= MAX_RATE_TARGET:
        raise SpecError(f"{where}: {text!r} is not a rate in samples/s (a number above 0 "
                        f"and at most {MAX_RATE_TARGET:g})")
    return rate


def nice(text: str, where: str) -> int:
    """``--nice=N``: 0 to :data:`MAX_NICE`; sbatch refuses a negative one to non-operators
    (``Nice value must be non-negative``), and so does malletrain (the user submits)."""
    t = text.strip()
    if t.startswith("-") and t[1:].isdigit():
        raise SpecError(f"{where}: {text!r}: only Slurm's operators may give a negative "
                        "--nice (sbatch refuses it too)")
    if not t.isdigit() or int(t) > MAX_NICE:
        raise SpecError(f"{where}: {text!r} must be an integer from 0 to {MAX_NICE}")
    return int(t)


def exclude(text: str, where: str) -> tuple[str, ...]:
    """``--exclude=n[1-4],gpu7``: sbatch's hostlist, expanded (a file of names: refused)."""
    if "/" in text:
        raise SpecError(f"{where}: {text!r}: a file of node names is not read; list the "
                        "nodes instead (--exclude=n[1-4],n9)")
    try:
        names = expand_hostlist(text.strip())
    except SlurmParseError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if len(names) > MAX_EXCLUDED_NODES:
        raise SpecError(f"{where}: more than {MAX_EXCLUDED_NODES} nodes")
    return tuple(dict.fromkeys(names))


def dependency(text: str, where: str) -> str:
    """``--dependency=afterok:m12``: checked here, kept as written (the daemon judges it)."""
    try:
        parse_dependency(text.strip())
    except DependencyError as exc:
        raise SpecError(f"{where}: {exc}") from None
    return text.strip()


def array(text: str, where: str) -> str:
    """``--array=0-15%4``: checked here; `malletrain submit` makes one job per task."""
    try:
        parse_array(text)
    except ArrayError as exc:
        raise SpecError(f"{where}: {exc}") from None
    return text.strip()


def gpu_count(text: str, where: str) -> tuple[str | None, int]:
    """``[type:]N`` -> (type, N), as --gpus-per-node/--gpus/--gpus-per-task take it."""
    kind, sep, count = text.strip().rpartition(":")
    return (kind or None) if sep else None, _gpu_number(count, where, 64 * 1024)


def _gpu_number(text: str, where: str, limit: int) -> int:
    """A GPU count: 0 (no GPUs, which sbatch takes) up to ``limit``."""
    return 0 if text.strip() == "0" else positive_int(text, where, limit)


def gres_gpus(text: str, where: str) -> tuple[str | None, int]:
    """``--gres=gpu[:type]:N[,other...]`` -> the GPU part (None, 0 without one)."""
    for item in text.split(","):
        name, _, rest = item.strip().partition(":")
        if name != "gpu":
            continue
        if not rest:
            return None, 1  # "gpu" alone is one GPU, as Slurm reads it
        kind, sep, count = rest.rpartition(":")
        if not sep and not rest.isdigit():
            return rest, 1  # "gpu:a100"
        return (kind or None), _gpu_number(count if sep else rest, where, 64)
    return None, 0


#: a time limit of zero, in any of Slurm's forms: "no time limit" (sbatch's man page)
_ZERO_TIME = re.compile(r"^(?:0+-)?0+(?::0+){0,2}$")


def time(text: str, where: str) -> int | None:
    """``--time``: seconds; None for no limit (``UNLIMITED``, ``INFINITE``, or zero, which
    Slurm reads as no limit). Spaces around it are not Slurm's (``" 30 "``: refused)."""
    if text != text.strip():
        raise SpecError(f"{where}: {text!r} is not a time (spaces around it)")
    if text.upper() in ("UNLIMITED", "INFINITE") or _ZERO_TIME.match(text):
        return None
    return parse_time_s(text, where)


def stop_signal(text: str, where: str) -> tuple[str, int, bool]:
    """``[{R|B}:]SIG[@seconds]`` -> (signal name, grace, to the batch shell only), as sbatch
    reads it (60 s by default)."""
    body = text.strip()
    shell_only = body.startswith("B:")
    if len(body) > 2 and body[1] == ":" and body[0] in "RB":
        body = body[2:]
    sig, at, grace = body.partition("@")
    name = sig.upper().removeprefix("SIG")
    if name.isdigit():
        try:
            name = signal.Signals(int(name)).name.removeprefix("SIG")
        except ValueError:
            name = sig
    if name not in STOP_SIGNALS:
        raise SpecError(f"{where}: {sig!r} is not a signal a job may ask for "
                        f"({', '.join(STOP_SIGNALS)})")
    seconds = positive_int(grace, where, MAX_STOP_GRACE_S) if at else 60
    return name, seconds, shell_only
