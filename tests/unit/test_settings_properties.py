"""Property-based tests: whatever is thrown at the loader, it returns Settings or raises a
ConfigError that names the file and the field, never anything else (no traceback)."""

from __future__ import annotations

import dataclasses
import math
import string
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from malletrain.errors import ConfigError
from malletrain.ops.cli_config import field_docs, settings_to_dict
from malletrain.ops.config_file import (
    SettingsError,
    load_settings,
    parse_settings,
)
from malletrain.ops.settings import Settings

FIELDS = sorted(field_docs())
SECTIONS = sorted({f.split(".")[0] for f in FIELDS})
FILE = "/etc/malletrain/test.yaml"
DEFAULTS = settings_to_dict(Settings())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", " ", "~", "~root/x", "a b", "a;b", "1e3", "yes", "NaN", "127.0.0.1",
                     "[::1]:80", "host:port", "/" + "x" * 200, "batch", "scavenger",
                     "DEBUG", "json", "equal-share", "\0", "0.0.0.0:65536"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(string.ascii_lowercase + "_", max_size=12), inner, max_size=4),
    ),
    max_leaves=12,
)


def check_outcome(text: str) -> Settings | SettingsError:
    try:
        return parse_settings(text, FILE)
    except ConfigError as err:
        assert isinstance(err, SettingsError)
        assert err.problems
        msg = str(err)
        assert msg.startswith(FILE), msg
        assert "Traceback" not in msg
        return err


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, allow_unicode=True)


@settings(max_examples=250, deadline=None)
@given(field=st.sampled_from(FIELDS), value=values)
def test_any_value_in_any_field_is_accepted_or_named(field, value):
    section, name = field.split(".")
    outcome = check_outcome(dump({section: {name: value}}))
    if isinstance(outcome, SettingsError):
        # the field we set is the one named (cross-field rules name it in their message)
        assert field in str(outcome), (field, value, str(outcome))
    else:
        got = getattr(getattr(outcome, section), name)
        if isinstance(got, Path):
            assert str(got).endswith(str(value).lstrip("./")) or Path(value).is_absolute()
        elif isinstance(got, tuple):
            assert list(got) == value
        elif isinstance(got, float) and isinstance(value, (int, float)):
            assert math.isclose(got, value)
        elif isinstance(got, str) and isinstance(value, str):
            assert got.lower() == value.lower()
        elif isinstance(got, str) and isinstance(value, bool):
            # a bare YAML 1.1 on/off (read as a boolean) for an on/off choice (accounting.mode)
            assert got == ("on" if value else "off"), (field, value, got)
        else:
            assert got == value


@settings(max_examples=80, deadline=None)
@given(
    where=st.sampled_from(["", *SECTIONS]),
    key=st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=20),
    value=values,
)
def test_unknown_keys_are_named(where, key, value):
    in_section = {f.split(".")[1] for f in FIELDS if f.startswith(where + ".")}
    known = in_section if where else set(SECTIONS)
    assume(key not in known)
    doc = {key: value} if not where else {where: {key: value}}
    outcome = check_outcome(dump(doc))
    assert isinstance(outcome, SettingsError)
    path = key if not where else f"{where}.{key}"
    assert path in outcome.fields and "unknown setting" in str(outcome)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=values)
def test_any_document_shape(doc):
    check_outcome(dump(doc))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text(text):
    check_outcome(text)


yaml_fragments = st.lists(
    st.sampled_from([
        "allocator:", "  tick_interval_s: 5", "  policy: [", "slurm: {", "  partitions: [batch",
        "- a", "  - b", "\t", "&x a", "*x", "*nope", "!!python/object:os.system x", "? [a, b]",
        ": c", "'unterminated", '"\\xZZ"', "%YAML 1.1", "---", "...", "key: value: other",
        "  ", "#", "logging: {level: INFO, level: DEBUG}", "a: !!binary Zm9v", "b: !!set {x}",
        "c: 2001-12-14", "d: 0o777", "e: 0x1F", "f: .inf", "g: ~", "{", "}", "[", "]", ",",
    ]),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(parts=yaml_fragments)
def test_yaml_that_is_almost_right(parts):
    outcome = check_outcome("\n".join(parts) + "\n")
    if isinstance(outcome, SettingsError) and "malformed YAML" in str(outcome):
        # the parser's complaints carry a line number inside the file
        lines = [p.line for p in outcome.problems]
        assert all(line is None or 1 <= line <= len(parts) + 2 for line in lines)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_bytes_on_disk(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "malletrain.yaml"
        path.write_bytes(data)
        try:
            load_settings(path)
        except ConfigError as err:
            assert str(err).startswith(str(path))


def _valid_value(section: str, f: dataclasses.Field[Any]) -> st.SearchStrategy[Any]:
    """Values a field accepts, from its default's type and its bounds."""
    meta, default = f.metadata, f.default
    lo = meta.get("min") if meta.get("min") is not None else meta.get("gt")
    hi = meta.get("max")
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int) and f.name != "port":
        return st.integers(int(lo or 0) + 1, int(hi or 10**6))
    if isinstance(default, float):
        return st.floats(float(lo or 0) + 0.01, float(hi or 1e6))
    return st.just(DEFAULTS[section][f.name])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_valid_configs_round_trip(data):
    doc: dict[str, dict[str, Any]] = {}
    for sec in dataclasses.fields(Settings):
        cls = type(getattr(Settings(), sec.name))
        for f in dataclasses.fields(cls):
            if data.draw(st.booleans()):
                doc.setdefault(sec.name, {})[f.name] = data.draw(_valid_value(sec.name, f))
    limits = doc.get("limits", {})
    assume(limits.get("max_jobs_per_user", 8) <= limits.get("max_jobs_total", 100))
    slot = doc.get("slurm", {})
    assume(slot.get("min_slot_time_s", 60) <= slot.get("max_slot_time_s", 3600))
    loaded = parse_settings(dump(doc), FILE)
    again = parse_settings(dump(settings_to_dict(loaded)), FILE)
    assert again == loaded
    for section, fields in doc.items():
        for name, value in fields.items():
            assert settings_to_dict(loaded)[section][name] == value
