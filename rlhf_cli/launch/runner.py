"""Start a resolved run: write its record, start the ranks, forward signals, return their exit code."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.config.resolve import RECIPE_FILE, ResolvedRun
from rlhf_cli.launch.command import ACCELERATE_FILE, LAUNCH_SCRIPT, launch_command, launch_script


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_run_files(run: ResolvedRun, accelerate: dict[str, Any]) -> None:
    """The resolved recipe, the accelerate config and launch.sh, in the output dir, before any rank starts."""
    run_dir = run.output_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    header = f"# Resolved by rlhf from {run.recipe or 'flags'}; a valid recipe for `rlhf {run.algorithm}`.\n"
    (run_dir / RECIPE_FILE).write_text(header + yaml.safe_dump(run.recipe_values(), sort_keys=True))
    (run_dir / ACCELERATE_FILE).write_text(yaml.safe_dump(accelerate, sort_keys=True))
    script = run_dir / LAUNCH_SCRIPT
    script.write_text(launch_script(launch_command(run), Path.cwd()))
    script.chmod(0o755)


def launch(run: ResolvedRun) -> int:
    """Run the ranks to the end; Ctrl-C or SIGTERM is passed on to them. Returns their exit code."""
    accelerate = dict(run.accelerate)
    if accelerate.get("num_machines", 1) == 1 and "main_process_port" not in accelerate:
        accelerate["main_process_port"] = _free_port()  # two runs on one node must not collide
    write_run_files(run, accelerate)
    command = launch_command(run)
    # The ranks get their own process group, so a terminal's Ctrl-C reaches them once, through us.
    ranks = subprocess.Popen(command.argv, env={**os.environ, **command.env}, start_new_session=True)
    forwarded: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        # A second interrupt means "stop now".
        os.killpg(ranks.pid, signal.SIGKILL if len(forwarded) > 1 else signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = ranks.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code
