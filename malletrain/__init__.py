"""malletrain: scavenge idle Slurm nodes for malleable deep-learning training.

Layering (checked by ``tests/unit/test_layering.py``)::

    core/     pure decision logic: scavenger prediction, profiler, allocator, lifecycle
    slurm/    the cluster backend: observe (snapshots) and act (submit/cancel/...)
    sim/      a simulated cluster backend that replays traces; uses core/
    elastic/  the worker runtime (torch) and the membership coordinator
    daemon/   observe -> decide -> act loop on a real cluster; uses core/, slurm/, elastic/
    ops/      settings, metrics, logging, systemd integration
    cli.py    the ``malletrain`` command

``core`` imports nothing from the other packages, so the simulator and the daemon
run the same decision code with only the cluster backend swapped.
"""

__version__ = "0.1.0"
