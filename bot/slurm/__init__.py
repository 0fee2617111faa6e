"""Slurm: the scheduler's answers (jobs, node states) and the SSH access to scripts/slurm-node-actions.sh."""
