"""Pure decision logic shared by the daemon and the simulator (no I/O, no Slurm)."""
