"""The user's side and its way in: ``malletrain submit | jobs | cancel`` run as the user
(:mod:`.cli_user`), the Unix socket where the kernel names the caller (:mod:`.channel`), the
daemon's answers to those requests (:mod:`.requests`) and submissions still in flight
(:mod:`.submissions`).

May import: :mod:`malletrain.daemon.jobs`, core, slurm, ops.
"""
