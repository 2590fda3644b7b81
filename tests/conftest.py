"""Fixtures shared by the test modules."""

from slurm_fixtures import slurm_cluster  # noqa: F401  (a two-node Slurm cluster on this machine)
