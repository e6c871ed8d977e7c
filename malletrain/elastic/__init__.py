"""malletrain.elastic: checkpoint-free elastic training, in rooms by role.

* ``protocol/``: what both sides of a job's coordinator speak (wire, keys, records, sessions).
* ``coordinator/``: the membership store on the login node and the daemon's handle on it.
* ``worker/``: the runtime inside each training process (``ElasticJob``).
* ``training/``: what training does at a given size (data position, batch/LR rules, compression).
* ``restart/``: restart mode: a batch script run unchanged, one batch shell per size.

A training script needs only this package's top level::

    from malletrain.elastic import ElasticJob, LinearScaling

Names are imported on first use (PEP 562), so importing the package pulls in no torch: the
daemon and the coordinator use its rooms without it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The public API: name -> the module (under malletrain.elastic) that defines it.
_EXPORTS = {
    "ElasticJob": "worker.job",
    "Step": "worker.job",
    "AcceleratedJob": "worker.accelerate",
    "Stateful": "worker.transfer",
    "ScalingRule": "training.rules",
    "LinearScaling": "training.rules",
    "SqrtScaling": "training.rules",
    "FixedGlobalBatch": "training.rules",
    "SlowLinkCompression": "training.compress",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'malletrain.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"malletrain.elastic.{module}"), name)
