"""The contract between the launcher and the ranks, named once: the files of a run's output directory, the
variables the launcher sets for the ranks, and the exit code of a preemption.

The launcher writes the run's files before any rank starts; the ranks write their records, checkpoints and
the model; the launcher and `rlhf report` read them afterwards. Pure: paths only, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Variables the launcher sets for every rank.
OUTPUT_MODE_ENV = "RLHF_OUTPUT"  # quiet | normal | verbose, from --quiet / --verbose
PROBE_GENERATION_ENV = "RLHF_PROBE_GENERATION"  # set: each rank records what generation cost it
STOCK_TRL_ENV = "RLHF_STOCK_TRL_GENERATION"  # set: TRL's no-gather generation as shipped (the upstream-bug canary)
PROBE_CUDA_MEMORY_ENV = "RLHF_PROBE_CUDA_MEMORY"  # set: each rank records its peak CUDA memory per phase
# The pre-launch check (rlhf_cli/rank/prelaunch.py) marks each step on stderr with this, for the launcher to say
# which step hung.
PRELAUNCH_STEP_MARK = "[rlhf prelaunch] "
START_GATE_ENV = "RLHF_START_GATE_FD"  # the launch supervisor starts no rank until it reads START_GATE from this pipe
START_GATE = b"go"
PLANNED_SAVE_ENV = "RLHF_PLANNED_SAVE_SECONDS"  # the plan's seconds of one save, for the ETA until a save is measured
PLANNED_STEP_ENV = "RLHF_PLANNED_STEP_SECONDS"  # JSON: the plan's seconds per step by step phase, which the ETA weighs
RUN_DIR_ENV = "RLHF_RUN_DIR"  # the shared output dir, for the launch supervisor: where it records how its ranks ended

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the ranks checkpointed and stopped; run again with --resume auto


def signal_exit_code(signum: int) -> int:
    """The exit code of a process stopped by signal `signum`, as a shell reports it: 128 + N (Ctrl-C: 130)."""
    return 128 + signum

# What the first-failure marker holds: how the other ranks stop.
FAILED = "failed"  # a rank raised, or died: stop
STALLED = "stalled"  # the job stopped moving, or a rank fell silent: write your stack, then stop

RECIPE_HEADER = "# Resolved by rlhf from "  # the first line of the recipe.yaml a launcher writes
MANIFEST = "rlhf-manifest.json"  # in a checkpoint: its files and sizes, written once every rank has saved
TRAINER_STATE = "trainer_state.json"  # the trainer's state and every logged metric (run dir and checkpoints)
POLICY_AND_VALUE = "policy_and_value.pt"  # in a PPO checkpoint without DeepSpeed: the trained policy and value weights
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_RANK_RECORD = re.compile(r"rank-\d+\.json")  # not rank-N.error.json, rank-N.heartbeat.json


def checkpoint_step(checkpoint: Path | str) -> int | None:
    """N of a `checkpoint-N` directory, or None for any other name."""
    match = _CHECKPOINT.fullmatch(Path(checkpoint).name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class RunDir:
    """A run's output directory and the name of everything in it."""

    path: Path

    # -- written by the launcher, before any rank starts ---------------------------------------------------
    @property
    def recipe(self) -> Path:
        """The fully resolved recipe, itself a valid recipe; the ranks read nothing else."""
        return self.path / "recipe.yaml"

    @property
    def accelerate_config(self) -> Path:
        return self.path / "accelerate_config.yaml"

    @property
    def launch_script(self) -> Path:
        return self.path / "launch.sh"

    @property
    def written(self) -> Path:
        """The top-level entries rlhf's runs wrote here (rlhf_cli/output/ownership.py): all that `--overwrite`
        removes."""
        return self.path / "rlhf-files.json"

    @property
    def run_record(self) -> Path:
        """Command, versions and layout; at the end how it ended (machine 0 only)."""
        return self.path / "run.json"

    def machine(self, machine_rank: int) -> RunDir:
        """Where machine N > 0 of a multi-node job keeps its own launch files: machine 0 owns the output dir."""
        return self if machine_rank == 0 else RunDir(self.path / "machines" / f"machine-{machine_rank}")

    # -- written by the ranks -----------------------------------------------------------------------------
    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def preempted(self) -> Path:
        return self.path / "preempted.json"

    @property
    def trainer_state(self) -> Path:
        return self.path / TRAINER_STATE

    @property
    def ranks(self) -> Path:
        return self.path / "ranks"

    def rank_record(self, rank: int) -> Path:
        return self.ranks / f"rank-{rank}.json"

    def rank_log(self, rank: int) -> Path:
        """Everything the rank and its libraries printed (unless --verbose, which shows it instead)."""
        return self.ranks / f"rank-{rank}.log"

    def rank_error(self, rank: int) -> Path:
        """A failed rank's error and traceback."""
        return self.ranks / f"rank-{rank}.error.json"

    @property
    def first_failure(self) -> Path:
        """Created by the first rank to fail, exclusively; every other rank stops on seeing it. It holds what
        happened (`FAILED`, `STALLED`): on a stall every rank writes its stack before it stops."""
        return self.ranks / "first-failure"

    def heartbeat(self, rank: int) -> Path:
        """Rewritten every few seconds by the rank's watch: alive, where, and when its main thread last moved."""
        return self.ranks / f"rank-{rank}.heartbeat.json"

    def stack(self, rank: int) -> Path:
        """The rank's Python stacks (every thread), written when the job stalled."""
        return self.ranks / f"rank-{rank}.stack.txt"

    def rank_exits(self, machine_rank: int) -> Path:
        """Written by a machine's launch supervisor when its ranks failed: each one's exit code or signal, and the
        machine's memory; what a rank killed by a signal cannot record itself."""
        return self.ranks / f"machine-{machine_rank}.exits.json"

    def rank_records(self) -> list[Path]:
        return sorted(path for path in self.ranks.glob("rank-[0-9]*.json") if _RANK_RECORD.fullmatch(path.name))

    def rank_errors(self) -> list[Path]:
        return sorted(self.ranks.glob("rank-*.error.json"))

    @property
    def merged_model(self) -> Path:
        """With LoRA and `merge_adapter`: the policy with its adapter merged in (the adapter itself is in `path`)."""
        return self.path / "merged"

    def rank_exits_files(self) -> list[Path]:
        """Every machine's `rank_exits`."""
        return sorted(self.ranks.glob("machine-*.exits.json"))

    def attempt_files(self) -> list[Path]:
        """What one attempt leaves about how it went (errors, heartbeats, stacks, exits, the failure marker): a
        resumed run must not read the last attempt's."""
        patterns = ("rank-*.error.json", "rank-*.heartbeat.json", "rank-*.stack.txt")
        return sorted(path for pattern in patterns for path in self.ranks.glob(pattern)) + \
            self.rank_exits_files() + [self.first_failure]

    def checkpoint(self, step: int) -> Path:
        return self.path / f"checkpoint-{step}"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, directory) of every `checkpoint-N` here, newest first."""
        found = ((checkpoint_step(path), path) for path in self.path.glob("checkpoint-*") if path.is_dir())
        return sorted(((step, path) for step, path in found if step is not None), reverse=True)
