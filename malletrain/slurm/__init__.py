"""The Slurm cluster backend: typed snapshots in (observe) and actions out (act)."""
