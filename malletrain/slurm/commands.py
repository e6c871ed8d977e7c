"""Slurm commands rendered as data (argument lists, never shell strings), and their errors.

Golden-tested in tests/unit/test_slurm_backend.py: what the backend runs is exactly these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from malletrain.slurm.errors import (
    SlurmCommandError,
    SlurmUnavailableError,
)
from malletrain.slurm.hostlist import compress_hostlist

#: stderr fragments that mean "Slurm is not answering right now" (retry), not "no".
_RETRYABLE_MARKERS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connect failure",
    "zero bytes were transmitted",
    "try again",
    "transport endpoint",
    "resource temporarily unavailable",
    "communication connection failure",
    "slurm backup controller in standby mode",
    "protocol authentication error",
    "munge",
    # 22.05's scontrol update/release/hold with slurmctld down: "Unexpected message
    # received for job N", one line per job (seen on the dev cluster)
    "unexpected message received",
)


#: ``scontrol update job`` fields a caller may set (Slurm's own names).
UPDATABLE_FIELDS = frozenset(
    {
        "NodeList", "ReqNodeList", "ExcNodeList", "NumNodes", "TimeLimit", "TimeMin",
        "Comment", "Partition", "JobName", "Dependency", "Features", "Nice", "StartTime",
        "Priority",
    }
)


_SIGNAL_RE = re.compile(r"^(?:SIG)?[A-Z][A-Z0-9]*$|^\d{1,2}$")


_STEPS = ("children", "batch", "all")


def classify_failure(argv: Sequence[str], returncode: int, stderr: str) -> Exception:
    """A typed error for a failed command: retryable when Slurm was merely unreachable."""
    words = " ".join(stderr.split())[:300] or f"exit status {returncode}"
    command = " ".join(argv[:3])
    lowered = stderr.lower()
    if any(marker in lowered for marker in _RETRYABLE_MARKERS):
        hint = " (is slurmctld running?)" if "unable to contact slurm controller" in lowered else ""
        return SlurmUnavailableError(f"Slurm is not answering ({command}): {words}{hint}")
    if "could not establish a configuration source" in lowered:
        return SlurmCommandError(
            f"{command}: no Slurm configuration found (set SLURM_CONF, e.g. from "
            f"`slurm/dev-cluster env`): {words}", argv=tuple(argv), stderr=stderr)
    return SlurmCommandError(f"{command} failed: {words}", argv=tuple(argv), stderr=stderr)


def render_update(job_id: int, fields: Mapping[str, str | int | Sequence[str]]) -> list[str]:
    """``scontrol update`` argv; a sequence of node names is compressed (``n[1-3]``)."""
    if not fields:
        raise ValueError("update: no fields given")
    argv = ["scontrol", "update", f"JobId={int(job_id)}"]
    for key, value in fields.items():
        if key not in UPDATABLE_FIELDS:
            raise ValueError(f"update: field {key!r} is not one of {sorted(UPDATABLE_FIELDS)}")
        if isinstance(value, bool):
            raise ValueError(f"update: field {key} must be a string or number, not a bool")
        if isinstance(value, int):
            text = str(value)
        elif isinstance(value, str):
            text = value
        else:
            text = compress_hostlist(str(v) for v in value)
        if "\n" in text or "\0" in text:
            raise ValueError(f"update: field {key} must be one line")
        argv.append(f"{key}={text}")
    return argv


def render_update_line(job_id: int, fields: Mapping[str, str | int | Sequence[str]]
                       ) -> str | None:
    """The same update as one line of a ``scontrol`` script (``update JobId=5 ...``, the
    commands it reads from stdin), or None when a value holds a blank or a quote: the
    script's words are split on blanks, so such an update runs alone as argv."""
    words = render_update(job_id, fields)[1:]
    if any(c.isspace() or c in "\"'" for w in words for c in w):
        return None
    return " ".join(words)


def render_signal(job_id: int, sig: str, steps: str = "children") -> list[str]:
    if not _SIGNAL_RE.match(sig):
        raise ValueError(f"signal: {sig!r} is not a signal name like TERM or USR1")
    if steps not in _STEPS:
        raise ValueError(f"signal: steps must be one of {_STEPS}, got {steps!r}")
    argv = ["scancel", f"--signal={sig}"]
    if steps == "batch":
        argv.append("--batch")
    elif steps == "all":
        argv.append("--full")
    argv.append(str(int(job_id)))
    return argv



#: The ``scontrol`` verbs that take a list of job ids (``scontrol release 1,2,3``).
JOB_LIST_VERBS = ("release", "requeuehold", "hold")
#: How 22.05's scontrol names an id of such a list, or a script line, it could not act on
#: (it acts on the others): ``Invalid job id specified for job 999``, ``Job is pending
#: execution for job 3``; an update of an unknown job: ``scontrol: error: Could not load
#: state information for job 999999: Invalid job id specified``.
_FOR_JOB_RE = re.compile(r"^(?:scontrol: error: )?(?P<why>.+?) for job (?P<id>\d+)"
                         r"(?::\s*(?P<detail>.+?))?\s*$")


def render_act_line(verb: str, job_id: int) -> str:
    """``VERB JOB``: one line of an ``scontrol`` script (fact 14) acting on one job."""
    if verb not in JOB_LIST_VERBS:
        raise ValueError(f"scontrol {verb!r} is not one of {JOB_LIST_VERBS}")
    return f"{verb} {int(job_id)}"


def script_verbs(lines: Sequence[str]) -> dict[int, str]:
    """Each job's verb in an ``scontrol`` script of act and update lines (for messages)."""
    verbs: dict[int, str] = {}
    for line in lines:
        verb, _, rest = line.partition(" ")
        first = rest.split(" ", 1)[0].removeprefix("JobId=")
        if first.isdigit():
            verbs[int(first)] = verb
    return verbs


def job_list_failures(argv: Sequence[str], job_ids: Sequence[int], returncode: int,
                      stderr: str, verbs: Mapping[int, str] | None = None
                      ) -> dict[int, Exception]:
    """The ids of a job-list call or script that failed, each with its error (``verbs``:
    each job's command in a script); raises when the call failed as a whole (no line names
    one of ``job_ids``: slurmctld down, say)."""
    wanted = {int(i) for i in job_ids}
    failed: dict[int, Exception] = {}
    for line in stderr.splitlines():
        m = _FOR_JOB_RE.match(line.strip())
        if m and int(m.group("id")) in wanted:
            job_id = int(m.group("id"))
            verb = (verbs or {}).get(job_id, argv[1] if len(argv) > 1 else "")
            why = m.group("why") + (f": {m.group('detail')}" if m.group("detail") else "")
            failed[job_id] = classify_failure([argv[0], verb, str(job_id)], returncode or 1, why)
    if returncode != 0 and not failed:
        raise classify_failure(argv, returncode, stderr)
    return failed
