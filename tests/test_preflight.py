"""The pre-launch check: the trainer's config built and the reward functions imported once, in a process of their
own, before any rank starts; what they refuse is reported like every other mistake. Seconds each (TRL's import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, launch_rlhf, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.preflight import check_before_launch

CHECK = """
import json, sys
from pathlib import Path
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.preflight import check_before_launch

run = resolve(RunRequest("rloo", "rloo/smoke", sets=tuple(sys.argv[1:])), cwd=Path.cwd(), cuda=False)
try:
    check_before_launch(run)
    problems = []
except ConfigError as error:
    problems = error.problems
heavy = [name for name in ("torch", "transformers", "trl", "deepspeed") if name in sys.modules]
print(json.dumps({"problems": problems, "heavy_in_launcher": heavy}))
"""


def run_check(tmp_path: Path, *sets: str) -> dict:
    """The check as the launcher runs it, from a fresh process: its problems, and what the launcher imported."""
    done = subprocess.run([sys.executable, "-c", CHECK, *sets], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_what_trl_and_the_reward_functions_refuse_is_found_before_any_rank(tmp_path: Path) -> None:
    write(tmp_path / "raises.py", "raise RuntimeError('no GPU quota')\n")
    write(tmp_path / "narrow.py", "def score(completions):\n    return [0.0 for _ in completions]\n")
    write(tmp_path / "chatty.py", "print('hello from the user module')\n"
                                  "def score(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    found = run_check(tmp_path, "reward_funcs=[raises.py:score, narrow.py:score, chatty.py:score]",
                      "auto_find_batch_size=true")
    assert found["heavy_in_launcher"] == []  # TRL and torch stayed in the check's own process
    problems = found["problems"]
    assert len(problems) == 3, problems
    assert problems[0] == f"`reward_funcs`: {tmp_path}/raises.py:score: importing it failed (RuntimeError: no GPU " \
                          "quota); fix the module"
    assert problems[1].startswith(f"`reward_funcs`: {tmp_path}/narrow.py:score cannot take the arguments the trainer "
                                  "passes (prompts, completions, completion_ids, trainer_state, log_extra, "
                                  "log_metric): got an unexpected keyword argument 'prompts'")
    assert problems[2].startswith("trl.RLOOConfig refuses these values: ValueError: auto_find_batch_size is not "
                                  "supported by RLOO")  # a rule only TRL knows: the config's own check finds it


def test_a_run_that_fits_passes_with_the_launcher_free_of_torch(tmp_path: Path) -> None:
    write(tmp_path / "good.py", "def score(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    assert run_check(tmp_path, "reward_funcs=[good.py:score]") == {"problems": [], "heavy_in_launcher": []}


def test_a_reward_module_that_hangs_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    write(tmp_path / "hangs.py", "import subprocess, time\n"
                                 f"child = subprocess.Popen(['sleep', '600'])\nopen({str(pid_file)!r}, 'w')"
                                 ".write(str(child.pid))\ntime.sleep(600)\n"
                                 "def score(**kwargs):\n    return []\n")
    run = resolve(RunRequest("rloo", "rloo/smoke", sets=("reward_funcs=[hangs.py:score]",)), cwd=tmp_path, cuda=False)
    with pytest.raises(ConfigError) as raised:
        check_before_launch(run, timeout=8)
    assert raised.value.problems == [f"the pre-launch check did not finish in 8 s while importing reward function "
                                     f"{tmp_path}/hangs.py:score; a reward module that waits on something at import "
                                     "hangs every rank too"]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # SIGKILL is sent; on a busy machine the process takes a moment to go
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_a_reward_module_that_exits_the_process_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "quits.py", "import os\nos._exit(3)\ndef score(**kwargs):\n    return []\n")
    run = resolve(RunRequest("rloo", "rloo/smoke", sets=("reward_funcs=[quits.py:score]",)), cwd=tmp_path, cuda=False)
    with pytest.raises(ConfigError, match=r"ended with exit code 3 while importing reward function .*quits.py:score"):
        check_before_launch(run, timeout=120)


def test_num_generations_3_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    """The real command, nothing stubbed: exit 2 in about a second, no output dir, no rank."""
    out = tmp_path / "out"
    done = launch_rlhf("rloo", out, "--set", "num_generations=3", env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: `num_generations` (3) must divide the generation batch (4 = per_device_train_batch_size x processes "
        "x steps per generation): set num_generations to 2, or per_device_train_batch_size to a multiple of 3"]
    assert not out.exists()  # the ranks write their records there first
