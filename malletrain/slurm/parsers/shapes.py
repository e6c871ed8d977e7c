"""The value shapes of Slurm's JSON across releases, read into one form, or refused.

A field the scheduling depends on (a node's state, a job's state, nodes, counts and times)
that comes in a shape not listed here raises :class:`SlurmParseError` naming the command,
the Slurm release, its data_parser and the field: a misread there could put a scavenger
job on nodes a regular job was promised, so it is never guessed (issue: on 24.11 the
22.05 parser read a RUNNING job as UNKNOWN with no nodes, without a word).

Shapes known (22.05 = openapi v0.0.38; 23.02+ = data_parser v0.0.39 to v0.0.45):

* numbers: an int (22.05), or ``{"set": bool, "infinite": bool, "number": int}``;
* states: a string (22.05; node base state lower-case), or a list of strings, the base
  state first and then its flags (``["IDLE", "PLANNED"]``, ``["PENDING", "REQUEUED"]``);
* feature lists: a comma-separated string (22.05) or a list of strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from malletrain.slurm.errors import SlurmParseError

#: Slurm's INFINITE for 32-bit fields; what a ``{"infinite": true}`` number becomes.
INFINITE_32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Source:
    """Which command and Slurm produced a JSON answer (from its ``meta``), for errors."""

    command: str
    release: str = "unknown release"
    data_parser: str = "unknown data_parser"

    def __str__(self) -> str:
        return f"{self.command} (Slurm {self.release}, {self.data_parser})"


def source_of(data: Mapping[str, Any], command: str) -> Source:
    """The :class:`Source` of a parsed answer; 22.05 and 23.02+ spell ``meta`` differently."""
    meta = data.get("meta")
    if not isinstance(meta, dict):
        return Source(command)
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    plugin = meta.get("plugin") or {}
    release = "unknown release"
    if isinstance(slurm, dict):
        version = slurm.get("version") or {}
        if isinstance(slurm.get("release"), str):
            release = slurm["release"]
        elif isinstance(version, dict) and {"major", "minor"} <= set(version):
            release = ".".join(str(version.get(k, "?")) for k in ("major", "minor", "micro"))
    parser = "unknown data_parser"
    if isinstance(plugin, dict):
        parser = str(plugin.get("data_parser") or plugin.get("name") or parser)
    return Source(command, release, parser)


def shape_error(source: Source, where: str, field: str, value: object, known: str
                ) -> SlurmParseError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return SlurmParseError(
        f"{source}: {where}: field {field!r} is {type(value).__name__} {shown}, a shape "
        f"malletrain does not know (known: {known}); refusing the whole answer rather "
        "than misreading it"
    )


def number(rec: Mapping[str, Any], field: str, source: Source, where: str,
           default: int = 0) -> int:
    """An integer field; ``{"set": false}`` is ``0`` (unset), ``infinite`` is INFINITE."""
    value = rec.get(field)
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, dict) and isinstance(value.get("set"), bool):
        if value.get("infinite") is True:
            return INFINITE_32
        if not value["set"]:
            return 0
        inner = value.get("number")
        if isinstance(inner, int) and not isinstance(inner, bool):
            return inner
    raise shape_error(source, where, field, value,
                      "an integer, or an object with set, infinite and number")


def states(rec: Mapping[str, Any], field: str, source: Source, where: str
           ) -> tuple[str, ...]:
    """A state field as (base, flag, ...) upper-case; a missing one is ``("UNKNOWN",)``."""
    value = rec.get(field)
    if value is None:
        return ("UNKNOWN",)
    if isinstance(value, str) and value:
        return (value.upper(),)
    if (isinstance(value, list) and value
            and all(isinstance(v, str) and v for v in value)):
        return tuple(v.upper() for v in value)
    raise shape_error(source, where, field, value,
                      "a non-empty string, or a non-empty list of strings")


def names(rec: Mapping[str, Any], field: str, source: Source, where: str
          ) -> tuple[str, ...]:
    """A list of names: a comma-separated string or a list of strings."""
    value = rec.get(field)
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(v for v in value.split(",") if v)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise shape_error(source, where, field, value,
                      "a comma-separated string, or a list of strings")


def text(rec: Mapping[str, Any], field: str, source: Source, where: str) -> str:
    """A string field the schedule depends on (a job's node list): never guessed."""
    value = rec.get(field)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise shape_error(source, where, field, value, "a string")
