"""The store's typed rows, and the memos that turn its tables into records each tick.

The daemon reads every job each tick (500 jobs at ``benchmarks/load.py``'s size). Built
from scratch, that was ~55 ms a read: every row's history replayed through the lifecycle
table, every record allocated again. :class:`JobRows` keeps what a read built and builds
again only what changed: a job's lifecycle when a history row was added for it (history
ids only grow: the column is AUTOINCREMENT), its record when its row differs from the last
read's. A job gone from the table (pruned) is forgotten, so the memo holds what the table
holds. :class:`SlotRows` does the same for the slots.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, fields

from malletrain.core.lifecycle import JobPhase, Lifecycle, Transition, replay
from malletrain.daemon.jobs.spec import JobSpec, spec_from_json


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    seq: int
    uid: int
    user: str
    spec: JobSpec
    lifecycle: Lifecycle
    created_s: float
    samples_total: int = 0
    samples_per_s: float = 0.0
    rescales_up: int = 0
    rescales_down: int = 0
    preemptions: int = 0
    start_failures: int = 0
    last_progress_s: float | None = None
    message: str = ""

    @property
    def state(self) -> JobPhase:
        return self.lifecycle.state


@dataclass(frozen=True)
class SlotRecord:
    job_id: str
    slot: int
    slurm_job_id: int
    placed_node: str | None = None
    placed_at_s: float | None = None
    leaving_since_s: float | None = None
    last_node: str | None = None
    last_status: str = "parked"


def transition_of(h: sqlite3.Row) -> Transition:
    return Transition(JobPhase(h["from_state"]) if h["from_state"] else None,
                      JobPhase(h["to_state"]), h["at_s"], h["reason"])


def job_record(row: sqlite3.Row, lifecycle: Lifecycle, spec: JobSpec | None = None
               ) -> JobRecord:
    """The record of one row; ``spec``: the row's spec already decoded."""
    return JobRecord(
        job_id=row["job_id"], seq=row["seq"], uid=row["uid"], user=row["user"],
        spec=spec if spec is not None else spec_from_json(row["spec"]), lifecycle=lifecycle,
        created_s=row["created_s"], samples_total=row["samples_total"],
        samples_per_s=row["samples_per_s"], rescales_up=row["rescales_up"],
        rescales_down=row["rescales_down"], preemptions=row["preemptions"],
        start_failures=row["start_failures"],
        last_progress_s=row["last_progress_s"], message=row["message"],
    )


#: what an ended job keeps of its spec: what ``malletrain jobs`` shows, and its kind (the
#: profile it fed). A spec is up to a request's 1 MiB (arguments, environment); kept for
#: every ended job it let one user grow the daemon by submitting and cancelling (issue 49)
ENDED_SPEC_FIELDS = ("name", "min_nodes", "max_nodes", "rate_target", "kind", "mode")


def ended_spec_json(text: str) -> str:
    """The stored spec ``text`` cut to :data:`ENDED_SPEC_FIELDS` (a few hundred bytes);
    ``script`` is ``/``. Registered as an SQL function, so a database's ended rows are cut
    one row at a time, never all read into memory; unreadable text gives the bare minimum."""
    try:
        data = json.loads(text)
        kept = {k: data[k] for k in ENDED_SPEC_FIELDS if k in data}
        spec_from_json(json.dumps({"script": "/", **kept}))  # still a valid spec
    except Exception:  # a row this code never wrote: keep no part of it
        kept = {}
    return json.dumps({"script": "/", **kept}, separators=(",", ":"))


#: the slots table's columns in :class:`SlotRecord`'s field order
SLOT_COLUMNS = ", ".join(f.name for f in fields(SlotRecord))


class SlotRows:
    """Every slot of the table as a record, each built again only when its row changed.

    The tick reads every slot (~2,500 at ``benchmarks/load.py``'s 500 jobs) and most rows
    are as they were: as ``sqlite3.Row`` objects turned into new records this was 8 % of
    the daemon's CPU there (py-spy). Rows are read as plain tuples and a record is reused
    while its tuple is equal; the memo holds only the last read's rows.
    """

    def __init__(self) -> None:
        self._records: dict[tuple[object, ...], SlotRecord] = {}

    def read(self, db: sqlite3.Connection, job_id: str | None = None) -> list[SlotRecord]:
        cur = db.cursor()
        cur.row_factory = None  # tuples, in SLOT_COLUMNS order
        if job_id is None:
            rows = cur.execute(f"SELECT {SLOT_COLUMNS} FROM slots ORDER BY job_id, slot")
        else:
            rows = cur.execute(f"SELECT {SLOT_COLUMNS} FROM slots WHERE job_id=? "
                               "ORDER BY slot", (job_id,))
        old, new = self._records, {}
        out = []
        for row in rows:
            rec = old.get(row)
            if rec is None:
                rec = SlotRecord(*row)
            new[row] = rec
            out.append(rec)
        if job_id is None:
            self._records = new
        return out


#: the jobs table's columns but ``spec``: a tick's read leaves the specs in SQLite (up to a
#: request's 1 MiB each; 100 live jobs of 800 KB cost 62 ms a read when they came along)
_COLUMNS_BUT_SPEC = ("job_id, seq, uid, user, state, created_s, samples_total, samples_per_s, "
                     "rescales_up, rescales_down, preemptions, start_failures, "
                     "last_progress_s, message")


class JobRows:
    """Every job of the table as a record, rebuilt only where the table changed.

    A job's spec is read and decoded when the job is first seen, and again only when it
    ends (the store then cuts it to what ``malletrain jobs`` shows: :func:`ended_spec_json`);
    it changes at no other time.

    Not thread-safe by itself: the store calls it under its lock, on its one connection.
    """

    def __init__(self) -> None:
        self._history_seen_id = 0
        self._history: dict[str, list[Transition]] = {}
        self._lifecycles: dict[str, Lifecycle] = {}
        self._records: dict[str, tuple[tuple[object, ...], Lifecycle, JobRecord]] = {}

    def read(self, db: sqlite3.Connection) -> list[JobRecord]:
        """The jobs in submission order (``IllegalTransition`` on a corrupt history, as a
        fresh replay would)."""
        rows = db.execute(f"SELECT {_COLUMNS_BUT_SPEC} FROM jobs ORDER BY seq").fetchall()
        changed: set[str] = set()
        for h in db.execute("SELECT * FROM history WHERE id > ? ORDER BY id",
                            (self._history_seen_id,)):
            self._history.setdefault(h["job_id"], []).append(transition_of(h))
            self._history_seen_id = h["id"]
            changed.add(h["job_id"])
        for job_id in changed:
            self._lifecycles.pop(job_id, None)
        out = [self._record(db, row) for row in rows]
        if len(self._records) > len(out) or len(self._history) > len(out):
            self._forget_all_but({r.job_id for r in out})
        return out

    def _record(self, db: sqlite3.Connection, row: sqlite3.Row) -> JobRecord:
        job_id = row["job_id"]
        lc = self._lifecycles.get(job_id)
        if lc is None:
            lc = replay(self._history.get(job_id, ()))
            self._lifecycles[job_id] = lc
        key = tuple(row)
        hit = self._records.get(job_id)
        if hit is not None and hit[0] == key and hit[1] is lc:
            return hit[2]
        # a job's row changes with each progress report, its spec only when it ends
        ended = JobPhase(row["state"]).terminal
        spec = (hit[2].spec if hit is not None and hit[2].state.terminal == ended
                else spec_from_json(db.execute("SELECT spec FROM jobs WHERE job_id=?",
                                               (job_id,)).fetchone()[0]))
        rec = job_record(row, lc, spec)
        self._records[job_id] = (key, lc, rec)
        return rec

    def _forget_all_but(self, job_ids: set[str]) -> None:
        for memo in (self._history, self._lifecycles, self._records):
            for gone in memo.keys() - job_ids:
                del memo[gone]
