"""A resolved run -> the exact argv and environment that start its ranks. Pure: no I/O."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.launch.module_start import module_argv, script_argv
from rlhf_cli.output.run_dir import OUTPUT_MODE_ENV, RUN_DIR_ENV, RunDir

# Seconds the ranks get to checkpoint after a preemption signal before torch's agent kills them.
PREEMPTION_GRACE_SECONDS = 300


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]  # added to the caller's environment

    def shell(self) -> str:
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        return " ".join(assignments + [shlex.join(self.argv)])


def machine_rank(run: ResolvedRun) -> int:
    return int(run.accelerate.get("machine_rank") or 0)


def run_files_dir(run: ResolvedRun) -> RunDir:
    """Where this machine's launch files go: the output dir on machine 0, which owns it; machines of a
    multi-node job share the output dir, so the others keep theirs apart (and never look like a run)."""
    return RunDir(run.output_dir).machine(machine_rank(run))


def launch_command(run: ResolvedRun, python: str = sys.executable, verbosity: str = "normal") -> Launch:
    """accelerate's launcher starting `rlhf_cli.rank ALGORITHM RECIPE` on every rank of this machine, each process
    with the working directory last on its import path (rlhf_cli/launch/module_start.py)."""
    run_dir = run_files_dir(run)
    argv = [
        *module_argv(python, "rlhf_cli.launch.supervisor"),  # accelerate launch, without its failure traceback
        "--config_file", str(run_dir.accelerate_config),
        # The shared config file holds the job's layout; which machine this is goes on the command line.
        "--machine_rank", str(machine_rank(run)),
        *script_argv("rlhf_cli.rank"), run.algorithm, str(run_dir.recipe),
    ]
    env = {
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(PREEMPTION_GRACE_SECONDS),
    }
    if verbosity == "quiet":
        env["LOGLEVEL"] = "ERROR"  # torch's elastic agent: its warnings and banners
    if run.cpu_only:
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed would otherwise look for CUDA and fail
    # The recipe's `env:` block (TRL's) beats the caller's environment and rlhf's defaults, as TRL's parser does;
    # it is in the resolved recipe and launch.sh, and each machine's launcher resolves the same recipe.
    env.update(run.value("env"))
    env[OUTPUT_MODE_ENV] = verbosity
    env[RUN_DIR_ENV] = str(run.output_dir)  # shared by every machine: the supervisor records its ranks' ends there
    return Launch(argv, env)


def launch_script(launch: Launch, workdir: Path) -> str:
    """`launch.sh`: re-runs the same ranks from the same files."""
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(launch.env.items()))
    return f"#!/usr/bin/env bash\n# Re-runs this run's ranks.\nset -euo pipefail\ncd {shlex.quote(str(workdir))}\n" \
           f"{exports}exec {shlex.join(launch.argv)}\n"
