"""What a run leaves in its output dir, named once for the launcher and the ranks that both use it."""

from __future__ import annotations

RUN_FILE = "run.json"  # launcher: command, versions, layout, then how it ended
SUMMARY_FILE = "summary.json"  # rank 0: steps, pace, last metrics
PREEMPTED_FILE = "preempted.json"  # rank 0: the step and checkpoint a preemption stopped at
RANKS_DIR = "ranks"  # rank-N.json per rank; rank-N.error.json for a rank that failed
FIRST_FAILURE_FILE = "ranks/first-failure"  # created by the first rank to fail, exclusively
ERROR_FILES = "rank-*.error.json"  # in RANKS_DIR


def error_file(rank: int) -> str:
    """A failed rank's error record, in RANKS_DIR."""
    return f"rank-{rank}.error.json"

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the ranks checkpointed and stopped; run again with --resume auto
