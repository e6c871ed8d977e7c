"""The shipped systemd unit: `systemd-analyze verify`, hardening score, consistency with the code.

`systemd-analyze verify` checks that ExecStart's binary exists, so the test verifies a copy
whose ExecStart points at the malletrain entry point of this environment (the same console
script the packaged path /opt/malletrain/bin/malletrain is); every other line is the shipped
unit's, unchanged. A control case proves the check can fail.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain.errors import ConfigError
from malletrain.ops.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "configs" / "malletrain.service"
COORDINATOR_UNIT = ROOT / "configs" / "malletrain-coordinator.service"
SYSUSERS = ROOT / "configs" / "malletrain.sysusers.conf"
SHIPPED_BINARY = "/opt/malletrain/bin/malletrain"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def unit_lines(unit: Path = UNIT) -> dict[str, list[str]]:
    """key -> values (systemd allows repeated keys), ignoring comments."""
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


def local_copy(tmp_path: Path, extra: str = "", unit: Path = UNIT) -> Path:
    binary = Path(sys.executable).parent / "malletrain"
    assert binary.exists(), f"{binary}: the package's console script is not installed"
    text = unit.read_text()
    assert f"ExecStart={SHIPPED_BINARY} " in text
    text = text.replace(f"={SHIPPED_BINARY} ", f"={binary} ")
    if extra:
        text = text.replace("[Service]\n", "[Service]\n" + extra + "\n")
    path = tmp_path / unit.name  # the unit name must stay the same
    path.write_text(text)
    return path


def verify(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", *map(str, paths)], capture_output=True, text=True,
        timeout=60,
    )


def test_units_pass_systemd_analyze_verify(tmp_path):
    result = verify(local_copy(tmp_path), local_copy(tmp_path, unit=COORDINATOR_UNIT))
    assert result.returncode == 0, result.stderr
    # verify exits 0 even for unknown keys; it only warns. Warnings count as failures here.
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if "malletrain" in line
    ]
    assert not complaints, "\n".join(complaints)


def test_verify_catches_a_broken_unit(tmp_path):
    """Control: the check above is able to fail."""
    result = verify(local_copy(tmp_path, extra="NoNewPrivilegs=yes"))
    assert "Unknown key" in result.stderr and "NoNewPrivilegs" in result.stderr
    missing = local_copy(tmp_path).read_text().replace(
        str(Path(sys.executable).parent / "malletrain"), str(tmp_path / "no-such-binary")
    )
    bad = tmp_path / "x" / "malletrain.service"
    bad.parent.mkdir()
    bad.write_text(missing)
    result = verify(bad)
    assert result.returncode != 0 and "no-such-binary" in result.stderr


@pytest.mark.parametrize("unit", [UNIT, COORDINATOR_UNIT], ids=lambda u: u.name)
def test_hardening_exposure_is_low(tmp_path, unit):
    # systemd's own score: 0 (locked down) .. 10 (unprotected); 2.0 is well inside "OK".
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=20", "--no-pager",
         str(local_copy(tmp_path, unit=unit))],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert f"Overall exposure level for {unit.name}" in result.stdout


def test_unit_is_a_notify_service_with_the_required_hardening():
    u = unit_lines()
    expected = {
        "Type": "notify", "NotifyAccess": "main", "User": "malletrain", "Group": "malletrain",
        "Restart": "on-failure", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
        "ProtectHome": "yes", "PrivateTmp": "yes", "ProtectKernelTunables": "yes",
    }
    for key, value in expected.items():
        assert u.get(key) == [value], (key, u.get(key))
    # reload = validate (fails the reload visibly if the file is bad), then SIGHUP
    assert u["ExecReload"] == [
        f"{SHIPPED_BINARY} config check /etc/malletrain/malletrain.yaml",
        "/bin/kill -HUP $MAINPID",
    ]
    assert set(u["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "/var/lib/malletrain" in u["ReadWritePaths"][0].split()
    assert u["CapabilityBoundingSet"] == [""]  # no capabilities at all


def test_unit_agrees_with_the_code():
    u = unit_lines()
    defaults = Settings()
    # the daemon gets its stop deadline before systemd's SIGKILL, and pings the watchdog
    # (at least every WatchdogSec/2) well within the interval
    assert float(u["TimeoutStopSec"][0]) > defaults.daemon.stop_timeout_s
    assert float(u["WatchdogSec"][0]) >= 4 * defaults.allocator.tick_interval_s
    # an invalid config exits with ConfigError's status; restarting would not fix it
    assert u["RestartPreventExitStatus"] == [str(ConfigError.exit_code)]
    # the runtime/state directories systemd creates are the default socket and database paths
    assert defaults.submit.socket_path.parent == Path("/run") / u["RuntimeDirectory"][0]
    assert defaults.state.database_path.parent == Path("/var/lib") / u["StateDirectory"][0]
    argv = shlex.split(u["ExecStart"][0])
    assert argv[0] == SHIPPED_BINARY and argv[1:3] == ["daemon", "--config"]
    assert argv[3] == "/etc/malletrain/malletrain.yaml"
    assert shlex.split(u["ExecReload"][0])[-1] == argv[3]  # reload checks the same file


@pytest.mark.parametrize(
    ("unit", "key", "index"),
    [(UNIT, "ExecStart", 0), (UNIT, "ExecReload", 0), (COORDINATOR_UNIT, "ExecStart", 0)],
    ids=["daemon", "reload-check", "coordinator"],
)
def test_exec_lines_are_real_command_lines(unit, key, index):
    """The malletrain command lines of the units are accepted by the CLI as built."""
    from malletrain.cli import build_parser

    argv = shlex.split(unit_lines(unit)[key][index])
    assert argv[0] == SHIPPED_BINARY
    args = build_parser().parse_args(argv[1:])
    assert callable(getattr(args, "func", None)), f"{argv[1]} is not registered"


def test_coordinator_unit_is_where_the_daemon_looks():
    """The daemon attaches to the coordinator unit's address file / the configured port."""
    from malletrain.cli import build_parser
    from malletrain.daemon.service.coordinator_proc import coordinator_files as _coordinator_files

    args = build_parser().parse_args(shlex.split(unit_lines(COORDINATOR_UNIT)["ExecStart"][0])[1:])
    defaults = Settings()
    assert (args.host, args.port) == (defaults.coordinator.host, defaults.coordinator.port)
    assert args.address_file == _coordinator_files(defaults)[0]
    u, c = unit_lines(), unit_lines(COORDINATOR_UNIT)
    assert "malletrain-coordinator.service" in u["Wants"]
    assert c["User"] == u["User"] and c["StateDirectory"] == u["StateDirectory"]
    assert c["Restart"] == ["always"]


def test_sysusers_snippet_creates_the_unit_user(tmp_path):
    sysusers = shutil.which("systemd-sysusers")
    assert sysusers, "systemd-sysusers missing (apt package systemd)"
    conf_dir = tmp_path / "etc" / "sysusers.d"
    conf_dir.mkdir(parents=True)
    shutil.copy(SYSUSERS, conf_dir / "malletrain.conf")
    subprocess.run([sysusers, f"--root={tmp_path}"], check=True, capture_output=True, timeout=60)
    passwd = (tmp_path / "etc" / "passwd").read_text().splitlines()
    (entry,) = [line for line in passwd if line.startswith("malletrain:")]
    _, _, uid, _, _, home, shell = entry.split(":")
    assert int(uid) < 1000  # a system account
    assert home == "/var/lib/malletrain" and shell == "/usr/sbin/nologin"
    assert unit_lines()["User"] == ["malletrain"]
