"""The daemon's nodes on every tick: their states (:data:`~.versions.NODE_STATES`) laid over
their records (the JSON node list, read every ``PERIODIC_S["nodes_json"]``). Pure.

``sinfo --noheader --Node --Format=NodeList:0|,StateComplete:0|`` prints one line per node
and partition, ``n6|idle+drain|``: the base state and the flags that the JSON list gives
as ``"state": "idle", "state_flags": ["DRAIN"]``, joined by ``+``. Checked against the JSON
on the dev cluster (idle, allocated, drained, draining, planned and down nodes:
``tests/slurm/test_backend_contract.py``) and in the recorded answers of 22.05, 24.11 and
26.05 (``tests/unit/test_slurm_backend.py``). What the records say beside the state
(partitions, features, GRES, CPUs, reason) changes when an operator acts; the last-busy time
of a node that went idle since its record was read is unknown, and left unset (its hole is
taken to start now; the daemon tracks each hole's start from then on).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from malletrain.core.cluster import Node, NodeState
from malletrain.slurm.errors import SlurmParseError
from malletrain.slurm.parsers.parse_json import node_state

#: The warning of a node that has a state but no record yet: the backend reads the records
#: again on the next tick (a node added to the cluster since the last read).
UNRECORDED_NODE = "not in the last node records"
#: Odd lines tolerated (each a warning) before the whole answer is refused.
MAX_ODD_LINES = 20


def parse_node_states(text: str, warnings: list[str] | None = None
                      ) -> dict[str, tuple[str, frozenset[str]]]:
    """``{node: (BASE, {FLAG, ...})}``, upper-case, the first line of each node kept.

    Read every tick: 10,000 lines at 5,000 nodes in two partitions. A node's later lines
    are skipped unread, and a line's state is decoded once and kept (:func:`_state_of`):
    a machine has a few dozen distinct states.
    """
    warns = warnings if warnings is not None else []
    out: dict[str, tuple[str, frozenset[str]]] = {}
    odd = 0
    for line in text.splitlines():
        name, sep, rest = line.partition("|")
        if name in out:
            continue
        state = rest.split("|", 1)[0].strip()
        if not sep or not state or not _NAME.fullmatch(name):
            if not line.strip():
                continue
            odd += 1
            warns.append(f"sinfo node states: line {line[:80]!r} is not NAME|STATE|; skipped")
            if odd > MAX_ODD_LINES:
                raise SlurmParseError(
                    f"sinfo node states: more than {MAX_ODD_LINES} lines not of the form "
                    f"NAME|STATE| (is --Format honoured?): {line[:80]!r}")
            continue
        out[name] = _state_of(state)
    return out


#: a node name as sinfo prints it: no blanks, no field separator
_NAME = re.compile(r"[^\s|]+")


@functools.lru_cache(maxsize=1024)
def _state_of(state: str) -> tuple[str, frozenset[str]]:
    """``idle+drain`` -> ``("IDLE", {"DRAIN"})``; the short forms' ``*`` (not responding),
    if a release adds it, as the flag ``NOT_RESPONDING``."""
    base, *flags = state.upper().split("+")
    if base.endswith("*"):
        base, flags = base[:-1], [*flags, "NOT_RESPONDING"]
    return base, frozenset(f for f in flags if f)


def merge_node_states(records: Sequence[Node],
                      states: Mapping[str, tuple[str, frozenset[str]]],
                      warnings: list[str] | None = None) -> tuple[Node, ...]:
    """``records`` with each node's state and flags as ``states`` say now.

    A node without a state line (in no partition) keeps its record's state; a node with a
    state and no record is added with its state alone (no partitions: never scavenged) and
    a :data:`UNRECORDED_NODE` warning.
    """
    warns = warnings if warnings is not None else []
    out: list[Node] = []
    for node in records:
        now = states.get(node.name)
        if now is None:
            out.append(node)
            continue
        base, flags = now
        state = _node_state(base, flags)
        if state is NodeState.UNKNOWN and base != "UNKNOWN":
            warns.append(f"sinfo node states: node {node.name}: unknown state "
                         f"{base.lower()!r}; treated as unknown")
        if state is node.state and flags == node.flags:
            out.append(node)
            continue
        went_idle = state is NodeState.IDLE and node.state is not NodeState.IDLE
        out.append(replace(node, state=state, flags=flags,
                           last_busy_at=None if went_idle else node.last_busy_at))
    recorded = {n.name for n in records}
    for name in sorted(states.keys() - recorded):
        base, flags = states[name]
        warns.append(f"sinfo node states: node {name} is {UNRECORDED_NODE}; read next tick")
        out.append(Node(name=name, state=node_state(base.lower(), flags), flags=flags))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _node_state(base: str, flags: frozenset[str]) -> NodeState:
    """:func:`~.parse_json.node_state` of a state line, once per distinct state."""
    return node_state(base.lower(), flags)
