"""Before any rank starts: the trainer's config built and each reward function imported once, in a process of
their own (rlhf_cli/rank/preflight.py), their problems reported as every other mistake is (exit 2).

Why a separate process: both run code the launcher must not. TRL's config pulls in torch, and transformers'
__post_init__ would set up a device and a process group in whatever process builds it; a reward module is the
user's code, which may import anything, print, or never return. The launcher itself never imports torch, so it
holds no CUDA context the ranks could trip over, and the check's process is gone before the ranks start.
What it costs: one Python start and TRL's import, a few seconds (benchmarks/launcher.py measures it), which the
launcher spends while the launch agent imports torch and accelerate: the agent waits at a gate and starts no
rank until the check has passed (rlhf_cli/launch/runner.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.command import launch_command
from rlhf_cli.run_dir import PREFLIGHT_STEP_MARK

PREFLIGHT_MODULE = "rlhf_cli.rank.preflight"
TIMEOUT_SECONDS = 300  # TRL's import on a slow shared file system, with room; a reward module that hangs stops here


def _last_step(stderr: str) -> str:
    steps = [line[len(PREFLIGHT_STEP_MARK):] for line in stderr.splitlines() if line.startswith(PREFLIGHT_STEP_MARK)]
    return steps[-1] if steps else "starting"


def _last_lines(stderr: str, count: int = 3) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(PREFLIGHT_STEP_MARK)]
    return " | ".join(line.strip() for line in lines[-count:])


class PendingCheck:
    """The check running in its own process; `wait()` returns when all is well and raises ConfigError with what
    the trainer's config or a reward function refuses."""

    def __init__(self, run: ResolvedRun, timeout: float = TIMEOUT_SECONDS) -> None:
        payload = {"algorithm": run.algorithm, "values": run.recipe_values(),
                   "processes": int(run.accelerate.get("num_processes") or 1)}
        env = {**os.environ, **launch_command(run).env}
        self.timeout = timeout
        # Its own session: a reward module's children are stopped with it when it runs out of time.
        self.checker = subprocess.Popen([sys.executable, "-m", PREFLIGHT_MODULE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                        start_new_session=True)
        self.payload = json.dumps(payload, default=str)

    def wait(self) -> None:
        checker = self.checker
        try:
            stdout, stderr = checker.communicate(self.payload, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(checker.pid, signal.SIGKILL)
            _, stderr = checker.communicate()
            raise ConfigError(f"the pre-launch check did not finish in {self.timeout:.0f} s while "
                              f"{_last_step(stderr)}; a reward module that waits on something at import hangs every "
                              "rank too") from None
        except BaseException:
            os.killpg(checker.pid, signal.SIGKILL)
            checker.wait()
            raise
        try:
            problems = json.loads(stdout)["problems"]
        except (ValueError, KeyError, TypeError):
            code = checker.returncode
            raise ConfigError(f"the pre-launch check ended with exit code {code} while {_last_step(stderr)}: "
                              f"{_last_lines(stderr) or 'no output'}") from None
        if problems:
            raise ConfigError(*problems)


def check_before_launch(run: ResolvedRun, timeout: float = TIMEOUT_SECONDS) -> None:
    """Raise ConfigError with what the trainer's config or a reward function refuses; return when all is well."""
    PendingCheck(run, timeout).wait()
