"""``AuthStore``: a ``torch.distributed.Store`` over the coordinator's authenticated wire.

Used everywhere a ``TCPStore`` client was in the workers: their link to the coordinator and
the process group's rendezvous (``init_process_group(store=PrefixStore(prefix, auth_store))``,
verified with gloo on torch 2.13). It wraps an :class:`.authclient.AuthClient` (the daemon
uses that one directly, without torch) and gives its errors torch's types, so callers that
handle a ``TCPStore`` failure handle this one: a timeout is ``DistStoreError``, a lost or
refused connection ``DistNetworkError`` (both ``RuntimeError``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from malletrain.elastic.protocol import authclient as ac
from malletrain.elastic.protocol.authclient import DEFAULT_TIMEOUT_S

T = TypeVar("T")


class AuthenticationRefused(dist.DistNetworkError):
    """The coordinator refused the key at the handshake (wrong secret, realm or master)."""


class StoreRefused(dist.DistStoreError):
    """The coordinator refused a request (not this job's key, history rewrite, a quota)."""


def _torch_errors(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ac.AuthenticationRefused as exc:
        raise AuthenticationRefused(str(exc)) from exc
    except ac.CoordinatorUnreachable as exc:
        raise dist.DistNetworkError(str(exc)) from exc
    except ac.KeyTimeout as exc:
        raise dist.DistStoreError(str(exc)) from exc
    except ac.StoreRefused as exc:
        raise StoreRefused(str(exc)) from exc


class AuthStore(dist.Store):
    """One authenticated session (thread-safe: one request at a time)."""

    def __init__(self, host: str, port: int, job: str | None, secret: bytes, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, connect_timeout_s: float = 10.0) -> None:
        super().__init__()
        self._client = _torch_errors(lambda: ac.AuthClient(
            host, port, job, secret, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s))

    def close(self) -> None:
        self._client.close()

    def set_timeout(self, timeout: timedelta) -> None:
        self._client.timeout_s = timeout.total_seconds()

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self._client.timeout_s)

    def set(self, key: str, value: object) -> None:
        _torch_errors(lambda: self._client.set(key, value))

    def get(self, key: str) -> bytes:
        return _torch_errors(lambda: self._client.get(key))

    def add(self, key: str, amount: int) -> int:
        return _torch_errors(lambda: self._client.add(key, amount))

    def check(self, keys: Sequence[str]) -> bool:
        return _torch_errors(lambda: self._client.check(keys))

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        _torch_errors(lambda: self._client.wait(keys, timeout))

    def num_keys(self) -> int:
        return _torch_errors(self._client.num_keys)

    def delete_key(self, key: str) -> bool:
        return _torch_errors(lambda: self._client.delete_key(key))

    def compare_set(self, key: str, expected: object, desired: object) -> bytes:
        return _torch_errors(lambda: self._client.compare_set(key, expected, desired))
