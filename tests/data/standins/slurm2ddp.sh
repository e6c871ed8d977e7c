#!/bin/bash
# Stand-in for anemoi-house's slurm2ddp.sh (github.com/timothyas/anemoi-house, slurm2ddp.sh,
# Apache-2.0), the helper its batch scripts (and nested-eagle's) run directly under srun from
# the user's home: `srun ~/anemoi-house/slurm2ddp.sh anemoi-training train ...`. Not a copy:
# the same steps, NERSC's export_DDP_vars.sh idiom: torch.distributed's variables from the
# task's Slurm ones (port from the job id), then the command in the task's place.
export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS
export MASTER_PORT=$((29500 + SLURM_JOB_ID % 10000))
MASTER_ADDR=$(scontrol show hostnames "$SLURM_NODELIST" | head -n 1)
export MASTER_ADDR
exec "$@"
