"""A resolved run -> the exact argv and environment that start its ranks. Pure: no I/O."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from rlhf_cli.config.resolve import RECIPE_FILE, ResolvedRun

ACCELERATE_FILE = "accelerate_config.yaml"
LAUNCH_SCRIPT = "launch.sh"


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]  # added to the caller's environment

    def shell(self) -> str:
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        return " ".join(assignments + [shlex.join(self.argv)])


def launch_command(run: ResolvedRun, python: str = sys.executable) -> Launch:
    """accelerate's launcher starting `python -m rlhf_cli.rank ALGORITHM RECIPE` on every rank."""
    run_dir = run.output_dir
    argv = [
        python, "-m", "accelerate.commands.launch",
        "--config_file", str(run_dir / ACCELERATE_FILE),
        "-m", "rlhf_cli.rank", run.algorithm, str(run_dir / RECIPE_FILE),
    ]
    env = {"TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if run.cpu_only:
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed would otherwise look for CUDA and fail
    return Launch(argv, env)


def launch_script(launch: Launch, workdir: Path) -> str:
    """`launch.sh`: re-runs the same ranks from the same files."""
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(launch.env.items()))
    return f"#!/usr/bin/env bash\n# Re-runs this run's ranks.\nset -euo pipefail\ncd {shlex.quote(str(workdir))}\n" \
           f"{exports}exec {shlex.join(launch.argv)}\n"
