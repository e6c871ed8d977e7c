"""Which Slurm backend a cluster gets: pyslurm where it matches Slurm, the CLI otherwise.

pyslurm links libslurm's ABI, so its major.minor must equal the cluster's Slurm; PyPI's
pyslurm is built for one Slurm release only. The CLI backend (``--json``) is the one tested
on the dev cluster.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from malletrain.slurm.backend import DEFAULT_TIMEOUT_S, CliBackend, SlurmBackend
from malletrain.slurm.errors import (
    SlurmCommandError,
    SlurmCommandNotFoundError,
    SlurmParseError,
    SlurmUnavailableError,
)
from malletrain.slurm.pyslurm_backend import PyslurmBackend

log = logging.getLogger(__name__)

_logged_reasons: set[str] = set()


def _log_once(level: int, reason: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        log.log(level, "%s", reason)


def _major_minor(version: str) -> str | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", version)
    return f"{int(m.group(1))}.{int(m.group(2)):02d}" if m else None


def choose_backend_kind(pyslurm_version: str | None, slurm_version: str | None) -> tuple[str, str]:
    """Pure decision: ``("pyslurm"|"cli", reason)`` from the two versions.

    ``pyslurm_version`` is ``None`` when pyslurm cannot be imported.  pyslurm's major.minor
    must equal Slurm's (pyslurm 25.11.x needs Slurm 25.11), since it links libslurm's ABI.
    """
    if pyslurm_version is None:
        return "cli", (
            "pyslurm is not importable; using the Slurm CLI backend (PyPI's pyslurm is "
            "built for Slurm 25.11 only and does not build against older Slurm)"
        )
    want = _major_minor(pyslurm_version)
    if slurm_version is None:
        return "cli", (
            f"pyslurm {pyslurm_version} is importable but the cluster's Slurm version is "
            "unknown; using the Slurm CLI backend"
        )
    if want != _major_minor(slurm_version):
        return "cli", (
            f"pyslurm {pyslurm_version} is built for Slurm {want} but this cluster runs "
            f"Slurm {slurm_version}; using the Slurm CLI backend"
        )
    return "pyslurm", f"pyslurm {pyslurm_version} matches Slurm {slurm_version}"


def select_backend(
    *, env: Mapping[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    daemon: bool = False,
) -> SlurmBackend:
    """The best backend for this cluster; says once (log) why it picked the CLI.

    ``daemon``: read the queue in the daemon's form, a job list far cheaper than whole
    JSON records on a centre's queue (:func:`~malletrain.slurm.versions.every_tick`).
    """
    cli = CliBackend(env=env, timeout_s=timeout_s, daemon=daemon)
    try:
        import pyslurm
    except Exception:  # a broken build raises more than ImportError
        pyslurm = None
    pyslurm_version = getattr(pyslurm, "__version__", "0") if pyslurm is not None else None
    slurm_version: str | None = None
    if pyslurm is not None:
        try:
            slurm_version = cli.slurm_version()
        except (SlurmCommandNotFoundError, SlurmCommandError, SlurmParseError,
                SlurmUnavailableError):
            slurm_version = None
    kind, reason = choose_backend_kind(pyslurm_version, slurm_version)
    if kind == "pyslurm":
        _log_once(logging.INFO, f"using the pyslurm backend: {reason}")
        return PyslurmBackend(pyslurm, cli=cli)
    _log_once(logging.INFO if pyslurm is None else logging.WARNING, reason)
    return cli
