"""Signals (real SIGHUP/SIGTERM to this process) and the between-ticks config reload."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from malletrain.ops.config_file import load_settings
from malletrain.ops.metrics import Metrics
from malletrain.ops.service import ControlSignals, reload_config
from malletrain.ops.systemd import Notifier


@pytest.fixture
def signals():
    s = ControlSignals()
    s.install()
    yield s
    s.restore()


def test_sighup_requests_one_reload_and_wakes_the_loop(signals):
    t0 = time.monotonic()
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGHUP)).start()
    assert signals.wait(10) is True
    assert time.monotonic() - t0 < 5
    os.kill(os.getpid(), signal.SIGHUP)  # two HUPs before the loop looks: one reload
    assert signals.take_reload() is True
    assert signals.take_reload() is False
    assert not signals.stop_requested


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_request_stop(signals, sig):
    os.kill(os.getpid(), sig)
    assert signals.wait(5) is True
    assert signals.stop_requested and signals.stop_signal == sig


def test_wait_times_out_without_signal(signals):
    t0 = time.monotonic()
    assert signals.wait(0.2) is False
    assert time.monotonic() - t0 >= 0.19


def test_restore_puts_previous_handlers_back():
    before = signal.getsignal(signal.SIGHUP)
    s = ControlSignals()
    s.install()
    assert signal.getsignal(signal.SIGHUP) != before
    s.restore()
    assert signal.getsignal(signal.SIGHUP) == before


@pytest.fixture
def notify(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.settimeout(2)
    yield Notifier(str(path)), sock
    sock.close()


def test_reload_applies_a_valid_file(tmp_path, notify, caplog):
    notifier, sock = notify
    cfg = tmp_path / "c.yaml"
    cfg.write_text("allocator:\n  tick_interval_s: 5\n")
    running = load_settings(cfg)
    cfg.write_text("allocator:\n  tick_interval_s: 2\nmetrics:\n  address: 127.0.0.1:1\n")
    metrics = Metrics(CollectorRegistry())
    caplog.set_level(logging.INFO, logger="malletrain.ops.service")
    new = reload_config(cfg, running, metrics=metrics, notifier=notifier,
                        reconfigure_logging=False)
    assert new.allocator.tick_interval_s == 2.0
    assert new.metrics.address == running.metrics.address  # restart-only: kept
    assert any("metrics.address changed but takes effect only after a restart" in r.message
               for r in caplog.records)
    assert sock.recv(100) == b"RELOADING=1"
    assert sock.recv(100).startswith(b"READY=1\nSTATUS=config reloaded")
    assert metrics.config_reloads.labels(result="ok")._value.get() == 1


def test_reload_keeps_running_config_on_invalid_file(tmp_path, notify, caplog):
    notifier, sock = notify
    cfg = tmp_path / "c.yaml"
    cfg.write_text("allocator:\n  tick_interval_s: 5\n")
    running = load_settings(cfg)
    cfg.write_text("allocator:\n  tick_interval_s: -1\n")
    metrics = Metrics(CollectorRegistry())
    assert reload_config(cfg, running, metrics=metrics, notifier=notifier) is running
    (record,) = [r for r in caplog.records if "reload rejected" in r.message]
    assert record.levelno == logging.ERROR
    assert "allocator.tick_interval_s" in record.getMessage()
    assert f"{cfg}:2:" in record.getMessage()
    assert sock.recv(100) == b"RELOADING=1"
    assert b"rejected" in sock.recv(200)
    assert metrics.config_reloads.labels(result="rejected")._value.get() == 1


def test_stop_deadline_exits_a_stuck_shutdown(tmp_path):
    """A process whose shutdown hangs is ended at the deadline, with a log line saying why."""
    script = tmp_path / "stuck.py"
    script.write_text(
        "import logging, os, signal, sys, time\n"
        "from malletrain.ops.service import ControlSignals\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "s = ControlSignals(stop_deadline_s=1.0)\n"
        "s.install()\n"
        "print('ready', flush=True)\n"
        "while not s.stop_requested:\n"
        "    s.wait(0.1)\n"
        "time.sleep(60)  # a shutdown that never ends\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(20)
    assert rc == 1 and 0.9 <= time.monotonic() - t0 < 10
    assert "stop took longer than 1 s" in proc.stderr.read()


def test_clean_stop_cancels_the_deadline(tmp_path):
    script = tmp_path / "clean.py"
    script.write_text(
        "import time\n"
        "from malletrain.ops.service import ControlSignals\n"
        "s = ControlSignals(stop_deadline_s=0.5)\n"
        "s.install()\n"
        "print('ready', flush=True)\n"
        "while not s.stop_requested:\n"
        "    s.wait(0.1)\n"
        "s.restore()\n"
        "time.sleep(1.0)  # past the deadline, but the stop already completed\n"
        "raise SystemExit(0)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
