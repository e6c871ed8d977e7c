"""Error types shared by every layer.

The split follows kopf: :class:`RetryableError` means "the world may change, try
again next tick" (slurmctld restarting, a timeout); :class:`PermanentError` means
"this input will never work" (a malformed job spec).  Both are :class:`UserError`
so the CLI prints them as one clear line instead of a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An error whose message is meant for the person running the command."""

    exit_code = 1


class RetryableError(UserError):
    """A failure that may pass if retried later (timeouts, a daemon down)."""

    exit_code = 75  # EX_TEMPFAIL


class PermanentError(UserError):
    """Input or state that will not become valid by waiting."""

    exit_code = 65  # EX_DATAERR


class ConfigError(PermanentError):
    """Invalid configuration. The message names the file and the field."""

    exit_code = 78  # EX_CONFIG
