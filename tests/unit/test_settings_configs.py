"""configs/malletrain.yaml documents every field with the code's defaults; `malletrain config`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from malletrain.cli import main
from malletrain.ops.cli_config import field_docs, settings_to_dict
from malletrain.ops.config_file import load_settings
from malletrain.ops.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "malletrain.yaml"


def test_shipped_config_is_valid_and_states_the_defaults():
    assert load_settings(CONFIG) == Settings()


def test_every_field_is_in_the_shipped_config_with_a_comment_above_it():
    lines = CONFIG.read_text().splitlines()
    missing = []
    for path in field_docs():
        section, name = path.split(".")
        start = lines.index(f"{section}:")
        for i in range(start + 1, len(lines)):
            if re.match(rf"  {name}:", lines[i]):
                if not lines[i - 1].lstrip().startswith("#"):
                    missing.append(f"{path} (no comment above line {i + 1})")
                break
            if lines[i] and not lines[i].startswith((" ", "#")):
                missing.append(f"{path} (not in section {section})")
                break
        else:
            missing.append(path)
    assert not missing, missing


def test_config_check_ok(capsys):
    assert main(["config", "check", str(CONFIG)]) == 0
    assert "ok" in capsys.readouterr().out


def test_config_check_bad_file_is_one_clear_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("allocator:\n  tick_interval_s: soon\n")
    assert main(["config", "check", str(bad)]) == 78
    err = capsys.readouterr().err
    assert f"{bad}:2: allocator.tick_interval_s: must be a number" in err
    assert "Traceback" not in err


def test_config_check_uses_env_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MALLETRAIN_CONFIG", str(tmp_path / "absent.yaml"))
    assert main(["config", "check"]) == 78
    assert "absent.yaml: no such file" in capsys.readouterr().err


def test_config_show_fills_defaults(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("allocator:\n  policy: equal-share\n")
    assert main(["config", "show", str(cfg)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    expected = settings_to_dict(Settings())
    expected["allocator"]["policy"] = "equal-share"
    assert shown == expected
    assert main(["config", "show", "--json", "--defaults"]) == 0
    assert json.loads(capsys.readouterr().out) == settings_to_dict(Settings())
