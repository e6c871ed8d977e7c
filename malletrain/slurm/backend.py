"""The Slurm backend interface and its CLI implementation.

Everything above this layer (daemon, ``malletrain nodes``, ops) talks to a
:class:`SlurmBackend`:

* observe: :meth:`SlurmBackend.snapshot` -> :class:`~malletrain.core.cluster.ClusterSnapshot`,
  from ONE batched set of calls per tick;
* act: ``submit(SbatchSpec) -> job id``, ``cancel``, ``signal``, ``hold``, ``release``,
  ``requeue_hold``, ``update(job_id, **fields)``.

Failures are typed (:mod:`malletrain.slurm.errors`): a timeout, slurmctld down or a "try
again" answer raise :class:`SlurmUnavailableError` (retryable); wrap the backend in
:class:`~malletrain.slurm.cache.SnapshotCache` to keep serving the last good snapshot meanwhile.
:func:`~malletrain.slurm.select.select_backend` picks this or the pyslurm one
(:mod:`malletrain.slurm.pyslurm_backend`). Commands are argument lists run with a
timeout, never shell strings.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, runtime_checkable

from malletrain.core.cluster import ClusterSnapshot, Job
from malletrain.slurm.coalesce import CoalescedScontrol
from malletrain.slurm.commands import (
    classify_failure,
    job_list_failures,
    render_signal,
    render_update,
    render_update_line,
    script_verbs,
)
from malletrain.slurm.errors import (
    SlurmCommandError,
    SlurmCommandNotFoundError,
    SlurmParseError,
    SlurmUnavailableError,
)
from malletrain.slurm.parsers.parse import SnapshotTexts, build_snapshot, check_periodic
from malletrain.slurm.parsers.parse_json import check_json_errors
from malletrain.slurm.parsers.parse_plain_jobs import RecordMemo, parse_jobs_plain
from malletrain.slurm.parsers.parse_states import UNRECORDED_NODE
from malletrain.slurm.parsers.parse_text import parse_job_gpus, parse_job_ids
from malletrain.slurm.privacy import Privacy, read_privacy
from malletrain.slurm.refresh import BackgroundRefresh
from malletrain.slurm.sbatch import SbatchSpec, parse_job_id
from malletrain.slurm.versions import (
    FORMAT_ENV,
    JOB_GPUS,
    JOBS_PLAIN,
    PENDING_IDS_COMMAND,
    PERIODIC_S,
    Release,
    check_readable,
    jobs_format,
    periodic,
    snapshot_commands,
    support_note,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 20.0

#: Job ids that are gone or done: fine for an idempotent cancel.
_GONE_MARKERS = ("already completing or completed", "invalid job id")


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@runtime_checkable
class SlurmBackend(Protocol):
    """What the rest of malletrain needs from Slurm. Implementations: CLI, pyslurm."""

    #: ``"cli"`` or ``"pyslurm"``.
    name: str
    #: Read each job's GPUs too (``Job.gpus``): the daemon sets it where the site holds a
    #: GPU limit on running jobs together (one more ``squeue`` a tick).
    count_gpus: bool

    def snapshot(self) -> ClusterSnapshot:
        """Nodes, partitions, jobs (with planned starts/nodes) and reservations, now."""
        ...

    def submit(self, spec: SbatchSpec) -> int:
        """Submit a batch job; return its id."""
        ...

    def cancel(self, job_id: int, *, missing_ok: bool = True) -> None:
        """Cancel a job (idempotent unless ``missing_ok`` is false)."""
        ...

    def signal(self, job_id: int, sig: str, *, steps: str = "children") -> None:
        """Send ``sig`` to the job's steps (``children``), batch shell (``batch``) or ``all``."""
        ...

    def hold(self, job_id: int) -> None: ...

    def release(self, job_id: int) -> None: ...

    def requeue_hold(self, job_id: int) -> None:
        """Requeue a running job and hold it (``scontrol requeuehold``)."""
        ...

    def update(self, job_id: int, **fields: str | int | Sequence[str]) -> None:
        """``scontrol update JobId=ID Key=Value...``, keys from :data:`UPDATABLE_FIELDS`."""
        ...

    def pending_job_ids(self) -> frozenset[int]:
        """The ids of pending jobs: a query far cheaper than :meth:`snapshot`, for the
        daemon's arrival probe between ticks
        (:class:`~malletrain.daemon.observe.arrivals.ArrivalProbe`)."""
        ...

    def privacy(self) -> Privacy:
        """Who may see whose jobs (``PrivateData``, operators): :mod:`.privacy`."""
        ...

    def jobs(self, job_ids: Sequence[int]) -> tuple[Job, ...]:
        """These jobs only, as a snapshot shows them (those Slurm knows): one short query
        for a request that checks a few jobs, where a whole snapshot costs a tick's work."""
        ...


#: How long an ``scontrol`` line waits for the other lines of its wave when no script runs
#: (slurm/coalesce.py): a little of a give-back's time (regular jobs wait ~1 s for Slurm's
#: own preemption) against a call per line.
SCRIPT_GATHER_S = 0.05


class CliBackend:
    """The backend over Slurm's command-line clients (``sinfo``, ``squeue``, ``scontrol``...)."""

    name = "cli"

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
        parallel: bool = True,
        release: Release | None = None,
        daemon: bool = False,
    ) -> None:
        self._env = dict(env) if env is not None else None
        #: The cluster's Slurm release; read once (``sinfo --version``) when not given.
        self._release = release
        #: The daemon's form of a tick: the job list instead of whole JSON records.
        self.daemon = daemon
        self.count_gpus = False
        #: The last answer of each periodic call: (read at, text).
        self._periodic: dict[str, tuple[float, str]] = {}
        #: this tick's periodic answers, kept once its snapshot parsed
        self._fresh_periodic: dict[str, tuple[float, str]] = {}
        self.timeout_s = timeout_s
        self._runner: Runner = runner or subprocess.run
        self._clock = clock
        #: Run a tick's calls at once (one round-trip of latency instead of six).
        self.parallel = parallel
        #: the tick's job list records, kept between ticks (parse_plain_jobs.RecordMemo)
        self._job_memo = RecordMemo()
        #: the action workers' release/requeuehold/hold and placements' updates: one
        #: ``scontrol`` script per batch (slurm/coalesce.py)
        self._scontrol = CoalescedScontrol(self._scontrol_script, SCRIPT_GATHER_S)
        #: the daemon's periodic answers, read again off the tick
        self._refresh = BackgroundRefresh(lambda c: self._run_batch(c, {}), check_periodic,
                                          clock)

    def _run(
        self,
        argv: Sequence[str],
        *,
        input_text: str | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self._env if self._env is not None else os.environ)
        if extra_env:
            env.update(extra_env)
        try:
            # errors="replace": a job name in another encoding must not fail a whole tick
            return self._runner(
                list(argv), input=input_text, capture_output=True, text=True,
                errors="replace", timeout=self.timeout_s, env=env, check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmCommandNotFoundError(
                f"{argv[0]}: command not found (is Slurm's client installed and on PATH?)"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailableError(
                f"{' '.join(argv[:3])}: no answer within {self.timeout_s:g} s"
            ) from exc
        except OSError as exc:
            raise SlurmUnavailableError(f"{argv[0]}: could not run: {exc}") from exc

    def _check(self, argv: Sequence[str], **kw: object) -> str:
        res = self._run(argv, **kw)  # type: ignore[arg-type]
        if res.returncode != 0:
            raise classify_failure(argv, res.returncode, res.stderr or res.stdout)
        return res.stdout

    # -- observe ----------------------------------------------------------------------
    def slurm_release(self) -> Release:
        """The cluster's Slurm release, read once: it picks the commands of a tick."""
        if self._release is None:
            release = Release.parse(self._check(["sinfo", "--version"]))
            check_readable(release)
            note = support_note(release)
            if note:
                log.warning("%s", note)
            self._release = release
        return self._release

    def snapshot_commands(self) -> dict[str, tuple[str, ...]]:
        """Every call of a full snapshot on this cluster's release, in checking order."""
        return snapshot_commands(self.slurm_release(), self.daemon)

    def due_commands(self) -> dict[str, tuple[str, ...]]:
        """This tick's calls: the every-tick ones, and periodic ones older than their period."""
        now = self._clock()
        kept = periodic(self.slurm_release(), self.daemon)
        return {key: argv for key, argv in self.snapshot_commands().items()
                if key not in kept or key not in self._periodic
                or now - self._periodic[key][0] >= PERIODIC_S[key]}

    def snapshot_texts(self) -> SnapshotTexts:
        """The raw outputs of one tick (what the golden files record).

        At most three calls a tick in steady state (:func:`~.versions.every_tick`), plus a
        periodic one when its answer is older than :data:`~.versions.PERIODIC_S`.
        In parallel mode the clients run at once, so a tick costs about one call's
        latency; failures are reported in :meth:`snapshot_commands` order (a JSON
        answer's errors when it is parsed, or when a later call failed). Sequentially,
        a JSON answer with errors stops the tick at once (each further call would wait
        seconds more for a dead slurmctld).
        """
        commands = self._due_now()
        if self.count_gpus:
            commands["job_gpus"] = JOB_GPUS
        token = secrets.token_hex(12)  # the job list's record marker, new for every call
        outputs = self._run_batch(commands, {"jobs_plain": {FORMAT_ENV: jobs_format(token)}})
        if "jobs_plain" in outputs:
            outputs["jobs_token"] = token
        taken_at = self._clock()
        kept = periodic(self.slurm_release(), self.daemon)
        self._fresh_periodic = {k: (taken_at, outputs[k]) for k in kept if k in outputs}
        for key in kept:
            if key not in outputs:
                outputs[key] = self._periodic[key][1]
        return SnapshotTexts(**outputs)

    def _due_now(self) -> dict[str, tuple[str, ...]]:
        """The calls this tick waits for: for the daemon, a due periodic call of which it
        has an answer is read off the tick instead (slurm/refresh.py)."""
        if not self.daemon:
            return self.due_commands()
        self._periodic.update(self._refresh.take())
        commands = self.due_commands()
        late = {k: argv for k, argv in commands.items() if k in self._periodic}
        if late:
            self._refresh.start(late, {k: text for k, (_, text) in self._periodic.items()})
        return {k: argv for k, argv in commands.items() if k not in late}

    def _run_batch(self, commands: Mapping[str, Sequence[str]],
                   envs: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
        if not self.parallel:
            outputs: dict[str, str] = {}
            for key, argv in commands.items():
                outputs[key] = self._check(argv, extra_env=envs.get(key))
                if key.endswith("_json"):
                    check_json_errors(outputs[key], " ".join(argv))
            return outputs
        pool = ThreadPoolExecutor(max_workers=len(commands), thread_name_prefix="slurm-tick")
        try:
            futures = {key: pool.submit(self._check, argv, extra_env=envs.get(key))
                       for key, argv in commands.items()}
            # a JSON answer's "errors" are checked when it is parsed: decoding each
            # multi-megabyte answer here as well doubled the tick's JSON work at 5,000
            # nodes (benchmarks/load.py). Only when a later call failed are the earlier
            # answers checked here, so the failure reported is the first in order.
            outputs = {}
            for key, future in futures.items():
                try:
                    outputs[key] = future.result()
                except Exception:
                    for done, text in outputs.items():
                        if done.endswith("_json"):
                            check_json_errors(text, " ".join(commands[done]))
                    raise
            return outputs
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def snapshot(self) -> ClusterSnapshot:
        taken_at = self._clock()
        snap = build_snapshot(taken_at, self.snapshot_texts(), self._job_memo)
        # periodic answers are kept only once a snapshot built from them parsed: an odd
        # answer (slurmctld restarting, a broken wrapper) is asked again next tick instead
        # of failing every tick for its whole period (found by benchmarks/faults.py)
        self._periodic.update(self._fresh_periodic)
        if any(UNRECORDED_NODE in w for w in snap.warnings):
            self._periodic.pop("nodes_json", None)  # a new node: its record next tick
        return snap

    def pending_job_ids(self) -> frozenset[int]:
        return parse_job_ids(self._check(PENDING_IDS_COMMAND))

    def jobs(self, job_ids: Sequence[int]) -> tuple[Job, ...]:
        if not job_ids:
            return ()
        argv = [*JOBS_PLAIN, "--jobs=" + ",".join(str(int(i)) for i in job_ids)]
        token = secrets.token_hex(12)
        res = self._run(argv, extra_env={FORMAT_ENV: jobs_format(token)})
        if res.returncode != 0:
            if "invalid job id" in (res.stderr or "").lower():
                return ()  # none of them exists (with one known, squeue lists it, exit 0)
            raise classify_failure(argv, res.returncode, res.stderr or res.stdout)
        warnings: list[str] = []
        found = parse_jobs_plain(res.stdout, token, warnings)
        for w in warnings:
            log.warning("%s", w)
        return found

    def job_gpus(self) -> dict[int, int]:
        """{job id: GPUs} of the running and pending jobs that have any (one ``squeue``)."""
        warnings: list[str] = []
        found = parse_job_gpus(self._check(JOB_GPUS), warnings)
        for w in warnings:
            log.warning("%s", w)
        return found

    def privacy(self) -> Privacy:
        return read_privacy(lambda argv: self._check(list(argv)))

    def slurm_version(self) -> str:
        """The client's Slurm version as ``"22.05"`` (``sinfo --version``, no slurmctld needed)."""
        return str(self.slurm_release())

    # -- act ---------------------------------------------------------------------------
    def submit(self, spec: SbatchSpec) -> int:
        out = self._check(spec.render(), input_text=spec.script, extra_env=spec.render_env())
        try:
            return parse_job_id(out)
        except ValueError as exc:
            raise SlurmParseError(f"sbatch: {exc}") from None

    def cancel(self, job_id: int, *, missing_ok: bool = True) -> None:
        # Without --verbose, 22.05's scancel says nothing and exits 0 even for an unknown
        # job id; with it, it names the error on stderr (still exit 0).
        argv = ["scancel", "--verbose", str(int(job_id))]
        res = self._run(argv)
        text = f"{res.stderr}\n{res.stdout}".lower()
        if any(m in text for m in _GONE_MARKERS):
            if missing_ok:
                return
            raise SlurmCommandError(f"scancel {job_id}: {res.stderr.strip()}", tuple(argv),
                                    res.stderr)
        if res.returncode != 0 or "error:" in text:
            raise classify_failure(argv, res.returncode or 1, res.stderr)

    def signal(self, job_id: int, sig: str, *, steps: str = "children") -> None:
        argv = render_signal(job_id, sig, steps)
        res = self._run(argv)
        if res.returncode != 0 or "error" in res.stderr.lower():
            raise classify_failure(argv, res.returncode or 1, res.stderr)

    def hold(self, job_id: int) -> None:
        self._scontrol.act("hold", job_id)

    def release(self, job_id: int) -> None:
        self._scontrol.act("release", job_id)

    def requeue_hold(self, job_id: int) -> None:
        self._scontrol.act("requeuehold", job_id)

    def update(self, job_id: int, **fields: str | int | Sequence[str]) -> None:
        line = render_update_line(job_id, fields)
        if line is None:
            self._check(render_update(job_id, fields))
        else:
            self._scontrol.update(job_id, line)

    def _scontrol_script(self, job_ids: Sequence[int], lines: Sequence[str]
                         ) -> dict[int, Exception]:
        """One ``scontrol`` reading the lines whose calls arrived together, of any verb (it
        echoes them on stdout; its errors, ``... for job N``, go to stderr)."""
        res = self._run(["scontrol"], input_text="".join(f"{line}\n" for line in lines))
        return job_list_failures(["scontrol", "script"], job_ids, res.returncode,
                                 res.stderr or f"exit status {res.returncode}",
                                 script_verbs(lines))
