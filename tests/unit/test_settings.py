"""Settings loader: defaults, every kind of bad input, SIGHUP reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from malletrain.errors import ConfigError
from malletrain.ops.cli_config import field_docs, settings_to_dict
from malletrain.ops.config_file import (
    SettingsError,
    load_settings,
    parse_settings,
    reload_settings,
)
from malletrain.ops.settings import Settings
from malletrain.ops.settings_fields import parse_address


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "malletrain.yaml"
    p.write_text(text)
    return p


def test_empty_file_gives_defaults(tmp_path):
    assert load_settings(write(tmp_path, "")) == Settings()
    assert load_settings(write(tmp_path, "# only a comment\n")) == Settings()
    assert load_settings(write(tmp_path, "allocator:\n")) == Settings()


def test_values_are_typed_and_frozen(tmp_path):
    s = load_settings(write(tmp_path, (
        "allocator:\n  tick_interval_s: 2\n  policy: equal-share\n"
        "slurm:\n  partitions: [batch, gpu]\n  qos: scav\n"
        "logging:\n  level: debug\n  format: JSON\n"
        "state:\n  database_path: db/state.db\n"
    )))
    assert s.allocator.tick_interval_s == 2.0 and isinstance(s.allocator.tick_interval_s, float)
    assert s.allocator.policy == "equal-share"
    assert s.slurm.partitions == ("batch", "gpu")
    assert s.logging.level == "DEBUG" and s.logging.format == "json"
    # relative paths are relative to the config file's directory
    assert s.state.database_path == tmp_path.resolve() / "db" / "state.db"
    with pytest.raises(AttributeError):
        s.allocator.tick_interval_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("allocator:\n  tick_interval_s: -1\n", "allocator.tick_interval_s", ">= 0.1"),
        ("allocator:\n  tick_interval_s: fast\n", "allocator.tick_interval_s", "must be a number"),
        ("allocator:\n  tick_interval_s: .nan\n", "allocator.tick_interval_s", "finite"),
        ("allocator:\n  tick_intervals: 3\n", "allocator.tick_intervals", "did you mean"),
        ("allocator:\n  policy: best\n", "allocator.policy", "must be one of"),
        ("allocator:\n  policy: malletrain-known-curves\n", "allocator.policy", "true throughput"),
        ("limits:\n  max_nodes_per_job: 1.5\n", "limits.max_nodes_per_job", "integer"),
        ("limits:\n  max_nodes_per_job: true\n", "limits.max_nodes_per_job", "integer"),
        ("allocator:\n  warmup_s: -3\n", "allocator.warmup_s", ">= 0"),
        ("allocator: 5\n", "allocator", "mapping"),
        ("slurm:\n  partitions: batch\n", "slurm.partitions", "must be a list"),
        ("slurm:\n  partitions: []\n", "slurm.partitions", "at least one"),
        ("slurm:\n  partitions: [batch, 3]\n", "slurm.partitions[1]", "string"),
        ("slurm:\n  scavenger_partition: batch\n", "slurm.scavenger_partition", "also in"),
        ("slurm:\n  qos: 'a;b'\n", "slurm.qos", "must not contain"),
        ("metrics:\n  address: 9464\n", "metrics.address", "string"),
        ("metrics:\n  address: 'localhost:99999'\n", "metrics.address", "0..65535"),
        ("metrics:\n  enabled: 'yes please'\n", "metrics.enabled", "true or false"),
        ("coordinator:\n  port: 9464\n", "metrics.address", "coordinator.port"),
        ("logging:\n  level: loud\n", "logging.level", "must be one of"),
        ("state:\n  database_path: ''\n", "state.database_path", "non-empty path"),
        ("state:\n  database_path: null\n", "state.database_path", "must not be null"),
        ("submit:\n  socket_path: /" + "x" * 120 + "\n", "submit.socket_path", "at most 107"),
        ("limits:\n  max_jobs_per_user: 0\n", "limits.max_jobs_per_user", ">= 1"),
        ("limits:\n  max_jobs_per_user: 500\n", "limits.max_jobs_per_user", "max_jobs_total"),
        ("sluurm: {}\n", "sluurm", "did you mean 'slurm'"),
        ("allocator:\n  node_prices: 1\n", "allocator.node_prices", "must be a mapping"),
        ("allocator:\n  node_prices: {a100: x}\n", "allocator.node_prices.a100",
         "must be a number"),
        ("allocator:\n  node_prices: {a100: -1}\n", "allocator.node_prices", "from 0 to"),
        ("allocator:\n  node_prices: {A100: 1}\n", "allocator.node_prices", "lower case"),
        ("allocator:\n  node_prices: {1: 1}\n", "allocator.node_prices.1", "string"),
    ],
)
def test_bad_values_name_file_field_and_problem(tmp_path, text, field, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    err = info.value
    assert isinstance(err, SettingsError)
    assert field in err.fields, str(err)
    msg = str(err)
    assert str(path) in msg and field in msg and words in msg, msg
    if field.rpartition(".")[2].partition("[")[0] + ":" in text:  # set in the file: has a line
        assert err.problems[0].line is not None, msg


def test_all_problems_reported_at_once(tmp_path):
    path = write(tmp_path, "allocator:\n  tick_interval_s: 0\n  policy: x\nlogging:\n  level: y\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    expected = {"allocator.tick_interval_s", "allocator.policy", "logging.level"}
    assert set(info.value.fields) == expected
    assert [p.line for p in info.value.problems] == [2, 3, 5]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("allocator:\n  tick_interval_s: [1\n", 3, "malformed YAML"),
        ("a: b\n  c: d\n", 2, "malformed YAML"),
        ("x:\n\t- y\n", 2, "malformed YAML"),
        ("logging: {}\nlogging: {}\n", 2, "given twice"),
        ("- 1\n- 2\n", 1, "top level must be a mapping"),
    ],
)
def test_malformed_yaml_names_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    assert f"{path}:{line}:" in str(info.value), str(info.value)
    assert words in str(info.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(SettingsError, match="no such file"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(SettingsError, match="is a directory"):
        load_settings(tmp_path)
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SettingsError, match="UTF-8"):
        load_settings(p)


def test_parse_address():
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("host.example:80") == ("host.example", 80)
    for bad in ("9464", ":9464", "::1:9464", "[zz]:1", "h:p", "h:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_reload_keeps_running_config_on_error(tmp_path):
    path = write(tmp_path, "allocator:\n  tick_interval_s: 2\n")
    running = load_settings(path)
    path.write_text("allocator:\n  tick_interval_s: -2\n")
    result = reload_settings(path, running)
    assert not result.ok and result.settings is running
    assert "allocator.tick_interval_s" in str(result.error)


def test_reload_applies_reloadable_fields_and_names_restart_only_ones(tmp_path):
    path = write(tmp_path, "allocator:\n  tick_interval_s: 2\n")
    running = load_settings(path)
    path.write_text(
        "allocator:\n  tick_interval_s: 7\nlogging:\n  level: DEBUG\n"
        "metrics:\n  address: 127.0.0.1:9999\n"
    )
    result = reload_settings(path, running)
    assert result.ok
    assert result.settings.allocator.tick_interval_s == 7.0
    assert result.settings.logging.level == "DEBUG"
    assert result.settings.metrics.address == running.metrics.address  # needs a restart
    assert result.needs_restart == ("metrics.address",)
    assert set(result.changed) == {"allocator.tick_interval_s", "logging.level"}


def test_every_field_is_documented_and_round_trips():
    docs = field_docs()
    assert all(len(doc) > 10 for doc in docs.values())
    import yaml

    text = yaml.safe_dump(settings_to_dict(Settings()))
    assert parse_settings(text, "roundtrip.yaml") == Settings()


def test_policy_options_follow_the_settings(tmp_path):
    from malletrain.core.policies import make_policy

    s = load_settings(write(tmp_path, (
        "allocator:\n  horizon_s: 600\n  warmup_s: 12\n  default_scale_up_s: 4\n"
    )))
    assert s.allocator.policy_options().horizon_s == 600.0
    assert make_policy(s.allocator.policy, s.allocator.policy_options()).name == "malletrain"
    advisor = s.allocator.advisor_settings()
    assert (advisor.warmup_s, advisor.default_scale_up_s) == (12.0, 4.0)
    # live, a short warm-up-only stint is stall, not throughput (docs/daemon.md)
    assert advisor.min_warmup_evidence_s > 0.0


def test_slot_settings_reach_the_decision(tmp_path):
    from malletrain.daemon.service.daemon import decide_settings

    s = load_settings(write(tmp_path, (
        "slurm:\n  yield_ahead_s: 3\n  min_slot_time_s: 120\n  max_slot_time_s: 900\n"
        "  scavenger_partition: scav\n  yield_confirm_s: 2.5\n  yield_unplanned_s: 0\n"
        "coordinator:\n  heartbeat_timeout_s: 45\n"
    )))
    d = decide_settings(s)
    assert (d.yield_ahead_s, d.min_slot_time_s, d.max_slot_time_s) == (3.0, 120.0, 900.0)
    assert d.yield_confirm_s == 2.5 and decide_settings(Settings()).yield_confirm_s == 1.0
    assert d.yield_unplanned_s == 0.0 and decide_settings(Settings()).yield_unplanned_s == 10.0
    assert (d.scavenger_partition, d.heartbeat_timeout_s) == ("scav", 45.0)
    assert decide_settings(Settings()).yield_ahead_s == 10.0
    with pytest.raises(SettingsError, match=r"slurm\.yield_ahead_s"):
        load_settings(write(tmp_path, "slurm:\n  yield_ahead_s: -1\n"))
    with pytest.raises(SettingsError, match=r"slurm\.yield_confirm_s"):
        load_settings(write(tmp_path, "slurm:\n  yield_confirm_s: 61\n"))


def test_node_prices_reach_the_decision_in_slurms_type_names(tmp_path):
    """``allocator.node_prices`` (issue 19 §1): keyed by the type ``malletrain nodes`` shows,
    ``cpu`` for nodes without GPUs (whose type is ""); with prices the plan counts work in
    each job's one-node units, the units a price is given in."""
    from malletrain.daemon.service.daemon import decide_settings

    s = load_settings(write(tmp_path, "allocator:\n  node_prices: {a100: 0.5, cpu: 0.1}\n"))
    assert decide_settings(s).node_prices == {"a100": 0.5, "": 0.1}
    assert s.allocator.policy_options().work_units
    assert not Settings().allocator.policy_options().work_units
    assert decide_settings(Settings()).node_prices == {}


def test_the_odd_nodes_turn_is_a_setting_the_policy_runs_with(tmp_path):
    from malletrain.core.policies import make_policy

    s = load_settings(write(tmp_path, "accounting:\n  fair_turn_s: 120\n"))
    assert s.policy_options().fair_turn_s == 120.0
    policy = make_policy(s.allocator.policy, s.policy_options())
    assert policy.fair_turn_s == 120.0
    assert Settings().policy_options().fair_turn_s == 600.0
    assert load_settings(write(tmp_path, "accounting:\n  fair_turn_s: 0\n")).policy_options(
        ).fair_turn_s == 0.0
    with pytest.raises(SettingsError) as err:
        load_settings(write(tmp_path, "accounting:\n  fair_turn_s: -5\n"))
    assert "accounting.fair_turn_s" in str(err.value)
