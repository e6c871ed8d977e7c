"""``torchrun --rdzv_backend=malletrain``: torchrun's rendezvous over the job's coordinator.

torchrun takes rendezvous backends from other packages (entry point group
``torchrun.handlers``, ``setup.cfg``). This one is torch's own dynamic rendezvous
(``DynamicRendezvousHandler`` with ``C10dRendezvousBackend``: the same protocol as
``--rdzv_backend=c10d``), kept in the job's namespace of malletrain's coordinator through an
authenticated :class:`~malletrain.elastic.protocol.authstore.AuthStore` instead of an open
``TCPStore``: with ``c10d`` anyone who reaches the store's port can read and rewrite the
rendezvous (docs/security.md); here a client needs the job's secret.

Where it connects: ``--rdzv_endpoint`` if given, else ``$MALLETRAIN_COORDINATOR``; the job
and its secret come from ``$MALLETRAIN_JOB_ID`` and ``$MALLETRAIN_JOB_SECRET`` (never from
the command line: every user can read every process's arguments; the environment is
readable by the job's user and root only). Keys live under ``mt/<job>/torchrun/<run id>/``:
the job's own space and quota.

What it does not change: the agent still hosts the workers' own ``TCPStore``
(``MASTER_ADDR:MASTER_PORT``, open while the workers run; docs/security.md says so). Measured
with one node (``ss -ltn``): ``--standalone`` opens two listening stores, this backend one.
Native slots with ``--launcher torchrun`` use it (``daemon/jobs/slots.py``); torchrun's default
``--rdzv_id`` (``none``) is replaced by a fresh id per agent, and refused above one node.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Mapping

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from malletrain.elastic.protocol import wire
from malletrain.elastic.protocol.authstore import AuthStore
from malletrain.elastic.protocol.keys import ID_RE, Keys
from malletrain.errors import PermanentError

log = logging.getLogger(__name__)

#: the backend's name: ``torchrun --rdzv_backend=malletrain``
NAME = "malletrain"


class RendezvousConfigError(PermanentError, ValueError):
    """The agent cannot reach its job's coordinator as configured."""


def _endpoint(params: RendezvousParameters, env: Mapping[str, str]) -> tuple[str, int]:
    text = params.endpoint or env.get("MALLETRAIN_COORDINATOR", "")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RendezvousConfigError(
            f"malletrain rendezvous: no coordinator as host:port (--rdzv_endpoint "
            f"{params.endpoint!r}, $MALLETRAIN_COORDINATOR {env.get('MALLETRAIN_COORDINATOR')!r})")
    return host.strip("[]"), int(port)


def _job(env: Mapping[str, str]) -> tuple[str, bytes]:
    job = env.get("MALLETRAIN_JOB_ID", "")
    text = env.get("MALLETRAIN_JOB_SECRET", "")
    if not ID_RE.match(job) or not text:
        raise RendezvousConfigError(
            "malletrain rendezvous: $MALLETRAIN_JOB_ID and $MALLETRAIN_JOB_SECRET must be set "
            "(a malletrain job's slot sets them)")
    try:
        return job, wire.parse_secret(text)
    except ValueError as exc:
        raise RendezvousConfigError(f"malletrain rendezvous: $MALLETRAIN_JOB_SECRET: {exc}"
                                    ) from None


class _JobStore(dist.PrefixStore):
    """A PrefixStore that keeps its AuthStore alive: torch holds only the C++ side of a
    Python store, so a Python store referenced by nothing else is collected and every call
    through the prefix then fails ("Not implemented")."""

    def __init__(self, prefix: str, inner: AuthStore) -> None:
        super().__init__(prefix, inner)
        self.inner = inner


class _Backend(C10dRendezvousBackend):
    """torch's c10d rendezvous protocol, named as torchrun was asked for it."""

    @property
    def name(self) -> str:
        return NAME


def create_rdzv_handler(params: RendezvousParameters,
                        env: Mapping[str, str] | None = None) -> RendezvousHandler:
    """torch's dynamic rendezvous, its state in the job's authenticated coordinator space."""
    env = os.environ if env is None else env
    host, port = _endpoint(params, env)
    job, secret = _job(env)
    if params.run_id == "none":  # torchrun's default: fine alone, never shared
        if params.max_nodes > 1:
            raise RendezvousConfigError("malletrain rendezvous: more than one node needs "
                                        "--rdzv_id, the same on every node")
        # a fresh id per agent: a finished (closed) rendezvous is never joined again
        params = replace_run_id(params, f"one-{os.getpid()}-{secrets.token_hex(4)}")
    if not ID_RE.match(params.run_id):
        raise RendezvousConfigError(f"malletrain rendezvous: --rdzv_id {params.run_id!r} "
                                    "must be letters, digits, '.', '_' or '-'")
    prefix = f"{Keys(job).root}torchrun/{params.run_id}/"  # the job's own key space
    store = _JobStore(prefix, AuthStore(host, port, job, secret))
    backend = _Backend(store, params.run_id)
    log.info("torchrun rendezvous %s of job %s through the coordinator at %s:%d",
             params.run_id, job, host, port)
    return create_handler(store, backend, params)


def replace_run_id(params: RendezvousParameters, run_id: str) -> RendezvousParameters:
    return RendezvousParameters(params.backend, params.endpoint, run_id, params.min_nodes,
                                params.max_nodes, params.local_addr, **params.config)


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The entry point: torchrun calls it once and registers what it returns as ``NAME``."""
    return create_rdzv_handler
