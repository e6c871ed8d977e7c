"""Slurm hostlist expressions (``n[1-3,5]``, ``rack[1-2]-n[01-02]``) as pure functions.

Slurm prints node sets compressed everywhere (squeue's NODELIST and SCHEDNODES,
``scontrol show reservation``'s ``Nodes=``, the ``nodes`` field of ``squeue --json``).
Expanding them here, without calling ``scontrol show hostnames``, keeps parsing pure and
costs no extra process per tick.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable

from malletrain.slurm.errors import SlurmParseError

#: Slurm's "no nodes" spellings.
_EMPTY = frozenset({"", "(null)", "None", "N/A"})
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
#: Refuse absurd ranges rather than allocating millions of names from a typo.
MAX_HOSTS = 1_000_000


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmParseError(f"hostlist {expr!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"hostlist {expr!r}: unmatched ']'")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmParseError(f"hostlist {expr!r}: unmatched '['")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(expr: str, body: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE_RE.match(item.strip())
        if not m:
            raise SlurmParseError(f"hostlist {expr!r}: bad range {item!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise SlurmParseError(f"hostlist {expr!r}: range {item!r} runs backwards")
        if hi - lo + 1 > MAX_HOSTS:
            raise SlurmParseError(f"hostlist {expr!r}: range {item!r} is too large")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def expand_hostlist(expr: str | None) -> tuple[str, ...]:
    """``"n[1-3,5],m7"`` -> ``("n1", "n2", "n3", "n5", "m7")``, in Slurm's order.

    Zero padding is kept (``n[01-02]`` -> ``n01, n02``); several bracket groups in one
    name expand as a product, like Slurm's.  Empty spellings (``""``, ``(null)``) give
    ``()``.  A malformed expression raises :class:`SlurmParseError` naming it.
    """
    if expr is None or expr.strip() in _EMPTY:
        return ()
    return _expand(expr.strip())


@functools.lru_cache(maxsize=4096)  # a running job's node list is read again every tick
def _expand(expr: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in _split_top_level(expr):
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices: list[list[str]] = []
        for piece in pieces:
            if piece.startswith("[") and piece.endswith("]"):
                choices.append(_expand_ranges(expr, piece[1:-1]))
            elif piece:
                if "[" in piece or "]" in piece:
                    raise SlurmParseError(f"hostlist {expr!r}: stray bracket in {part!r}")
                choices.append([piece])
        for combo in itertools.product(*choices):
            names.append("".join(combo))
            if len(names) > MAX_HOSTS:
                raise SlurmParseError(f"hostlist {expr!r} is too large")
    return tuple(names)


_NAME_RE = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: Iterable[str]) -> str:
    """The inverse of :func:`expand_hostlist` for simple names: ``n1,n2,n3,n5`` -> ``n[1-3,5]``.

    Names are grouped by prefix and zero-padding width, in first-seen order; names without
    a numeric suffix are kept as they are.  Used to render ``NodeList=`` arguments.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name in dict.fromkeys(names):
        m = _NAME_RE.match(name)
        if not m:
            order.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        group = (prefix, width)
        if group not in groups:
            groups[group] = []
            order.append(group)
        groups[group].append(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, width = item
        nums = sorted(set(groups[item]))
        ranges: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            lo, hi = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(lo if start == prev else f"{lo}-{hi}")
            if n is not None:
                start = prev = n
        if len(nums) == 1:
            out.append(f"{prefix}{ranges[0]}")
        else:
            out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
