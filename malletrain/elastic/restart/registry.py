"""The tasks a node runs for its job's steps, as its node agent finds and stops them.

A step's tasks on a node are children of that node slot's ``slurmstepd``, not of the node
agent, so the agent's process-tree walk (:mod:`.tree`) does not see them. Each task wrapper
(:mod:`.task`) therefore registers itself in the agent's private directory
(``<run_dir>/tasks/<pid>``, with the process's start time, so a reused pid is never
signalled), as its own process group; the agent signals and waits for those groups when it
stops a generation, as ``slurmstepd`` does for a job's steps on its node.

The agent writes ``<run_dir>/generation`` (``<epoch> run`` / ``<epoch> stop``) *before* it
scans: a task that registers after the scan sees ``stop`` and leaves at once, so no task of
a stopped generation can slip past its agent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil


def _tasks_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "tasks"


def set_generation(run_dir: str | Path, epoch: int, state: str) -> None:
    """The agent's side: generation ``epoch`` runs here, or is stopping."""
    path = Path(run_dir) / "generation"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{epoch} {state}\n")
    os.replace(tmp, path)
    _tasks_dir(run_dir).mkdir(mode=0o700, exist_ok=True)


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read().decode("ascii", "replace")
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks


def register(run_dir: str | Path, epoch: int, wait_s: float = 60.0) -> bool:
    """The task's side: record this process (as its own process group) for the agent.
    A task can arrive before its node's agent has started the generation (the agent waits
    for the last generation to stop everywhere first): it waits up to ``wait_s`` for it.
    False if the generation is not (or no longer) running here: the task must not start."""
    with contextlib.suppress(OSError):
        os.setsid()  # a session (and process group) of its own: signalled as a whole
    end = time.monotonic() + wait_s
    state = _state(run_dir)
    while (state is None or state[0] < epoch) and time.monotonic() < end:
        time.sleep(0.05)
        state = _state(run_dir)
    if state != (epoch, "run"):
        return False
    pid = os.getpid()
    entry = _tasks_dir(run_dir) / str(pid)
    tmp = entry.with_name(f".{pid}")
    tmp.write_text(_start_time(pid))
    os.replace(tmp, entry)  # whole or absent: the agent may be reading the directory
    if _state(run_dir) != (epoch, "run"):  # the agent began to stop meanwhile
        unregister(run_dir)
        return False
    return True


def _state(run_dir: str | Path) -> tuple[int, str] | None:
    try:
        epoch, state = (Path(run_dir) / "generation").read_text().split()
        return int(epoch), state
    except (OSError, ValueError):
        return None


def unregister(run_dir: str | Path) -> None:
    with contextlib.suppress(OSError):
        (_tasks_dir(run_dir) / str(os.getpid())).unlink()


def live_tasks(run_dir: str | Path) -> list[int]:
    """Process groups of registered tasks still alive (stale entries removed)."""
    out = []
    try:
        entries = list(_tasks_dir(run_dir).iterdir())
    except OSError:
        return []
    for entry in entries:
        pid = int(entry.name) if entry.name.isdigit() else 0
        if pid <= 0:
            continue
        if _same_process(pid, entry) or (not psutil.pid_exists(pid) and _group_alive(pid)):
            out.append(pid)  # the task, or what its group left behind after it ended
        elif not psutil.pid_exists(pid):
            with contextlib.suppress(OSError):
                entry.unlink()
    return out


def _same_process(pid: int, entry: Path) -> bool:
    try:
        return (_start_time(pid) == entry.read_text().strip()
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except (OSError, IndexError, psutil.Error):
        return False


def _group_alive(pgid: int) -> bool:
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_tasks(tasks: list[int], sig: int) -> None:
    """A signal for each task: to its wrapper, which passes it to everything the task
    started (:func:`.task.supervise`); SIGKILL to everything below the wrapper and to its
    process group, the wrapper included (it cannot pass that one on)."""
    for pid in tasks:
        if sig == signal.SIGKILL:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.kill()  # those that left the group too (a subreaper's)
        with contextlib.suppress(OSError):
            if sig == signal.SIGKILL:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
