"""What the daemon watches besides the Slurm snapshot: each job's coordinator state fed to the
Profiling Advisor (:mod:`.monitor`), what it learned kept across restarts (:mod:`.learned`),
and arrivals at Slurm that wake the loop early (:mod:`.arrivals`).

May import: :mod:`malletrain.daemon.jobs`, :mod:`malletrain.daemon.tick` (its views), core,
the coordinator's handle.
"""
