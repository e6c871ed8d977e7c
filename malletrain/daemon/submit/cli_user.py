"""``malletrain submit | jobs | cancel``: the user's side, run AS THE USER.

``submit`` reads the script's ``#SBATCH`` lines like sbatch (flags win), validates the
spec, asks the daemon (over its Unix socket, which authenticates the caller by uid) for a
job id, then submits the job's node-slot pool ITSELF, as the user: ``max_nodes`` held
single-node jobs in the scavenger partition (:mod:`malletrain.daemon.jobs.slots`). So the
training code runs under the user's identity through Slurm, and the daemon never needs
the right to submit for someone else. Finally it attaches the slot ids to the job; the
daemon checks that each slot job belongs to the caller before it accepts them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from malletrain.daemon.jobs.array_tasks import task_count, task_spec
from malletrain.daemon.jobs.directives import (
    ScriptErrors,
    batch_environment,
    build_spec,
    merge,
    parse_option_tokens,
    read_directives,
    script_mode,
    spec_warnings,
)
from malletrain.daemon.jobs.sbatch_options import environment_options
from malletrain.daemon.jobs.slots import node_command, render_slot, slot_extra_args
from malletrain.daemon.jobs.spec import MAX_SCRIPT_BYTES, JobSpec, SpecError
from malletrain.daemon.submit.channel import CLIENT_RETRY_S, call
from malletrain.daemon.submit.cli_options import (
    SubmitParser,
    add_job_options,
    command_line_tokens,
)
from malletrain.elastic.restart.script import ScriptPlan
from malletrain.errors import PermanentError, UserError
from malletrain.slurm.hostlist import compress_hostlist

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/run/malletrain/submit.sock"


def socket_path(args: argparse.Namespace) -> Path:
    return Path(args.socket or os.environ.get("MALLETRAIN_SOCKET") or DEFAULT_SOCKET)


def retry_s() -> float:
    """How long to keep trying a daemon that restarts or is busy: ``$MALLETRAIN_RETRY_S``."""
    text = os.environ.get("MALLETRAIN_RETRY_S", "")
    if not text:
        return CLIENT_RETRY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise SpecError(f"MALLETRAIN_RETRY_S={text!r}: expected seconds from 0 to 3600")
    return value


def _call(sock: Path, request: dict[str, Any], idempotent: bool = True) -> dict[str, Any]:
    """One request to the daemon, tried again while it restarts or is busy (as ``sbatch``
    waits for slurmctld), saying so once on stderr."""
    told = False
    window_s = retry_s()

    def tell(exc: UserError) -> None:
        nonlocal told
        if not told:
            print(f"malletrain: {exc}; trying again for up to {window_s:.0f} s",
                  file=sys.stderr)
            told = True

    return call(sock, request, retry_s=window_s, idempotent=idempotent, on_retry=tell)


def register(subparsers: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", default=None,
                        help="the daemon's socket (default $MALLETRAIN_SOCKET or "
                             f"{DEFAULT_SOCKET})")

    sub = subparsers.add_parser(
        "submit", parents=[common],
        help="submit a malleable training job (like sbatch)",
        description=(
            "Submit a malleable data-parallel training job. #SBATCH lines in the script are "
            "read like sbatch reads them; flags given here win. The job grows onto idle nodes "
            "and yields them to regular jobs at once."
        ),
    )
    sub.__class__ = SubmitParser  # (argparse makes every subparser of its own class)
    add_job_options(sub)
    sub.add_argument("--python", default=sys.executable,
                     help="Python on the nodes that runs the workers (default: this one)")
    sub.add_argument("--parsable", action="store_true", help="print only the job id")
    sub.add_argument("--test-only", action="store_true",
                     help="check the script and print what would run; submit nothing "
                          "(no daemon or Slurm needed), like sbatch --test-only")
    sub.add_argument("--json", action="store_true", help="with --test-only: print JSON")
    sub.add_argument("script", help="training script (run on every node of the job)")
    sub.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    sub.set_defaults(func=cmd_submit)

    jobs = subparsers.add_parser("jobs", parents=[common], help="list malleable jobs (like squeue)")
    jobs.add_argument("--json", action="store_true", help="print JSON")
    jobs.add_argument("-a", "--all", action="store_true", help="include finished jobs")
    jobs.set_defaults(func=cmd_jobs)

    cancel = subparsers.add_parser("cancel", parents=[common], help="cancel malleable jobs")
    cancel.add_argument("job_ids", nargs="+")
    cancel.set_defaults(func=cmd_cancel)


def read_script(path_text: str) -> tuple[Path, str]:
    path = Path(path_text).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PermanentError(f"{path_text}: no such file") from None
    except OSError as exc:
        raise PermanentError(f"{path_text}: cannot read it: {exc.strerror}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise PermanentError(f"{path_text}: larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError:
        raise PermanentError(f"{path_text}: not a UTF-8 text file") from None


@dataclass(frozen=True)
class ReadScript:
    """A script as `malletrain submit` read it: the spec, and what rendering needs."""

    spec: JobSpec
    warnings: tuple[str, ...]
    text: str
    plan: ScriptPlan | None  # restart mode: the shell script's launch line


def _read_spec(args: argparse.Namespace) -> ReadScript:
    path, text = read_script(args.script)
    tokens = command_line_tokens(args)
    # sbatch's order: the script's #SBATCH lines, then its SBATCH_* variables, then the flags
    opts = merge(merge(read_directives(text, str(path)), environment_options(os.environ)),
                 parse_option_tokens(tokens, "command line"))
    plan, problems = script_mode(text, str(path), batch_environment(opts))
    opts = replace(opts, problems=opts.problems + problems)
    script_args = list(args.args)
    if script_args and script_args[0] == "--":
        script_args = script_args[1:]
    spec = build_spec(opts, script=str(path), args=script_args, cwd=os.getcwd(),
                      python=str(Path(args.python).absolute()), default_name=path.name,
                      plan=plan)
    return ReadScript(spec, opts.warnings + spec_warnings(opts, spec, plan), text, plan)


def cmd_test_only(args: argparse.Namespace) -> int:
    """What would run, offline: no daemon, no Slurm (``sbatch --test-only``'s role)."""
    try:
        read = _read_spec(args)
    except ScriptErrors as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        if args.json:
            print(json.dumps({"accepted": False, "errors": list(exc.problems)}))
        return 1
    spec = read.spec
    report = {
        "accepted": True, "name": spec.name, "mode": spec.mode, "min_nodes": spec.min_nodes,
        "max_nodes": spec.max_nodes, "time_s": spec.time_limit_s,
        "gpus_per_node": spec.gpus_per_node, "gpu_type": spec.gpu_type,
        "workers_per_node": spec.nproc_per_node, "launcher": spec.launcher,
        "rate_target": spec.rate_target, "exclude": list(spec.exclude),
        "dependency": spec.dependency, "array": spec.array, "jobs": task_count(spec),
        "slot_options": list(slot_extra_args(spec)), "warnings": list(read.warnings),
        "per_node_command": node_command(spec),
    }
    if read.plan is not None:
        launch = read.plan.launch
        report.update(launcher=launch.kind if launch else None,
                      launch_line=launch.lineno if launch else None,
                      launch_words=list(launch.words) if launch else [],
                      launch_alternatives=[x.lineno for x in read.plan.alternatives],
                      tasks_per_node=spec.tasks_per_node,
                      stop_signal=spec.stop_signal, stop_grace_s=spec.stop_grace_s)
    if args.json:
        print(json.dumps(report))
        return 0
    for w in read.warnings:
        print(f"malletrain submit: warning: {w}", file=sys.stderr)
    print(_describe(read))
    return 0


def _describe(read: ReadScript) -> str:
    spec = read.spec
    time_text = "no limit" if spec.time_limit_s is None else f"{spec.time_limit_s} s"
    gpus = (f"{spec.gpus_per_node} {spec.gpu_type or 'any'} GPU(s)" if spec.gpus_per_node
            else "no GPU")
    lines = [f"malleable job {spec.name!r} would run on {spec.min_nodes}-{spec.max_nodes} "
             f"nodes ({time_text}), {spec.nproc_per_node} worker(s) and {gpus} per node",
             "each node slot: sbatch " + (" ".join(slot_extra_args(spec)) or
                                          "(no options beyond the pool's)")]
    if spec.exclude:
        lines.append(f"never on: {compress_hostlist(spec.exclude)}")
    if spec.array:
        lines.append(f"job array --array={spec.array}: {task_count(spec)} malleable jobs, "
                     "one per task")
    if spec.dependency:
        lines.append(f"starts after: {spec.dependency}")
    if spec.rate_target is not None:
        lines.append(f"throughput target: {spec.rate_target:g} samples/s (more is worth "
                     "nothing to the job)")
    if read.plan is None:
        shown = [*node_command(spec)[:4], "...", spec.script, *spec.args]
        lines += ["mode: native (ElasticJob rescales in process, no checkpoint)",
                  "each node runs: " + " ".join(shown)]
        return "\n".join(lines)
    launch = read.plan.launch
    stop = (f"SIG{spec.stop_signal}, then up to {spec.stop_grace_s} s to exit"
            if spec.stop_signal != "TERM" else "SIGTERM")
    lines.append(f"mode: restart (the batch script runs once per size on the job's first "
                 f"node, its srun steps across the job's nodes; stopped with {stop})")
    for x in [launch, *read.plan.alternatives] if launch else []:
        lines.append(f"launch line {x.lineno} ({x.kind}): " + " ".join(x.words))
    return "\n".join(lines)


def cmd_submit(args: argparse.Namespace) -> int:
    if args.test_only:
        return cmd_test_only(args)
    read = _read_spec(args)
    spec = read.spec
    # "--export=VAR" means "pass my VAR": resolve it here, where the user's environment is
    env = {k: (v if v else os.environ.get(k, "")) for k, v in spec.environment.items()}
    spec = type(spec).from_dict({**spec.to_dict(), "environment": env})
    for w in read.warnings:
        print(f"malletrain submit: warning: {w}", file=sys.stderr)
    sock = socket_path(args)
    job_ids: list[str] = []
    slurm_ids: list[int] = []
    try:
        for index in range(task_count(spec)):
            job_id, slots = _submit_one(sock, task_spec(spec, index, job_ids), read)
            job_ids.append(job_id)
            slurm_ids += slots
    except (UserError, KeyboardInterrupt):
        for job_id in job_ids:  # an array is submitted whole or not at all, as sbatch does
            with contextlib.suppress(UserError):
                _call(sock, {"op": "cancel", "job_id": job_id})
        raise
    if args.parsable:
        print(job_ids[0])
    elif spec.array:
        print(f"Submitted malleable job array {job_ids[0]} (--array={spec.array}: "
              f"{len(job_ids)} jobs {job_ids[0]}..{job_ids[-1]}, {spec.min_nodes}-"
              f"{spec.max_nodes} nodes each, slot jobs {slurm_ids[0]}..{slurm_ids[-1]})")
    else:
        print(f"Submitted malleable job {job_ids[0]} ({spec.min_nodes}-{spec.max_nodes} "
              f"nodes, slot jobs {slurm_ids[0]}..{slurm_ids[-1]})")
    return 0


def _submit_one(sock: Path, spec: JobSpec, read: ReadScript) -> tuple[str, list[int]]:
    """One malleable job: the daemon's id for it, then its node slots as the user's own
    held Slurm jobs, attached; everything undone if a step fails."""
    from malletrain.slurm.backend import CliBackend

    answer = _call(sock, {"op": "submit", "spec": spec.to_dict()}, idempotent=False)
    job_id = str(answer["job_id"])
    if spec.qos is not None and answer.get("qos") != spec.qos:
        print(f"malletrain submit: warning: --qos={spec.qos} ignored: node slots run under "
              f"this site's scavenger QOS {answer.get('qos')}", file=sys.stderr)
    backend = CliBackend()
    slurm_ids: list[int] = []
    try:
        for k in range(spec.max_nodes):
            slot = render_slot(spec, job_id, k, coordinator=str(answer["coordinator"]),
                               secret=str(answer["job_secret"]),
                               state_dir=str(answer["state_dir"]),
                               partition=str(answer["partition"]), qos=answer.get("qos"),
                               account=answer.get("account"),
                               script_text=read.text if read.plan else None)
            slurm_ids.append(backend.submit(slot))
        _call(sock, {"op": "attach", "job_id": job_id, "slots": slurm_ids})
    except (UserError, KeyboardInterrupt) as exc:
        for sid in slurm_ids:
            with contextlib.suppress(UserError):
                backend.cancel(sid)
        with contextlib.suppress(UserError):
            _call(sock, {"op": "abort", "job_id": job_id})
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise type(exc)(f"job {job_id} not submitted: {exc}") from None
    return job_id, slurm_ids


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = ("JOBID", "USER", "NAME", "STATE", "NODES", "MIN-MAX", "SAMPLES", "SAMPLES/S",
            "PROFILE", "UP/DOWN", "PREEMPT", "REASON", "NODELIST")
    lines = [head]
    for r in rows:
        nodes = r.get("nodes") or []
        lines.append((
            str(r["job_id"]), str(r["user"]), str(r["name"])[:16], str(r["state"]),
            str(len(nodes)), f"{r['min_nodes']}-{r['max_nodes']}", str(r["samples_total"]),
            f"{float(r['samples_per_s']):.1f}", str(r["profile_points"]),
            f"{r['rescales_up']}/{r['rescales_down']}", str(r["preemptions"]),
            "StepFailed" if r.get("failure") else str(r.get("reason") or "-"),
            ",".join(nodes) or "-",
        ))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in lines)


def cmd_jobs(args: argparse.Namespace) -> int:
    rows = _call(socket_path(args), {"op": "jobs"})["jobs"]
    if not args.all:
        rows = [r for r in rows if r["state"] not in ("completed", "cancelled", "failed")]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_rows(rows))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    bad = 0
    for job_id in args.job_ids:
        try:
            answer = _call(socket_path(args), {"op": "cancel", "job_id": job_id})
            print(f"{job_id}: {answer.get('state', 'cancelling')}")
        except PermanentError as exc:
            print(f"malletrain cancel: error: {exc}", file=sys.stderr)
            bad += 1
    if bad:
        raise SpecError(f"{bad} of {len(args.job_ids)} job(s) could not be cancelled")
    return 0
