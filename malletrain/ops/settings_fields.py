"""Settings fields' metadata and checks: what drives validation, documentation and reloads."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from malletrain.core.policies import POLICIES as POLICY_REGISTRY


def daemon_policy_names() -> tuple[str, ...]:
    """Policies the daemon can run: those of core's registry that do not need the jobs' true
    throughput curves (only the simulator has those, e.g. ``malletrain-known-curves``)."""
    return tuple(name for name, spec in POLICY_REGISTRY.items() if spec.curves != "true")


#: sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_UNIX_PATH_MAX_BYTES = 107


# ---------------------------------------------------------------------------------------
# field helpers: metadata drives validation, documentation and reload behaviour
# ---------------------------------------------------------------------------------------
Check = Callable[[Any], "str | None"]


def meta(
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    check: Check | None = None,
    restart: bool = False,
) -> dict[str, Any]:
    """Metadata of a settings field: its documentation and its validation.

    ``min``/``max`` are inclusive bounds, ``gt`` an exclusive lower bound, ``check`` returns a
    problem or None. ``restart=True``: a SIGHUP reload cannot change it (sockets, paths).
    """
    return {"doc": doc, "min": min, "max": max, "gt": gt, "check": check, "restart": restart}


def parse_address(value: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port). Raises ValueError with the reason."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9464), got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. [::1]:9464, got {value!r}")
    if not port_text.isdigit():
        raise ValueError(f"port must be a number, got {port_text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    return host, port


def check_address(value: str) -> str | None:
    try:
        parse_address(value)
    except ValueError as exc:
        return str(exc)
    return None


def check_name(value: str) -> str | None:
    """Slurm partition/QOS/account names: non-empty, no whitespace, commas or shell-ish noise."""
    if not value:
        return "must not be empty"
    bad = sorted({c for c in value if c.isspace() or c in ",;'\"`$\\|&<>()*?"})
    if bad:
        return f"must not contain {''.join(bad)!r}, got {value!r}"
    return None


def check_names(values: tuple[str, ...]) -> str | None:
    if not values:
        return "must list at least one partition"
    for value in values:
        problem = check_name(value)
        if problem:
            return problem
    if len(set(values)) != len(values):
        return f"lists a partition twice: {list(values)}"
    return None


def check_optional_name(value: str | None) -> str | None:
    return None if value is None else check_name(value)


def check_socket_path(value: Path) -> str | None:
    if len(os.fsencode(str(value))) > _UNIX_PATH_MAX_BYTES:
        size = len(os.fsencode(str(value)))
        return f"is {size} bytes long; a Unix socket path may have at most {_UNIX_PATH_MAX_BYTES}"
    return None


def check_policy(value: str) -> str | None:
    names = daemon_policy_names()
    if value not in names:
        if value in POLICY_REGISTRY:
            return f"{value!r} needs the jobs' true throughput curves (simulator only); " \
                f"the daemon runs one of {', '.join(names)}"
        return f"must be one of {', '.join(names)}, got {value!r}"
    return None


def check_host(value: str) -> str | None:
    if not value or any(c.isspace() for c in value):
        return f"must be a host name or address, got {value!r}"
    return None


#: how ``allocator.node_prices`` names nodes without GPUs (``node_type`` gives them "")
CPU_NODE_TYPE = "cpu"
#: a node type as ``core.scavenger.node_type`` gives it: a GPU model from GRES, lower case
_NODE_TYPE_RE = re.compile(r"^[a-z0-9_.+-]{1,64}$")
#: a price per node-second in a job's one-node work; above 1000 no node is ever worth it
MAX_NODE_PRICE = 1000.0


def check_prices(value: Mapping[str, float]) -> str | None:
    for kind, price in value.items():
        if not _NODE_TYPE_RE.match(kind):
            return (f"{kind!r} is not a node type as `malletrain nodes` shows it (a GPU model "
                    f"in lower case, or {CPU_NODE_TYPE})")
        if not 0 <= price <= MAX_NODE_PRICE:
            return f"{kind}: a price is from 0 to {MAX_NODE_PRICE:g}, got {price:g}"
    return None
