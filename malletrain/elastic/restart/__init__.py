"""Restart mode: an unmodified batch script, restarted at every size change.

A job submitted as a shell batch script (``#!/bin/bash``) runs as written: on every node of
every slot its set-up lines run unchanged, and its one launch line (``srun torchrun ...``,
``torchrun ...``, ``srun python ...``, ``accelerate launch ...``, ``deepspeed ...``,
``python -m torch.distributed.run ...``) is handed to malletrain's launcher, which runs it
once per node at the job's current size. When the size changes, every node's launch is
stopped (the script's own ``--signal``, then SIGTERM) and started again at the new size; the
script resumes from its own checkpoint, as with torchrun's elastic restarts.

* :mod:`.script`: pure; finds the launch line, renders the script each node runs.
* :mod:`.launchers`: pure; the launch line's argument list at a given size, per launcher.
* :mod:`.launch`: the launcher the rendered line calls (``python -m ...restart.launch``).
* :mod:`.agent`: the per-node agent a slot runs: membership in, launches out.
"""
