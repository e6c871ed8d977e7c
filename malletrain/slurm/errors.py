"""Typed failures of the Slurm backend.

Callers (the daemon's tick, ``malletrain nodes``) decide by type, never by message:

* :class:`SlurmUnavailableError` (retryable): slurmctld down or slow, a timeout, a
  transient refusal such as "try again in a bit".  Keep the last good snapshot; retry.
* :class:`SlurmParseError` (permanent): output that does not parse or lacks a field we
  need (a Slurm upgrade changed the format).  Waiting does not help; the message names
  the command and the field.
* :class:`SlurmCommandNotFoundError` (permanent): ``sinfo`` & co. are not on PATH.
* :class:`SlurmCommandError` (permanent): Slurm refused an action (invalid job id,
  permission denied).  ``stderr`` holds Slurm's own words.
"""

from __future__ import annotations

from malletrain.errors import PermanentError, RetryableError


class SlurmUnavailableError(RetryableError):
    """Slurm did not answer (down, timed out, busy): retry on the next tick."""


class SlurmParseError(PermanentError):
    """Slurm's output does not have the shape this backend understands."""


class SlurmCommandNotFoundError(PermanentError):
    """A Slurm client command is not installed or not on PATH."""


class SlurmCommandError(PermanentError):
    """Slurm rejected an action; retrying the same request will not help."""

    def __init__(self, message: str, argv: tuple[str, ...] = (), stderr: str = "") -> None:
        super().__init__(message)
        self.argv = argv
        self.stderr = stderr
