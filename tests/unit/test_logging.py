"""Structured logging: text/JSON lines, job context from contextvar and adapter, reconfigure."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading

import pytest

from malletrain.ops.logs import configure_logging, job_context, job_logger


@pytest.fixture
def logger():
    lg = logging.getLogger("malletrain.test_logging_target")
    lg.propagate = False
    yield lg
    for h in list(lg.handlers):
        lg.removeHandler(h)
    lg.propagate = True


def lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


def test_json_lines_carry_job_and_extra_fields(logger):
    buf = io.StringIO()
    configure_logging("INFO", "json", stream=buf, logger=logger)
    with job_context("m17"):
        logger.info("growing to %d", 4, extra={"from_nodes": 2, "nodes": ["n1", "n2"]})
    logger.info("no job here")
    logger.debug("filtered out")
    first, second = (json.loads(x) for x in lines(buf))
    assert first["msg"] == "growing to 4" and first["level"] == "INFO"
    assert first["logger"] == "malletrain.test_logging_target"
    assert first["job_id"] == "m17" and first["from_nodes"] == 2 and first["nodes"] == ["n1", "n2"]
    assert first["ts"].endswith("Z")
    assert "job_id" not in second


def test_text_lines_and_exceptions_stay_structured(logger):
    buf = io.StringIO()
    configure_logging("debug", "text", stream=buf, logger=logger)
    job_logger(logger, "m2").warning("hung", extra={"silent_s": 31.5, "why": "no report"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("tick failed")
    out = lines(buf)
    assert " WARNING malletrain.test_logging_target [job_id=m2] hung silent_s=31.5 " in out[0]
    assert out[0].endswith('why="no report"')
    assert "ERROR" in out[1] and "tick failed" in out[1]
    assert any("RuntimeError: boom" in x for x in out)

    jbuf = io.StringIO()
    configure_logging("INFO", "json", stream=jbuf, logger=logger)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("tick failed")
    (record,) = (json.loads(x) for x in lines(jbuf))  # the traceback is inside one JSON line
    assert "RuntimeError: boom" in record["exc"]


def test_reconfigure_replaces_instead_of_doubling(logger):
    a, b = io.StringIO(), io.StringIO()
    configure_logging("INFO", "text", stream=a, logger=logger)
    configure_logging("WARNING", "json", stream=b, logger=logger)
    logger.info("dropped by the new level")
    logger.warning("once")
    assert a.getvalue() == ""
    assert [json.loads(x)["msg"] for x in lines(b)] == ["once"]
    assert [h.get_name() for h in logger.handlers].count("malletrain-structured") == 1


def test_exclusive_drops_foreign_handlers(logger):
    foreign = io.StringIO()
    logger.addHandler(logging.StreamHandler(foreign))
    ours = io.StringIO()
    configure_logging("INFO", "text", stream=ours, logger=logger, exclusive=True)
    logger.info("hello")
    assert foreign.getvalue() == "" and "hello" in ours.getvalue()


def test_job_context_is_per_thread_and_per_task(logger):
    buf = io.StringIO()
    configure_logging("INFO", "json", stream=buf, logger=logger)

    def worker(job: str) -> None:
        with job_context(job):
            for _ in range(50):
                logger.info(job)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def task(job: str) -> None:
        with job_context(job):
            await asyncio.sleep(0)
            logger.info(job)

    async def main() -> None:
        await asyncio.gather(*(task(f"a{i}") for i in range(4)))

    asyncio.run(main())
    records = [json.loads(x) for x in lines(buf)]
    assert len(records) == 204
    assert all(r["job_id"] == r["msg"] for r in records)


def test_unknown_format_is_refused(logger):
    with pytest.raises(ValueError, match="unknown log format"):
        configure_logging("INFO", "xml", logger=logger)


def test_a_value_with_control_characters_cannot_forge_a_text_log_line(logger):
    """Names, reasons and records come from users, workers and Slurm (issue 15)."""
    buf = io.StringIO()
    configure_logging("INFO", "text", stream=buf, logger=logger)
    forged = "m1\n2026-11-25T00:00:00.000Z ERROR malletrain.daemon all jobs cancelled\x1b[2J"
    logger.info("job %s submitted", forged, extra={"job_name": "a\rb"})
    [line] = lines(buf)
    assert "\\n2026-11-25" in line and "\\x1b[2J" in line and 'job_name="a\\rb"' in line
