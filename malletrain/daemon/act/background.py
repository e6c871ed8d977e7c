"""One call on a thread of its own, joined when its result is needed.

The tick reads Slurm this way while it reads the store and the coordinator (daemon.py).
A daemon thread, not an executor's: a read in flight against a slurmctld that does not
answer (up to the backend's timeout) must not hold the process at exit, and an executor's
workers are joined when the interpreter exits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """``fn()`` started now; :meth:`result` waits for it and returns or raises its outcome."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def wait(self) -> None:
        """Until the call has ended, whatever its outcome."""
        self._thread.join()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
