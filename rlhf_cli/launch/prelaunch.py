"""Before any rank starts: the trainer's config built and each reward function imported once, in a process of
their own (rlhf_cli/rank/prelaunch.py), their problems reported as every other mistake is (exit 2).

Why a separate process: both run code the launcher must not. TRL's config pulls in torch, and transformers'
__post_init__ would set up a device and a process group in whatever process builds it; a reward module is the
user's code, which may import anything, print, or never return. The launcher itself never imports torch, so it
holds no CUDA context the ranks could trip over, and the check's process is gone before the ranks start.
What it costs: one Python start and TRL's import, a few seconds (benchmarks/launcher.py measures it), which the
launcher spends while the launch supervisor imports torch and accelerate: the supervisor waits at a gate and starts no
rank until the check has passed (rlhf_cli/launch/runner.py). On 2 cores it cannot hide there, so a check that
passed is remembered (`passed_checks_dir`), keyed by a hash of what it read: the resolved values, the ranks'
environment, the installed versions, rlhf's own code, the bytes of each file of code it runs (rewards, tools,
environments, the rollout function) and, with tools, of the policy's chat template; not where the run writes or
which checkpoint it resumes. A run started again unchanged, elsewhere or resumed, skips it; code from an installed
module (whose code no hash here can follow), or tools with a hub policy, are checked every time. A pass
remembered wrongly costs a rank's error at start, not a wrong run.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.command import launch_command
from rlhf_cli.launch.versions import installed_versions
from rlhf_cli.machine.cache import cache_dir
from rlhf_cli.output.run_dir import OUTPUT_MODE_ENV, PRELAUNCH_STEP_MARK, RUN_DIR_ENV

PRELAUNCH_MODULE = "rlhf_cli.rank.prelaunch"
# Where a run writes, and the checkpoint it resumes from (which the resolver checked): the trainer's config only
# stores them, so a check that passed holds for a run started elsewhere or resumed.
NOT_CHECKED = ("output_dir", "logging_dir", "run_name", "resume_from_checkpoint")
TIMEOUT_SECONDS = 300  # TRL's import on a slow shared file system, with room; a reward module that hangs stops here


def _last_step(stderr: str) -> str:
    steps = [line[len(PRELAUNCH_STEP_MARK):] for line in stderr.splitlines() if line.startswith(PRELAUNCH_STEP_MARK)]
    return steps[-1] if steps else "starting"


def _last_lines(stderr: str, count: int = 3) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(PRELAUNCH_STEP_MARK)]
    return " | ".join(line.strip() for line in lines[-count:])


def passed_checks_dir() -> Path:
    """Where passed checks are remembered, one empty file each, in rlhf's cache."""
    return cache_dir() / "passed-checks"


def _code_stamp() -> list[float | str]:
    """rlhf's version and its newest source file: an edited checkout is checked again."""
    package = Path(__file__).resolve().parent.parent
    return [installed_versions()["rlhf"] or "", max(path.stat().st_mtime for path in package.rglob("*.py"))]


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json", "processor_config.json")


def _code_specs(values: dict[str, Any]) -> list[str]:
    """Every `file.py:name` or `module:name` the run executes: reward functions, tools, environments, rollout."""
    factory = values.get("environment_factory")
    factories = list(factory.values()) if isinstance(factory, dict) else [factory] if factory else []
    rollout = [values["rollout_func"]] if values.get("rollout_func") else []
    return [str(spec) for spec in [*(values.get("reward_funcs") or []), *(values.get("tools") or []), *factories,
                                   *rollout]]


def _sources(values: dict[str, Any]) -> dict[str, str] | None:
    """A hash of each file the check executes or reads beyond the values: the code files, with tools the policy's
    chat template (its tokenizer files), and a local dataset's size and time; None when one lies beyond a file's
    bytes (a module, what it imports, a hub model) or cannot be read."""
    paths = []
    for spec in _code_specs(values):
        target, sep, _ = spec.rpartition(":")
        if not sep and "." not in spec:
            continue  # one of TRL's own, fixed by TRL's version
        if not target.endswith(".py"):
            return None
        paths.append(Path(target))
    if values.get("tools") or values.get("environment_factory"):
        model = Path(str(values.get("model_name_or_path")))
        if not model.is_dir():
            return None
        paths += [model / name for name in TEMPLATE_FILES if (model / name).is_file()]
    dataset = Path(str(values.get("dataset_name")))
    try:
        sources = {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in paths}
        if dataset.is_file():  # its first rows give the reward's columns and reset's row; too large to hash
            sources[str(dataset)] = f"{dataset.stat().st_size}:{dataset.stat().st_mtime_ns}"
    except OSError:
        return None  # the check itself says why
    return sources


def check_key(payload: dict[str, Any], rank_env: dict[str, str]) -> str | None:
    """A hash of everything the check reads, or None when that cannot be known (rlhf_cli.launch.prelaunch's
    `_sources`)."""
    sources = _sources(payload["values"])
    if sources is None:
        return None
    # Where a run writes, what it resumes and how much it prints change nothing the check looks at: a run with the
    # default output dir (runs/ALGO-TIME), or resumed after a preemption, is the same check as the last one.
    values = {key: value for key, value in payload["values"].items() if key not in NOT_CHECKED}
    env = {key: value for key, value in rank_env.items() if key not in (RUN_DIR_ENV, OUTPUT_MODE_ENV)}
    identity = {"payload": {**payload, "values": values}, "env": env, "versions": installed_versions(),
                "code": _code_stamp(), "python": sys.executable, "sources": sources}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _remember(key: str | None) -> None:
    if key is None:
        return
    try:
        passed_checks_dir().mkdir(parents=True, exist_ok=True)
        (passed_checks_dir() / key).touch()
    except OSError:
        pass  # an unwritable cache only means the next run checks again


class PendingCheck:
    """The check running in its own process; `wait()` returns when all is well and raises ConfigError with what
    the trainer's config or a reward function refuses."""

    def __init__(self, run: ResolvedRun, timeout: float = TIMEOUT_SECONDS) -> None:
        payload = {"algorithm": run.algorithm, "values": run.recipe_values(),
                   "processes": int(run.accelerate.get("num_processes") or 1)}
        rank_env = launch_command(run).env
        self.timeout = timeout
        self.payload = json.dumps(payload, default=str)
        self.key = check_key(payload, rank_env)
        self.remembered = self.key is not None and (passed_checks_dir() / self.key).exists()
        self.checker: subprocess.Popen | None = None
        if self.remembered:
            return
        # Its own session: a reward module's children are stopped with it when it runs out of time.
        self.checker = subprocess.Popen([sys.executable, "-m", PRELAUNCH_MODULE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, **rank_env}, start_new_session=True)

    def wait(self) -> None:
        checker = self.checker
        if checker is None:
            return  # passed before, with everything it reads unchanged
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
        _remember(self.key)


def check_before_launch(run: ResolvedRun, timeout: float = TIMEOUT_SECONDS) -> None:
    """Raise ConfigError with what the trainer's config or a reward function refuses; return when all is well."""
    PendingCheck(run, timeout).wait()
