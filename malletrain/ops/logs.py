"""Structured logs: text or JSON lines, one logger per module, job context attached.

Why: operators grep the journal for one job and feed JSON lines to Loki/Elastic. So every
record carries the job it concerns (when there is one) as a field, not buried in prose,
and extra fields given with ``extra={...}`` come out as key=value (text) or as JSON keys.

Each module keeps its own ``log = logging.getLogger(__name__)``; this module only installs
the handler (:func:`configure_logging`, once at start and again after a SIGHUP reload) and
provides two ways to attach a job:

* :func:`job_context` - a context manager over a contextvar: every record logged inside it,
  from any module, carries ``job_id`` (the daemon wraps its per-job work in it);
* :func:`job_logger` - a LoggerAdapter bound to one job, for objects that live with a job.

Usage::

    import logging
    from malletrain.ops.logs import configure_logging, job_context, job_logger

    log = logging.getLogger(__name__)
    configure_logging(settings.logging.level, settings.logging.format)

    with job_context("m17"):
        log.info("growing", extra={"from_nodes": 2, "to_nodes": 4})
    # text: 2026-11-22T00:42:07.123Z INFO malletrain.daemon.act [job_id=m17] growing
    #       from_nodes=2 to_nodes=4   (one line)
    # json: {"ts": "2026-11-22T00:42:07.123Z", "level": "INFO", "logger": "malletrain.daemon.act",
    #        "msg": "growing", "job_id": "m17", "from_nodes": 2, "to_nodes": 4}

    jlog = job_logger(log, "m17")
    jlog.warning("no progress report for %.0f s", 31.0)
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator, MutableMapping
from typing import IO, Any

log = logging.getLogger(__name__)

_JOB_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "malletrain_job_id", default=None
)

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "job_id",
}

#: Marks the handler this module installed, so reconfiguring replaces it instead of adding one.
_HANDLER_NAME = "malletrain-structured"


@contextlib.contextmanager
def job_context(job_id: str) -> Iterator[None]:
    """Attach ``job_id`` to every record logged in this block (this thread/task only)."""
    token = _JOB_ID.set(job_id)
    try:
        yield
    finally:
        _JOB_ID.reset(token)


def current_job_id() -> str | None:
    return _JOB_ID.get()


class JobAdapter(logging.LoggerAdapter[logging.Logger]):
    """A logger bound to one job: its records carry ``job_id`` (merged with any ``extra``)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


def job_logger(logger: logging.Logger, job_id: str) -> JobAdapter:
    return JobAdapter(logger, {"job_id": job_id})


class JobContextFilter(logging.Filter):
    """Sets ``record.job_id`` from the adapter's extra or the job context (None if neither)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            record.job_id = _JOB_ID.get()
        return True


def _utc(created: float) -> str:
    millis = int(created % 1 * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """Fields given with ``extra=`` (anything not a standard LogRecord attribute)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """``TIME LEVEL logger [job_id=..] message key=value ...`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_utc(record.created), record.levelname, record.name]
        job_id = getattr(record, "job_id", None)
        if job_id is not None:
            parts.append(f"[job_id={job_id}]")
        parts.append(escape_controls(record.getMessage()))
        parts += [f"{k}={escape_controls(_text_value(v))}" for k, v in extra_fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


#: control characters (C0, DEL, C1) -> a visible escape: a value from a user, a worker or
#: Slurm (a name, a reason, a record) can never start a forged line in a text log
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def escape_controls(text: str) -> str:
    return text.translate(_CONTROLS)


def _text_value(v: Any) -> str:
    s = str(v)
    return json.dumps(s) if (not s or any(c.isspace() or c in '"=' for c in s)) else s


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, job_id (if any), extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        job_id = getattr(record, "job_id", None)
        if job_id is not None:
            out["job_id"] = job_id
        for k, v in extra_fields(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def make_formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {fmt!r} (text or json)")


def configure_logging(
    level: str = "INFO",
    fmt: str = "text",
    stream: IO[str] | None = None,
    logger: logging.Logger | None = None,
    exclusive: bool = False,
) -> logging.Handler:
    """Install (or replace) malletrain's handler on ``logger`` (default: the root logger).

    Safe to call again after a SIGHUP reload: the previous handler is replaced, not doubled.
    ``exclusive=True`` (the daemon) also drops handlers others installed, e.g. the plain one
    of cli.py's ``basicConfig``, so no line is written twice. Returns the handler.
    """
    target = logger if logger is not None else logging.getLogger()
    for old in list(target.handlers):
        if exclusive or old.get_name() == _HANDLER_NAME:
            target.removeHandler(old)
            if old.get_name() == _HANDLER_NAME:
                old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(make_formatter(fmt))
    handler.addFilter(JobContextFilter())
    target.addHandler(handler)
    target.setLevel(level.upper())
    return handler
