"""A run started from a directory holding a `logging.py` and a `random.py` of the user's: rlhf's processes (the
launcher, the pre-launch check, the supervisor, the ranks) import the standard library's, while a reward module
kept there and named by module is still imported by every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO, rlhf_argv
from rlhf_cli.launch.module_start import module_argv

SHADOW = "raise SystemExit('the working directory replaced the standard library')\n"
REWARD = "import logging, random\n\ndef score(completions, **kwargs):\n    return [random.Random(len(c)).random() " \
         "for c in completions]\n"


def test_a_run_from_a_directory_that_shadows_the_standard_library_trains(tmp_path: Path) -> None:
    for name in ("logging", "random"):
        (tmp_path / f"{name}.py").write_text(SHADOW)
    (tmp_path / "my_rewards.py").write_text(REWARD)
    argv = rlhf_argv("rloo", tmp_path / "out", "--set", "reward_model_name_or_path=null",
                     "--set", "reward_funcs=[my_rewards.score]", "--max-steps", "1")
    assert argv[1:3] == ["-m", "rlhf_cli"]  # started as the `rlhf` script starts it: not from the directory
    done = subprocess.run([*module_argv(sys.executable, "rlhf_cli"), *argv[3:]], capture_output=True, text=True,
                          timeout=480, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "replaced the standard library" not in done.stderr
    assert (tmp_path / "out" / "summary.json").is_file()

