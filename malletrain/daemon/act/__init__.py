"""Acting on a tick's plan: each action applied to Slurm and the coordinator and recorded
(:mod:`.actuator`), off the tick and urgent groups first (:mod:`.action_queue`,
:mod:`.background`).

May import: :mod:`malletrain.daemon.jobs`, :mod:`malletrain.daemon.tick` (the actions), core,
slurm, ops.
"""
