"""The settings file: YAML in, typed :class:`~malletrain.ops.settings.Settings` out.

Validation is strict and complete: unknown keys, wrong types, out-of-range values and
malformed YAML all raise :class:`SettingsError` (a :class:`~malletrain.errors.ConfigError`)
whose message names the file, the line where the YAML has one, the field path
(e.g. ``allocator.tick_interval_s``) and what is wrong.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from malletrain.errors import ConfigError
from malletrain.ops.settings import Settings, cross_checks


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file."""

    field: str  # dotted path, "" for the document itself
    message: str
    line: int | None = None  # 1-based, where the YAML has one

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        if not self.field:
            return f"{where}: {self.message}"
        return f"{where}: {self.field}: {self.message}"


class SettingsError(ConfigError):
    """Invalid configuration: ``problems`` lists them all; the message names file, line, field."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = tuple(problems)
        if len(problems) == 1:
            text = problems[0].render(file)
        else:
            text = f"{file}: {len(problems)} problems:\n" + "\n".join(
                "  " + p.render(file) for p in problems
            )
        super().__init__(text)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(p.field for p in self.problems)


# ---------------------------------------------------------------------------------------
# YAML reading (with line numbers and duplicate-key detection)
# ---------------------------------------------------------------------------------------
def _node_lines(node: yaml.Node, out: dict[str, int], dupes: list[Problem]) -> None:
    """Record the line of each key path; report keys given twice (PyYAML keeps the last).

    Iterative with a budget: aliases can make a small file a huge tree (billion laughs), and
    line numbers are only a courtesy for error messages.
    """
    budget = 10_000
    stack: list[tuple[yaml.Node, str]] = [(node, "")]
    while stack and budget > 0:
        current, prefix = stack.pop()
        if not isinstance(current, yaml.MappingNode):
            continue
        seen: set[str] = set()
        for key_node, value_node in current.value:
            budget -= 1
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            line = key_node.start_mark.line + 1
            if key in seen:
                dupes.append(Problem(path, "is given twice", line))
            seen.add(key)
            out.setdefault(path, line)
            stack.append((value_node, path))
            if isinstance(value_node, yaml.SequenceNode):
                for i, item in enumerate(value_node.value[:100]):
                    out.setdefault(f"{path}[{i}]", item.start_mark.line + 1)


def _read_yaml(text: str, file: str) -> tuple[Any, dict[str, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = "; ".join(str(x) for x in (exc.context, exc.problem) if x) or "cannot parse"
        raise SettingsError(file, [Problem("", f"malformed YAML: {what}", line)]) from None
    except yaml.YAMLError as exc:  # e.g. a ReaderError for control characters
        raise SettingsError(file, [Problem("", f"malformed YAML: {exc}")]) from None
    except RecursionError:
        raise SettingsError(file, [Problem("", "malformed YAML: nested too deeply")]) from None
    lines: dict[str, int] = {}
    dupes: list[Problem] = []
    if node is not None:
        _node_lines(node, lines, dupes)
    if dupes:
        raise SettingsError(file, dupes)
    return data, lines


# ---------------------------------------------------------------------------------------
# conversion: YAML value -> typed value, collecting problems
# ---------------------------------------------------------------------------------------
_YAML_TYPE = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
              list: "a list", dict: "a mapping", type(None): "null"}


def _describe(value: Any) -> str:
    kind = _YAML_TYPE.get(type(value), type(value).__name__)
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} ({shown})" if value is not None else "null"


def _num(x: float) -> str:
    """A number for a message: 5 not 5.0, and no OverflowError for a 400-digit integer."""
    if isinstance(x, int):
        text = str(x)
        return text if len(text) <= 20 else text[:8] + f"...({len(text)} digits)"
    return f"{x:g}"


class _Converter:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.problems: list[Problem] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def section(self, cls: type, value: Any, path: str) -> Any:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping of settings, got {_describe(value)}")
            return cls()
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str) or key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(fields)}"
                self.fail(sub, "unknown setting" + hint)
                continue
            f = fields[key]
            before = len(self.problems)
            converted = self.value(hints[key], raw, sub)
            if len(self.problems) == before:
                self.constraints(f, converted, sub)
            if len(self.problems) == before:
                kwargs[key] = converted
        return cls(**kwargs)

    def value(self, tp: Any, raw: Any, path: str) -> Any:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.section(tp, raw, path)
        if origin in (typing.Union, types.UnionType):
            if raw is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self.value(inner, raw, path)
        if raw is None:
            self.fail(path, f"must not be null (expected {self.expected(tp)})")
            return None
        if origin is Literal:
            if isinstance(raw, bool) and {"on", "off"} <= set(args):
                return "on" if raw else "off"  # YAML 1.1 reads a bare on/off as a boolean
            if isinstance(raw, str):
                for choice in args:
                    if raw.lower() == str(choice).lower():
                        return choice
            self.fail(path, f"must be one of {', '.join(map(str, args))}, got {_describe(raw)}")
            return None
        if origin is Mapping:
            if not isinstance(raw, Mapping):
                self.fail(path, f"must be a mapping, got {_describe(raw)}")
                return None
            return {self.value(args[0], k, f"{path}.{k}"): self.value(args[1], v, f"{path}.{k}")
                    for k, v in raw.items()}
        if origin is tuple:
            if not isinstance(raw, list):
                self.fail(path, f"must be a list, got {_describe(raw)}")
                return None
            return tuple(self.value(args[0], item, f"{path}[{i}]") for i, item in enumerate(raw))
        scalar = {bool: self._bool, int: self._int, float: self._float, str: self._str,
                  Path: self._path}.get(tp)
        if scalar is not None:
            return scalar(raw, path)
        raise TypeError(f"settings field type {tp!r} is not supported")  # a bug in this module

    def _bool(self, raw: Any, path: str) -> Any:
        if not isinstance(raw, bool):
            self.fail(path, f"must be true or false, got {_describe(raw)}")
        return raw

    def _int(self, raw: Any, path: str) -> Any:
        if isinstance(raw, bool) or not isinstance(raw, int):
            self.fail(path, f"must be an integer, got {_describe(raw)}")
        return raw

    def _float(self, raw: Any, path: str) -> float | None:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            self.fail(path, f"must be a number, got {_describe(raw)}")
            return None
        try:
            value = float(raw)
        except OverflowError:
            self.fail(path, "is too large")
            return None
        if not math.isfinite(value):
            self.fail(path, f"must be a finite number, got {raw}")
            return None
        return value

    def _str(self, raw: Any, path: str) -> Any:
        if not isinstance(raw, str):
            self.fail(path, f"must be a string, got {_describe(raw)} (quote it in YAML)")
        return raw

    def _path(self, raw: Any, path: str) -> Path | None:
        if not isinstance(raw, str) or not raw.strip():
            self.fail(path, f"must be a non-empty path, got {_describe(raw)}")
            return None
        if "\0" in raw:
            self.fail(path, "must not contain a NUL character")
            return None
        if raw.startswith("~"):
            self.fail(path, f"~ is not expanded (whose home?); write the full path: {raw!r}")
            return None
        p = Path(raw)
        return p if p.is_absolute() else self.base_dir / p

    @staticmethod
    def expected(tp: Any) -> str:
        if typing.get_origin(tp) is Literal:
            return "one of " + ", ".join(map(str, typing.get_args(tp)))
        if typing.get_origin(tp) in (tuple, Mapping):
            return "a list" if typing.get_origin(tp) is tuple else "a mapping"
        return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                Path: "a path"}.get(tp, str(tp))

    def constraints(self, f: dataclasses.Field[Any], value: Any, path: str) -> None:
        meta = f.metadata
        if value is None:
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if meta.get("min") is not None and value < meta["min"]:
                self.fail(path, f"must be >= {_num(meta['min'])}, got {_num(value)}")
            elif meta.get("gt") is not None and value <= meta["gt"]:
                self.fail(path, f"must be > {_num(meta['gt'])}, got {_num(value)}")
            elif meta.get("max") is not None and value > meta["max"]:
                self.fail(path, f"must be <= {_num(meta['max'])}, got {_num(value)}")
        check = meta.get("check")
        if check is not None and not self.problems_at(path):
            problem = check(value)
            if problem:
                self.fail(path, problem)

    def problems_at(self, path: str) -> bool:
        return any(p.field == path for p in self.problems)


def parse_settings(text: str, file: str = "<config>", base_dir: Path | None = None) -> Settings:
    """Validate YAML text into :class:`Settings` (``file`` only names it in errors)."""
    data, lines = _read_yaml(text, file)
    conv = _Converter(base_dir if base_dir is not None else Path.cwd())
    if data is not None and not isinstance(data, Mapping):
        what = f"the top level must be a mapping of sections, got {_describe(data)}"
        raise SettingsError(file, [Problem("", what, 1)])
    settings = conv.section(Settings, data or {}, "")
    problems = conv.problems
    if not problems:
        problems = [Problem(path, msg) for path, msg in cross_checks(settings)]
    if problems:
        raise SettingsError(file, [_with_line(p, lines) for p in problems])
    return settings


def _with_line(p: Problem, lines: Mapping[str, int]) -> Problem:
    path = p.field
    while path:
        if path in lines:
            return dataclasses.replace(p, line=lines[path])
        path = path.rpartition(".")[0]
    return p


def load_settings(path: str | os.PathLike[str] | None) -> Settings:
    """Read and validate a config file. ``None`` = built-in defaults (no file)."""
    if path is None:
        return Settings()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SettingsError(str(p), [Problem("", "no such file")]) from None
    except IsADirectoryError:
        raise SettingsError(str(p), [Problem("", "is a directory, not a config file")]) from None
    except OSError as exc:
        raise SettingsError(str(p), [Problem("", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(str(p), [Problem("", f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_settings(text, str(p), p.resolve().parent)


# ---------------------------------------------------------------------------------------
# SIGHUP reload
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReloadResult:
    """Outcome of a reload: the settings to run with next, or why the file was rejected.

    ``settings`` is always usable: on error it is the running settings unchanged. Fields that
    cannot change without a restart (sockets, the database) keep their running values;
    ``needs_restart`` names those that differ in the file.
    """

    settings: Settings
    error: ConfigError | None = None
    needs_restart: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def reload_settings(path: str | os.PathLike[str] | None, running: Settings) -> ReloadResult:
    """Load ``path`` again for SIGHUP; never raises for a bad file."""
    try:
        new = load_settings(path)
    except ConfigError as exc:
        return ReloadResult(settings=running, error=exc)
    sections: dict[str, Any] = {}
    needs_restart: list[str] = []
    changed: list[str] = []
    for sec in dataclasses.fields(Settings):
        old_sec, new_sec = getattr(running, sec.name), getattr(new, sec.name)
        keep: dict[str, Any] = {}
        for f in dataclasses.fields(old_sec):
            old_v, new_v = getattr(old_sec, f.name), getattr(new_sec, f.name)
            if old_v == new_v:
                continue
            path = f"{sec.name}.{f.name}"
            if f.metadata.get("restart"):
                needs_restart.append(path)
                keep[f.name] = old_v
            else:
                changed.append(path)
        sections[sec.name] = dataclasses.replace(new_sec, **keep) if keep else new_sec
    return ReloadResult(Settings(**sections), None, tuple(needs_restart), tuple(changed))
