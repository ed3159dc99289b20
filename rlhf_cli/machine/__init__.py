"""This machine: what it has (probe, no torch) and whether it can run rlhf (checks, behind `rlhf doctor`)."""
