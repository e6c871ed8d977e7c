"""The daemon's durable state: SQLite in WAL mode on the login node.

What must survive a ``kill -9`` (DESIGN section 3.7): the queue of malleable jobs with their
specs and owners, their slot jobs, each job's lifecycle history, the learned profiles (by
job kind), the per-slot marks of decisions in flight (placed at, leaving since) and a log
of Slurm actions (started, then done or failed). Everything else (which slot runs where,
who is in which membership, progress) is re-read from Slurm and the coordinator each tick,
so a restarted daemon reconciles instead of trusting a memory that may be stale.

Each write is its own transaction (``isolation_level=None`` + explicit BEGIN), so a crash
leaves either the old or the new row. One connection, guarded by a lock: the submit
channel's threads and the main loop share it.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from malletrain.core.lifecycle import JobPhase, Lifecycle, Transition, advance, replay
from malletrain.daemon.jobs.spec import JobSpec
from malletrain.daemon.jobs.store_files import prepare_private
from malletrain.daemon.jobs.store_rows import JobRecord as JobRecord
from malletrain.daemon.jobs.store_rows import (
    JobRows,
    SlotRows,
    ended_spec_json,
    job_record,
    transition_of,
)
from malletrain.daemon.jobs.store_rows import SlotRecord as SlotRecord

SCHEMA_VERSION = 1
#: the ended states, for queries (one ``?`` each)
_TERMINAL = tuple(p.value for p in JobPhase if p.terminal)
_TERMINAL_MARKS = ",".join("?" * len(_TERMINAL))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_s REAL NOT NULL,
    samples_total INTEGER NOT NULL DEFAULT 0,
    samples_per_s REAL NOT NULL DEFAULT 0,
    rescales_up INTEGER NOT NULL DEFAULT 0,
    rescales_down INTEGER NOT NULL DEFAULT 0,
    preemptions INTEGER NOT NULL DEFAULT 0,
    start_failures INTEGER NOT NULL DEFAULT 0,
    last_progress_s REAL,
    message TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS slots (
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    slot INTEGER NOT NULL,
    slurm_job_id INTEGER NOT NULL UNIQUE,
    placed_node TEXT,
    placed_at_s REAL,
    leaving_since_s REAL,
    last_node TEXT,
    last_status TEXT NOT NULL DEFAULT 'parked',
    PRIMARY KEY (job_id, slot)
);
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT NOT NULL,
    at_s REAL NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS profiles (kind TEXT PRIMARY KEY, data TEXT NOT NULL,
                                     updated_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS policy_state (policy TEXT PRIMARY KEY, data TEXT NOT NULL,
                                         updated_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    slurm_job_id INTEGER,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    started_s REAL NOT NULL,
    done_s REAL,
    ok INTEGER,
    error TEXT
);
CREATE INDEX IF NOT EXISTS history_job ON history(job_id, id);
CREATE INDEX IF NOT EXISTS actions_open ON actions(done_s);
"""


#: columns a caller may update (``Store.update_job`` / ``Store.mark_slot``)
_JOB_FIELDS = frozenset({"samples_total", "samples_per_s", "rescales_up", "rescales_down",
                         "preemptions", "start_failures", "last_progress_s", "message"})
_SLOT_FIELDS = frozenset({"placed_node", "placed_at_s", "leaving_since_s", "last_node",
                          "last_status"})


class Store:
    """Typed access to the state database. Thread-safe."""

    def __init__(self, path: Path | str, first_job_number: int = 1) -> None:
        """``first_job_number``: the first job's number in a new database (Slurm's
        FirstJobId; ``state.first_job_number``)."""
        self.path = Path(path)
        if str(path) != ":memory:":
            prepare_private(self.path)  # 0600, its WAL and SHM too, whatever the umask
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                                   timeout=10.0)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._rows = JobRows()
        self._slot_rows = SlotRows()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)",
                             (str(SCHEMA_VERSION),))
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('next_seq', ?)",
                             (str(first_job_number),))
            # names this database in every job secret: job ids restart at m1 with a new
            # database, and m1 must not get the secret an earlier m1's user already knows
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('realm', ?)",
                             (secrets.token_hex(8),))
            self._db.create_function("ended_spec", 1, ended_spec_json, deterministic=True)
            # a database of an older release kept every ended job's whole spec: cut them
            # here, row by row inside SQLite (never all in this process's memory)
            self._db.execute(f"UPDATE jobs SET spec=ended_spec(spec) WHERE state IN "
                             f"({_TERMINAL_MARKS}) AND spec != ended_spec(spec)", _TERMINAL)

    @property
    def realm(self) -> str:
        with self._lock:
            return str(self._db.execute("SELECT value FROM meta WHERE key='realm'").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def journal_mode(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    # ------------------------------------------------------------------ jobs

    def create_job(self, uid: int, user: str, spec: JobSpec, now_s: float | None = None
                   ) -> JobRecord:
        """A new job in ``submitting``, with the next id (``m<seq>``)."""
        now_s = time.time() if now_s is None else now_s
        lc = Lifecycle.new(now_s, f"submitted by {user}")
        with self._tx() as db:
            seq = int(db.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()[0])
            db.execute("UPDATE meta SET value=? WHERE key='next_seq'", (str(seq + 1),))
            job_id = f"m{seq}"
            db.execute(
                "INSERT INTO jobs (job_id, seq, uid, user, spec, state, created_s) "
                "VALUES (?,?,?,?,?,?,?)",
                (job_id, seq, uid, user, json.dumps(spec.to_dict()), lc.state.value, now_s),
            )
            self._insert_history(db, job_id, lc.history[0])
        return JobRecord(job_id, seq, uid, user, spec, lc, now_s)

    @staticmethod
    def _insert_history(db: sqlite3.Connection, job_id: str, t: Transition) -> None:
        db.execute(
            "INSERT INTO history (job_id, from_state, to_state, at_s, reason) VALUES (?,?,?,?,?)",
            (job_id, t.from_state.value if t.from_state else None, t.to_state.value, t.at_s,
             t.reason),
        )

    def transition(self, job_id: str, to: JobPhase, reason: str, now_s: float | None = None
                   ) -> JobRecord:
        """Move a job along the lifecycle table (IllegalTransition if not allowed)."""
        now_s = time.time() if now_s is None else now_s
        with self._tx() as db:
            rec = self._load(db, job_id)
            if rec is None:
                raise KeyError(job_id)
            lc = advance(rec.lifecycle, to, now_s, reason)
            db.execute("UPDATE jobs SET state=? WHERE job_id=?", (to.value, job_id))
            if to.terminal:  # an ended job keeps what `malletrain jobs` shows, no more
                db.execute("UPDATE jobs SET spec=ended_spec(spec) WHERE job_id=?", (job_id,))
                rec = self._load(db, job_id) or rec
            self._insert_history(db, job_id, lc.history[-1])
        return replace(rec, lifecycle=lc)

    def update_job(self, job_id: str, **fields: Any) -> None:
        self._update("jobs", _JOB_FIELDS, [(fields, {"job_id": job_id})])

    def update_jobs(self, updates: Mapping[str, Mapping[str, Any]]) -> None:
        """Several jobs' :meth:`update_job` in one transaction (the tick's progress)."""
        self._update("jobs", _JOB_FIELDS, [(f, {"job_id": j}) for j, f in updates.items()])

    def _load(self, db: sqlite3.Connection, job_id: str) -> JobRecord | None:
        row = db.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        if row is None:
            return None
        history = db.execute("SELECT * FROM history WHERE job_id=? ORDER BY id", (job_id,))
        return job_record(row, replay([transition_of(h) for h in history]))


    def job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            return self._load(self._db, job_id)

    def jobs(self, *, include_terminal: bool = True) -> list[JobRecord]:
        with self._lock:
            recs = self._rows.read(self._db)  # rebuilt only where the table changed
        if not include_terminal:
            recs = [r for r in recs if not r.state.terminal]
        return recs

    def prune_ended(self, keep: int, *, keep_per_user: int | None = None,
                    since_s: float | None = None) -> int:
        """Delete all but the newest ``keep`` ended jobs (and their rows), and of each user
        all but their newest ``keep_per_user``; returns how many. Jobs submitted since
        ``since_s`` are kept: they still count against their user's limits (:meth:`count_jobs`).

        Without it the database, and every tick's read of it, grows with every job ever
        submitted; without the per-user bound, one user's churn pushes every other user's
        history out of the ``keep`` newest."""
        with self._lock:  # a read first: most ticks have nothing to delete
            old = self._ended_beyond(keep, keep_per_user,
                                     float("inf") if since_s is None else since_s)
        if not old:
            return 0
        with self._tx() as db:
            for i in range(0, len(old), 500):
                part = old[i:i + 500]
                marks = ",".join("?" * len(part))
                for table in ("slots", "history", "actions", "jobs"):
                    db.execute(f"DELETE FROM {table} WHERE job_id IN ({marks})", part)
        return len(old)

    def _ended_beyond(self, keep: int, keep_per_user: int | None, before_s: float) -> list[str]:
        """The ended jobs created before ``before_s`` beyond the newest ``keep_per_user`` of
        their user, then beyond the newest ``keep`` of those left (SQLite's window
        functions: one query)."""
        per_user = keep_per_user if keep_per_user is not None else -1
        ranked = ("SELECT job_id, seq, ROW_NUMBER() OVER (PARTITION BY uid ORDER BY seq DESC) "
                  f"AS own FROM jobs WHERE state IN ({_TERMINAL_MARKS}) AND created_s < ?")
        return [r[0] for r in self._db.execute(
            "SELECT job_id FROM (SELECT job_id, own, "
            "ROW_NUMBER() OVER (ORDER BY (? >= 0 AND own > ?), seq DESC) AS overall "
            f"FROM ({ranked})) WHERE (? >= 0 AND own > ?) OR overall > ?",
            (per_user, per_user, *_TERMINAL, before_s, per_user, per_user, keep))]

    def count_jobs(self, uid: int | None = None, *, since_s: float | None = None) -> int:
        """Jobs not yet in a terminal state (all users, or one), and with ``since_s`` every
        job submitted since then, ended or not (a submission counts against the limits for
        a while, so that submit + abort in a loop is bounded like any submission)."""
        q = f"SELECT COUNT(*) FROM jobs WHERE (state NOT IN ({_TERMINAL_MARKS})"
        args: tuple[Any, ...] = _TERMINAL
        if since_s is not None:
            q += " OR created_s >= ?"
            args = (*args, since_s)
        q += ")"
        if uid is not None:
            q += " AND uid=?"
            args = (*args, uid)
        with self._lock:
            return int(self._db.execute(q, args).fetchone()[0])

    # ------------------------------------------------------------------ slots

    def add_slots(self, job_id: str, slurm_ids: list[int]) -> None:
        with self._tx() as db:
            for slot, sid in enumerate(slurm_ids):
                db.execute("INSERT INTO slots (job_id, slot, slurm_job_id) VALUES (?,?,?)",
                           (job_id, slot, int(sid)))

    def drop_slots(self, job_id: str, slurm_ids: Iterable[int]) -> None:
        """Forget slot jobs that were never ``job_id``'s (refused at the attach check), so
        that their owner can attach them."""
        with self._tx() as db:
            db.executemany("DELETE FROM slots WHERE job_id=? AND slurm_job_id=?",
                           [(job_id, int(i)) for i in slurm_ids])

    def slots(self, job_id: str | None = None) -> list[SlotRecord]:
        """Every slot (or one job's), by job and slot number."""
        with self._lock:
            return self._slot_rows.read(self._db, job_id)

    def mark_slot(self, job_id: str, slot: int, **fields: Any) -> None:
        self.mark_slots([(job_id, slot, fields)])

    def mark_slots(self, marks: Iterable[tuple[str, int, Mapping[str, Any]]]) -> None:
        """Several slots' :meth:`mark_slot` in one transaction."""
        self._update("slots", _SLOT_FIELDS,
                     [(f, {"job_id": j, "slot": s}) for j, s, f in marks])

    def _update(self, table: str, allowed: frozenset[str],
                changes: list[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> None:
        """``UPDATE table SET fields WHERE key`` for each (fields, key), in one transaction;
        column names only from ``allowed``, checked before anything is written."""
        for fields, _ in changes:
            bad = set(fields) - allowed
            if bad:
                raise ValueError(f"{table}: not updatable: {sorted(bad)}")
        changes = [(f, k) for f, k in changes if f]
        if not changes:
            return
        with self._tx() as db:
            for fields, key in changes:
                cols = ", ".join(f"{k}=?" for k in fields)
                where = " AND ".join(f"{k}=?" for k in key)
                db.execute(f"UPDATE {table} SET {cols} WHERE {where}",
                           (*fields.values(), *key.values()))

    # ------------------------------------------------------------------ actions

    def begin_action(self, job_id: str, slurm_job_id: int | None, kind: str, detail: str,
                     now_s: float | None = None) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO actions (job_id, slurm_job_id, kind, detail, started_s) "
                "VALUES (?,?,?,?,?)",
                (job_id, slurm_job_id, kind, detail, time.time() if now_s is None else now_s),
            )
            return int(cur.lastrowid or 0)

    def end_action(self, action_id: int, ok: bool, error: str = "") -> None:
        with self._tx() as db:
            db.execute("UPDATE actions SET done_s=?, ok=?, error=? WHERE id=?",
                       (time.time(), int(ok), error[:500], action_id))

    def open_actions(self) -> list[dict[str, Any]]:
        """Actions started and never recorded as done (the daemon died in between)."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM actions WHERE done_s IS NULL ORDER BY id")
            return [dict(r) for r in rows]

    def close_open_actions(self, note: str) -> int:
        with self._tx() as db:
            cur = db.execute("UPDATE actions SET done_s=?, ok=0, error=? WHERE done_s IS NULL",
                             (time.time(), note))
            return cur.rowcount

    def actions(self, job_id: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT * FROM actions"
        args: tuple[Any, ...] = ()
        if job_id is not None:
            q += " WHERE job_id=?"
            args = (job_id,)
        with self._lock:
            return [dict(r) for r in self._db.execute(q + " ORDER BY id", args)]

    # ------------------------------------------------------------------ profiles

    def save_profile(self, kind: str, data: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO profiles VALUES (?,?,?) ON CONFLICT(kind) DO UPDATE SET "
                       "data=excluded.data, updated_s=excluded.updated_s",
                       (kind, json.dumps(data), time.time()))

    def profiles(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT kind, data FROM profiles").fetchall()
        return {r["kind"]: json.loads(r["data"]) for r in rows}

    # ------------------------------------------------------------------ policy state

    def save_policy_state(self, policy: str, data: dict[str, Any]) -> None:
        """What an allocation policy learned (malletrain: hole lengths), by policy name."""
        with self._tx() as db:
            db.execute("INSERT INTO policy_state VALUES (?,?,?) ON CONFLICT(policy) DO UPDATE "
                       "SET data=excluded.data, updated_s=excluded.updated_s",
                       (policy, json.dumps(data), time.time()))

    def policy_state(self, policy: str) -> Any:
        """The stored state of ``policy`` (parsed JSON), or None."""
        with self._lock:
            row = self._db.execute("SELECT data FROM policy_state WHERE policy=?",
                                   (policy,)).fetchone()
        return None if row is None else json.loads(row["data"])
